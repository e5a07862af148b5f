//! AVX-512 level: one zmm register per 16-lane vector.
//!
//! Requires F, BW, DQ, VL plus FMA/F16C (every AVX-512 CPU has them). bf16 rounding is done
//! with integer ops, not `VCVTNEPS2BF16`, which flushes denormal inputs and would differ from
//! the scalar level.

use std::arch::x86_64::*;

use super::{Kernel, Simd};

/// Token: only constructed by [`Avx512::detect`].
#[derive(Clone, Copy, Debug)]
pub struct Avx512(());

impl Avx512 {
    pub fn detect() -> Option<Avx512> {
        let ok = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx512(()))
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
fn run_avx512<K: Kernel>(s: Avx512, k: K) -> K::Output {
    k.run(s)
}

// SAFETY (for every `unsafe` block in this impl that calls an intrinsic): an `Avx512` value
// exists only after `detect` confirmed every feature the intrinsics need; pointer arguments
// carry the trait's documented validity contract from the caller.
impl Simd for Avx512 {
    type V = __m512;
    type I = __m512i;
    const GEMM_MR: usize = 4;
    const GEMM_NR: usize = 4;
    const FAST_LUT: bool = true;

    #[inline(always)]
    fn vectorize<K: Kernel>(self, k: K) -> K::Output {
        // SAFETY: the token proves the features are present.
        unsafe { run_avx512(self, k) }
    }
    #[inline(always)]
    fn zero(self) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment. An explicit compare-select, so the NaN rule does not
        // depend on operand order chosen by the compiler for `vmaxps`.
        unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b), b, a) }
    }
    #[inline(always)]
    fn min(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b), b, a) }
    }
    #[inline(always)]
    fn round_even(self, a: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    fn nan_select(self, x: __m512, y: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), y, x) }
    }
    #[inline(always)]
    fn to_int(self, a: __m512) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_cvttps_epi32(a) }
    }
    #[inline(always)]
    fn to_float(self, a: __m512i) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    fn bitcast_f(self, a: __m512i) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_castsi512_ps(a) }
    }
    #[inline(always)]
    fn bitcast_i(self, a: __m512) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_castps_si512(a) }
    }
    #[inline(always)]
    fn isplat(self, x: i32) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_set1_epi32(x) }
    }
    #[inline(always)]
    fn iadd(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    fn isub(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_sub_epi32(a, b) }
    }
    #[inline(always)]
    fn and(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    fn or(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    fn shl(self, a: __m512i, n: u32) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_sll_epi32(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    fn shr(self, a: __m512i, n: u32) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_srl_epi32(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    fn mask_bits(self, mask: u32, val: i32) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_maskz_mov_epi32(mask as u16, _mm512_set1_epi32(val)) }
    }
    #[inline(always)]
    fn swap_pairs(self, v: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_permute_ps::<0b10_11_00_01>(v) }
    }
    #[inline(always)]
    fn lut16(self, table: __m512, idx: __m512i) -> __m512 {
        // SAFETY: see the impl comment. vpermps reads the low 4 bits of each index.
        unsafe { _mm512_permutexvar_ps(idx, table) }
    }
    #[inline(always)]
    fn splat_f16(self, bits: u16) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_cvtph_ps(_mm256_set1_epi16(bits as i16)) }
    }
    #[inline(always)]
    fn splat_f16x2(self, bits: u32) -> (__m512, __m512) {
        // SAFETY: see the impl comment. Lanes alternate lo, hi; duplicate evens and odds.
        unsafe {
            let v = _mm512_cvtph_ps(_mm256_set1_epi32(bits as i32));
            (_mm512_moveldup_ps(v), _mm512_movehdup_ps(v))
        }
    }
    #[inline(always)]
    fn reduce(self, v: __m512) -> f32 {
        // SAFETY: see the impl comment. Tree: (i, i+8), (i, i+4), (i, i+2), (0, 1).
        unsafe {
            let lo = _mm512_castps512_ps256(v);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            let s8 = _mm256_add_ps(lo, hi);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
            _mm_cvtss_f32(s1)
        }
    }
    #[inline(always)]
    fn reduce16(self, v: &[__m512; 16]) -> [f32; 16] {
        // The tree of `reduce` for 16 vectors at once, each add serving several vectors:
        // (i, i+8) of two vectors per add (halves), then (i, i+4) of four (128-bit quarters),
        // (i, i+2) within quarters, (0, 1). The same operand pairs as `reduce`, so the same
        // bits; lane 4q + j of the result holds the sum of v[4j + q].
        // SAFETY: see the impl comment.
        unsafe {
            // No closures here: they would not inherit the target features, so the intrinsics
            // could stay calls.
            let mut w = [_mm512_setzero_ps(); 8];
            for k in 0..8 {
                let (a, b) = (v[2 * k], v[2 * k + 1]);
                w[k] = _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0x44>(a, b),
                    _mm512_shuffle_f32x4::<0xee>(a, b),
                );
            }
            let mut z = [_mm512_setzero_ps(); 4];
            for m in 0..4 {
                let (a, b) = (w[2 * m], w[2 * m + 1]);
                z[m] = _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0x88>(a, b),
                    _mm512_shuffle_f32x4::<0xdd>(a, b),
                );
            }
            let mut u = [_mm512_setzero_ps(); 2];
            for p in 0..2 {
                let (a, b) = (z[2 * p], z[2 * p + 1]);
                u[p] =
                    _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xee>(a, b));
            }
            let (a, b) = (u[0], u[1]);
            let r = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(a, b), _mm512_shuffle_ps::<0xdd>(a, b));
            let mut t = [0f32; 16];
            _mm512_storeu_ps(t.as_mut_ptr(), r);
            let mut out = [0f32; 16];
            for (i, o) in out.iter_mut().enumerate() {
                *o = t[(i % 4) * 4 + i / 4];
            }
            out
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
    unsafe fn load(self, p: *const f32) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m512) {
        // SAFETY: see the impl comment.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut u16, v: __m512) {
        // SAFETY: see the impl comment. Same integer recipe as `math::f32_to_bf16`.
        unsafe {
            let b = _mm512_castps_si512(v);
            let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
            let r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
            let r = _mm512_srli_epi32::<16>(r);
            let nan = _mm512_or_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x40));
            let isnan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            let r = _mm512_mask_blend_epi32(isnan, r, nan);
            _mm256_storeu_si256(p.cast(), _mm512_cvtepi32_epi16(r));
        }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const u16) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_u8(self, p: *const u8) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_i8(self, p: *const u8) -> __m512i {
        // SAFETY: see the impl comment.
        unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())) }
    }
}
