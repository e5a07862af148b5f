//! One 16-lane vector abstraction under every CPU kernel, and the runtime choice of ISA.
//!
//! Kernels are written once, generic over [`Simd`], whose vector `V` always has 16 f32 lanes
//! (one AVX-512 register, two AVX2 registers, four NEON registers, or an array for the scalar
//! fallback). Because a kernel's arithmetic is expressed lane by lane in IEEE operations that
//! every ISA performs identically (add, mul, div, fma, compare-select, integer bit ops), **every
//! level produces the same bits**; the test suite checks it per op and per weight format.
//! Where an ISA has no exact equivalent (NaN behaviour of min/max, f32->bf16 rounding), the
//! trait defines the semantics and each level emulates it:
//! - `max(a, b) = if a > b { a } else { b }` (x86 `maxps` order), `min` likewise;
//! - bf16 stores round to nearest even with quiet NaNs, never via `VCVTNEPS2BF16` (which
//!   flushes denormals);
//! - `reduce` sums the 16 lanes in one tree: lanes i and i+8, then i and i+4, i and i+2, 0 and 1.
//!
//! NaN *payloads and signs* are the one exception: Rust leaves them unspecified (the compiler
//! may commute an addition), so levels agree on which values are NaN, not on their bits.
//!
//! A kernel runs under the ISA's `#[target_feature]` through [`Simd::vectorize`]: every
//! function between it and the intrinsics is `#[inline(always)]`, so the intrinsics inline
//! into the feature-enabled function (the `pulp` crate's pattern). Rejected: one hand-written
//! kernel per ISA (four copies of every format decoder to keep bit-identical by hand), and
//! compile-time `target-cpu` builds (the binary must run on any x86-64).

pub mod math;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "aarch64")]
pub mod neon;

use std::fmt;

/// A kernel body to run under one ISA: `run` is instantiated per [`Simd`] type and inlined
/// into that ISA's `#[target_feature]` function, so its implementations must be
/// `#[inline(always)]`.
pub trait Kernel {
    type Output;
    fn run<S: Simd>(self, s: S) -> Self::Output;
}

/// Instruction-set level of the CPU kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimdLevel {
    /// Portable Rust emulating the 16 lanes (bit-identical to the vector levels).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C, two 8-lane registers per vector.
    Avx2,
    /// x86-64 AVX-512 F/BW/DQ/VL, one register per vector.
    Avx512,
    /// aarch64 NEON (Advanced SIMD), four 4-lane registers per vector.
    Neon,
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Neon => "neon",
        })
    }
}

impl SimdLevel {
    /// The best level this CPU supports.
    pub fn detect() -> SimdLevel {
        [SimdLevel::Avx512, SimdLevel::Avx2, SimdLevel::Neon]
            .into_iter()
            .find(|l| l.supported())
            .unwrap_or(SimdLevel::Scalar)
    }

