//! Decoding each weight format into 16-lane f32 chunks, in registers.
//!
//! A row is a sequence of blocks (`BLOCK` elements in `BYTES` bytes); `chunk(c)` yields
//! elements `16c..16c+16` of a block exactly as f32. Layouts and formulas are those of
//! /work/shared/notes/quant-formats.md §3.3 (ggml `dequantize_row_*`), and the values are
//! exact: a code times an f16 scale, plus an f16 min, fits in f32, so `fma(d, q, m)` and
//! `d*q + m` agree and equal `tf_checkpoint::quant::dequantize_row`. K-quant scales are
//! `s = d*sc` and `b = -dmin*m` (both exact), then `w = fma(s, q, b)`; Q6_K is `(d*sc)*q`,
//! ggml's order. Plain formats use 16-element blocks plus a zero-filled tail chunk, so any
//! `k` works; ggml rows are whole blocks by construction (checked at load).
//!
//! Where the ISA has a one-instruction 16-entry lookup (`vpermps` on AVX-512), 4-bit codes
//! are decoded through a per-block table of `fma(d, i, m)` (or `d*(i-8)`),
//! which holds exactly the values the per-element formula gives; elsewhere the formula runs per
//! element (convert + fma). Rejected for 5-bit codes (a 32-entry `vpermt2ps` lookup measured
//! slower on Zen 4), K-quants and Q8_0 (tables rebuilt every sub-block, or 64-256 entries).

use super::super::simd::{Kernel, Simd, SimdLevel};
use super::super::weight::WeightFormat;

/// One weight format. `scales` is computed once per block, `chunk` once per 16 elements.
pub(crate) trait Format: Copy + Send + Sync + 'static {
    const BLOCK: usize;
    const BYTES: usize;
    /// Plain formats: rows may end in a partial 16-element chunk.
    const TAILED: bool = false;
    /// Per-block values (scales, or decoded lookup tables) held in registers.
    type Scales<S: Simd>: Copy;
    /// # Safety
    /// `blk` valid for `BYTES` reads.
    unsafe fn scales<S: Simd>(s: S, blk: *const u8) -> Self::Scales<S>;
    /// Elements `16c..16c+16` of the block, `c < BLOCK/16`.
    /// # Safety
    /// `blk` valid for `BYTES` reads.
    unsafe fn chunk<S: Simd>(s: S, blk: *const u8, sc: &Self::Scales<S>, c: usize) -> S::V;
    /// The last `n < 16` elements of a row of a plain format, zero-filled.
    /// # Safety
    /// `p` valid for `n` elements.
    #[inline(always)]
    unsafe fn tail<S: Simd>(s: S, _p: *const u8, _n: usize) -> S::V {
        s.zero()
    }
}

#[inline(always)]
unsafe fn rd_u16(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees 2 readable bytes.
    u16::from_le_bytes(unsafe { p.cast::<[u8; 2]>().read_unaligned() })
}

#[inline(always)]
unsafe fn rd_u32(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees 4 readable bytes.
    u32::from_le_bytes(unsafe { p.cast::<[u8; 4]>().read_unaligned() })
}

/// 0, 1, ..., 15.
const IOTA: [f32; 16] = [0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.];

#[inline(always)]
fn iota<S: Simd>(s: S) -> S::V {
    // SAFETY: IOTA holds 16 values.
    unsafe { s.load(IOTA.as_ptr()) }
}

/// The 4-bit codes of a 32-element block: low nibbles of the 16 bytes at `p` (c == 0) or
/// high nibbles (c == 1). With `masked == false` the low chunk keeps garbage above bit 3,
/// which `lut16` ignores.
#[inline(always)]
unsafe fn nibbles<S: Simd>(s: S, p: *const u8, high: bool, masked: bool) -> S::I {
    // SAFETY: the caller guarantees 16 readable bytes.
    let b = unsafe { s.load_u8(p) };
    if high {
        s.shr(b, 4)
    } else if masked {
        s.and(b, s.isplat(0xf))
    } else {
        b
    }
}

