//! HF `config.json` (+ `generation_config.json`) -> [`ModelSpec`].
//!
//! Reads the keys of transformers' `LlamaConfig`, `MistralConfig`, `Qwen2Config` and
//! `Qwen3Config`, with those classes' defaults for keys a file omits (checked against
//! transformers 5.24). What the modeling code hard-codes rather than reads is applied per
//! architecture: Qwen2 has q/k/v biases and no o_proj bias whatever the config says
//! (`modeling_qwen2.py`), Mistral has no biases, Qwen3 has q/k RMSNorm and its
//! `attention_bias` covers o_proj too, llama's `attention_bias` covers q/k/v/o.
//!
//! Invariants: every geometry key a family needs is present and positive or the result is a
//! `Config` error naming the key; anything seen but not representable in [`ModelSpec`]
//! (other RoPE scalings, sliding windows, activations other than SiLU, quantization methods)
//! lands in `spec.unsupported` so admission refuses it by name. An architecture no family
//! implements still yields a spec (read leniently) carrying its name, for the same reason.
//!
//! Alternative rejected: serde structs per config class. Configs vary by transformers
//! version (rope_theta vs rope_parameters, head_dim null or absent, ids as int or list), and a
//! typed struct would either reject real files or hide these choices in attributes.

mod cfg;
mod rope;

use std::path::Path;

use serde_json::Value;

use crate::error::{CheckpointError, Result};
use crate::spec::{ModelSpec, SpecialTokens};
use cfg::Cfg;

pub const CONFIG_FILE: &str = "config.json";
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// The architectures whose config classes this module knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Other,
}

impl Arch {
    fn from_name(name: &str) -> Arch {
        match name {
            "LlamaForCausalLM" => Arch::Llama,
            "MistralForCausalLM" => Arch::Mistral,
            "Qwen2ForCausalLM" => Arch::Qwen2,
            "Qwen3ForCausalLM" => Arch::Qwen3,
            _ => Arch::Other,
        }
    }

    /// The config class's `max_position_embeddings` default.
    fn default_max_positions(self) -> usize {
        match self {
            Arch::Llama => 2048,
            Arch::Mistral => 4096 * 32,
            Arch::Qwen2 | Arch::Qwen3 => 32768,
            Arch::Other => 0,
        }
    }

    /// The config class's `bos_token_id` / `eos_token_id` defaults.
    fn default_bos_eos(self) -> (Option<u32>, &'static [u32]) {
        match self {
            Arch::Llama | Arch::Mistral => (Some(1), &[2]),
            Arch::Qwen2 | Arch::Qwen3 | Arch::Other => (None, &[]),
        }
    }
}

/// Reads `dir/config.json` and merges `dir/generation_config.json` if present.
pub fn read_spec(dir: &Path) -> Result<ModelSpec> {
    let path = dir.join(CONFIG_FILE);
    if !path.is_file() {
        return Err(CheckpointError::Malformed {
            path: dir.to_path_buf(),
            format: "HF checkpoint directory",
            what: format!("{CONFIG_FILE} is missing"),
        });
    }
    let config = crate::safetensors::read_json_file(&path)?;
    let mut spec = spec_from_config(&path, &config)?;
    let gen_path = dir.join(GENERATION_CONFIG_FILE);
    if gen_path.is_file() {
        let gen = crate::safetensors::read_json_file(&gen_path)?;
        merge_generation_config(&mut spec, &gen_path, &gen)?;
    }
    Ok(spec)
}

