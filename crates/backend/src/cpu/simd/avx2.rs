//! AVX2 level: a 16-lane vector is two ymm registers, lanes 0..8 in `.0` and 8..16 in `.1`.
//!
//! The fixed reduction tree's first step (lane i + lane i+8) is then simply `.0 + .1`.

use std::arch::x86_64::*;

use super::{Kernel, Simd};

/// Token: only constructed by [`Avx2::detect`].
#[derive(Clone, Copy, Debug)]
pub struct Avx2(());

impl Avx2 {
    pub fn detect() -> Option<Avx2> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx2(()))
    }
}

#[derive(Clone, Copy, Debug)]
pub struct F8x2(__m256, __m256);
#[derive(Clone, Copy, Debug)]
pub struct I8x2(__m256i, __m256i);

#[target_feature(enable = "avx2,fma,f16c")]
fn run_avx2<K: Kernel>(s: Avx2, k: K) -> K::Output {
    k.run(s)
}

macro_rules! f2 {
    ($f:ident, $a:expr, $b:expr) => {
        // SAFETY: an `Avx2` token exists only after `detect` confirmed AVX2/FMA/F16C.
        unsafe { F8x2($f($a.0, $b.0), $f($a.1, $b.1)) }
    };
}
macro_rules! i2 {
    ($f:ident, $a:expr, $b:expr) => {
        // SAFETY: as in `f2`.
        unsafe { I8x2($f($a.0, $b.0), $f($a.1, $b.1)) }
    };
}

/// 8 lanes of f32 -> bf16 bits (in the low half of each 32-bit lane), nearest even.
#[inline(always)]
unsafe fn bf16_bits8(v: __m256) -> __m256i {
    // SAFETY: called only from `Avx2` methods (features present).
    unsafe {
        let b = _mm256_castps_si256(v);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
        let r = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
        let r = _mm256_srli_epi32::<16>(r);
        let nan = _mm256_or_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(0x40));
        let isnan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        _mm256_blendv_epi8(r, nan, isnan)
    }
}

// SAFETY (for every `unsafe` block in this impl): an `Avx2` value exists only after `detect`
// confirmed AVX2, FMA and F16C; pointer arguments carry the trait's validity contract.
impl Simd for Avx2 {
    type V = F8x2;
    type I = I8x2;
    const GEMM_MR: usize = 2;
    const GEMM_NR: usize = 2;
    const FAST_LUT: bool = false;

