//! The portable level: 16 lanes as arrays, each operation the IEEE operation per lane.
//!
//! It is the definition the vector levels must match bit for bit, and the fallback on CPUs
//! without a supported vector ISA. `mul_add` is a true fused multiply-add on every platform
//! (a libm `fmaf` call where the hardware lacks FMA), so the lane arithmetic is exact-IEEE.

use super::{math, Kernel, Simd};

/// The scalar token (always available).
#[derive(Clone, Copy, Debug, Default)]
pub struct Scalar;

#[inline(always)]
fn map<T: Copy, U: Copy + Default>(a: [T; 16], f: impl Fn(T) -> U) -> [U; 16] {
    let mut o = [U::default(); 16];
    for i in 0..16 {
        o[i] = f(a[i]);
    }
    o
}

#[inline(always)]
fn zip<T: Copy, U: Copy + Default>(a: [T; 16], b: [T; 16], f: impl Fn(T, T) -> U) -> [U; 16] {
    let mut o = [U::default(); 16];
    for i in 0..16 {
        o[i] = f(a[i], b[i]);
    }
    o
}

impl Simd for Scalar {
    type V = [f32; 16];
    type I = [i32; 16];
    const GEMM_MR: usize = 2;
    const GEMM_NR: usize = 2;
    const FAST_LUT: bool = false;

    #[inline(always)]
    fn vectorize<K: Kernel>(self, k: K) -> K::Output {
        k.run(self)
    }
    #[inline(always)]
    fn zero(self) -> Self::V {
        [0.0; 16]
    }
    #[inline(always)]
    fn splat(self, x: f32) -> Self::V {
        [x; 16]
    }
    #[inline(always)]
    fn add(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| x + y)
    }
    #[inline(always)]
    fn sub(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| x - y)
    }
    #[inline(always)]
    fn mul(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| x * y)
    }
    #[inline(always)]
    fn div(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| x / y)
    }
    #[inline(always)]
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        let mut o = [0.0; 16];
        for i in 0..16 {
            o[i] = a[i].mul_add(b[i], c[i]);
        }
        o
    }
    #[inline(always)]
    fn max(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| if x > y { x } else { y })
    }
    #[inline(always)]
    fn min(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| if x < y { x } else { y })
    }
    #[inline(always)]
    fn round_even(self, a: Self::V) -> Self::V {
        map(a, f32::round_ties_even)
    }
    #[inline(always)]
    fn nan_select(self, x: Self::V, y: Self::V) -> Self::V {
        zip(x, y, |a, b| if a.is_nan() { a } else { b })
    }
    #[inline(always)]
    fn to_int(self, a: Self::V) -> Self::I {
        map(a, |x| x as i32)
    }
    #[inline(always)]
    fn to_float(self, a: Self::I) -> Self::V {
        map(a, |x| x as f32)
    }
    #[inline(always)]
    fn bitcast_f(self, a: Self::I) -> Self::V {
        map(a, |x| f32::from_bits(x as u32))
    }
    #[inline(always)]
    fn bitcast_i(self, a: Self::V) -> Self::I {
        map(a, |x| x.to_bits() as i32)
    }
    #[inline(always)]
    fn isplat(self, x: i32) -> Self::I {
        [x; 16]
    }
    #[inline(always)]
    fn iadd(self, a: Self::I, b: Self::I) -> Self::I {
        zip(a, b, i32::wrapping_add)
    }
    #[inline(always)]
    fn isub(self, a: Self::I, b: Self::I) -> Self::I {
        zip(a, b, i32::wrapping_sub)
    }
    #[inline(always)]
    fn and(self, a: Self::I, b: Self::I) -> Self::I {
        zip(a, b, |x, y| x & y)
    }
    #[inline(always)]
    fn or(self, a: Self::I, b: Self::I) -> Self::I {
        zip(a, b, |x, y| x | y)
    }
    #[inline(always)]
    fn shl(self, a: Self::I, n: u32) -> Self::I {
        map(a, |x| ((x as u32) << n) as i32)
    }
    #[inline(always)]
    fn shr(self, a: Self::I, n: u32) -> Self::I {
        map(a, |x| ((x as u32) >> n) as i32)
    }
    #[inline(always)]
    fn mask_bits(self, mask: u32, val: i32) -> Self::I {
        let mut o = [0; 16];
        for (j, v) in o.iter_mut().enumerate() {
            if (mask >> j) & 1 != 0 {
                *v = val;
            }
        }
        o
    }
    #[inline(always)]
    fn swap_pairs(self, v: Self::V) -> Self::V {
        let mut o = v;
        for i in 0..8 {
            o.swap(2 * i, 2 * i + 1);
        }
        o
    }
    #[inline(always)]
    fn lut16(self, table: Self::V, idx: Self::I) -> Self::V {
        map(idx, |i| table[(i & 15) as usize])
    }
    #[inline(always)]
    fn splat_f16(self, bits: u16) -> Self::V {
        [math::f16_to_f32(bits); 16]
    }
    #[inline(always)]
    fn splat_f16x2(self, bits: u32) -> (Self::V, Self::V) {
        (self.splat_f16(bits as u16), self.splat_f16((bits >> 16) as u16))
    }
    #[inline(always)]
    fn reduce(self, v: Self::V) -> f32 {
        let mut t = v;
        for w in [8, 4, 2, 1] {
            for i in 0..w {
                t[i] += t[i + w];
            }
        }
        t[0]
    }
    #[inline(always)]
    fn f16_to_f32(self, bits: u16) -> f32 {
        math::f16_to_f32(bits)
    }

    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees 16 readable elements; [f32; 16] has f32 alignment
        // and read_unaligned needs none.
        unsafe { p.cast::<[f32; 16]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: Self::V) {
        // SAFETY: the caller guarantees 16 writable elements.
        unsafe { p.cast::<[f32; 16]>().write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> Self::V {
        // SAFETY: the caller guarantees 16 readable elements.
        let h = unsafe { p.cast::<[u16; 16]>().read_unaligned() };
        map(h, math::bf16_to_f32)
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut u16, v: Self::V) {
        // SAFETY: the caller guarantees 16 writable elements.
        unsafe { p.cast::<[u16; 16]>().write_unaligned(map(v, math::f32_to_bf16)) }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const u16) -> Self::V {
        // SAFETY: the caller guarantees 16 readable elements.
        let h = unsafe { p.cast::<[u16; 16]>().read_unaligned() };
        map(h, math::f16_to_f32)
    }
    #[inline(always)]
    unsafe fn load_u8(self, p: *const u8) -> Self::I {
        // SAFETY: the caller guarantees 16 readable bytes.
        let b = unsafe { p.cast::<[u8; 16]>().read_unaligned() };
        map(b, |x| x as i32)
    }
    #[inline(always)]
    unsafe fn load_i8(self, p: *const u8) -> Self::I {
        // SAFETY: the caller guarantees 16 readable bytes.
        let b = unsafe { p.cast::<[u8; 16]>().read_unaligned() };
        map(b, |x| x as i8 as i32)
    }
}
