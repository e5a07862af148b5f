//! Raw, thread-shareable access to activation buffers of either dtype, for the kernels.
//!
//! Ops check shapes once, then hand each thread a `Src`/`Dst` and a disjoint range of rows or
//! elements; these types carry the pointers across threads. A `Dst` rounds to bf16 whatever
//! its storage: an f32 output of a bf16-rounding op holds the rounded values.

use super::simd::{math, Simd};
use super::tensor::{CpuTensor, Data};

/// Read access to a tensor's elements (flat index = row * cols + col).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Src {
    Bf16(*const u16),
    F32(*const f32),
}

// SAFETY: a `Src` is only created from a tensor borrowed for the whole op, and only read.
unsafe impl Send for Src {}
// SAFETY: as above.
unsafe impl Sync for Src {}

impl Src {
    pub(crate) fn of(t: &CpuTensor) -> Src {
        match &t.data {
            Data::Bf16(v) => Src::Bf16(v.as_ptr()),
            Data::F32(v) => Src::F32(v.as_ptr()),
        }
    }

    /// # Safety
    /// Elements `i..i+16` exist.
    #[inline(always)]
    pub(crate) unsafe fn load<S: Simd>(self, s: S, i: usize) -> S::V {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Src::Bf16(p) => s.load_bf16(p.add(i)),
                Src::F32(p) => s.load(p.add(i)),
            }
        }
    }

    /// Elements `i..i+n` (n < 16), the other lanes 0.
    /// # Safety
    /// Elements `i..i+n` exist.
    #[inline(always)]
    pub(crate) unsafe fn load_n<S: Simd>(self, s: S, i: usize, n: usize) -> S::V {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Src::Bf16(p) => s.load_bf16_n(p.add(i), n),
                Src::F32(p) => s.load_n(p.add(i), n),
            }
        }
    }

    /// Element `i` as f32.
    /// # Safety
    /// Element `i` exists.
    #[inline(always)]
    pub(crate) unsafe fn get(self, i: usize) -> f32 {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Src::Bf16(p) => math::bf16_to_f32(*p.add(i)),
                Src::F32(p) => *p.add(i),
            }
        }
    }
}

/// Write access to a tensor's elements; every store rounds to bf16.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dst {
    Bf16(*mut u16),
    F32(*mut f32),
}

// SAFETY: a `Dst` is only created from a tensor mutably borrowed for the whole op, and
// threads write disjoint elements.
unsafe impl Send for Dst {}
// SAFETY: as above.
unsafe impl Sync for Dst {}

impl Dst {
    pub(crate) fn of(t: &mut CpuTensor) -> Dst {
        match &mut t.data {
            Data::Bf16(v) => Dst::Bf16(v.as_mut_ptr()),
            Data::F32(v) => Dst::F32(v.as_mut_ptr()),
        }
    }

    /// # Safety
    /// Elements `i..i+16` exist and no other thread writes them.
    #[inline(always)]
    pub(crate) unsafe fn store<S: Simd>(self, s: S, i: usize, v: S::V) {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Dst::Bf16(p) => s.store_bf16(p.add(i), v),
                Dst::F32(p) => s.store(p.add(i), math::round_bf16_v(s, v)),
            }
        }
    }

    /// # Safety
    /// Elements `i..i+n` exist and no other thread writes them.
    #[inline(always)]
    pub(crate) unsafe fn store_n<S: Simd>(self, s: S, i: usize, v: S::V, n: usize) {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Dst::Bf16(p) => s.store_bf16_n(p.add(i), v, n),
                Dst::F32(p) => s.store_n(p.add(i), math::round_bf16_v(s, v), n),
            }
        }
    }
}
