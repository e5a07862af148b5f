//! The test model's byte-level BPE vocabulary, rebuilt from its GGUF, against the Python
//! references in tests/fixtures/tokenizer_bpe.json (tools/fixtures/tokenizer_bpe.py): token ids
//! for 500+ strings under the model's own pre-tokenizer ("smollm") and 160 under each other
//! supported name, decodes of random id sequences, and the tokenizer.json export.

mod common;

use common::{fixture, ids, smollm_codec, smollm_vocab};
use serde_json::Value;
use tf_tokenizer::{TextCodec, TokenizerError};

fn variant_cases(doc: &Value, pre: &str) -> Vec<(String, Vec<u32>)> {
    doc["variants"][pre]["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("fixture has no cases for {pre}"))
        .iter()
        .map(|c| (c["text"].as_str().expect("text").to_string(), ids(&c["ids"])))
        .collect()
}

fn check_ids(codec: &TextCodec, cases: &[(String, Vec<u32>)], what: &str) {
    let mut bad = Vec::new();
    for (text, want) in cases {
        let got = codec.encode(text, true).expect("encode");
        if &got != want {
            bad.push(format!("{text:?}\n   got  {got:?}\n   want {want:?}"));
        }
    }
    assert!(bad.is_empty(), "{what}: {} of {} differ:\n{}", bad.len(), cases.len(), bad.join("\n"));
}

#[test]
fn smollm_ids_match_the_hf_layout() {
    let doc = fixture("tokenizer_bpe.json");
    let cases = variant_cases(&doc, "smollm");
    assert!(cases.len() >= 300, "fixture has {} strings", cases.len());
    assert_eq!(doc["meta"]["vocab_size"].as_u64(), Some(smollm_codec().vocab_size() as u64));
    check_ids(smollm_codec(), &cases, "smollm");
}

/// The fixture keeps transformers' GGUF converter's ids where they differ from the HF layout:
/// whitespace runs before numbers (it has no digit split). Our ids must be the layout's on all
/// of those, and the differences must all involve a number character (a regression guard that
/// the fixture's reference really is the digit-splitting one).
#[test]
fn smollm_differs_from_transformers_gguf_only_around_numbers() {
    let doc = fixture("tokenizer_bpe.json");
    let var = &doc["variants"]["smollm"];
    let mut seen = 0;
    for case in var["cases"].as_array().expect("cases") {
        let Some(other) = case.get("transformers_gguf") else { continue };
        seen += 1;
        let text = case["text"].as_str().expect("text");
        let got = smollm_codec().encode(text, true).expect("encode");
        assert_eq!(got, ids(&case["ids"]), "{text:?}");
        assert_ne!(got, ids(other), "{text:?}");
        assert!(text.chars().any(|c| c.is_numeric()), "{text:?} differs without a number");
    }
    assert_eq!(Some(seen), var["transformers_gguf_differs"].as_u64());
    assert!(seen > 0, "the fixture should show the digit-split difference");
}

#[test]
fn other_pre_tokenizers_match_their_hf_layouts() {
    let doc = fixture("tokenizer_bpe.json");
    for pre in ["gpt2", "llama-bpe", "qwen2", "default"] {
        let mut vocab = smollm_vocab().clone();
        vocab.pre = Some(pre.to_string());
        let codec = TextCodec::from_gguf(&vocab).expect("build");
        check_ids(&codec, &variant_cases(&doc, pre), pre);
    }
}

#[test]
fn no_pre_name_means_default() {
    let doc = fixture("tokenizer_bpe.json");
    let mut vocab = smollm_vocab().clone();
    vocab.pre = None;
    let codec = TextCodec::from_gguf(&vocab).expect("build");
    check_ids(&codec, &variant_cases(&doc, "default"), "no pre");
}

#[test]
fn unknown_pre_and_model_are_refused_by_name() {
    let mut vocab = smollm_vocab().clone();
    vocab.pre = Some("deepseek-coder".into());
    let err = TextCodec::from_gguf(&vocab).expect_err("unknown pre must be refused");
    assert!(matches!(err, TokenizerError::UnsupportedPre { .. }), "{err}");
    assert!(err.to_string().contains("\"deepseek-coder\""), "{err}");
    let mut vocab = smollm_vocab().clone();
    vocab.model = "bert".into();
    let err = TextCodec::from_gguf(&vocab).expect_err("unknown model must be refused");
    assert!(err.to_string().contains("\"bert\""), "{err}");
}

#[test]
fn malformed_vocabularies_are_errors() {
    let mut vocab = smollm_vocab().clone();
    vocab.token_types.truncate(10);
    assert!(TextCodec::from_gguf(&vocab).is_err());
    let mut vocab = smollm_vocab().clone();
    vocab.eos = Some(vocab.tokens.len() as u32);
    let err = TextCodec::from_gguf(&vocab).expect_err("eos out of range");
    assert!(err.to_string().contains("eos_token_id"), "{err}");
    let mut vocab = smollm_vocab().clone();
    vocab.merges[0] = "nospace".into();
    assert!(TextCodec::from_gguf(&vocab).is_err());
    let mut vocab = smollm_vocab().clone();
    vocab.merges.push("Ġzzqq xxjj".into());
    assert!(TextCodec::from_gguf(&vocab).is_err(), "a merge of unknown tokens must fail");
}

#[test]
fn decodes_match_the_reference() {
    let doc = fixture("tokenizer_bpe.json");
    let codec = smollm_codec();
    let decodes = doc["decodes"].as_array().expect("decodes");
    assert!(decodes.len() >= 50);
    for d in decodes {
        let seq = ids(&d["ids"]);
        assert_eq!(
            codec.decode(&seq, false).expect("decode"),
            d["text"].as_str().expect("text"),
            "{seq:?}"
        );
        let skipped = codec.decode(&seq, true).expect("decode");
        assert_eq!(skipped, d["text_skip_special"].as_str().expect("text"), "{seq:?}");
    }
}

#[test]
fn byte_level_round_trips_every_fixture_string() {
    let doc = fixture("tokenizer_bpe.json");
    for (text, _) in variant_cases(&doc, "smollm") {
        let ids = smollm_codec().encode(&text, false).expect("encode");
        assert_eq!(smollm_codec().decode(&ids, false).expect("decode"), text);
    }
}

#[test]
fn special_tokens_and_flags() {
    let codec = smollm_codec();
    let vocab = smollm_vocab();
    assert_eq!(codec.bos_id(), Some(1));
    assert_eq!(codec.eos_id(), Some(2));
    assert!(!codec.adds_bos() && !codec.adds_eos());
    assert_eq!(codec.encode("", true).expect("encode"), Vec::<u32>::new());
    assert_eq!(codec.encode("<|im_start|>user", false).expect("encode")[0], 1);
    for (id, ty) in vocab.token_types.iter().enumerate() {
        assert_eq!(codec.is_special(id as u32), *ty == 3, "token {id}");
    }
    assert_eq!(codec.token(1).as_deref(), Some("<|im_start|>"));
    assert_eq!(
        codec.token_id("Ġthe"),
        vocab.tokens.iter().position(|t| t == "Ġthe").map(|i| i as u32)
    );
    let ids = codec.encode("<|im_start|>hi<|im_end|>", false).expect("encode");
    assert_eq!(codec.decode(&ids, true).expect("decode"), "hi");
}

#[test]
fn bos_is_added_when_the_vocabulary_says_so() {
    let mut vocab = smollm_vocab().clone();
    vocab.add_bos = Some(true);
    vocab.add_eos = Some(true);
    let codec = TextCodec::from_gguf(&vocab).expect("build");
    let plain = smollm_codec().encode("Hello world", false).expect("encode");
    let mut want = vec![1];
    want.extend(&plain);
    want.push(2);
    assert_eq!(codec.encode("Hello world", true).expect("encode"), want);
    assert_eq!(codec.encode("Hello world", false).expect("encode"), plain);
    // llama.cpp's default for an absent flag: Llama-3's byte-level vocabulary adds BOS.
    let mut vocab = smollm_vocab().clone();
    vocab.add_bos = None;
    vocab.pre = Some("llama-bpe".into());
    assert!(TextCodec::from_gguf(&vocab).expect("build").adds_bos());
}

/// to_tokenizer_json + to_tokenizer_config, loaded back through the tokenizer.json path, give
/// the same ids and text on every fixture string.
#[test]
fn exported_tokenizer_json_round_trips() {
    let doc = fixture("tokenizer_bpe.json");
    let codec = smollm_codec();
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("tokenizer.json");
    let config = dir.path().join("tokenizer_config.json");
    std::fs::write(&json, codec.to_tokenizer_json().expect("serialize")).expect("write");
    let cfg = codec.to_tokenizer_config(Some("{{ bos_token }}"));
    std::fs::write(&config, serde_json::to_string_pretty(&cfg).expect("json")).expect("write");
    let back = TextCodec::from_files(&json, Some(&config)).expect("load exported tokenizer.json");
    assert_eq!(back.vocab_size(), codec.vocab_size());
    assert_eq!(back.special_tokens(), codec.special_tokens());
    assert_eq!((back.adds_bos(), back.adds_eos()), (codec.adds_bos(), codec.adds_eos()));
    check_ids(&back, &variant_cases(&doc, "smollm"), "exported tokenizer.json");
    for d in doc["decodes"].as_array().expect("decodes") {
        let seq = ids(&d["ids"]);
        assert_eq!(
            back.decode(&seq, true).expect("decode"),
            d["text_skip_special"].as_str().expect("text")
        );
    }
}

/// Tests that need the model fail (never skip) when it is absent, saying how to fetch it.
#[test]
fn a_missing_model_is_a_failure_that_says_how_to_fetch_it() {
    let empty = tempfile::tempdir().expect("tempdir");
    let err = common::locate_model(Some(empty.path())).expect_err("no model in an empty cache");
    assert!(err.contains("scripts/fetch-model.sh") && err.contains(common::MODEL_FILE), "{err}");
}

/// The checkpoint reader's `TokenizerSource` goes straight into `from_source`.
#[test]
fn from_source_on_the_checkpoint() {
    let ckpt = common::checkpoint();
    let codec = TextCodec::from_source(&ckpt.tokenizer).expect("from_source");
    assert_eq!(codec.vocab_size(), 49152);
    let text = "Hello <|im_start|>world 2024";
    assert_eq!(
        codec.encode(text, true).expect("encode"),
        smollm_codec().encode(text, true).expect("encode")
    );
}
