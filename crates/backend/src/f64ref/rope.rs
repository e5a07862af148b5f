//! RoPE inverse frequencies in f64: HF's formula (`modeling_rope_utils`: default, `linear`,
//! `llama3`), which HF evaluates in fp32, evaluated here in f64 so the reference's angles
//! carry no fp32 rounding. Mirrors `tf_engine::rope::inv_freq` (the fp32 version the fast
//! path's bf16 table is built from) operation for operation; the engine's model test checks
//! the two agree to fp32 precision.

use tf_checkpoint::spec::{RopeScaling, RopeSpec};

use crate::error::{BackendError, Result};

/// The `dim/2` inverse frequencies `1 / theta^(2i/dim)`, adjusted by the scaling kind.
pub fn inv_freq_f64(rope: &RopeSpec) -> Result<Vec<f64>> {
    if rope.dim == 0 || !rope.dim.is_multiple_of(2) || !rope.theta.is_finite() || rope.theta <= 0.0
    {
        return Err(BackendError::shape(
            "f64ref rope",
            format!("rotary dim {} and theta {} do not define RoPE", rope.dim, rope.theta),
        ));
    }
    let d = rope.dim as f64;
    let raw = (0..rope.dim / 2).map(|i| 1.0 / rope.theta.powf((2 * i) as f64 / d));
    Ok(match rope.scaling {
        RopeScaling::None => raw.collect(),
        RopeScaling::Linear { factor } => raw.map(|f| f / factor).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: lo,
            high_freq_factor: hi,
            original_max_position_embeddings,
        } => {
            let old = original_max_position_embeddings as f64;
            let (low_wavelen, high_wavelen) = (old / lo, old / hi);
            raw.map(|f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                let scaled = if wavelen > low_wavelen { f / factor } else { f };
                // HF: neither below high_wavelen nor above low_wavelen (f > 0, so no NaN).
                let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                if medium {
                    let smooth = (old / wavelen - lo) / (hi - lo);
                    (1.0 - smooth) * scaled / factor + smooth * scaled
                } else {
                    scaled
                }
            })
            .collect()
        }
    })
}