/// `w = d*q + m` for a 4-bit code of a 32-element block: a table lookup where the ISA has
/// one (the table holds `fma(d, i, m)` for i < 16, the very values the fma gives per element).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Affine4<S: Simd> {
    d: S::V,
    m: S::V,
    table: S::V,
}

impl<S: Simd> Affine4<S> {
    #[inline(always)]
    fn new(s: S, d: S::V, m: S::V) -> Self {
        let table = if S::FAST_LUT { s.fma(d, iota(s), m) } else { d };
        Affine4 { d, m, table }
    }

    /// Chunk c of the codes at `qs` (16 bytes).
    #[inline(always)]
    unsafe fn chunk(&self, s: S, qs: *const u8, c: usize) -> S::V {
        // SAFETY: forwarded from the caller.
        let q = unsafe { nibbles(s, qs, c == 1, !S::FAST_LUT) };
        if S::FAST_LUT {
            s.lut16(self.table, q)
        } else {
            s.fma(self.d, s.to_float(q), self.m)
        }
    }
}

/// `w = d*q + m` for 5-bit codes (convert + fma: a 32-entry lookup measured slower).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Affine5<S: Simd> {
    d: S::V,
    m: S::V,
}

impl<S: Simd> Affine5<S> {
    /// Chunk c: low 4 bits from the 16 bytes at `qs`, bit 4 from bits `16c..16c+16` of `qh`.
    #[inline(always)]
    unsafe fn chunk(&self, s: S, qs: *const u8, qh: u32, c: usize) -> S::V {
        // SAFETY: forwarded from the caller.
        let lo = unsafe { nibbles(s, qs, c == 1, true) };
        let q = s.or(lo, s.mask_bits(qh >> (16 * c), 16));
        s.fma(self.d, s.to_float(q), self.m)
    }
}

macro_rules! plain {
    ($name:ident, $size:expr, $load:ident, $load_n:ident, $t:ty) => {
        #[derive(Clone, Copy, Debug)]
        pub(crate) struct $name;
        impl Format for $name {
            const BLOCK: usize = 16;
            const BYTES: usize = 16 * $size;
            const TAILED: bool = true;
            type Scales<S: Simd> = ();
            #[inline(always)]
            unsafe fn scales<S: Simd>(_s: S, _blk: *const u8) {}
            #[inline(always)]
            unsafe fn chunk<S: Simd>(s: S, blk: *const u8, _sc: &(), _c: usize) -> S::V {
                // SAFETY: the caller guarantees a whole block.
                unsafe { s.$load(blk.cast::<$t>()) }
            }
            #[inline(always)]
            unsafe fn tail<S: Simd>(s: S, p: *const u8, n: usize) -> S::V {
                // SAFETY: the caller guarantees n elements.
                unsafe { s.$load_n(p.cast::<$t>(), n) }
            }
        }
    };
}

plain!(Bf16, 2, load_bf16, load_bf16_n, u16);
plain!(F16, 2, load_f16, load_f16_n, u16);
plain!(F32, 4, load, load_n, f32);

/// Q4_0: d@0 f16, qs[16]@2; `w = d*(q-8)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q4_0;
impl Format for Q4_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 18;
    type Scales<S: Simd> = Affine4<S>;
    #[inline(always)]
    unsafe fn scales<S: Simd>(s: S, blk: *const u8) -> Affine4<S> {
        // SAFETY: a whole block is readable.
        let d = s.splat_f16(unsafe { rd_u16(blk) });
        // d*(q-8) == fma(d, q, -8d): both exact.
        Affine4::new(s, d, s.mul(d, s.splat(-8.0)))
    }
    #[inline(always)]
    unsafe fn chunk<S: Simd>(s: S, blk: *const u8, sc: &Affine4<S>, c: usize) -> S::V {
        // SAFETY: qs spans bytes 2..18.
        unsafe { sc.chunk(s, blk.add(2), c) }
    }
}

