//! GGUF metadata (`{arch}.*`, `tokenizer.ggml.*`) and tensor list -> [`ModelSpec`].
//!
//! Architectures: `llama` -> `LlamaForCausalLM` with [`RopeStyle::Interleaved`] (llama.cpp's
//! `convert_hf_to_gguf.py` permutes q/k rows of llama models so GPT-J-style pairs on them
//! equal HF's rotate_half on the original weights); `qwen2`/`qwen3` -> `Qwen2ForCausalLM` /
//! `Qwen3ForCausalLM`, NeoX style, rows unpermuted. Any other architecture is kept as
//! `gguf:<arch>` and read leniently (missing keys become 0) so that admission can refuse it
//! by name instead of the reader failing on a key that architecture does not have.
//!
//! Features the spec cannot hold (yarn/longrope scaling, llama3 `rope_freqs`, experts...)
//! go to `unsupported` by name. Presence flags (tied embeddings, biases, q/k norms) come from
//! the tensor list, as llama.cpp's loader decides them.

use super::names::{any_layer_has, ROPE_FREQS};
use super::value::GgufValue;
use super::GgufFile;
use crate::error::{CheckpointError, Result};
use crate::spec::{ModelSpec, RopeScaling, RopeSpec, RopeStyle, SpecialTokens};

/// The HF architecture and RoPE style of a GGUF `general.architecture`, if implemented.
pub fn hf_architecture(arch: &str) -> Option<(&'static str, RopeStyle)> {
    match arch {
        "llama" => Some(("LlamaForCausalLM", RopeStyle::Interleaved)),
        "qwen2" => Some(("Qwen2ForCausalLM", RopeStyle::Neox)),
        "qwen3" => Some(("Qwen3ForCausalLM", RopeStyle::Neox)),
        _ => None,
    }
}

/// Typed access to `{arch}.*` keys with errors naming the key.
struct Keys<'a> {
    file: &'a GgufFile,
    arch: &'a str,
    /// Unknown architecture: a missing required key reads as 0 rather than failing.
    lenient: bool,
}

impl Keys<'_> {
    fn err(&self, key: &str, what: String) -> CheckpointError {
        CheckpointError::Config { path: self.file.path.clone(), key: key.to_string(), what }
    }

    fn full(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// The value of `key` converted by `conv`; a value of the wrong type is an error naming
    /// the key (for an unknown architecture it reads as absent: admission refuses it anyway).
    fn typed<'v, T>(
        &'v self,
        key: &str,
        want: &str,
        conv: impl Fn(&'v GgufValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => match conv(v) {
                Some(x) => Ok(Some(x)),
                None if self.lenient => Ok(None),
                None => Err(self.err(key, format!("expected {want}, found {}", show(v)))),
            },
        }
    }

    fn count(&self, suffix: &str) -> Result<Option<usize>> {
        self.typed(&self.full(suffix), "a non-negative integer", |v| {
            v.as_u64().and_then(|n| usize::try_from(n).ok())
        })
    }

    fn required_count(&self, suffix: &str) -> Result<usize> {
        match self.count(suffix)? {
            Some(n) => Ok(n),
            None if self.lenient => Ok(0),
            None => Err(self.err(&self.full(suffix), "missing".to_string())),
        }
    }

    fn float(&self, suffix: &str) -> Result<Option<f64>> {
        self.typed(&self.full(suffix), "a float", GgufValue::as_f64)
    }

    fn string(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a string", GgufValue::as_str)
    }

    fn token_id(&self, key: &str) -> Result<Option<u32>> {
        self.typed(key, "a token id (u32)", |v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
    }
}

/// A value with its type, shortened, for error messages.
fn show(v: &GgufValue) -> String {
    format!("{} {}", v.type_description(), v.summary())
}

/// `rope.scaling.type` (and the older `rope.scale_linear`) -> [`RopeScaling`]; kinds the spec
/// cannot represent are pushed to `unsupported`.
fn rope_scaling(k: &Keys<'_>, unsupported: &mut Vec<String>) -> Result<RopeScaling> {
    let ty = k.string(&k.full("rope.scaling.type"))?;
    match ty {
        None | Some("none") => {}
        Some("linear") => {
            let factor = k.float("rope.scaling.factor")?.ok_or_else(|| {
                k.err(
                    &k.full("rope.scaling.factor"),
                    "missing (rope.scaling.type is linear)".into(),
                )
            })?;
            return Ok(RopeScaling::Linear { factor });
        }
        Some(other) => {
            unsupported.push(format!("rope_scaling type {other:?}"));
            return Ok(RopeScaling::None);
        }
    }
    match k.float("rope.scale_linear")? {
        Some(f) if f != 1.0 => Ok(RopeScaling::Linear { factor: f }),
        _ => Ok(RopeScaling::None),
    }
}

