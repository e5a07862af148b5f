//! `spec::hf::read_spec` against what transformers makes of real published configs.
//!
//! The fixtures and their `expected.json` come from `tests/fixtures/hf/gen_fixtures.py`
//! (transformers' `AutoConfig`/`GenerationConfig` on each directory, plus the per-architecture
//! facts its modeling files hard-code), so nothing expected here is computed by this crate.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tf_checkpoint::spec::hf::read_spec;
use tf_checkpoint::spec::{RopeScaling, RopeStyle};
use tf_checkpoint::ModelSpec;

fn configs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/configs")
}

fn load(name: &str) -> (ModelSpec, Value) {
    let dir = configs_dir().join(name);
    let spec = read_spec(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
    (spec, serde_json::from_str(&text).expect("expected.json parses"))
}

fn u(v: &Value) -> usize {
    v.as_u64().expect("integer") as usize
}

fn opt_id(v: &Value) -> Option<u32> {
    v.as_u64().map(|x| x as u32)
}

/// Compares every field of `spec` with transformers' reading in `want`.
fn check(name: &str, spec: &ModelSpec, want: &Value) {
    let ctx = |field: &str| format!("{name}: {field}");
    assert_eq!(spec.architecture, want["architecture"].as_str().unwrap(), "{}", ctx("arch"));
    for (got, key) in [
        (spec.hidden_size, "hidden_size"),
        (spec.intermediate_size, "intermediate_size"),
        (spec.num_hidden_layers, "num_hidden_layers"),
        (spec.num_attention_heads, "num_attention_heads"),
        (spec.num_key_value_heads, "num_key_value_heads"),
        (spec.head_dim, "head_dim"),
        (spec.vocab_size, "vocab_size"),
        (spec.max_position_embeddings, "max_position_embeddings"),
        (spec.rope.dim, "rope_dim"),
    ] {
        assert_eq!(got, u(&want[key]), "{}", ctx(key));
    }
    assert_eq!(spec.rms_norm_eps, want["rms_norm_eps"].as_f64().unwrap(), "{}", ctx("eps"));
    assert_eq!(spec.rope.theta, want["rope_theta"].as_f64().unwrap(), "{}", ctx("theta"));
    assert_eq!(spec.rope.style, RopeStyle::Neox, "{}", ctx("style"));
    for (got, key) in [
        (spec.tie_word_embeddings, "tie_word_embeddings"),
        (spec.attention_bias, "attention_bias"),
        (spec.o_proj_bias, "o_proj_bias"),
        (spec.mlp_bias, "mlp_bias"),
        (spec.qk_norm, "qk_norm"),
    ] {
        assert_eq!(got, want[key].as_bool().unwrap(), "{}", ctx(key));
    }
    let sc = &want["rope_scaling"];
    let want_scaling = match want["rope_type"].as_str().unwrap() {
        "llama3" => RopeScaling::Llama3 {
            factor: sc["factor"].as_f64().unwrap(),
            low_freq_factor: sc["low_freq_factor"].as_f64().unwrap(),
            high_freq_factor: sc["high_freq_factor"].as_f64().unwrap(),
            original_max_position_embeddings: u(&sc["original_max_position_embeddings"]),
        },
        "linear" => RopeScaling::Linear { factor: sc["factor"].as_f64().unwrap() },
        // Default, and kinds refused through `unsupported` (checked below).
        _ => RopeScaling::None,
    };
    assert_eq!(spec.rope.scaling, want_scaling, "{}", ctx("rope scaling"));
    assert_eq!(spec.special.bos, opt_id(&want["bos"]), "{}", ctx("bos"));
    assert_eq!(spec.special.pad, opt_id(&want["pad"]), "{}", ctx("pad"));
    let eos: Vec<u32> = want["eos"].as_array().unwrap().iter().map(|v| u(v) as u32).collect();
    assert_eq!(spec.special.eos, eos, "{}", ctx("eos"));
    let unsupported: Vec<&str> =
        want["unsupported"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(spec.unsupported, unsupported, "{}", ctx("unsupported"));
}

#[test]
fn every_fixture_matches_transformers() {
    let mut names: Vec<String> = std::fs::read_dir(configs_dir())
        .expect("fixtures dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 7, "fixture set changed: {names:?}");
    for name in &names {
        let (spec, want) = load(name);
        check(name, &spec, &want);
    }
}

#[test]
fn smollm2_transformers5_form() {
    let (spec, _) = load("smollm2-135m-v5");
    // The fixture really is the transformers-5 spelling: no top-level rope_theta.
    let raw: Value = serde_json::from_str(
        &std::fs::read_to_string(configs_dir().join("smollm2-135m-v5/config.json")).unwrap(),
    )
    .unwrap();
    assert!(raw.get("rope_theta").is_none() && raw["rope_parameters"]["rope_theta"] == 100000);
    assert_eq!(spec.rope.theta, 100000.0);
    assert!(spec.tie_word_embeddings);
    assert_eq!((spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim), (9, 3, 64));
    assert!(spec.unsupported.is_empty());
}

#[test]
fn llama31_rope_scaling_and_eos_list() {
    let (spec, _) = load("llama-3.1-8b-instruct");
    assert_eq!(
        spec.rope.scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert_eq!(spec.special.eos, vec![128001, 128008, 128009]);
    assert_eq!(spec.rope.theta, 500000.0);
}

#[test]
fn mistral_sliding_window_refused_only_when_set() {
    let (v01, _) = load("mistral-7b-v0.1");
    assert_eq!(v01.unsupported, vec!["sliding_window 4096".to_string()]);
    let (v03, _) = load("mistral-7b-instruct-v0.3");
    assert!(v03.unsupported.is_empty(), "{:?}", v03.unsupported);
    assert_eq!(v03.vocab_size, 32768);
}

#[test]
fn qwen_biases_norms_and_generation_eos() {
    let (q2, _) = load("qwen2.5-0.5b-instruct");
    assert!(q2.attention_bias && !q2.o_proj_bias && !q2.qk_norm);
    // generation_config.json adds <|endoftext|> to the config's <|im_end|>.
    assert_eq!(q2.special.eos, vec![151645, 151643]);
    assert!(q2.unsupported.is_empty(), "use_sliding_window is false: {:?}", q2.unsupported);
    let (q3, _) = load("qwen3-0.6b");
    assert!(q3.qk_norm && !q3.attention_bias && !q3.o_proj_bias);
    assert_eq!(q3.head_dim, 128);
    assert_eq!(q3.q_dim(), 2048, "Qwen3-0.6B: 16 heads x 128, wider than hidden 1024");
}