/// Q4_1: d@0, m@2 (f16), qs[16]@4; `w = d*q + m`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q4_1;
impl Format for Q4_1 {
    const BLOCK: usize = 32;
    const BYTES: usize = 20;
    type Scales<S: Simd> = Affine4<S>;
    #[inline(always)]
    unsafe fn scales<S: Simd>(s: S, blk: *const u8) -> Affine4<S> {
        // SAFETY: a whole block is readable.
        let (d, m) = s.splat_f16x2(unsafe { rd_u32(blk) });
        Affine4::new(s, d, m)
    }
    #[inline(always)]
    unsafe fn chunk<S: Simd>(s: S, blk: *const u8, sc: &Affine4<S>, c: usize) -> S::V {
        // SAFETY: qs spans bytes 4..20.
        unsafe { sc.chunk(s, blk.add(4), c) }
    }
}

/// Q5_0: d@0, qh@2 (u32), qs[16]@6; bit j of qh is bit 4 of element j; `w = d*(q-16)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q5_0;
impl Format for Q5_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 22;
    type Scales<S: Simd> = (Affine5<S>, u32);
    #[inline(always)]
    unsafe fn scales<S: Simd>(s: S, blk: *const u8) -> (Affine5<S>, u32) {
        // SAFETY: a whole block is readable.
        let (d, qh) = unsafe { (s.splat_f16(rd_u16(blk)), rd_u32(blk.add(2))) };
        (Affine5 { d, m: s.mul(d, s.splat(-16.0)) }, qh)
    }
    #[inline(always)]
    unsafe fn chunk<S: Simd>(s: S, blk: *const u8, sc: &(Affine5<S>, u32), c: usize) -> S::V {
        // SAFETY: qs spans bytes 6..22.
        unsafe { sc.0.chunk(s, blk.add(6), sc.1, c) }
    }
}

/// Q5_1: d@0, m@2, qh@4, qs[16]@8; `w = d*q + m`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q5_1;
impl Format for Q5_1 {
    const BLOCK: usize = 32;
    const BYTES: usize = 24;
    type Scales<S: Simd> = (Affine5<S>, u32);
    #[inline(always)]
    unsafe fn scales<S: Simd>(s: S, blk: *const u8) -> (Affine5<S>, u32) {
        // SAFETY: a whole block is readable.
        let ((d, m), qh) = unsafe { (s.splat_f16x2(rd_u32(blk)), rd_u32(blk.add(4))) };
        (Affine5 { d, m }, qh)
    }
    #[inline(always)]
    unsafe fn chunk<S: Simd>(s: S, blk: *const u8, sc: &(Affine5<S>, u32), c: usize) -> S::V {
        // SAFETY: qs spans bytes 8..24.
        unsafe { sc.0.chunk(s, blk.add(8), sc.1, c) }
    }
}

/// Q8_0: d@0 f16, qs[32] int8 @2; `w = d*q`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q8_0;
impl Format for Q8_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 34;
    type Scales<S: Simd> = S::V;
    #[inline(always)]
    unsafe fn scales<S: Simd>(s: S, blk: *const u8) -> S::V {
        // SAFETY: a whole block is readable.
        s.splat_f16(unsafe { rd_u16(blk) })
    }
    #[inline(always)]
    unsafe fn chunk<S: Simd>(s: S, blk: *const u8, d: &S::V, c: usize) -> S::V {
        // SAFETY: qs spans bytes 2..34.
        let q = unsafe { s.load_i8(blk.add(2 + 16 * c)) };
        s.mul(*d, s.to_float(q))
    }
}

/// The 6-bit (scale, min) pair `j` of a Q4_K/Q5_K block (ggml `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Per 32-element sub-block `(s, b)` of a Q4_K/Q5_K block: `s = d*sc`, `b = -(dmin*m)`.
#[inline(always)]
unsafe fn k4_scales<S: Simd>(s: S, blk: *const u8) -> [(f32, f32); 8] {
    // SAFETY: the caller guarantees a whole block (d@0, dmin@2, scales[12]@4).
    let (d, dmin, q) = unsafe {
        (
            s.f16_to_f32(rd_u16(blk)),
            s.f16_to_f32(rd_u16(blk.add(2))),
            blk.add(4).cast::<[u8; 12]>().read_unaligned(),
        )
    };
    let mut out = [(0f32, 0f32); 8];
    for (j, o) in out.iter_mut().enumerate() {
        let (sc, m) = scale_min_k4(j, &q);
        *o = (d * sc as f32, -(dmin * m as f32));
    }
    out
}

