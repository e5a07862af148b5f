//! `spec::hf::spec_from_config` on hand-written configs: defaults of the transformers config
//! classes, scaling kinds, refusals by name, and one error per kind of bad key.
//!
//! Expected values are facts about transformers (its config-class defaults and modeling
//! files, version 5.24), stated beside each test.

use std::path::Path;

use serde_json::{json, Value};
use tf_checkpoint::spec::hf::{merge_generation_config, spec_from_config};
use tf_checkpoint::spec::RopeScaling;
use tf_checkpoint::{CheckpointError, ModelSpec};

const PATH: &str = "/models/x/config.json";

fn llama() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096
    })
}

fn with(mut base: Value, key: &str, v: Value) -> Value {
    base[key] = v;
    base
}

fn without(mut base: Value, key: &str) -> Value {
    base.as_object_mut().unwrap().remove(key);
    base
}

fn spec(config: &Value) -> ModelSpec {
    spec_from_config(Path::new(PATH), config).unwrap_or_else(|e| panic!("{e}"))
}

/// The error must be `Config` naming `key` and the file, and its text must contain `what`.
fn config_err(config: &Value, key: &str, what: &str) {
    let err = spec_from_config(Path::new(PATH), config).expect_err("must fail");
    let msg = err.to_string();
    match &err {
        CheckpointError::Config { key: k, path, .. } => {
            assert_eq!(k, key, "{msg}");
            assert_eq!(path, Path::new(PATH));
        }
        other => panic!("want Config error for `{key}`, got {other:?}"),
    }
    assert!(msg.contains(PATH) && msg.contains(what), "{msg}");
}

#[test]
fn missing_required_keys_name_the_key() {
    for key in [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    ] {
        config_err(&without(llama(), key), key, "missing");
    }
    config_err(
        &without(without(llama(), "architectures"), "model_type"),
        "architectures",
        "missing",
    );
}

#[test]
fn wrong_types_name_the_key() {
    config_err(&with(llama(), "hidden_size", json!("256")), "hidden_size", "integer");
    config_err(&with(llama(), "num_hidden_layers", json!(-2)), "num_hidden_layers", "-2");
    config_err(&with(llama(), "num_key_value_heads", json!(2.5)), "num_key_value_heads", "2.5");
    config_err(&with(llama(), "vocab_size", json!(0)), "vocab_size", "positive");
    config_err(&with(llama(), "rms_norm_eps", json!("1e-5")), "rms_norm_eps", "number");
    config_err(
        &with(llama(), "tie_word_embeddings", json!(1)),
        "tie_word_embeddings",
        "true or false",
    );
    config_err(&with(llama(), "eos_token_id", json!("2")), "eos_token_id", "integer");
    config_err(&with(llama(), "eos_token_id", json!([2, "x"])), "eos_token_id", "integer");
    config_err(&with(llama(), "bos_token_id", json!(1u64 << 40)), "bos_token_id", "32 bits");
    config_err(&with(llama(), "architectures", json!("LlamaForCausalLM")), "architectures", "list");
    config_err(&with(llama(), "rope_scaling", json!("llama3")), "rope_scaling", "object");
    config_err(&with(llama(), "rope_theta", json!(-1.0)), "rope_theta", "positive");
    let err = spec_from_config(Path::new(PATH), &json!([1, 2])).unwrap_err();
    assert!(matches!(err, CheckpointError::Config { .. }), "{err}");
}

#[test]
fn llama3_scaling_keys_are_required() {
    let full = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    for key in ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]
    {
        let scaling = without(full.clone(), key);
        config_err(
            &with(llama(), "rope_scaling", scaling),
            &format!("rope_scaling.{key}"),
            "missing",
        );
    }
    // Same check under the transformers-5 key.
    let v5 = with(without(llama(), "rope_theta"), "rope_parameters", without(full, "factor"));
    config_err(&v5, "rope_parameters.factor", "missing");
}