/// The spec of a parsed `config.json`; `path` names the file in errors.
pub fn spec_from_config(path: &Path, config: &Value) -> Result<ModelSpec> {
    let architecture = architecture(&Cfg::new(path, config, false)?)?;
    let arch = Arch::from_name(&architecture);
    let cfg = Cfg::new(path, config, arch == Arch::Other)?;
    let mut unsupported = Vec::new();

    let hidden_size = cfg.positive("hidden_size")?;
    let num_attention_heads = cfg.positive("num_attention_heads")?;
    let head_dim = head_dim(&cfg, arch, hidden_size, num_attention_heads)?;
    let num_key_value_heads = match cfg.usize("num_key_value_heads")? {
        None => num_attention_heads,
        Some(_) => cfg.positive("num_key_value_heads")?,
    };
    let rope = rope::rope_spec(&cfg, head_dim, &mut unsupported)?;
    let max_position_embeddings =
        cfg.usize_or("max_position_embeddings", arch.default_max_positions())?;
    let (attention_bias, o_proj_bias, mlp_bias) = biases(&cfg, arch)?;
    sliding_window(&cfg, arch, max_position_embeddings, &mut unsupported)?;
    other_features(&cfg, &mut unsupported)?;
    let mut seen = std::collections::HashSet::new();
    unsupported.retain(|u| seen.insert(u.clone()));

    let (bos, eos) = arch.default_bos_eos();
    Ok(ModelSpec {
        hidden_size,
        intermediate_size: cfg.positive("intermediate_size")?,
        num_hidden_layers: cfg.positive("num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size: cfg.positive("vocab_size")?,
        rms_norm_eps: rms_norm_eps(&cfg)?,
        rope,
        max_position_embeddings,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        attention_bias,
        o_proj_bias,
        mlp_bias,
        qk_norm: arch == Arch::Qwen3,
        special: SpecialTokens {
            bos: cfg.token_id("bos_token_id", bos)?,
            eos: cfg.token_ids("eos_token_id", eos)?,
            pad: cfg.token_id("pad_token_id", None)?,
        },
        unsupported,
        architecture,
    })
}

/// Adds `generation_config.json`'s ids: its `eos_token_id`s join the config's (generation
/// stops at any of them, as transformers' `generate` does with this file); its bos/pad fill
/// only what the config left unset.
pub fn merge_generation_config(spec: &mut ModelSpec, path: &Path, gen: &Value) -> Result<()> {
    let gen = Cfg::new(path, gen, false)?;
    for id in gen.token_ids("eos_token_id", &[])? {
        if !spec.special.eos.contains(&id) {
            spec.special.eos.push(id);
        }
    }
    if spec.special.bos.is_none() {
        spec.special.bos = gen.token_id("bos_token_id", None)?;
    }
    if spec.special.pad.is_none() {
        spec.special.pad = gen.token_id("pad_token_id", None)?;
    }
    Ok(())
}

/// `architectures[0]`, or for configs without it the HF name of a known `model_type`.
fn architecture(cfg: &Cfg<'_>) -> Result<String> {
    match cfg.get("architectures") {
        Some(Value::Array(list)) => match list.first() {
            Some(Value::String(name)) => Ok(name.clone()),
            _ => Err(cfg.err("architectures", "expected a non-empty list of strings")),
        },
        Some(other) => Err(cfg.err("architectures", format!("expected a list, found {other}"))),
        None => match cfg.str("model_type")? {
            Some("llama") => Ok("LlamaForCausalLM".into()),
            Some("mistral") => Ok("MistralForCausalLM".into()),
            Some("qwen2") => Ok("Qwen2ForCausalLM".into()),
            Some("qwen3") => Ok("Qwen3ForCausalLM".into()),
            Some(other) => Ok(format!("model_type {other}")),
            None => Err(cfg.err("architectures", "is missing, and so is model_type")),
        },
    }
}

/// `head_dim`, or the config class's default: 128 for Qwen3, else hidden / heads.
fn head_dim(cfg: &Cfg<'_>, arch: Arch, hidden: usize, heads: usize) -> Result<usize> {
    if cfg.usize("head_dim")?.is_some() {
        return cfg.positive("head_dim");
    }
    if arch == Arch::Qwen3 && cfg.raw("head_dim").is_none() {
        return Ok(128);
    }
    let exact = heads > 0 && hidden.is_multiple_of(heads);
    cfg.ensure(exact, "head_dim", || {
        format!(
            "is absent and hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
        )
    })?;
    Ok(hidden.checked_div(heads).unwrap_or(0))
}

fn rms_norm_eps(cfg: &Cfg<'_>) -> Result<f64> {
    let eps = cfg.f64_or("rms_norm_eps", 1e-6)?;
    cfg.ensure(eps >= 0.0, "rms_norm_eps", || format!("must not be negative, found {eps}"))?;
    Ok(eps)
}

/// (q/k/v bias, o_proj bias, mlp bias) as each modeling file builds its projections.
fn biases(cfg: &Cfg<'_>, arch: Arch) -> Result<(bool, bool, bool)> {
    Ok(match arch {
        Arch::Llama | Arch::Other => {
            let attn = cfg.bool_or("attention_bias", false)?;
            (attn, attn, cfg.bool_or("mlp_bias", false)?)
        }
        Arch::Mistral => (false, false, false),
        Arch::Qwen2 => (true, false, false),
        Arch::Qwen3 => {
            let attn = cfg.bool_or("attention_bias", false)?;
            (attn, attn, false)
        }
    })
}

/// Names a sliding window narrower than the context: Mistral's `sliding_window` (absent
/// means the class default 4096, null means none), Qwen's when `use_sliding_window`, and any
/// `layer_types` entry other than full attention (transformers 5).
fn sliding_window(
    cfg: &Cfg<'_>,
    arch: Arch,
    max_positions: usize,
    unsupported: &mut Vec<String>,
) -> Result<()> {
    let declared = match cfg.raw("sliding_window") {
        None if arch == Arch::Mistral => Some(4096),
        None => None,
        Some(_) => cfg.usize("sliding_window")?,
    };
    let active = match arch {
        Arch::Mistral => true,
        Arch::Qwen2 | Arch::Qwen3 => cfg.bool_or("use_sliding_window", false)?,
        Arch::Llama | Arch::Other => false,
    };
    let mut windows: Vec<usize> = Vec::new();
    if active {
        windows.extend(declared);
    }
    if let Some(Value::Array(types)) = cfg.get("layer_types") {
        for t in types {
            match (t.as_str(), declared) {
                (Some("full_attention"), _) => {}
                (Some("sliding_attention"), Some(w)) => windows.push(w),
                _ => unsupported.push(format!("layer_types entry {t}")),
            }
        }
    }
    let narrow = windows.into_iter().filter(|&w| w < max_positions);
    unsupported.extend(narrow.map(|w| format!("sliding_window {w}")));
    Ok(())
}

/// Activation and quantization method.
fn other_features(cfg: &Cfg<'_>, unsupported: &mut Vec<String>) -> Result<()> {
    match cfg.str("hidden_act")? {
        None | Some("silu") | Some("swish") => {}
        Some(other) => unsupported.push(format!("hidden_act \"{other}\"")),
    }
    // MLX writes `quantization_config` without `quant_method` (its tensors say the rest);
    // transformers' methods (gptq, awq, fp8, bitsandbytes...) name themselves.
    if let Some(q) = cfg.sub("quantization_config", "quantization_config.")? {
        if let Some(method) = q.str("quant_method")? {
            unsupported.push(format!("quantization_config quant_method \"{method}\""));
        }
    }
    Ok(())
}