/// Q4_K: d@0, dmin@2, scales[12]@4, qs[128]@16; element `64c + 32t + l` is nibble t of
/// `qs[32c + l]`, sub-block `i = 2c + t`; `w = d*sc_i*q - dmin*m_i`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q4K;
impl Format for Q4K {
    const BLOCK: usize = 256;
    const BYTES: usize = 144;
    type Scales<S: Simd> = [(f32, f32); 8];
    #[inline(always)]
    unsafe fn scales<S: Simd>(s: S, blk: *const u8) -> [(f32, f32); 8] {
        // SAFETY: a whole block is readable.
        unsafe { k4_scales(s, blk) }
    }
    #[inline(always)]
    unsafe fn chunk<S: Simd>(s: S, blk: *const u8, sc: &[(f32, f32); 8], c: usize) -> S::V {
        let (g, t, half) = (c / 4, (c / 2) % 2, c % 2);
        // SAFETY: qs spans bytes 16..144; 16 + 32g + 16half + 16 <= 144.
        let q = unsafe { nibbles(s, blk.add(16 + 32 * g + 16 * half), t == 1, true) };
        let (sv, bv) = sc[c / 2];
        s.fma(s.splat(sv), s.to_float(q), s.splat(bv))
    }
}

/// Q5_K: as Q4_K with qh[32]@16 and qs[128]@48; bit i of `qh[l]` is bit 4 of the element.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q5K;
impl Format for Q5K {
    const BLOCK: usize = 256;
    const BYTES: usize = 176;
    type Scales<S: Simd> = [(f32, f32); 8];
    #[inline(always)]
    unsafe fn scales<S: Simd>(s: S, blk: *const u8) -> [(f32, f32); 8] {
        // SAFETY: a whole block is readable.
        unsafe { k4_scales(s, blk) }
    }
    #[inline(always)]
    unsafe fn chunk<S: Simd>(s: S, blk: *const u8, sc: &[(f32, f32); 8], c: usize) -> S::V {
        let (g, t, half, i) = (c / 4, (c / 2) % 2, c % 2, (c / 2) as u32);
        // SAFETY: qs spans 48..176 and qh 16..48; the offsets below stay inside.
        let (lo, h) = unsafe {
            (
                nibbles(s, blk.add(48 + 32 * g + 16 * half), t == 1, true),
                s.load_u8(blk.add(16 + 16 * half)),
            )
        };
        let hb = s.shl(s.and(s.shr(h, i), s.isplat(1)), 4);
        let (sv, bv) = sc[c / 2];
        s.fma(s.splat(sv), s.to_float(s.or(lo, hb)), s.splat(bv))
    }
}

/// Q6_K: ql[128]@0, qh[64]@128, scales[16] int8 @192, d@208; element `128h + 32s + l` has
/// low 4 bits `ql[64h + 32(s&1) + l] >> 4(s>>1)`, high 2 bits `qh[32h + l] >> 2s`, minus 32;
/// `w = (d*sc[8h + 2s + l/16]) * q`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q6K;
impl Format for Q6K {
    const BLOCK: usize = 256;
    const BYTES: usize = 210;
    type Scales<S: Simd> = f32;
    #[inline(always)]
    unsafe fn scales<S: Simd>(s: S, blk: *const u8) -> f32 {
        // SAFETY: a whole block is readable.
        s.f16_to_f32(unsafe { rd_u16(blk.add(208)) })
    }
    #[inline(always)]
    unsafe fn chunk<S: Simd>(s: S, blk: *const u8, d: &f32, c: usize) -> S::V {
        let (h, sub, half) = (c / 8, (c % 8) / 2, c % 2);
        // SAFETY: ql spans 0..128, qh 128..192, scales 192..208; offsets stay inside.
        let (lo, hi, sc) = unsafe {
            (
                nibbles(s, blk.add(64 * h + 32 * (sub & 1) + 16 * half), sub >= 2, true),
                s.load_u8(blk.add(128 + 32 * h + 16 * half)),
                *blk.add(192 + 8 * h + 2 * sub + half) as i8,
            )
        };
        let hi = s.shl(s.and(s.shr(hi, 2 * sub as u32), s.isplat(3)), 4);
        let q = s.isub(s.or(lo, hi), s.isplat(32));
        s.mul(s.splat(*d * sc as f32), s.to_float(q))
    }
}

