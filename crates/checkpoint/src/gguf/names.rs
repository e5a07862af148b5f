//! GGUF tensor names to Hugging Face names, so families read one naming scheme.
//!
//! The table is llama.cpp's `TENSOR_NAMES` for the llama/qwen2/qwen3 architectures read
//! backwards (gguf-py `constants.py` `MODEL_TENSOR` and `tensor_mapping.py`). A name outside it
//! is kept as is: families never ask for it, and `info` still lists it.
//!
//! Alternative rejected: renaming at lookup time in each family; one mapping at open keeps
//! file formats out of the families entirely.

/// Whole-model tensors.
const GLOBAL: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Per-block tensors: `blk.N.<gguf>` -> `model.layers.N.<hf>`, each with `.weight`/`.bias`.
const PER_LAYER: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// The llama3 RoPE frequency-factor tensor llama.cpp writes instead of `rope_scaling`.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// The HF name of a GGUF tensor, or `None` if it is not in the table.
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some((_, hf)) = GLOBAL.iter().find(|(g, _)| *g == gguf) {
        return Some((*hf).to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let layer: usize = layer.parse().ok()?;
    let (module, param) = rest.rsplit_once('.')?;
    if param != "weight" && param != "bias" {
        return None;
    }
    let (_, hf) = PER_LAYER.iter().find(|(g, _)| *g == module)?;
    Some(format!("model.layers.{layer}.{hf}.{param}"))
}

/// The GGUF name of an HF tensor name (the inverse of [`hf_name`]).
pub fn gguf_name(hf: &str) -> Option<String> {
    if let Some((g, _)) = GLOBAL.iter().find(|(_, h)| *h == hf) {
        return Some((*g).to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, param) = rest.rsplit_once('.')?;
    if param != "weight" && param != "bias" {
        return None;
    }
    let (g, _) = PER_LAYER.iter().find(|(_, h)| *h == module)?;
    Some(format!("blk.{layer}.{g}.{param}"))
}

/// True if some block has the per-layer tensor `blk.N.<suffix>` (e.g. `attn_q.bias`).
pub fn any_layer_has<'a>(mut names: impl Iterator<Item = &'a str>, suffix: &str) -> bool {
    names.any(|n| {
        n.strip_prefix("blk.").and_then(|r| r.split_once('.')).is_some_and(|(layer, rest)| {
            layer.bytes().all(|b| b.is_ascii_digit()) && rest == suffix
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_llama_names_both_ways() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output.weight", "lm_head.weight"),
            ("blk.12.attn_output.weight", "model.layers.12.self_attn.o_proj.weight"),
            ("blk.0.attn_q.bias", "model.layers.0.self_attn.q_proj.bias"),
            ("blk.3.attn_k_norm.weight", "model.layers.3.self_attn.k_norm.weight"),
            ("blk.29.ffn_norm.weight", "model.layers.29.post_attention_layernorm.weight"),
        ];
        for (g, h) in cases {
            assert_eq!(hf_name(g).as_deref(), Some(h), "{g}");
            assert_eq!(gguf_name(h).as_deref(), Some(g), "{h}");
        }
    }

    #[test]
    fn leaves_unknown_names_alone() {
        for g in [
            "rope_freqs.weight",
            "blk.x.attn_q.weight",
            "blk..attn_q.weight",
            "blk.0.attn_q.scale",
            "blk.0.ssm_a",
        ] {
            assert_eq!(hf_name(g), None, "{g}");
        }
    }

    #[test]
    fn finds_per_layer_tensors() {
        let names = ["blk.0.attn_q.weight", "blk.10.attn_q.bias", "xblk.1.attn_k.bias"];
        assert!(any_layer_has(names.iter().copied(), "attn_q.bias"));
        assert!(!any_layer_has(names.iter().copied(), "attn_k.bias"));
    }
}