fn special_tokens(k: &Keys<'_>) -> Result<SpecialTokens> {
    let mut eos = Vec::new();
    // llama.cpp ends generation on any of eos / eot / eom (`llama_vocab::is_eog`).
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = k.token_id(key)? {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    Ok(SpecialTokens {
        bos: k.token_id("tokenizer.ggml.bos_token_id")?,
        eos,
        pad: k.token_id("tokenizer.ggml.padding_token_id")?,
    })
}

/// Geometry keys: (hidden, heads, kv heads, head_dim).
fn attention_geometry(
    k: &Keys<'_>,
    unsupported: &mut Vec<String>,
) -> Result<(usize, usize, usize, usize)> {
    let hidden = k.required_count("embedding_length")?;
    let heads = k.required_count("attention.head_count")?;
    let kv_heads = k.count("attention.head_count_kv")?.unwrap_or(heads);
    let head_dim = match k.count("attention.key_length")? {
        Some(d) => d,
        None if heads == 0 && k.lenient => 0,
        None if heads == 0 => return Err(k.err(&k.full("attention.head_count"), "is 0".into())),
        None => hidden / heads,
    };
    if let Some(v) = k.count("attention.value_length")? {
        if v != head_dim {
            unsupported.push(format!("value head size {v} != key head size {head_dim}"));
        }
    }
    Ok((hidden, heads, kv_heads, head_dim))
}

/// `general.architecture`, which must be a string.
fn architecture(file: &GgufFile) -> Result<&str> {
    let key = "general.architecture";
    let err = |what: String| CheckpointError::Config {
        path: file.path.clone(),
        key: key.to_string(),
        what,
    };
    match file.get(key) {
        Some(GgufValue::String(s)) => Ok(s),
        Some(v) => Err(err(format!("expected a string, found {}", show(v)))),
        None => Err(err("missing".to_string())),
    }
}

/// `{arch}.vocab_size`, else the token list's length, else token_embd's outer dim.
fn vocab_size(k: &Keys<'_>) -> Result<usize> {
    if let Some(v) = k.count("vocab_size")? {
        return Ok(v);
    }
    match vocab_size_fallback(k.file) {
        Some(v) => Ok(v),
        None if k.lenient => Ok(0),
        None => Err(k.err(
            &k.full("vocab_size"),
            "missing, and no tokenizer.ggml.tokens or token_embd.weight to infer it".into(),
        )),
    }
}

/// Features found only as tensors or optional keys that the spec cannot represent.
fn unsupported_features(k: &Keys<'_>, unsupported: &mut Vec<String>) -> Result<()> {
    if k.file.tensors.iter().any(|t| t.name == ROPE_FREQS) {
        unsupported.push("rope_freqs tensor (llama3 RoPE scaling in GGUF)".to_string());
    }
    if let Some(n) = k.count("expert_count")?.filter(|&n| n > 0) {
        unsupported.push(format!("mixture of experts ({n} experts)"));
    }
    Ok(())
}

/// Builds the spec of an opened GGUF file.
pub fn model_spec(file: &GgufFile) -> Result<ModelSpec> {
    let arch = architecture(file)?;
    let known = hf_architecture(arch);
    let k = Keys { file, arch, lenient: known.is_none() };
    let (architecture, style) = match known {
        Some((hf, style)) => (hf.to_string(), style),
        None => (format!("gguf:{arch}"), RopeStyle::Neox),
    };
    let mut unsupported = Vec::new();
    let (hidden, heads, kv_heads, head_dim) = attention_geometry(&k, &mut unsupported)?;
    let scaling = rope_scaling(&k, &mut unsupported)?;
    unsupported_features(&k, &mut unsupported)?;
    let rms_norm_eps = match k.float("attention.layer_norm_rms_epsilon")? {
        Some(e) => e,
        None if k.lenient => 0.0,
        None => return Err(k.err(&k.full("attention.layer_norm_rms_epsilon"), "missing".into())),
    };
    let names = || file.tensors.iter().map(|t| t.name.as_str());
    Ok(ModelSpec {
        architecture,
        hidden_size: hidden,
        intermediate_size: k.required_count("feed_forward_length")?,
        num_hidden_layers: k.required_count("block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        vocab_size: vocab_size(&k)?,
        rms_norm_eps,
        rope: RopeSpec {
            theta: k.float("rope.freq_base")?.unwrap_or(10_000.0),
            style,
            scaling,
            dim: k.count("rope.dimension_count")?.unwrap_or(head_dim),
        },
        max_position_embeddings: k.required_count("context_length")?,
        tie_word_embeddings: !names().any(|n| n == "output.weight"),
        attention_bias: any_layer_has(names(), "attn_q.bias"),
        o_proj_bias: any_layer_has(names(), "attn_output.bias"),
        mlp_bias: ["ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"]
            .iter()
            .any(|s| any_layer_has(names(), s)),
        qk_norm: any_layer_has(names(), "attn_q_norm.weight"),
        special: special_tokens(&k)?,
        unsupported,
    })
}

/// Vocabulary size from the token list, else from the embedding's outer dim.
fn vocab_size_fallback(file: &GgufFile) -> Option<usize> {
    if let Some((_, tokens)) = file.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
        return Some(tokens.len());
    }
    file.tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .and_then(|t| t.shape.first().copied())
}
