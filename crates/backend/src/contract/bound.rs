//! The error bounds of gate 2, one function per op; the derivations are in the `contract`
//! module doc. Every bound is homogeneous of degree one in the data (up to the 2^-134
//! subnormal allowance), which is what lets a planted 1%-off reference scale its bound with
//! it.

/// Unit roundoff used for fp32 arithmetic: 2^-23, twice fp32's, so that tensor cores which
/// truncate addends during alignment are covered.
pub const U: f64 = 1.0 / (1u64 << 23) as f64;
/// bf16 unit roundoff: half an ulp of x is at most 2^-8 |x|.
pub const U_BF16: f64 = 1.0 / 256.0;
/// Half the least positive bf16 subnormal (2^-134): the absolute error of rounding a value
/// in the subnormal range.
pub const TINY: f64 = 1.0 / (1u128 << 127) as f64 / 128.0;
/// Stated accuracy of the device's exp (and exp2 variants): 2^-20 relative (8 fp32 ulps).
pub const EPS_EXP: f64 = 1.0 / (1u64 << 20) as f64;

/// gamma(n) = n u / (1 - n u); infinite when n u >= 1 (no bound).
pub fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    if nu >= 1.0 {
        f64::INFINITY
    } else {
        nu / (1.0 - nu)
    }
}

/// A value `v` computed with error at most `e`, then rounded to bf16.
pub fn round_bf16(v: f64, e: f64) -> f64 {
    e + U_BF16 * (v.abs() + e) + TINY
}

/// A dot product of `terms` terms (bias included as one) whose |products| sum to `abs_sum`.
pub fn dot(v: f64, terms: usize, abs_sum: f64) -> f64 {
    round_bf16(v, gamma(terms) * abs_sum)
}

/// `bf16(a + b)` of two bf16 values summing exactly to `v`.
pub fn add(v: f64) -> f64 {
    round_bf16(v, U * v.abs())
}

/// `bf16(w * bf16(x * r))`, `r` the fp32 rsqrt of a mean over `group` squares.
pub fn rms_norm(v: f64, group: usize) -> f64 {
    let rel = (1.0 + gamma(group + 6)) * (1.0 + U).powi(2) * (1.0 + U_BF16).powi(2) - 1.0;
    v.abs() * rel + TINY
}

/// `bf16(bf16(a) + bf16(b))` with `a = x cos`, `b = partner * (+-sin)` exact; `v = a + b`.
pub fn rope(v: f64, a: f64, b: f64) -> f64 {
    round_bf16(v, (U_BF16 + 2.0 * U) * (1.0 + U_BF16) * (a.abs() + b.abs()))
}

/// rope of inputs known to within `e_in` each way (a product's bound, carried through the
/// rotation: `e_in = |c| E1 + |s| E2`), `abs_terms` bounding |a| + |b| of the inputs as computed
/// (`(|x1| + E1) |c| + (|x2| + E2) |s|`); v the exact value.
pub fn rope_of(v: f64, abs_terms: f64, e_in: f64) -> f64 {
    round_bf16(v, (U_BF16 + 2.0 * U) * (1.0 + U_BF16) * abs_terms + e_in)
}

/// `bf16(bf16(silu(g)) * up)`, `v` the exact product.
pub fn swiglu(v: f64) -> f64 {
    let eps_s = EPS_EXP + 4.0 * U;
    v.abs() * ((1.0 + eps_s) * (1.0 + U_BF16).powi(2) * (1.0 + U) - 1.0) + TINY
}

/// What the attention bound needs of one (row, head): see [`attention`].
#[derive(Clone, Copy, Debug)]
pub struct AttnTerms {
    /// Positions attended (p + 1).
    pub positions: usize,
    pub head_dim: usize,
    /// max_j scale * sum_d |q_d k_jd|.
    pub max_abs_score: f64,
    /// max_j s_j - min_j s_j of the exact scores.
    pub score_range: f64,
}