    #[inline(always)]
    fn vectorize<K: Kernel>(self, k: K) -> K::Output {
        // SAFETY: the token proves the features are present.
        unsafe { run_avx2(self, k) }
    }
    #[inline(always)]
    fn zero(self) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe { F8x2(_mm256_setzero_ps(), _mm256_setzero_ps()) }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe { F8x2(_mm256_set1_ps(x), _mm256_set1_ps(x)) }
    }
    #[inline(always)]
    fn add(self, a: F8x2, b: F8x2) -> F8x2 {
        f2!(_mm256_add_ps, a, b)
    }
    #[inline(always)]
    fn sub(self, a: F8x2, b: F8x2) -> F8x2 {
        f2!(_mm256_sub_ps, a, b)
    }
    #[inline(always)]
    fn mul(self, a: F8x2, b: F8x2) -> F8x2 {
        f2!(_mm256_mul_ps, a, b)
    }
    #[inline(always)]
    fn div(self, a: F8x2, b: F8x2) -> F8x2 {
        f2!(_mm256_div_ps, a, b)
    }
    #[inline(always)]
    fn fma(self, a: F8x2, b: F8x2, c: F8x2) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe { F8x2(_mm256_fmadd_ps(a.0, b.0, c.0), _mm256_fmadd_ps(a.1, b.1, c.1)) }
    }
    #[inline(always)]
    fn max(self, a: F8x2, b: F8x2) -> F8x2 {
        // SAFETY: see the impl comment. blendv picks the second operand where the mask is set.
        unsafe {
            let m0 = _mm256_cmp_ps::<_CMP_GT_OQ>(a.0, b.0);
            let m1 = _mm256_cmp_ps::<_CMP_GT_OQ>(a.1, b.1);
            F8x2(_mm256_blendv_ps(b.0, a.0, m0), _mm256_blendv_ps(b.1, a.1, m1))
        }
    }
    #[inline(always)]
    fn min(self, a: F8x2, b: F8x2) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            let m0 = _mm256_cmp_ps::<_CMP_LT_OQ>(a.0, b.0);
            let m1 = _mm256_cmp_ps::<_CMP_LT_OQ>(a.1, b.1);
            F8x2(_mm256_blendv_ps(b.0, a.0, m0), _mm256_blendv_ps(b.1, a.1, m1))
        }
    }
    #[inline(always)]
    fn round_even(self, a: F8x2) -> F8x2 {
        const M: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        // SAFETY: see the impl comment.
        unsafe { F8x2(_mm256_round_ps::<M>(a.0), _mm256_round_ps::<M>(a.1)) }
    }
    #[inline(always)]
    fn nan_select(self, x: F8x2, y: F8x2) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            let m0 = _mm256_cmp_ps::<_CMP_UNORD_Q>(x.0, x.0);
            let m1 = _mm256_cmp_ps::<_CMP_UNORD_Q>(x.1, x.1);
            F8x2(_mm256_blendv_ps(y.0, x.0, m0), _mm256_blendv_ps(y.1, x.1, m1))
        }
    }
    #[inline(always)]
    fn to_int(self, a: F8x2) -> I8x2 {
        // SAFETY: see the impl comment.
        unsafe { I8x2(_mm256_cvttps_epi32(a.0), _mm256_cvttps_epi32(a.1)) }
    }
    #[inline(always)]
    fn to_float(self, a: I8x2) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe { F8x2(_mm256_cvtepi32_ps(a.0), _mm256_cvtepi32_ps(a.1)) }
    }
    #[inline(always)]
    fn bitcast_f(self, a: I8x2) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe { F8x2(_mm256_castsi256_ps(a.0), _mm256_castsi256_ps(a.1)) }
    }
    #[inline(always)]
    fn bitcast_i(self, a: F8x2) -> I8x2 {
        // SAFETY: see the impl comment.
        unsafe { I8x2(_mm256_castps_si256(a.0), _mm256_castps_si256(a.1)) }
    }
    #[inline(always)]
    fn isplat(self, x: i32) -> I8x2 {
        // SAFETY: see the impl comment.
        unsafe { I8x2(_mm256_set1_epi32(x), _mm256_set1_epi32(x)) }
    }
    #[inline(always)]
    fn iadd(self, a: I8x2, b: I8x2) -> I8x2 {
        i2!(_mm256_add_epi32, a, b)
    }
    #[inline(always)]
    fn isub(self, a: I8x2, b: I8x2) -> I8x2 {
        i2!(_mm256_sub_epi32, a, b)
    }
    #[inline(always)]
    fn and(self, a: I8x2, b: I8x2) -> I8x2 {
        i2!(_mm256_and_si256, a, b)
    }
    #[inline(always)]
    fn or(self, a: I8x2, b: I8x2) -> I8x2 {
        i2!(_mm256_or_si256, a, b)
    }
    #[inline(always)]
    fn shl(self, a: I8x2, n: u32) -> I8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            let c = _mm_cvtsi32_si128(n as i32);
            I8x2(_mm256_sll_epi32(a.0, c), _mm256_sll_epi32(a.1, c))
        }
    }
    #[inline(always)]
    fn shr(self, a: I8x2, n: u32) -> I8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            let c = _mm_cvtsi32_si128(n as i32);
            I8x2(_mm256_srl_epi32(a.0, c), _mm256_srl_epi32(a.1, c))
        }
    }
    #[inline(always)]
    fn mask_bits(self, mask: u32, val: i32) -> I8x2 {
        // SAFETY: see the impl comment. Lane j tests bit j of the broadcast mask.
        unsafe {
            let bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
            let lo = _mm256_set1_epi32((mask & 0xff) as i32);
            let hi = _mm256_set1_epi32(((mask >> 8) & 0xff) as i32);
            let v = _mm256_set1_epi32(val);
            let m0 = _mm256_cmpeq_epi32(_mm256_and_si256(lo, bit), bit);
            let m1 = _mm256_cmpeq_epi32(_mm256_and_si256(hi, bit), bit);
            I8x2(_mm256_and_si256(m0, v), _mm256_and_si256(m1, v))
        }
    }
    #[inline(always)]
    fn swap_pairs(self, v: F8x2) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            F8x2(_mm256_permute_ps::<0b10_11_00_01>(v.0), _mm256_permute_ps::<0b10_11_00_01>(v.1))
        }
    }
    #[inline(always)]
    fn lut16(self, table: F8x2, idx: I8x2) -> F8x2 {
        // SAFETY: see the impl comment. Each 8-entry half is looked up with the low 3 bits,
        // then bit 3 (moved to the sign) picks the half.
        unsafe {
            let pick = |i: __m256i| {
                let lo = _mm256_permutevar8x32_ps(table.0, i);
                let hi = _mm256_permutevar8x32_ps(table.1, i);
                _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(i)))
            };
            F8x2(pick(idx.0), pick(idx.1))
        }
    }
    #[inline(always)]
    fn splat_f16(self, bits: u16) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            let v = _mm256_cvtph_ps(_mm_set1_epi16(bits as i16));
            F8x2(v, v)
        }
    }
    #[inline(always)]
    fn splat_f16x2(self, bits: u32) -> (F8x2, F8x2) {
        // SAFETY: see the impl comment. Lanes alternate lo, hi; duplicate evens and odds.
        unsafe {
            let v = _mm256_cvtph_ps(_mm_set1_epi32(bits as i32));
            let (d, m) = (_mm256_moveldup_ps(v), _mm256_movehdup_ps(v));
            (F8x2(d, d), F8x2(m, m))
        }
    }
    #[inline(always)]
    fn reduce(self, v: F8x2) -> f32 {
        // SAFETY: see the impl comment. Tree: (i, i+8), (i, i+4), (i, i+2), (0, 1).
        unsafe {
            let s8 = _mm256_add_ps(v.0, v.1);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
            _mm_cvtss_f32(s1)
        }
    }
    #[inline(always)]
    fn f16_to_f32(self, bits: u16) -> f32 {
        // SAFETY: see the impl comment (F16C).
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))) }
    }

    #[inline(always)]
    fn prefetch(self, p: *const u8) {
        // SAFETY: a prefetch never faults or changes memory; any address is allowed.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe { F8x2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: F8x2) {
        // SAFETY: see the impl comment.
        unsafe {
            _mm256_storeu_ps(p, v.0);
            _mm256_storeu_ps(p.add(8), v.1);
        }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            let a = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
            let b = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(8).cast()));
            F8x2(
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(a)),
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(b)),
            )
        }
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut u16, v: F8x2) {
        // SAFETY: see the impl comment. packus interleaves 128-bit halves; the permute puts
        // lanes back in order (all values are < 2^16, so the saturation never triggers).
        unsafe {
            let packed = _mm256_packus_epi32(bf16_bits8(v.0), bf16_bits8(v.1));
            let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
            _mm256_storeu_si256(p.cast(), ordered);
        }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const u16) -> F8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            F8x2(
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast())),
            )
        }
    }
    #[inline(always)]
    unsafe fn load_u8(self, p: *const u8) -> I8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            let b = _mm_loadu_si128(p.cast());
            I8x2(_mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(b)))
        }
    }
    #[inline(always)]
    unsafe fn load_i8(self, p: *const u8) -> I8x2 {
        // SAFETY: see the impl comment.
        unsafe {
            let b = _mm_loadu_si128(p.cast());
            I8x2(_mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(b)))
        }
    }
}