/// Runs `$body` with `$F` bound to the `Format` type of `$fmt`.
macro_rules! with_format {
    ($fmt:expr, $F:ident => $body:expr) => {{
        use $crate::cpu::linear::formats as fm;
        use $crate::cpu::weight::WeightFormat as W;
        match $fmt {
            W::Bf16 => {
                type $F = fm::Bf16;
                $body
            }
            W::F16 => {
                type $F = fm::F16;
                $body
            }
            W::F32 => {
                type $F = fm::F32;
                $body
            }
            W::Q4_0 => {
                type $F = fm::Q4_0;
                $body
            }
            W::Q4_1 => {
                type $F = fm::Q4_1;
                $body
            }
            W::Q5_0 => {
                type $F = fm::Q5_0;
                $body
            }
            W::Q5_1 => {
                type $F = fm::Q5_1;
                $body
            }
            W::Q8_0 => {
                type $F = fm::Q8_0;
                $body
            }
            W::Q4_K => {
                type $F = fm::Q4K;
                $body
            }
            W::Q5_K => {
                type $F = fm::Q5K;
                $body
            }
            W::Q6_K => {
                type $F = fm::Q6K;
                $body
            }
        }
    }};
}
pub(crate) use with_format;

/// Decodes `k` elements of one row into `out` (f32), chunk by chunk: writes
/// `round_up(k, 16)` values, the tail zero-filled.
///
/// # Safety
/// `row` valid for a whole row of `k` elements; `out` valid for `round_up(k, 16)` writes.
#[inline(always)]
pub(crate) unsafe fn decode_row_into<S: Simd, F: Format>(
    s: S,
    row: *const u8,
    k: usize,
    out: *mut f32,
) {
    let nblocks = k / F::BLOCK;
    for b in 0..nblocks {
        // SAFETY: block b lies within the row; its outputs within `out`.
        unsafe {
            let blk = row.add(b * F::BYTES);
            let sc = F::scales(s, blk);
            for c in 0..F::BLOCK / 16 {
                s.store(out.add(b * F::BLOCK + 16 * c), F::chunk(s, blk, &sc, c));
            }
        }
    }
    let rem = k - nblocks * F::BLOCK;
    if F::TAILED && rem > 0 {
        // SAFETY: the tail's `rem` elements follow the blocks; out has a 16-lane slot there.
        unsafe {
            let v = F::tail(s, row.add(nblocks * F::BYTES), rem);
            s.store(out.add(nblocks * F::BLOCK), v);
        }
    }
}

struct DecodeRow<'a, F> {
    row: &'a [u8],
    k: usize,
    out: &'a mut [f32],
    _f: std::marker::PhantomData<F>,
}

impl<F: Format> Kernel for DecodeRow<'_, F> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        // SAFETY: `decode_row` checked the row length and that out has round_up(k, 16) slots.
        unsafe { decode_row_into::<S, F>(s, self.row.as_ptr(), self.k, self.out.as_mut_ptr()) };
    }
}

/// Decodes one row of `k` elements of `format` into `out[..round_up(k, 16)]` (the tail
/// zero-filled); panics if `row` is not exactly one row or `out` is too short (callers pass
/// checked slices).
pub(crate) fn decode_row(
    level: SimdLevel,
    format: WeightFormat,
    row: &[u8],
    k: usize,
    out: &mut [f32],
) {
    with_format!(format, F => {
        let rb = k / F::BLOCK * F::BYTES + if F::TAILED { k % F::BLOCK * (F::BYTES / 16) } else { 0 };
        assert!(
            row.len() == rb && out.len() >= k.div_ceil(16) * 16,
            "decode_row: {} bytes and {} outputs for {k} elements",
            row.len(),
            out.len()
        );
        level.dispatch(DecodeRow::<F> { row, k, out, _f: std::marker::PhantomData })
    })
}
