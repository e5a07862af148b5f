//! NEON level (aarch64): a 16-lane vector is four q registers, lanes 4i..4i+4 in `.0[i]`.
//!
//! NEON's `vmaxq_f32` propagates NaN, unlike the trait's `a > b ? a : b`, so min/max are
//! compare-selects. f16 loads go through the exact software conversion (stable Rust has no
//! `float16x4_t`); f16 weights are rare and only their loads pay for it.

use std::arch::aarch64::*;

use super::{math, Kernel, Simd};

/// Token: only constructed by [`Neon::detect`].
#[derive(Clone, Copy, Debug)]
pub struct Neon(());

impl Neon {
    pub fn detect() -> Option<Neon> {
        std::arch::is_aarch64_feature_detected!("neon").then_some(Neon(()))
    }
}

#[derive(Clone, Copy, Debug)]
pub struct F4x4([float32x4_t; 4]);
#[derive(Clone, Copy, Debug)]
pub struct I4x4([int32x4_t; 4]);

#[target_feature(enable = "neon")]
fn run_neon<K: Kernel>(s: Neon, k: K) -> K::Output {
    k.run(s)
}

macro_rules! each {
    ($t:ident, |$i:ident| $e:expr) => {
        // SAFETY: a `Neon` token exists only after `detect` confirmed NEON.
        $t(unsafe {
            [
                {
                    let $i = 0;
                    $e
                },
                {
                    let $i = 1;
                    $e
                },
                {
                    let $i = 2;
                    $e
                },
                {
                    let $i = 3;
                    $e
                },
            ]
        })
    };
}

// SAFETY (for every `unsafe` block in this impl): a `Neon` value exists only after `detect`
// confirmed NEON; pointer arguments carry the trait's validity contract.
impl Simd for Neon {
    type V = F4x4;
    type I = I4x4;
    const GEMM_MR: usize = 2;
    const GEMM_NR: usize = 2;
    const FAST_LUT: bool = false;