/// Pieces a kernel may split each fp32 softmax weight into for the P V product: three bf16
/// values summing to it exactly (tensor-core attention), so each position adds up to three
/// exact products to the sum.
pub const PV_PIECES: usize = 3;
/// Bound on `sum_i |b_i| / |p|` over those pieces: `|b0| <= (1 + 2^-8) |p|`,
/// `|b1| <= 2^-8 (1 + 2^-8) |p|`, `|b2| <= 2^-16 |p|`, in all below `1 + 2^-6`.
pub const PV_PIECE_GROWTH: f64 = 1.0 + 1.0 / 64.0;

/// The relative factor c such that `|o_d - out_d| <= c A_d` before the final rounding, with
/// `A_d = sum_j p_j |v_jd|`; `None` when the terms are too large for the bound to hold.
pub fn attention_factor(t: AttnTerms) -> Option<f64> {
    let delta = gamma(t.head_dim + 2) * t.max_abs_score;
    let range = t.score_range + 2.0 * delta;
    let theta = delta + 2.0 * U * range;
    let events = t.positions.div_ceil(16) + 8;
    let rho = (theta + events as f64 * (EPS_EXP + 2.0 * U * range)).exp() * (1.0 + EPS_EXP) - 1.0;
    let g = gamma(PV_PIECES * t.positions + 2 * events + 8) * PV_PIECE_GROWTH;
    if !(rho < 0.5 && g < 0.5) {
        return None;
    }
    let kappa = 2.0 * rho / (1.0 - rho);
    Some((2.0 * U + g + kappa + g * (1.0 + kappa)) * (1.0 + 2.0 * U) / (1.0 - g))
}

/// The attention bound of one output element: exact `v`, `a = sum_j p_j |v_jd|`.
pub fn attention(v: f64, a: f64, factor: f64) -> f64 {
    round_bf16(v, factor * a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_the_stated_powers_of_two() {
        assert_eq!(U, 2f64.powi(-23));
        assert_eq!(U_BF16, 2f64.powi(-8));
        assert_eq!(TINY, 2f64.powi(-134));
        assert_eq!(EPS_EXP, 2f64.powi(-20));
        // Half of the least bf16 subnormal, as bf16 itself sees it.
        let least = half::bf16::from_bits(1).to_f64();
        assert_eq!(TINY, least / 2.0);
    }

    #[test]
    fn gamma_by_hand() {
        assert_eq!(gamma(0), 0.0);
        let n = 1000.0;
        assert_eq!(gamma(1000), n * U / (1.0 - n * U));
        assert!(gamma(1 << 23).is_infinite());
    }

    #[test]
    fn half_an_ulp_is_within_the_rounding_term() {
        // Every bf16 rounding of a value near 1.0, 3.0, 1e-3 is within round_bf16(v, 0).
        for v in [1.0f64, 1.0 + 1.0 / 512.0, 3.0 + 1.0 / 200.0, 1e-3, -7.77, 1e30] {
            let r = half::bf16::from_f64(v).to_f64();
            assert!((r - v).abs() <= round_bf16(v, 0.0), "{v}");
        }
        // The worst case: halfway between 1 and the next bf16 is 2^-8 from both.
        let tie = 1.0 + 1.0 / 256.0;
        let r = half::bf16::from_f64(tie).to_f64();
        assert_eq!((r - tie).abs(), 1.0 / 256.0);
        assert!((r - tie).abs() <= round_bf16(tie, 0.0));
    }

    #[test]
    fn attention_factor_is_small_for_sane_inputs_and_refused_for_wild_ones() {
        let t =
            AttnTerms { positions: 1024, head_dim: 128, max_abs_score: 10.0, score_range: 12.0 };
        let f = attention_factor(t).unwrap();
        assert!(f > gamma(1024) && f < 2e-3, "{f}");
        let wild = AttnTerms { max_abs_score: 1e9, ..t };
        assert!(attention_factor(wild).is_none());
    }
}
