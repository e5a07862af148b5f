//! GGUF metadata -> ModelSpec, HF names, vocabulary, unsupported features and versions, on
//! small models built byte by byte (gguf_common::mini_model). The expected values are the
//! semantics the brief and llama.cpp define (key names: gguf-py `constants.py`).

mod gguf_common;

use gguf_common::*;
use tf_checkpoint::admission::refusals;
use tf_checkpoint::checkpoint::CheckpointFormat;
use tf_checkpoint::gguf::GgufFile;
use tf_checkpoint::spec::{RopeScaling, RopeStyle};
use tf_checkpoint::tensor::{DType, GgmlType, TensorFormat};
use tf_checkpoint::{Checkpoint, CheckpointError, TokenizerSource};

fn open(g: &Gguf) -> (tempfile::NamedTempFile, Checkpoint) {
    let f = g.write();
    let c = Checkpoint::open(f.path()).unwrap_or_else(|e| panic!("open: {e}"));
    (f, c)
}

fn hf_layer_names(l: u32) -> Vec<String> {
    [
        "input_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "post_attention_layernorm",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]
    .iter()
    .map(|m| format!("model.layers.{l}.{m}.weight"))
    .collect()
}

#[test]
fn llama_spec_names_and_vocab() {
    let (_f, c) = open(&mini_model("llama"));
    let s = &c.spec;
    assert_eq!(c.format, CheckpointFormat::Gguf);
    assert_eq!(s.architecture, "LlamaForCausalLM");
    assert_eq!(
        (s.hidden_size, s.intermediate_size, s.num_hidden_layers),
        (HIDDEN as usize, FFN as usize, LAYERS as usize)
    );
    assert_eq!((s.num_attention_heads, s.num_key_value_heads, s.head_dim), (4, 2, 16));
    assert_eq!(s.vocab_size, VOCAB as usize, "from the token list (no llama.vocab_size key)");
    assert_eq!(s.rms_norm_eps, f64::from(1e-6f32));
    assert_eq!(s.rope.theta, 500000.0);
    assert_eq!(s.rope.style, RopeStyle::Interleaved);
    assert_eq!(s.rope.scaling, RopeScaling::None);
    assert_eq!(s.rope.dim, 16);
    assert_eq!(s.max_position_embeddings, 256);
    assert!(s.tie_word_embeddings);
    assert!(!s.attention_bias && !s.o_proj_bias && !s.mlp_bias && !s.qk_norm);
    assert_eq!((s.special.bos, s.special.eos.clone(), s.special.pad), (Some(1), vec![2], None));
    assert!(s.unsupported.is_empty(), "{:?}", s.unsupported);
    assert!(refusals(&c).is_empty(), "{:?}", refusals(&c));

    let mut want: Vec<String> = (0..LAYERS).flat_map(hf_layer_names).collect();
    want.push("model.embed_tokens.weight".into());
    want.push("model.norm.weight".into());
    want.sort();
    let got: Vec<String> = c.tensors.keys().cloned().collect();
    assert_eq!(got, want);
    let q = c.tensor("model.layers.1.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.format, TensorFormat::Ggml(GgmlType::Q8_0));
    assert_eq!(q.shape, vec![64, 64]);
    let k = c.tensor("model.layers.0.self_attn.k_proj.weight").unwrap();
    assert_eq!(k.shape, vec![32, 64], "HF order: [out, in]");
    let e = c.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!((e.shape.clone(), e.bytes().len()), (vec![32, 64], 32 * 2 * 34));
    assert_eq!(c.tensor("model.norm.weight").unwrap().format, TensorFormat::Plain(DType::F32));

    let TokenizerSource::Gguf(v) = &c.tokenizer else { panic!("GGUF vocab expected") };
    assert_eq!(v.model, "gpt2");
    assert_eq!(v.tokens.len(), 32);
    assert_eq!(v.tokens[5], "tok5");
    assert_eq!(v.token_types[..4], [3, 3, 3, 1]);
    assert_eq!(v.merges, vec!["t o", "to k"]);
    assert_eq!((v.bos, v.eos, v.unk, v.pad), (Some(1), Some(2), None, None));
    assert_eq!(c.chat_template.as_deref(), Some("{{ messages }}"));
}

#[test]
fn tensor_bytes_are_the_files() {
    let g = mini_model("llama");
    let (f, c) = open(&g);
    let raw = std::fs::read(f.path()).unwrap();
    let file = GgufFile::open(f.path()).unwrap();
    for t in &g.tensors {
        let info = file.tensor_info(&t.name).unwrap();
        assert_eq!(&raw[info.offset..info.offset + t.data.len()], t.data.as_slice(), "{}", t.name);
        let hf = tf_checkpoint::gguf::hf_name(&t.name).unwrap();
        assert_eq!(c.tensor(&hf).unwrap().bytes(), t.data.as_slice(), "{hf}");
    }
}

#[test]
fn qwen2_biases_and_untied_head() {
    let mut g = mini_model("qwen2").tensor("output.weight", &[HIDDEN, VOCAB], Q8_0);
    for l in 0..LAYERS {
        g = g
            .tensor(&format!("blk.{l}.attn_q.bias"), &[HIDDEN], F32)
            .tensor(&format!("blk.{l}.attn_k.bias"), &[32], F32)
            .tensor(&format!("blk.{l}.attn_v.bias"), &[32], F32);
    }
    let (_f, c) = open(&g);
    assert_eq!(c.spec.architecture, "Qwen2ForCausalLM");
    assert_eq!(c.spec.rope.style, RopeStyle::Neox);
    assert!(c.spec.attention_bias && !c.spec.o_proj_bias && !c.spec.qk_norm);
    assert!(!c.spec.tie_word_embeddings);
    assert_eq!(c.tensor("lm_head.weight").unwrap().shape, vec![32, 64]);
    assert_eq!(c.tensor("model.layers.1.self_attn.k_proj.bias").unwrap().shape, vec![32]);
    assert!(refusals(&c).is_empty(), "{:?}", refusals(&c));
}

#[test]
fn qwen3_qk_norm_and_explicit_head_dim() {
    let mut g = mini_model("qwen3")
        .kv("qwen3.attention.key_length", Val::U32(32))
        .kv("qwen3.attention.value_length", Val::U32(32))
        .kv("qwen3.vocab_size", Val::U32(40))
        .kv("qwen3.rope.dimension_count", Val::U32(32))
        .kv("tokenizer.ggml.eot_token_id", Val::U32(7))
        .kv("tokenizer.ggml.padding_token_id", Val::I32(0));
    for l in 0..LAYERS {
        g = g.tensor(&format!("blk.{l}.attn_q_norm.weight"), &[32], F32).tensor(
            &format!("blk.{l}.attn_k_norm.weight"),
            &[32],
            F32,
        );
    }
    let (_f, c) = open(&g);
    assert_eq!(c.spec.architecture, "Qwen3ForCausalLM");
    assert_eq!((c.spec.head_dim, c.spec.rope.dim), (32, 32));
    assert_eq!(c.spec.vocab_size, 40, "the vocab_size key wins over the token list");
    assert!(c.spec.qk_norm);
    assert_eq!(c.spec.special.eos, vec![2, 7], "eot ends generation too");
    assert_eq!(c.spec.special.pad, Some(0));
    assert!(c.tensors.contains_key("model.layers.0.self_attn.q_norm.weight"));
    assert!(c.tensors.contains_key("model.layers.1.self_attn.k_norm.weight"));
}

#[test]
fn unknown_architecture_is_kept_by_name_and_refused() {
    // Keys an unknown architecture lacks or types differently do not stop the open.
    let per_layer = Val::Arr(4, vec![Val::U32(4), Val::U32(2)]);
    let g = Gguf::default()
        .kv("general.architecture", s("phi3"))
        .kv("phi3.attention.head_count_kv", per_layer)
        .tensor("token_embd.weight", &[64, 8], F32);
    let (_f, c) = open(&g);
    assert_eq!(c.spec.architecture, "gguf:phi3");
    let r = refusals(&c);
    assert!(r.iter().any(|m| m.contains("gguf:phi3")), "{r:?}");
    assert_eq!(c.spec.vocab_size, 8, "from token_embd");
}

#[test]
fn rope_scaling_kinds() {
    let g = mini_model("llama")
        .kv("llama.rope.scaling.type", s("linear"))
        .kv("llama.rope.scaling.factor", Val::F32(4.0));
    assert_eq!(open(&g).1.spec.rope.scaling, RopeScaling::Linear { factor: 4.0 });
    let g = mini_model("llama").kv("llama.rope.scale_linear", Val::F32(2.0));
    assert_eq!(open(&g).1.spec.rope.scaling, RopeScaling::Linear { factor: 2.0 });
    let g = mini_model("llama").kv("llama.rope.scaling.type", s("none"));
    assert_eq!(open(&g).1.spec.rope.scaling, RopeScaling::None);

    let g = mini_model("llama")
        .kv("llama.rope.scaling.type", s("yarn"))
        .kv("llama.rope.scaling.factor", Val::F32(4.0));
    let (_f, c) = open(&g);
    assert_eq!(c.spec.unsupported, vec![r#"rope_scaling type "yarn""#.to_string()]);
    assert!(refusals(&c)
        .iter()
        .any(|m| m.contains(r#"rope_scaling type "yarn" is not implemented"#)));

    let g = mini_model("llama").kv("llama.rope.scaling.type", s("linear"));
    let f = g.write();
    match Checkpoint::open(f.path()) {
        Err(CheckpointError::Config { key, .. }) => assert_eq!(key, "llama.rope.scaling.factor"),
        other => panic!("expected a Config error, got {other:?}"),
    }
}

#[test]
fn llama3_rope_freqs_tensor_is_unsupported() {
    let g = mini_model("llama").tensor("rope_freqs.weight", &[8], F32);
    let (_f, c) = open(&g);
    assert_eq!(
        c.spec.unsupported,
        vec!["rope_freqs tensor (llama3 RoPE scaling in GGUF)".to_string()]
    );
    assert!(c.tensors.contains_key("rope_freqs.weight"), "unmapped names are kept as they are");
    assert!(!refusals(&c).is_empty());
}

#[test]
fn unsupported_tensor_types_are_listed_and_refused_by_name() {
    // IQ4_NL (id 20): 32-element blocks of 18 bytes; id 99: unknown to ggml.
    let g = mini_model("llama")
        .tensor_data("blk.0.attn_q_norm.weight", &[64], 20, vec![0; 36])
        .tensor_data("blk.1.attn_q_norm.weight", &[64], 99, vec![0; 64]);
    let f = g.write();
    let file = GgufFile::open(f.path()).unwrap();
    let iq = file.tensor_info("blk.0.attn_q_norm.weight").unwrap();
    assert_eq!((iq.type_name.as_str(), iq.format, iq.len), ("IQ4_NL", None, Some(36)));
    let unk = file.tensor_info("blk.1.attn_q_norm.weight").unwrap();
    assert_eq!((unk.type_name.as_str(), unk.len), ("unknown type 99", None));
    match file.tensor_view("blk.0.attn_q_norm.weight") {
        Err(e @ CheckpointError::Tensor { .. }) => {
            let m = e.to_string();
            assert!(
                m.contains("blk.0.attn_q_norm.weight") && m.contains("IQ4_NL is not supported"),
                "{m}"
            );
        }
        other => panic!("expected a Tensor error, got {other:?}"),
    }
    let c = Checkpoint::open(f.path()).unwrap();
    assert_eq!(c.spec.unsupported.len(), 2, "{:?}", c.spec.unsupported);
    assert!(c.spec.unsupported[0].contains("model.layers.0.self_attn.q_norm.weight"));
    assert!(c.spec.unsupported[0].contains("IQ4_NL"));
    assert!(c.spec.unsupported[1].contains("unknown type 99"));
    assert!(!c.tensors.contains_key("model.layers.0.self_attn.q_norm.weight"));
    let r = refusals(&c);
    assert!(r.iter().any(|m| m.contains("IQ4_NL")), "{r:?}");
}

#[test]
fn version_2_reads_like_version_3_and_version_1_is_refused() {
    let mut g = mini_model("llama");
    let (_f3, c3) = open(&g);
    g.version = 2;
    let f2 = g.write();
    let file = GgufFile::open(f2.path()).unwrap();
    assert_eq!(file.version, 2);
    let c2 = Checkpoint::open(f2.path()).unwrap();
    assert_eq!(c2.spec, c3.spec);
    assert_eq!(c2.tensors.keys().collect::<Vec<_>>(), c3.tensors.keys().collect::<Vec<_>>());
    g.version = 1;
    let f1 = g.write();
    let e = Checkpoint::open(f1.path()).unwrap_err();
    assert!(matches!(e, CheckpointError::Malformed { .. }));
    assert!(e.to_string().contains("GGUF version 1"), "{e}");
}

#[test]
fn missing_and_mistyped_keys_name_the_key() {
    let mut g = mini_model("llama");
    g.kvs.retain(|(k, _)| k != "llama.block_count");
    match Checkpoint::open(g.write().path()) {
        Err(CheckpointError::Config { key, what, .. }) => {
            assert_eq!((key.as_str(), what.as_str()), ("llama.block_count", "missing"));
        }
        other => panic!("expected Config, got {other:?}"),
    }
    // A second value for a key already present is a malformed file, not an override.
    let g = mini_model("llama").kv("llama.feed_forward_length", s("wide"));
    let mut g2 = mini_model("llama");
    for (k, v) in g2.kvs.iter_mut() {
        if k == "llama.attention.head_count" {
            *v = s("four");
        }
    }
    assert!(matches!(Checkpoint::open(g.write().path()), Err(CheckpointError::Malformed { .. })));
    match Checkpoint::open(g2.write().path()) {
        Err(e @ CheckpointError::Config { .. }) => {
            let m = e.to_string();
            assert!(m.contains("llama.attention.head_count") && m.contains("found string"), "{m}");
        }
        other => panic!("expected Config, got {other:?}"),
    }
    let mut g3 = mini_model("llama");
    for (k, v) in g3.kvs.iter_mut() {
        if k == "tokenizer.ggml.bos_token_id" {
            *v = Val::I32(-1);
        }
    }
    let e = Checkpoint::open(g3.write().path()).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.bos_token_id"), "{e}");
}

#[test]
fn hf_name_collision_is_malformed() {
    let g = mini_model("llama").tensor("model.norm.weight", &[HIDDEN], F32);
    let e = Checkpoint::open(g.write().path()).unwrap_err();
    assert!(matches!(e, CheckpointError::Malformed { .. }));
    assert!(e.to_string().contains("model.norm.weight"), "{e}");
}
