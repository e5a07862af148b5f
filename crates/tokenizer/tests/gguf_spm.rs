//! A SentencePiece (`llama`) GGUF vocabulary rebuilt as BPE with byte fallback, against
//! `sentencepiece` itself (tests/fixtures/tokenizer_spm.json, tools/fixtures/tokenizer_spm.py),
//! and the tokenizer.json path on the same model as transformers saves it (spm_hf/).

mod common;

use common::{fixture, fixture_path, ids, spm_vocab};
use serde_json::Value;
use tf_tokenizer::TextCodec;

fn cases(doc: &Value) -> &Vec<Value> {
    doc["cases"].as_array().expect("cases")
}

#[test]
fn ids_match_sentencepiece() {
    let doc = fixture("tokenizer_spm.json");
    let codec = TextCodec::from_gguf(&spm_vocab(&doc)).expect("build");
    assert!(cases(&doc).len() >= 300);
    let mut bad = Vec::new();
    for case in cases(&doc) {
        let text = case["text"].as_str().expect("text");
        let got = codec.encode(text, true).expect("encode");
        if got != ids(&case["ids"]) {
            bad.push(format!("{text:?}: got {got:?} want {:?}", ids(&case["ids"])));
        }
    }
    assert!(bad.is_empty(), "{} differ:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn flags_and_specials() {
    let doc = fixture("tokenizer_spm.json");
    let codec = TextCodec::from_gguf(&spm_vocab(&doc)).expect("build");
    assert!(codec.adds_bos() && !codec.adds_eos());
    assert_eq!(codec.encode("", true).expect("encode"), vec![1]);
    assert_eq!(codec.encode("", false).expect("encode"), Vec::<u32>::new());
    assert!(codec.is_special(0) && codec.is_special(1) && codec.is_special(2));
    let tool = codec.token_id("<tool>").expect("user-defined token");
    assert!(!codec.is_special(tool), "user-defined tokens are added but not special");
    // Without the prefix-space flag no `▁` is put in front.
    let mut vocab = spm_vocab(&doc);
    vocab.add_space_prefix = Some(false);
    let bare = TextCodec::from_gguf(&vocab).expect("build");
    let with = codec.encode("hello", false).expect("encode");
    let without = bare.encode("hello", false).expect("encode");
    assert_ne!(with, without);
    assert_eq!(codec.decode(&with, false).expect("decode"), "hello");
    assert_eq!(bare.decode(&without, false).expect("decode"), "hello");
}

/// Decoding random ids (byte tokens in any order, specials, unknowns) agrees with transformers'
/// decoder for the same model.
#[test]
fn decodes_match_transformers() {
    let doc = fixture("tokenizer_spm.json");
    let codec = TextCodec::from_gguf(&spm_vocab(&doc)).expect("build");
    for d in doc["decodes"].as_array().expect("decodes") {
        let seq = ids(&d["ids"]);
        assert_eq!(
            codec.decode(&seq, false).expect("decode"),
            d["text_hf"].as_str().expect("text"),
            "{seq:?}"
        );
    }
}

/// Text without added-token strings survives encode + decode (byte fallback is lossless).
/// Around added tokens it cannot: the prefix space put before each text fragment after one
/// (llama.cpp's and Llama-2's behaviour) decodes as a space, in llama.cpp too.
#[test]
fn round_trip() {
    let doc = fixture("tokenizer_spm.json");
    let codec = TextCodec::from_gguf(&spm_vocab(&doc)).expect("build");
    for case in cases(&doc) {
        let text = case["text"].as_str().expect("text");
        if ["<s>", "</s>", "<unk>", "<tool>", "</tool>"].iter().any(|s| text.contains(s)) {
            continue;
        }
        let ids = codec.encode(text, true).expect("encode");
        assert_eq!(codec.decode(&ids, true).expect("decode"), text);
    }
}

/// The tokenizer.json path: transformers' saved tokenizer (Metaspace pre-tokenizer, BOS from
/// the post-processor) gives transformers' ids, and the config's special tokens are found.
#[test]
fn tokenizer_json_path_matches_transformers() {
    let doc = fixture("tokenizer_spm.json");
    let dir = fixture_path("spm_hf");
    let codec = TextCodec::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .expect("load spm_hf");
    assert_eq!(codec.bos_id(), Some(1));
    assert_eq!(codec.eos_id(), Some(2));
    assert_eq!(codec.special_tokens().unk.as_ref().map(|t| t.id), Some(0));
    assert!(codec.adds_bos());
    for case in cases(&doc) {
        let text = case["text"].as_str().expect("text");
        let want = ids(case.get("transformers_gguf").unwrap_or(&case["ids"]));
        assert_eq!(codec.encode(text, true).expect("encode"), want, "{text:?}");
    }
}

/// A config that states add_bos_token/add_eos_token rebuilds the post-processor, as
/// transformers does.
#[test]
fn config_flags_rebuild_the_post_processor() {
    let src = fixture_path("spm_hf");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = serde_json::json!({"bos_token": "<s>", "eos_token": {"content": "</s>"},
                                    "add_bos_token": false, "add_eos_token": true});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("write");
    let codec = TextCodec::from_files(
        &src.join("tokenizer.json"),
        Some(&dir.path().join("tokenizer_config.json")),
    )
    .expect("load");
    let plain = codec.encode("hello world", false).expect("encode");
    let mut want = plain.clone();
    want.push(2);
    assert_eq!(codec.encode("hello world", true).expect("encode"), want);
    assert!(!codec.adds_bos() && codec.adds_eos());
}

#[test]
fn missing_files_are_named() {
    let err = TextCodec::from_files(std::path::Path::new("/nonexistent/tokenizer.json"), None)
        .expect_err("missing file");
    assert!(err.to_string().contains("/nonexistent/tokenizer.json"), "{err}");
}
