//! RoPE settings of an HF config: theta, scaling kind, rotary dims.
//!
//! Two spellings exist. transformers 4 writes a top-level `rope_theta` and an optional
//! `rope_scaling` object (`{"type"|"rope_type": .., "factor": ..}`); transformers 5 writes one
//! `rope_parameters` object holding `rope_theta`, `rope_type` and the scaling fields (and
//! `partial_rotary_factor`). As in transformers 5's `convert_rope_params_to_dict`, a non-null
//! `rope_scaling` takes the place of `rope_parameters`, and a theta missing from that object
//! comes from the top level (default 10000, every llama-family config class's default).
//!
//! Scaling kinds the llama family implements become [`RopeScaling`]; any other kind
//! (`yarn`, `dynamic`, `longrope`, ...) is named in `unsupported` so admission refuses it.
//! HF checkpoints always use [`RopeStyle::Neox`] (`rotate_half`).

use super::cfg::Cfg;
use crate::error::Result;
use crate::spec::{RopeScaling, RopeSpec, RopeStyle};

/// transformers' `default_theta` for llama, mistral, qwen2 and qwen3.
const DEFAULT_THETA: f64 = 10_000.0;

pub(super) fn rope_spec(
    cfg: &Cfg<'_>,
    head_dim: usize,
    unsupported: &mut Vec<String>,
) -> Result<RopeSpec> {
    let params = match cfg.sub("rope_scaling", "rope_scaling.")? {
        Some(p) => Some(p),
        None => cfg.sub("rope_parameters", "rope_parameters.")?,
    };
    let theta = match params.map(|p| p.f64("rope_theta")).transpose()?.flatten() {
        Some(t) => t,
        None => cfg.f64_or("rope_theta", DEFAULT_THETA)?,
    };
    cfg.ensure(theta > 0.0, "rope_theta", || format!("must be positive, found {theta}"))?;
    let scaling = match params {
        Some(p) => scaling(&p, unsupported)?,
        None => RopeScaling::None,
    };
    let partial = match params.map(|p| p.f64("partial_rotary_factor")).transpose()?.flatten() {
        Some(f) => f,
        None => cfg.f64_or("partial_rotary_factor", 1.0)?,
    };
    cfg.ensure(partial > 0.0 && partial <= 1.0, "partial_rotary_factor", || {
        format!("must be in (0, 1], found {partial}")
    })?;
    // transformers: `dim = int(head_dim * partial_rotary_factor)` (truncation).
    let dim = (head_dim as f64 * partial) as usize;
    Ok(RopeSpec { theta, style: RopeStyle::Neox, scaling, dim })
}

fn scaling(p: &Cfg<'_>, unsupported: &mut Vec<String>) -> Result<RopeScaling> {
    let kind = match p.str("rope_type")? {
        Some(k) => k,
        None => p.str("type")?.unwrap_or("default"),
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: p.positive_f64("factor")? },
        "llama3" => {
            let low_freq_factor = p.positive_f64("low_freq_factor")?;
            let high_freq_factor = p.positive_f64("high_freq_factor")?;
            // The llama3 formula divides by (high - low).
            p.ensure(high_freq_factor > low_freq_factor, "high_freq_factor", || {
                format!("must exceed low_freq_factor {low_freq_factor}, found {high_freq_factor}")
            })?;
            RopeScaling::Llama3 {
                factor: p.positive_f64("factor")?,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: p.positive("original_max_position_embeddings")?,
            }
        }
        other => {
            unsupported.push(format!("rope_scaling type \"{other}\""));
            RopeScaling::None
        }
    })
}