    /// Whether this CPU (and OS) can run the level.
    pub fn supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => avx2::Avx2::detect().is_some(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => avx512::Avx512::detect().is_some(),
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => neon::Neon::detect().is_some(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every level this CPU supports, scalar first.
    pub fn all_supported() -> Vec<SimdLevel> {
        [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Neon]
            .into_iter()
            .filter(|l| l.supported())
            .collect()
    }

    /// Runs `k` at this level. A level the CPU lacks runs as scalar (callers check
    /// [`SimdLevel::supported`] when they construct a backend, so this is a safety net).
    #[inline]
    pub fn dispatch<K: Kernel>(self, k: K) -> K::Output {
        match self {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => match avx512::Avx512::detect() {
                Some(s) => s.vectorize(k),
                None => scalar::Scalar.vectorize(k),
            },
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => match avx2::Avx2::detect() {
                Some(s) => s.vectorize(k),
                None => scalar::Scalar.vectorize(k),
            },
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => match neon::Neon::detect() {
                Some(s) => s.vectorize(k),
                None => scalar::Scalar.vectorize(k),
            },
            _ => scalar::Scalar.vectorize(k),
        }
    }
}

/// 16 f32 lanes (`V`) and 16 i32 lanes (`I`). A value of a type implementing `Simd` is a
/// token proving the CPU supports the ISA (constructed only by runtime detection).
///
/// Loads and stores take raw pointers: the caller guarantees `p` is valid for the 16 (or
/// `n`) elements read or written; no alignment is required.
pub trait Simd: Copy + Send + Sync + 'static {
    type V: Copy;
    type I: Copy;
    /// Register tile of the GEMM micro-kernel (rows x columns of accumulators), sized to the
    /// ISA's register file; it changes no element's arithmetic.
    const GEMM_MR: usize;
    const GEMM_NR: usize;
    /// Whether `lut16` is one instruction (then 4-bit codes are decoded by table lookup;
    /// otherwise by convert + fma, which gives the same values).
    const FAST_LUT: bool;

    /// Runs `k` inside a function compiled with this ISA's target features.
    fn vectorize<K: Kernel>(self, k: K) -> K::Output;

    fn zero(self) -> Self::V;
    fn splat(self, x: f32) -> Self::V;
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c` with one rounding.
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `if a > b { a } else { b }` per lane.
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// `if a < b { a } else { b }` per lane.
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    /// Round to the nearest integer, ties to even.
    fn round_even(self, a: Self::V) -> Self::V;
    /// `x` where `x` is NaN, else `y`.
    fn nan_select(self, x: Self::V, y: Self::V) -> Self::V;
    /// Truncating float -> int conversion (callers pass values within i32 range).
    fn to_int(self, a: Self::V) -> Self::I;
    /// Exact int -> float conversion for |a| < 2^24.
    fn to_float(self, a: Self::I) -> Self::V;
    fn bitcast_f(self, a: Self::I) -> Self::V;
    fn bitcast_i(self, a: Self::V) -> Self::I;
    fn isplat(self, x: i32) -> Self::I;
    fn iadd(self, a: Self::I, b: Self::I) -> Self::I;
    fn isub(self, a: Self::I, b: Self::I) -> Self::I;
    fn and(self, a: Self::I, b: Self::I) -> Self::I;
    fn or(self, a: Self::I, b: Self::I) -> Self::I;
    /// Logical shifts by `n < 32`.
    fn shl(self, a: Self::I, n: u32) -> Self::I;
    fn shr(self, a: Self::I, n: u32) -> Self::I;
    /// Lane j = `val` if bit j of `mask` is set, else 0.
    fn mask_bits(self, mask: u32, val: i32) -> Self::I;
    /// Lanes 2i and 2i+1 exchanged.
    fn swap_pairs(self, v: Self::V) -> Self::V;
    /// Lane i = `table[idx[i] & 15]`.
    fn lut16(self, table: Self::V, idx: Self::I) -> Self::V;
    /// The binary16 value `bits` in every lane (exact).
    fn splat_f16(self, bits: u16) -> Self::V;
    /// The binary16 values of the low and high halves of `bits`, each in every lane.
    fn splat_f16x2(self, bits: u32) -> (Self::V, Self::V);
    /// The 16 lanes summed in the fixed tree (8+8, 4+4, 2+2, 1+1).
    fn reduce(self, v: Self::V) -> f32;
    /// `out[i] = self.reduce(v[i])` bit for bit: the same tree for 16 vectors at once (a
    /// level may interleave them, as AVX-512 does with 15 adds instead of 60).
    #[inline(always)]
    fn reduce16(self, v: &[Self::V; 16]) -> [f32; 16] {
        let mut out = [0f32; 16];
        for (o, &x) in out.iter_mut().zip(v) {
            *o = self.reduce(x);
        }
        out
    }
    /// Exact IEEE binary16 -> f32.
    fn f16_to_f32(self, bits: u16) -> f32;
    /// A hint to bring the cache line of `p` in; `p` need not be valid (never dereferenced).
    #[inline(always)]
    fn prefetch(self, _p: *const u8) {}

    /// # Safety
    /// `p` valid for 16 reads.
    unsafe fn load(self, p: *const f32) -> Self::V;
    /// # Safety
    /// `p` valid for 16 writes.
    unsafe fn store(self, p: *mut f32, v: Self::V);
    /// bf16 bit patterns widened exactly.
    /// # Safety
    /// `p` valid for 16 reads.
    unsafe fn load_bf16(self, p: *const u16) -> Self::V;
    /// Rounded to nearest even (NaN stays a quiet NaN).
    /// # Safety
    /// `p` valid for 16 writes.
    unsafe fn store_bf16(self, p: *mut u16, v: Self::V);
    /// binary16 widened exactly.
    /// # Safety
    /// `p` valid for 16 reads.
    unsafe fn load_f16(self, p: *const u16) -> Self::V;
    /// 16 bytes zero-extended.
    /// # Safety
    /// `p` valid for 16 reads.
    unsafe fn load_u8(self, p: *const u8) -> Self::I;
    /// 16 bytes sign-extended.
    /// # Safety
    /// `p` valid for 16 reads.
    unsafe fn load_i8(self, p: *const u8) -> Self::I;

    /// First `n < 16` lanes from `p`, the rest 0.
    /// # Safety
    /// `p` valid for `n` reads.
    #[inline(always)]
    unsafe fn load_n(self, p: *const f32, n: usize) -> Self::V {
        let mut t = [0f32; 16];
        // SAFETY: the caller guarantees n readable elements; t holds 16 >= n.
        unsafe { std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), n.min(16)) };
        // SAFETY: t is 16 elements.
        unsafe { self.load(t.as_ptr()) }
    }
    /// # Safety
    /// `p` valid for `n` writes.
    #[inline(always)]
    unsafe fn store_n(self, p: *mut f32, v: Self::V, n: usize) {
        let mut t = [0f32; 16];
        // SAFETY: t is 16 elements.
        unsafe { self.store(t.as_mut_ptr(), v) };
        // SAFETY: the caller guarantees n writable elements.
        unsafe { std::ptr::copy_nonoverlapping(t.as_ptr(), p, n.min(16)) };
    }
    /// # Safety
    /// `p` valid for `n` reads.
    #[inline(always)]
    unsafe fn load_bf16_n(self, p: *const u16, n: usize) -> Self::V {
        let mut t = [0u16; 16];
        // SAFETY: as in `load_n`.
        unsafe { std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), n.min(16)) };
        // SAFETY: t is 16 elements.
        unsafe { self.load_bf16(t.as_ptr()) }
    }
    /// # Safety
    /// `p` valid for `n` reads.
    #[inline(always)]
    unsafe fn load_f16_n(self, p: *const u16, n: usize) -> Self::V {
        let mut t = [0u16; 16];
        // SAFETY: as in `load_n`.
        unsafe { std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), n.min(16)) };
        // SAFETY: t is 16 elements.
        unsafe { self.load_f16(t.as_ptr()) }
    }
    /// # Safety
    /// `p` valid for `n` writes.
    #[inline(always)]
    unsafe fn store_bf16_n(self, p: *mut u16, v: Self::V, n: usize) {
        let mut t = [0u16; 16];
        // SAFETY: t is 16 elements.
        unsafe { self.store_bf16(t.as_mut_ptr(), v) };
        // SAFETY: the caller guarantees n writable elements.
        unsafe { std::ptr::copy_nonoverlapping(t.as_ptr(), p, n.min(16)) };
    }
}