#[test]
fn class_defaults_fill_absent_keys() {
    // LlamaConfig: kv heads = heads, head_dim = hidden / heads, eps 1e-6, theta 10000,
    // max positions 2048, untied, bos 1 / eos 2.
    let minimal = json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 1000});
    let s = spec(&minimal);
    assert_eq!((s.num_key_value_heads, s.head_dim, s.rope.dim), (4, 64, 64));
    assert_eq!((s.rms_norm_eps, s.rope.theta, s.max_position_embeddings), (1e-6, 10000.0, 2048));
    assert!(!s.tie_word_embeddings && !s.attention_bias && !s.mlp_bias && !s.qk_norm);
    assert_eq!((s.special.bos, s.special.eos.clone(), s.special.pad), (Some(1), vec![2], None));
    assert_eq!(s.rope.scaling, RopeScaling::None);
    // Null means "use the default" for kv heads and head_dim.
    let nulls =
        with(with(minimal.clone(), "num_key_value_heads", Value::Null), "head_dim", Value::Null);
    assert_eq!((spec(&nulls).num_key_value_heads, spec(&nulls).head_dim), (4, 64));
    // Qwen3Config's head_dim default is 128, not hidden / heads; its max positions 32768.
    let q3 = with(minimal.clone(), "architectures", json!(["Qwen3ForCausalLM"]));
    assert_eq!((spec(&q3).head_dim, spec(&q3).max_position_embeddings), (128, 32768));
    assert_eq!((spec(&q3).special.bos, spec(&q3).special.eos.clone()), (None, vec![]));
    // MistralConfig: max positions 4096 * 32, sliding_window 4096 when absent.
    let m = with(minimal.clone(), "architectures", json!(["MistralForCausalLM"]));
    assert_eq!(spec(&m).max_position_embeddings, 131072);
    assert_eq!(spec(&m).unsupported, vec!["sliding_window 4096"]);
    // model_type alone names the architecture.
    let mt = with(without(minimal, "architectures"), "model_type", json!("qwen2"));
    assert_eq!(spec(&mt).architecture, "Qwen2ForCausalLM");
}

#[test]
fn head_dim_not_derivable_is_an_error() {
    let c = with(with(llama(), "hidden_size", json!(250)), "num_attention_heads", json!(3));
    config_err(&c, "head_dim", "not a multiple");
    // An explicit head_dim makes it fine (Qwen3-style geometry).
    assert_eq!(spec(&with(c, "head_dim", json!(128))).head_dim, 128);
}

#[test]
fn both_rope_spellings_agree() {
    let v4 = with(llama(), "rope_scaling", Value::Null);
    let v5 = with(
        without(llama(), "rope_theta"),
        "rope_parameters",
        json!({"rope_theta": 10000.0, "rope_type": "default"}),
    );
    assert_eq!(spec(&v4), spec(&v5));
    // transformers 5: a theta missing from rope_parameters comes from the top level, and a
    // non-null legacy rope_scaling takes rope_parameters' place.
    let mixed = with(llama(), "rope_parameters", json!({"rope_type": "default"}));
    assert_eq!(spec(&mixed).rope.theta, 10000.0);
    let legacy = with(
        with(llama(), "rope_parameters", json!({"rope_theta": 5.0, "rope_type": "default"})),
        "rope_scaling",
        json!({"type": "linear", "factor": 2.0}),
    );
    assert_eq!(spec(&legacy).rope.scaling, RopeScaling::Linear { factor: 2.0 });
    assert_eq!(spec(&legacy).rope.theta, 10000.0);
}

#[test]
fn partial_rotary_sets_rope_dim() {
    // transformers: dim = int(head_dim * partial_rotary_factor).
    let top = with(llama(), "partial_rotary_factor", json!(0.5));
    assert_eq!((spec(&top).head_dim, spec(&top).rope.dim), (64, 32));
    let nested = with(
        llama(),
        "rope_parameters",
        json!({"rope_theta": 1e4, "rope_type": "default", "partial_rotary_factor": 0.25}),
    );
    assert_eq!(spec(&nested).rope.dim, 16);
    config_err(
        &with(llama(), "partial_rotary_factor", json!(1.5)),
        "partial_rotary_factor",
        "(0, 1]",
    );
}