    #[inline(always)]
    fn vectorize<K: Kernel>(self, k: K) -> K::Output {
        // SAFETY: the token proves the feature is present.
        unsafe { run_neon(self, k) }
    }
    #[inline(always)]
    fn zero(self) -> F4x4 {
        each!(F4x4, |_i| vdupq_n_f32(0.0))
    }
    #[inline(always)]
    fn splat(self, x: f32) -> F4x4 {
        each!(F4x4, |_i| vdupq_n_f32(x))
    }
    #[inline(always)]
    fn add(self, a: F4x4, b: F4x4) -> F4x4 {
        each!(F4x4, |i| vaddq_f32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn sub(self, a: F4x4, b: F4x4) -> F4x4 {
        each!(F4x4, |i| vsubq_f32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn mul(self, a: F4x4, b: F4x4) -> F4x4 {
        each!(F4x4, |i| vmulq_f32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn div(self, a: F4x4, b: F4x4) -> F4x4 {
        each!(F4x4, |i| vdivq_f32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn fma(self, a: F4x4, b: F4x4, c: F4x4) -> F4x4 {
        each!(F4x4, |i| vfmaq_f32(c.0[i], a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn max(self, a: F4x4, b: F4x4) -> F4x4 {
        each!(F4x4, |i| vbslq_f32(vcgtq_f32(a.0[i], b.0[i]), a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn min(self, a: F4x4, b: F4x4) -> F4x4 {
        each!(F4x4, |i| vbslq_f32(vcltq_f32(a.0[i], b.0[i]), a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn round_even(self, a: F4x4) -> F4x4 {
        each!(F4x4, |i| vrndnq_f32(a.0[i]))
    }
    #[inline(always)]
    fn nan_select(self, x: F4x4, y: F4x4) -> F4x4 {
        // x == x is false exactly for NaN lanes.
        each!(F4x4, |i| vbslq_f32(vceqq_f32(x.0[i], x.0[i]), y.0[i], x.0[i]))
    }
    #[inline(always)]
    fn to_int(self, a: F4x4) -> I4x4 {
        each!(I4x4, |i| vcvtq_s32_f32(a.0[i]))
    }
    #[inline(always)]
    fn to_float(self, a: I4x4) -> F4x4 {
        each!(F4x4, |i| vcvtq_f32_s32(a.0[i]))
    }
    #[inline(always)]
    fn bitcast_f(self, a: I4x4) -> F4x4 {
        each!(F4x4, |i| vreinterpretq_f32_s32(a.0[i]))
    }
    #[inline(always)]
    fn bitcast_i(self, a: F4x4) -> I4x4 {
        each!(I4x4, |i| vreinterpretq_s32_f32(a.0[i]))
    }
    #[inline(always)]
    fn isplat(self, x: i32) -> I4x4 {
        each!(I4x4, |_i| vdupq_n_s32(x))
    }
    #[inline(always)]
    fn iadd(self, a: I4x4, b: I4x4) -> I4x4 {
        each!(I4x4, |i| vaddq_s32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn isub(self, a: I4x4, b: I4x4) -> I4x4 {
        each!(I4x4, |i| vsubq_s32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn and(self, a: I4x4, b: I4x4) -> I4x4 {
        each!(I4x4, |i| vandq_s32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn or(self, a: I4x4, b: I4x4) -> I4x4 {
        each!(I4x4, |i| vorrq_s32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    fn shl(self, a: I4x4, n: u32) -> I4x4 {
        let c = n as i32;
        each!(I4x4, |i| vreinterpretq_s32_u32(vshlq_u32(
            vreinterpretq_u32_s32(a.0[i]),
            vdupq_n_s32(c)
        )))
    }
    #[inline(always)]
    fn shr(self, a: I4x4, n: u32) -> I4x4 {
        let c = -(n as i32);
        each!(I4x4, |i| vreinterpretq_s32_u32(vshlq_u32(
            vreinterpretq_u32_s32(a.0[i]),
            vdupq_n_s32(c)
        )))
    }
    #[inline(always)]
    fn mask_bits(self, mask: u32, val: i32) -> I4x4 {
        const BITS: [u32; 4] = [1, 2, 4, 8];
        each!(I4x4, |i| {
            let bit = vld1q_u32(BITS.as_ptr());
            let m = vtstq_u32(vdupq_n_u32((mask >> (4 * i)) & 0xf), bit);
            vandq_s32(vreinterpretq_s32_u32(m), vdupq_n_s32(val))
        })
    }
    #[inline(always)]
    fn swap_pairs(self, v: F4x4) -> F4x4 {
        each!(F4x4, |i| vrev64q_f32(v.0[i]))
    }
    #[inline(always)]
    fn lut16(self, table: F4x4, idx: I4x4) -> F4x4 {
        let mut t = [0f32; 16];
        let mut i = [0i32; 16];
        let mut o = [0f32; 16];
        // SAFETY: every buffer holds 16 lanes.
        unsafe {
            self.store(t.as_mut_ptr(), table);
            for k in 0..4 {
                vst1q_s32(i.as_mut_ptr().add(4 * k), idx.0[k]);
            }
        }
        for (o, &i) in o.iter_mut().zip(&i) {
            *o = t[(i & 15) as usize];
        }
        // SAFETY: o holds 16 lanes.
        unsafe { self.load(o.as_ptr()) }
    }
    #[inline(always)]
    fn splat_f16(self, bits: u16) -> F4x4 {
        self.splat(math::f16_to_f32(bits))
    }
    #[inline(always)]
    fn splat_f16x2(self, bits: u32) -> (F4x4, F4x4) {
        (self.splat_f16(bits as u16), self.splat_f16((bits >> 16) as u16))
    }
    #[inline(always)]
    fn reduce(self, v: F4x4) -> f32 {
        // SAFETY: see the impl comment. Tree: (i, i+8), (i, i+4), (i, i+2), (0, 1).
        unsafe {
            let s8a = vaddq_f32(v.0[0], v.0[2]);
            let s8b = vaddq_f32(v.0[1], v.0[3]);
            let s4 = vaddq_f32(s8a, s8b);
            let s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
            vget_lane_f32::<0>(s2) + vget_lane_f32::<1>(s2)
        }
    }
    #[inline(always)]
    fn f16_to_f32(self, bits: u16) -> f32 {
        math::f16_to_f32(bits)
    }

    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> F4x4 {
        each!(F4x4, |i| vld1q_f32(p.add(4 * i)))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: F4x4) {
        for i in 0..4 {
            // SAFETY: see the impl comment.
            unsafe { vst1q_f32(p.add(4 * i), v.0[i]) };
        }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> F4x4 {
        each!(F4x4, |i| vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.add(4 * i)))))
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut u16, v: F4x4) {
        for i in 0..4 {
            // SAFETY: see the impl comment. Same integer recipe as `math::f32_to_bf16`.
            unsafe {
                let b = vreinterpretq_u32_f32(v.0[i]);
                let lsb = vandq_u32(vshrq_n_u32::<16>(b), vdupq_n_u32(1));
                let r = vshrq_n_u32::<16>(vaddq_u32(b, vaddq_u32(lsb, vdupq_n_u32(0x7fff))));
                let nan = vorrq_u32(vshrq_n_u32::<16>(b), vdupq_n_u32(0x40));
                let ok = vceqq_f32(v.0[i], v.0[i]);
                vst1_u16(p.add(4 * i), vmovn_u32(vbslq_u32(ok, r, nan)));
            }
        }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const u16) -> F4x4 {
        let mut t = [0f32; 16];
        for (j, v) in t.iter_mut().enumerate() {
            // SAFETY: the caller guarantees 16 readable elements.
            *v = math::f16_to_f32(unsafe { p.add(j).read_unaligned() });
        }
        // SAFETY: t is 16 elements.
        unsafe { self.load(t.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn load_u8(self, p: *const u8) -> I4x4 {
        // SAFETY: see the impl comment.
        unsafe {
            let b = vld1q_u8(p);
            let lo = vmovl_u8(vget_low_u8(b));
            let hi = vmovl_u8(vget_high_u8(b));
            I4x4([
                vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(lo))),
                vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(lo))),
                vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(hi))),
                vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(hi))),
            ])
        }
    }
    #[inline(always)]
    unsafe fn load_i8(self, p: *const u8) -> I4x4 {
        // SAFETY: see the impl comment.
        unsafe {
            let b = vld1q_s8(p.cast());
            let lo = vmovl_s8(vget_low_s8(b));
            let hi = vmovl_s8(vget_high_s8(b));
            I4x4([
                vmovl_s16(vget_low_s16(lo)),
                vmovl_s16(vget_high_s16(lo)),
                vmovl_s16(vget_low_s16(hi)),
                vmovl_s16(vget_high_s16(hi)),
            ])
        }
    }
}
