//! RoPE tables as HF computes them, for the backend's `rope` op.
//!
//! HF (`modeling_rope_utils` + `LlamaRotaryEmbedding`): `inv_freq = 1 / base^(arange(0, d, 2)
//! / d)` in fp32, adjusted by the scaling kind; the angle `inv_freq * position` is one fp32
//! product; `cos`/`sin` are taken in fp32 and cast to the activation dtype (bf16). We take cos
//! and sin in f64 of the fp32 angle and round to f32, then bf16: the same value except where
//! torch's fp32 `cos` is off by an ulp at a bf16 rounding boundary.
//!
//! The table is `(positions, dim)` bf16: dim/2 cosines then dim/2 sines, one row per absolute
//! position, so a row's rotation depends on its position only.

use half::bf16;
use tf_checkpoint::spec::{RopeScaling, RopeSpec};

/// fp32 inverse frequencies (dim/2 of them) after scaling, as HF computes them.
pub fn inv_freq(rope: &RopeSpec) -> Vec<f32> {
    let d = rope.dim as f32;
    let base = rope.theta;
    let raw: Vec<f32> = (0..rope.dim / 2)
        .map(|i| {
            let e = (2 * i) as f32 / d;
            let p = base.powf(f64::from(e)) as f32;
            1.0f32 / p
        })
        .collect();
    match rope.scaling {
        RopeScaling::None => raw,
        RopeScaling::Linear { factor } => raw.iter().map(|f| f / factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, lo, hi) = (factor as f32, low_freq_factor as f32, high_freq_factor as f32);
            let old = original_max_position_embeddings as f32;
            let low_wavelen = old / lo;
            let high_wavelen = old / hi;
            raw.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    // HF: ~(wavelen < high) * ~(wavelen > low); wavelengths are finite and positive.
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
    }
}

/// The bf16 table bytes `(positions, rope.dim)` for positions `0..positions`.
pub fn table_bf16(rope: &RopeSpec, positions: usize) -> Vec<u8> {
    let inv = inv_freq(rope);
    let half = inv.len();
    let mut out = Vec::with_capacity(positions * half * 4);
    for p in 0..positions {
        let pos = p as f32;
        let angles: Vec<f64> = inv.iter().map(|&f| f64::from(f * pos)).collect();
        for a in &angles {
            out.extend_from_slice(&bf16::from_f32(a.cos() as f32).to_le_bytes());
        }
        for a in &angles {
            out.extend_from_slice(&bf16::from_f32(a.sin() as f32).to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tf_checkpoint::spec::RopeStyle;

    fn spec(scaling: RopeScaling) -> RopeSpec {
        RopeSpec { theta: 500000.0, style: RopeStyle::Neox, scaling, dim: 128 }
    }

    #[test]
    fn plain_frequencies_match_the_formula() {
        let f = inv_freq(&spec(RopeScaling::None));
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        let want = 1.0 / 500000f64.powf(2.0 * 10.0 / 128.0);
        assert!((f64::from(f[10]) - want).abs() < want * 1e-6);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let l3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let (a, b) = (inv_freq(&spec(RopeScaling::None)), inv_freq(&spec(l3)));
        assert_eq!(a[0], b[0], "high frequency untouched");
        assert_eq!(b[63], a[63] / 8.0, "low frequency divided by factor");
        let mid = (0..64).filter(|&i| b[i] != a[i] && b[i] != a[i] / 8.0).count();
        assert!(mid > 0, "some medium frequencies are smoothed");
    }

    #[test]
    fn table_row_zero_is_cos_one_sin_zero() {
        let t = table_bf16(&spec(RopeScaling::None), 2);
        let v: Vec<f32> = t.chunks(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
        assert!(v[..64].iter().all(|&c| c == 1.0));
        assert!(v[64..128].iter().all(|&s| s == 0.0));
        assert_eq!(v[128 + 64], bf16::from_f32(1f32.sin()).to_f32());
    }
}
