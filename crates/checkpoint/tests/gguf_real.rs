//! `Checkpoint::open` on the real test model (SmolLM2-135M-Instruct Q4_1 GGUF): the spec, the
//! HF names of all 272 tensors, the vocabulary, admission, and that opening is fast (the
//! header only; tensor data stays unread in the map). Expected values are SmolLM2-135M's
//! published config (HF `config.json`: 30 layers, hidden 576, 9 heads, 3 kv heads,
//! intermediate 1536, rope_theta 100000, rms_norm_eps 1e-5, tied embeddings, vocab 49152).

mod gguf_common;

use std::time::Instant;

use gguf_common::model_path;
use tf_checkpoint::admission::admit;
use tf_checkpoint::spec::{RopeScaling, RopeStyle};
use tf_checkpoint::tensor::{DType, GgmlType, TensorFormat};
use tf_checkpoint::{Checkpoint, TokenizerSource};

#[test]
fn real_model_spec() {
    let path = model_path();
    let t0 = Instant::now();
    let c = Checkpoint::open(&path).unwrap();
    let elapsed = t0.elapsed();
    eprintln!("Checkpoint::open({}) took {elapsed:?}", path.display());
    let s = &c.spec;
    assert_eq!(s.architecture, "LlamaForCausalLM");
    assert_eq!((s.hidden_size, s.intermediate_size, s.num_hidden_layers), (576, 1536, 30));
    assert_eq!((s.num_attention_heads, s.num_key_value_heads, s.head_dim), (9, 3, 64));
    assert_eq!(s.vocab_size, 49152);
    assert_eq!(s.rms_norm_eps, f64::from(1e-5f32), "the f32 metadata value, widened");
    assert_eq!(s.rope.theta, 100000.0);
    assert_eq!(s.rope.style, RopeStyle::Interleaved);
    assert_eq!(s.rope.scaling, RopeScaling::None);
    assert_eq!(s.rope.dim, 64);
    assert_eq!(s.max_position_embeddings, 8192);
    assert!(s.tie_word_embeddings);
    assert!(!s.attention_bias && !s.o_proj_bias && !s.mlp_bias && !s.qk_norm);
    assert_eq!((s.special.bos, s.special.eos.clone(), s.special.pad), (Some(1), vec![2], Some(2)));
    assert!(s.unsupported.is_empty(), "{:?}", s.unsupported);
    admit(&c).unwrap();
    assert_eq!(s.param_count(), 134_515_008, "SmolLM2-135M's parameter count");
}

#[test]
fn real_model_hf_names() {
    let c = Checkpoint::open(&model_path()).unwrap();
    let mut want = vec!["model.embed_tokens.weight".to_string(), "model.norm.weight".to_string()];
    for l in 0..30 {
        for m in [
            "input_layernorm",
            "post_attention_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ] {
            want.push(format!("model.layers.{l}.{m}.weight"));
        }
    }
    want.sort();
    let got: Vec<&String> = c.tensors.keys().collect();
    assert_eq!(got.len(), 272);
    assert_eq!(got, want.iter().collect::<Vec<_>>());
    let shape_fmt = |n: &str| {
        let t = c.tensor(n).unwrap();
        (t.shape.clone(), t.format)
    };
    let q41 = TensorFormat::Ggml(GgmlType::Q4_1);
    assert_eq!(
        shape_fmt("model.embed_tokens.weight"),
        (vec![49152, 576], TensorFormat::Ggml(GgmlType::Q8_0))
    );
    assert_eq!(shape_fmt("model.layers.0.self_attn.q_proj.weight"), (vec![576, 576], q41));
    assert_eq!(shape_fmt("model.layers.7.self_attn.k_proj.weight"), (vec![192, 576], q41));
    assert_eq!(shape_fmt("model.layers.29.mlp.down_proj.weight"), (vec![576, 1536], q41));
    assert_eq!(shape_fmt("model.layers.29.mlp.up_proj.weight"), (vec![1536, 576], q41));
    assert_eq!(shape_fmt("model.norm.weight"), (vec![576], TensorFormat::Plain(DType::F32)));
    assert_eq!(
        c.weight_bytes(),
        30_081_024 + 61 * 2304 + 30 * (3 * 552_960 + 2 * 207_360 + 2 * 69_120)
    );
}

#[test]
fn real_model_vocab_and_template() {
    let c = Checkpoint::open(&model_path()).unwrap();
    let TokenizerSource::Gguf(v) = &c.tokenizer else { panic!("GGUF vocab expected") };
    assert_eq!((v.model.as_str(), v.pre.as_deref()), ("gpt2", Some("smollm")));
    assert_eq!(v.tokens.len(), 49152);
    assert_eq!(&v.tokens[..3], ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
    assert_eq!(v.token_types.len(), 49152);
    assert_eq!(&v.token_types[..3], [3, 3, 3]);
    assert_eq!(v.merges.len(), 48900);
    assert_eq!(&v.merges[..2], ["Ġ t", "Ġ a"]);
    assert!(v.scores.is_empty());
    assert_eq!((v.bos, v.eos, v.unk, v.pad), (Some(1), Some(2), Some(0), Some(2)));
    assert_eq!((v.add_bos, v.add_eos, v.add_space_prefix), (Some(false), None, Some(false)));
    let t = c.chat_template.as_deref().unwrap();
    assert!(t.starts_with("{% for message in messages %}"), "{t}");
    assert!(t.contains("<|im_start|>"));
}

#[test]
fn real_model_opens_fast() {
    let path = model_path();
    Checkpoint::open(&path).unwrap(); // warm the page cache for the header
    let t0 = Instant::now();
    let n = 5;
    for _ in 0..n {
        Checkpoint::open(&path).unwrap();
    }
    let each = t0.elapsed() / n;
    eprintln!("Checkpoint::open: {each:?} per open");
    // Decoding the header (98k strings) is milliseconds; reading 98 MB of data would not be
    // caught by this bound on a warm cache, but a parse that copies tensor data would be.
    assert!(each.as_millis() < 500, "open took {each:?}");
}
