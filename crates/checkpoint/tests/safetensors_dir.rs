//! HF checkpoint directories: sharded round trip, every way an index can lie, and
//! `open_hf_dir` (config, tokenizer files, chat template, admission by name).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tf_checkpoint::admission::refusals;
use tf_checkpoint::checkpoint::CheckpointFormat;
use tf_checkpoint::safetensors::{open_hf_dir, open_weights};
use tf_checkpoint::{
    Checkpoint, CheckpointError, DType, TensorData, TensorFormat, TokenizerSource,
};

/// (name, dtype, shape, bytes)
type T<'a> = (&'a str, &'a str, Vec<usize>, Vec<u8>);

/// A minimal safetensors writer: tensors back to back in the given order.
fn write_safetensors(path: &Path, tensors: &[T<'_>], metadata: Option<Value>) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let begin = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    if let Some(m) = metadata {
        header.insert("__metadata__".into(), m);
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const S1: &str = "model-00001-of-00002.safetensors";
const S2: &str = "model-00002-of-00002.safetensors";

/// Two shards and their index: `a` (F32) and `b` (BF16) in shard 1, `c` (U32) in shard 2.
fn sharded(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let a = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = vec![0x80, 0x3f, 0x00, 0xc0];
    let c: Vec<u8> = (0u8..12).collect();
    write_safetensors(
        &dir.join(S1),
        &[("a", "F32", vec![2, 3], a.clone()), ("b", "BF16", vec![2], b.clone())],
        Some(json!({"format": "pt"})),
    );
    write_safetensors(&dir.join(S2), &[("c", "U32", vec![3], c.clone())], None);
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {"total_size": 40}, "weight_map": {"a": S1, "b": S1, "c": S2}}),
    );
    vec![("a".into(), a), ("b".into(), b), ("c".into(), c)]
}

#[test]
fn sharded_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let written = sharded(dir.path());
    let w = open_weights(dir.path()).unwrap();
    assert_eq!(w.tensors.len(), 3);
    for (name, bytes) in &written {
        assert_eq!(w.tensors[name].bytes(), &bytes[..], "{name}");
        assert!(matches!(w.tensors[name].data, TensorData::Mapped { .. }));
    }
    assert_eq!(w.tensors["a"].shape, vec![2, 3]);
    assert_eq!(w.tensors["b"].format, TensorFormat::Plain(DType::BF16));
    assert_eq!(w.tensors["c"].format, TensorFormat::Plain(DType::U32));
    assert_eq!(w.files, vec![dir.path().join(S1), dir.path().join(S2)]);
    assert_eq!(w.metadata.get("format").map(String::as_str), Some("pt"));
}

fn index_refused(dir: &Path, says: &[&str]) {
    let err = open_weights(dir).expect_err("must be refused");
    let msg = err.to_string();
    assert!(matches!(err, CheckpointError::Malformed { .. }), "{msg}");
    for s in says {
        assert!(msg.contains(s), "`{s}` not in: {msg}");
    }
}

fn set_weight_map(dir: &Path, map: Value) {
    write_json(&dir.join("model.safetensors.index.json"), &json!({"weight_map": map}));
}

#[test]
fn index_names_a_missing_shard() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    std::fs::remove_file(dir.path().join(S2)).unwrap();
    index_refused(dir.path(), &["model.safetensors.index.json", S2, "does not exist"]);
}

#[test]
fn index_lists_a_tensor_its_shard_lacks() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    set_weight_map(dir.path(), json!({"a": S1, "b": S1, "c": S2, "lm_head.weight": S2}));
    index_refused(dir.path(), &["tensor `lm_head.weight`", S2, "absent"]);
    set_weight_map(dir.path(), json!({"a": S2, "b": S1, "c": S2}));
    index_refused(dir.path(), &["tensor `a`", "listed under shard", "lives in", S1]);
}

#[test]
fn tensor_in_two_shards() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    write_safetensors(&dir.path().join(S2), &[("a", "U8", vec![1], vec![7])], None);
    index_refused(dir.path(), &["tensor `a` appears in two shards", S1, S2]);
}

#[test]
fn shard_names_stay_inside_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    for bad in ["../model.safetensors", "/etc/passwd", "sub/x.safetensors", "", "."] {
        set_weight_map(dir.path(), json!({"a": bad}));
        index_refused(dir.path(), &["not a plain file name"]);
    }
}

#[test]
fn malformed_indexes() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    set_weight_map(dir.path(), json!({}));
    index_refused(dir.path(), &["`weight_map` is empty"]);
    write_json(&dir.path().join("model.safetensors.index.json"), &json!({"metadata": {}}));
    index_refused(dir.path(), &["`weight_map` is missing"]);
    set_weight_map(dir.path(), json!({"a": 3}));
    index_refused(dir.path(), &["tensor `a`", "not a string"]);
    std::fs::write(dir.path().join("model.safetensors.index.json"), b"{\"weight_map\": ").unwrap();
    index_refused(dir.path(), &["model.safetensors.index.json", "malformed JSON"]);
    // A shard that is itself malformed reports the shard.
    sharded(dir.path());
    std::fs::write(dir.path().join(S2), [1u8, 2, 3]).unwrap();
    index_refused(dir.path(), &[S2, "shorter than the 8-byte header length"]);
}

