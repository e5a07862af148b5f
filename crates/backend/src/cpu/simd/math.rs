//! Number formats and transcendental functions shared by every SIMD level.
//!
//! `exp` is our own: a libm `expf` differs between platforms and from any vector
//! polynomial, which would break `SIMD == scalar` bits. It is written once over [`Simd`]
//! operations (Cephes-style: `n = round(x*log2 e)`, two-step Cody-Waite reduction, degree-5
//! polynomial, scaling by 2^n in two exact halves), so every level runs the same IEEE
//! operations in the same order. Its error is within 2 ulp of the true value (tested against
//! f64), results below the subnormal range round to 0, and NaN passes through.

use super::Simd;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n * LN2_HI` is exact for |n| < 2^9 (Cephes `C1`, `C2`).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const P: [f32; 6] =
    [1.987_569_2e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// e^x per lane (see the module doc for the exact recipe).
#[inline(always)]
pub fn exp<S: Simd>(s: S, x: S::V) -> S::V {
    // Clamp so 2^n stays representable in two halves; NaN becomes -104 here and is restored
    // at the end.
    let xc = s.min(s.max(x, s.splat(-104.0)), s.splat(89.0));
    let n = s.round_even(s.mul(xc, s.splat(LOG2E)));
    let r = s.fma(n, s.splat(-LN2_HI), xc);
    let r = s.fma(n, s.splat(-LN2_LO), r);
    let mut p = s.splat(P[0]);
    for &c in &P[1..] {
        p = s.fma(p, r, s.splat(c));
    }
    let y = s.add(s.fma(p, s.mul(r, r), r), s.splat(1.0));
    // 2^n = 2^n1 * 2^n2 with n1 = trunc(n/2): both halves are normal floats for
    // n in [-151, 129], so the first product is exact and the second rounds once.
    let ni = s.to_int(n);
    let n1 = s.to_int(s.mul(n, s.splat(0.5)));
    let n2 = s.isub(ni, n1);
    let e1 = s.bitcast_f(s.shl(s.iadd(n1, s.isplat(127)), 23));
    let e2 = s.bitcast_f(s.shl(s.iadd(n2, s.isplat(127)), 23));
    s.nan_select(x, s.mul(s.mul(y, e1), e2))
}

/// `g / (1 + e^-g)` per lane.
#[inline(always)]
pub fn silu<S: Simd>(s: S, g: S::V) -> S::V {
    let e = exp(s, s.sub(s.zero(), g));
    s.div(g, s.add(s.splat(1.0), e))
}

/// f32 -> bf16 bits, round to nearest even; NaN becomes a quiet NaN keeping its sign and top
/// payload bits (what `half::bf16::from_f32` and PyTorch do).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) | 0x40) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// bf16 bits -> f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 rounded to the nearest bf16 value, as f32.
#[inline(always)]
pub fn round_bf16(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(x))
}

/// IEEE binary16 bits -> f32, exact (subnormals, infinities and NaN payloads included).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: value = man * 2^-24, exact in f32.
            let v = man as f32 * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -v } else { v };
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Each lane rounded to the nearest bf16 value (ties to even), kept as f32; NaN stays NaN.
/// The same integer recipe as [`f32_to_bf16`], so every level agrees.
#[inline(always)]
pub fn round_bf16_v<S: Simd>(s: S, x: S::V) -> S::V {
    let b = s.bitcast_i(x);
    let lsb = s.and(s.shr(b, 16), s.isplat(1));
    let r = s.and(s.iadd(b, s.iadd(lsb, s.isplat(0x7fff))), s.isplat(0xffff_0000u32 as i32));
    s.nan_select(x, s.bitcast_f(r))
}
