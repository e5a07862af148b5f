//! The incremental detokenizer's contract, as properties: for any id sequence, the chunks
//! concatenate to `decode(ids)` exactly, and no chunk but the final flush ends in U+FFFD (an
//! incomplete character is held back, not emitted broken). Checked over random id sequences on
//! both vocabularies (byte-level BPE and SentencePiece byte fallback), with and without
//! skipping specials, and over every fixture string.

mod common;

use common::{fixture, smollm_codec, spm_vocab, Rng};
use tf_tokenizer::{DecodeStream, TextCodec};

/// Streams `ids`; returns the chunks (the last one is `finish`'s).
fn stream(codec: &TextCodec, ids: &[u32], skip: bool) -> Vec<String> {
    let mut s = DecodeStream::new(skip);
    let mut chunks: Vec<String> = ids.iter().map(|&id| s.step(codec, id).expect("step")).collect();
    chunks.push(s.finish(codec).expect("finish"));
    chunks
}

fn check(codec: &TextCodec, ids: &[u32], skip: bool) {
    let chunks = stream(codec, ids, skip);
    let whole = codec.decode(ids, skip).expect("decode");
    assert_eq!(chunks.concat(), whole, "ids {ids:?} skip {skip}: chunks {chunks:?}");
    for c in &chunks[..chunks.len() - 1] {
        assert!(
            !c.ends_with('\u{fffd}'),
            "ids {ids:?}: chunk {c:?} ends in U+FFFD; chunks {chunks:?}"
        );
    }
}

/// Random sequences: mostly uniform over the vocabulary, some low ids (specials live there),
/// some runs of one region (byte tokens sit together in both vocabularies).
fn random_sequences(vocab: u64, seed: u64, count: usize) -> Vec<Vec<u32>> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| {
            let len = rng.below(64) as usize;
            let base = rng.below(vocab);
            (0..len)
                .map(|_| match rng.below(10) {
                    0 => rng.below(32.min(vocab)),
                    1..=3 => (base + rng.below(300)) % vocab,
                    _ => rng.below(vocab),
                } as u32)
                .collect()
        })
        .collect()
}

#[test]
fn random_ids_byte_level() {
    let codec = smollm_codec();
    for ids in random_sequences(codec.vocab_size() as u64, 0x5eed_1234, 600) {
        check(codec, &ids, false);
        check(codec, &ids, true);
    }
}

#[test]
fn random_ids_sentencepiece() {
    let codec = TextCodec::from_gguf(&spm_vocab(&fixture("tokenizer_spm.json"))).expect("build");
    for ids in random_sequences(codec.vocab_size() as u64, 0xabcd_ef01, 1500) {
        check(&codec, &ids, false);
        check(&codec, &ids, true);
    }
}

#[test]
fn fixture_strings_stream_back_to_themselves() {
    let doc = fixture("tokenizer_bpe.json");
    let codec = smollm_codec();
    for case in doc["variants"]["smollm"]["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let ids = codec.encode(text, false).expect("encode");
        assert_eq!(stream(codec, &ids, false).concat(), text);
        check(codec, &ids, true);
    }
    let doc = fixture("tokenizer_spm.json");
    let spm = TextCodec::from_gguf(&spm_vocab(&doc)).expect("build");
    for case in doc["cases"].as_array().expect("cases") {
        let ids = spm.encode(case["text"].as_str().expect("text"), true).expect("encode");
        check(&spm, &ids, false);
        check(&spm, &ids, true);
    }
}

/// A character spread over several tokens comes out whole, once complete.
#[test]
fn multi_token_characters_are_held_back() {
    let codec = smollm_codec();
    let text = "😀👨‍👩‍👧 ok";
    let ids = codec.encode(text, false).expect("encode");
    let chunks = stream(codec, &ids, false);
    assert_eq!(chunks.concat(), text);
    let held = chunks.iter().filter(|c| c.is_empty()).count();
    assert!(held > 0, "{ids:?} -> {chunks:?}: nothing was held back");
    for c in &chunks {
        assert!(!c.contains('\u{fffd}'), "{chunks:?}");
    }
    // SentencePiece: an unknown character becomes byte tokens.
    let spm = TextCodec::from_gguf(&spm_vocab(&fixture("tokenizer_spm.json"))).expect("build");
    let ids = spm.encode("x 🦀 y", false).expect("encode");
    let chunks = stream(&spm, &ids, false);
    assert_eq!(chunks.concat(), "x 🦀 y");
    assert!(chunks.iter().all(|c| !c.contains('\u{fffd}')), "{chunks:?}");
}

/// The stream keeps only a window of ids, so a long generation stays cheap per step.
#[test]
fn long_streams_stay_exact() {
    let codec = smollm_codec();
    let text = "Hello, world! 你好 😀 123 ".repeat(300);
    let ids = codec.encode(&text, false).expect("encode");
    assert_eq!(stream(codec, &ids, false).concat(), text);
}