#[test]
fn unimplemented_features_are_named() {
    for kind in ["yarn", "dynamic", "longrope"] {
        let c = with(llama(), "rope_scaling", json!({"rope_type": kind, "factor": 4.0}));
        assert_eq!(spec(&c).unsupported, vec![format!("rope_scaling type \"{kind}\"")]);
    }
    let gelu = with(llama(), "hidden_act", json!("gelu_pytorch_tanh"));
    assert_eq!(spec(&gelu).unsupported, vec!["hidden_act \"gelu_pytorch_tanh\""]);
    let gptq = with(llama(), "quantization_config", json!({"quant_method": "gptq", "bits": 4}));
    assert_eq!(spec(&gptq).unsupported, vec!["quantization_config quant_method \"gptq\""]);
    // mlx-lm's block has no quant_method; its tensors carry the format.
    let mlx = with(llama(), "quantization_config", json!({"group_size": 64, "bits": 4}));
    assert!(spec(&mlx).unsupported.is_empty());
}

#[test]
fn sliding_windows() {
    let qwen2 = with(llama(), "architectures", json!(["Qwen2ForCausalLM"]));
    let off = with(qwen2.clone(), "sliding_window", json!(1024));
    assert!(spec(&off).unsupported.is_empty(), "use_sliding_window absent = false");
    let on = with(off, "use_sliding_window", json!(true));
    assert_eq!(spec(&on).unsupported, vec!["sliding_window 1024"]);
    // A window as wide as the context slides nothing.
    let wide = with(on, "sliding_window", json!(4096));
    assert!(spec(&wide).unsupported.is_empty());
    // transformers 5 layer_types.
    let typed = with(
        with(qwen2, "layer_types", json!(["full_attention", "sliding_attention"])),
        "sliding_window",
        json!(512),
    );
    assert_eq!(spec(&typed).unsupported, vec!["sliding_window 512"]);
    // Llama has no sliding window whatever the key says.
    assert!(spec(&with(llama(), "sliding_window", json!(16))).unsupported.is_empty());
}

#[test]
fn biases_per_architecture() {
    let biased = with(with(llama(), "attention_bias", json!(true)), "mlp_bias", json!(true));
    let s = spec(&biased);
    assert!(s.attention_bias && s.o_proj_bias && s.mlp_bias);
    // Mistral's modeling file hard-codes bias=False; Qwen2's q/k/v True and o_proj False.
    let m = spec(&with(biased.clone(), "architectures", json!(["MistralForCausalLM"])));
    assert!(!m.attention_bias && !m.o_proj_bias && !m.mlp_bias);
    let q2 = spec(&with(llama(), "architectures", json!(["Qwen2ForCausalLM"])));
    assert!(q2.attention_bias && !q2.o_proj_bias && !q2.mlp_bias);
    let q3 = spec(&with(biased, "architectures", json!(["Qwen3ForCausalLM"])));
    assert!(q3.attention_bias && q3.o_proj_bias && !q3.mlp_bias && q3.qk_norm);
}

#[test]
fn token_ids_and_generation_config() {
    let c = with(with(llama(), "pad_token_id", json!(-1)), "eos_token_id", json!([7, -1, 9]));
    let mut s = spec(&c);
    assert_eq!((s.special.pad, s.special.eos.clone()), (None, vec![7, 9]));
    let gen = json!({"eos_token_id": [9, 11], "bos_token_id": 5, "pad_token_id": 3});
    merge_generation_config(&mut s, Path::new("/g.json"), &gen).unwrap();
    assert_eq!(s.special.eos, vec![7, 9, 11]);
    assert_eq!((s.special.bos, s.special.pad), (Some(1), Some(3)), "config bos wins; pad filled");
    let bad = merge_generation_config(&mut s, Path::new("/g.json"), &json!({"eos_token_id": {}}));
    assert!(matches!(bad, Err(CheckpointError::Config { ref key, .. }) if key == "eos_token_id"));
}

#[test]
fn unknown_architecture_still_yields_a_spec() {
    // A GPT-2 config has none of the llama keys; it must reach admission to be refused by name.
    let gpt2 = json!({"architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_layer": 12,
                      "vocab_size": 50257, "activation_function": "gelu_new"});
    let s = spec(&gpt2);
    assert_eq!(s.architecture, "GPT2LMHeadModel");
    assert_eq!(s.vocab_size, 50257);
    assert_eq!(s.hidden_size, 0);
}