#[test]
fn single_file_wins_and_no_weights_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    index_refused(dir.path(), &["neither model.safetensors nor model.safetensors.index.json"]);
    sharded(dir.path());
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[("z", "I8", vec![1], vec![9])],
        None,
    );
    let w = open_weights(dir.path()).unwrap();
    assert_eq!(w.tensors.keys().collect::<Vec<_>>(), vec!["z"]);
}

fn fixture_config(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/configs").join(name)
}

/// A checkpoint directory with the fixture's config files, a tokenizer.json stand-in and one
/// tensor.
fn hf_dir(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "generation_config.json"] {
        let src = fixture_config(config).join(f);
        if src.is_file() {
            std::fs::copy(src, dir.path().join(f)).unwrap();
        }
    }
    std::fs::write(dir.path().join("tokenizer.json"), b"{}").unwrap();
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[("model.norm.weight", "BF16", vec![2], vec![0x80, 0x3f, 0x80, 0x3f])],
        None,
    );
    dir
}

#[test]
fn opens_an_hf_directory() {
    let dir = hf_dir("smollm2-135m-v5");
    write_json(
        &dir.path().join("tokenizer_config.json"),
        &json!({"chat_template": "{{ messages }}", "eos_token": "<|im_end|>"}),
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.format, CheckpointFormat::Safetensors);
    assert_eq!(ck.path, dir.path());
    assert_eq!(ck.spec.architecture, "LlamaForCausalLM");
    assert_eq!(ck.spec.special.eos, vec![2]);
    assert_eq!(ck.chat_template.as_deref(), Some("{{ messages }}"));
    match &ck.tokenizer {
        TokenizerSource::Json { tokenizer_json, tokenizer_config } => {
            assert_eq!(tokenizer_json, &dir.path().join("tokenizer.json"));
            assert_eq!(
                tokenizer_config.as_deref(),
                Some(&*dir.path().join("tokenizer_config.json"))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(ck.tensor("model.norm.weight").unwrap().shape, vec![2]);
    assert!(refusals(&ck).is_empty(), "{:?}", refusals(&ck));
}

#[test]
fn tokenizer_config_is_optional() {
    let dir = hf_dir("qwen3-0.6b");
    let ck = open_hf_dir(dir.path()).unwrap();
    assert!(ck.chat_template.is_none());
    assert!(matches!(ck.tokenizer, TokenizerSource::Json { tokenizer_config: None, .. }));
    assert_eq!(ck.spec.special.eos, vec![151645, 151643], "generation_config.json merged");
}

#[test]
fn missing_files_are_named() {
    let dir = hf_dir("qwen3-0.6b");
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let msg = open_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("tokenizer.json is missing"), "{msg}");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let msg = open_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("config.json is missing"), "{msg}");
    let msg = Checkpoint::open(&dir.path().join("nope")).unwrap_err().to_string();
    assert!(msg.contains("nope"), "{msg}");
}

#[test]
fn chat_template_sources() {
    let dir = hf_dir("qwen3-0.6b");
    let tc = dir.path().join("tokenizer_config.json");
    write_json(
        &tc,
        &json!({"chat_template": [{"name": "tool_use", "template": "T"},
                                  {"name": "default", "template": "D"}]}),
    );
    assert_eq!(open_hf_dir(dir.path()).unwrap().chat_template.as_deref(), Some("D"));
    write_json(&tc, &json!({"chat_template": [{"name": "rag", "template": "R"}]}));
    assert_eq!(open_hf_dir(dir.path()).unwrap().chat_template, None);
    // chat_template.jinja overrides tokenizer_config.json, as in transformers.
    write_json(&tc, &json!({"chat_template": "from config"}));
    std::fs::write(dir.path().join("chat_template.jinja"), "from file").unwrap();
    assert_eq!(open_hf_dir(dir.path()).unwrap().chat_template.as_deref(), Some("from file"));
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    write_json(&tc, &json!({"chat_template": 5}));
    let err = open_hf_dir(dir.path()).unwrap_err();
    assert!(matches!(&err, CheckpointError::Config { key, .. } if key == "chat_template"), "{err}");
}

#[test]
fn yarn_is_refused_by_name() {
    let dir = hf_dir("qwen2.5-7b-instruct-yarn");
    let ck = open_hf_dir(dir.path()).unwrap();
    let reasons = refusals(&ck);
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("rope_scaling type \"yarn\" is not implemented for family llama")),
        "{reasons:?}"
    );
}

#[test]
fn mistral_window_and_unknown_architecture_are_refused_by_name() {
    let dir = hf_dir("mistral-7b-v0.1");
    let reasons = refusals(&open_hf_dir(dir.path()).unwrap());
    assert_eq!(reasons, vec!["sliding_window 4096 is not implemented for family llama"]);
    write_json(
        &dir.path().join("config.json"),
        &json!({"architectures": ["GPT2LMHeadModel"], "n_embd": 768, "vocab_size": 50257}),
    );
    let reasons = refusals(&open_hf_dir(dir.path()).unwrap());
    assert!(
        reasons[0].contains("architecture `GPT2LMHeadModel` is not implemented"),
        "{reasons:?}"
    );
}
