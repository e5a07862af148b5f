//! The two product kernels: a fused decode-and-multiply for few rows, a panel GEMM for many.
//!
//! **The arithmetic of every output element** `(r, n)`, whichever kernel computes it: 16 lane
//! accumulators, lane l taking `acc = fma(w_k, x_k, acc)` for k ≡ l (mod 16) in increasing
//! k; the lanes summed by the fixed tree of `Simd::reduce`; `+ bias` in f32; one rounding to
//! the output type. It depends on `k` alone, so a row's result is the same in a call of 1 row
//! or 512, and the SIMD levels agree bit for bit.
//!
//! - `gemv_*` (few rows: decode steps, up to 8 sequences with a 32-register ISA): weights are
//!   decoded in registers chunk by chunk and used at once by every row, 4 columns interleaved
//!   for instruction-level parallelism (2 columns above 4 rows, to keep `rows x columns`
//!   accumulators plus the rows' inputs in registers); memory bandwidth bound at 1 row, so it
//!   prefetches the weight rows `PREFETCH_COLS` columns ahead (the hardware prefetcher alone
//!   left a whole-model decode 1.4-1.6x slower).
//! - `gemm_*` (more rows, prefill): a thread decodes a panel of up to `GEMM_COLS` columns to
//!   f32 scratch once (a few dozen KiB, L2-resident), then a register-blocked micro-kernel
//!   (`MR` rows x `NR` columns of accumulators) sweeps all rows over it; compute bound.
//!
//! Rejected: the panel GEMM for 5-8 rows (what batched decode of 5-8 sequences needs). It
//! writes each decoded weight to memory and reads it back per 4-row tile, and the per-row
//! arithmetic it saves over the fused kernel is small; measured on Zen 4 (2 threads), the
//! Q8_0 lm_head [49152x576] took 4.8 ms at 4 rows (fused) but 13.0 ms at 5 and 18.2 ms at 8
//! (panel), which capped an 8-sequence decode step at ~2.6x the throughput of one sequence.

use super::super::simd::Simd;
use super::formats::Format;

/// Rows up to which the fused kernel is used, by the ISA's register file: 8 rows x 2
/// columns of accumulators plus 8 input vectors need 32 vector registers (AVX-512, whose
/// GEMM tile is 4x4); with 16 (AVX2, NEON, whose tile is 2x2) the fused kernel stops at 4.
#[inline(always)]
pub(crate) fn gemv_max_rows<S: Simd>() -> usize {
    if S::GEMM_MR * S::GEMM_NR >= 16 {
        8
    } else {
        4
    }
}
/// Columns per work item (and per decoded panel) of the GEMM.
pub(crate) const GEMM_COLS: usize = 16;
/// Columns per work item of the GEMV.
pub(crate) const GEMV_COLS: usize = 32;
/// How many columns (weight rows) ahead the GEMV prefetches weights.
const PREFETCH_COLS: usize = 8;

/// How the final f32 value is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutKind {
    Bf16,
    F32,
    /// Rounded to bf16, stored as f32 (logits).
    F32RoundBf16,
}

/// One product's operands, shared read-only by every thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Job {
    /// Weight rows (`n` of `row_bytes`).
    pub w: *const u8,
    pub row_bytes: usize,
    pub k: usize,
    /// Row stride of `x`: `k` rounded up to 16, the padding zero.
    pub kp: usize,
    /// (rows, kp) f32 inputs.
    pub x: *const f32,
    pub rows: usize,
    pub n: usize,
    /// `n` f32 values, or null.
    pub bias: *const f32,
    /// (rows, n) output of `out_kind`.
    pub out: *mut u8,
    pub out_kind: OutKind,
}

// SAFETY: a Job is a set of pointers into buffers that outlive the `Pool::run` call sharing
// it; threads only read through `w`, `x`, `bias`, and write disjoint columns of `out`.
unsafe impl Send for Job {}
// SAFETY: as above.
unsafe impl Sync for Job {}

impl Job {
    /// Finishes element (r, c): bias, rounding, store.
    ///
    /// # Safety
    /// `r < rows`, `c < n`, and no other thread writes column `c`.
    #[inline(always)]
    unsafe fn put(&self, r: usize, c: usize, sum: f32) {
        let y = if self.bias.is_null() {
            sum
        } else {
            // SAFETY: c < n and bias holds n values.
            sum + unsafe { *self.bias.add(c) }
        };
        let i = r * self.n + c;
        // SAFETY: i < rows * n, within the output buffer of `out_kind`.
        unsafe {
            match self.out_kind {
                OutKind::Bf16 => {
                    *self.out.cast::<u16>().add(i) = super::super::simd::math::f32_to_bf16(y)
                }
                OutKind::F32 => *self.out.cast::<f32>().add(i) = y,
                OutKind::F32RoundBf16 => {
                    *self.out.cast::<f32>().add(i) = super::super::simd::math::round_bf16(y)
                }
            }
        }
    }
}

/// Columns `n0..n1` of a product of at most `gemv_max_rows::<S>()` rows.
///
/// # Safety
/// `j` describes valid buffers, `n1 <= j.n`, `1 <= j.rows <= gemv_max_rows::<S>()`, and this
/// thread owns the columns.
#[inline(always)]
pub(crate) unsafe fn gemv_range<S: Simd, F: Format>(s: S, j: &Job, n0: usize, n1: usize) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match j.rows {
            1 => gemv_rows::<S, F, 1, 4>(s, j, n0, n1),
            2 => gemv_rows::<S, F, 2, 4>(s, j, n0, n1),
            3 => gemv_rows::<S, F, 3, 4>(s, j, n0, n1),
            4 => gemv_rows::<S, F, 4, 4>(s, j, n0, n1),
            5 => gemv_rows::<S, F, 5, 2>(s, j, n0, n1),
            6 => gemv_rows::<S, F, 6, 2>(s, j, n0, n1),
            7 => gemv_rows::<S, F, 7, 2>(s, j, n0, n1),
            _ => gemv_rows::<S, F, 8, 2>(s, j, n0, n1),
        }
    }
}

/// Rows `R` (all of them), columns in groups of `CN`, then one by one.
#[inline(always)]
unsafe fn gemv_rows<S: Simd, F: Format, const R: usize, const CN: usize>(
    s: S,
    j: &Job,
    n0: usize,
    n1: usize,
) {
    // The weights stream from memory (decode reads each once per token): prefetch this work
    // item's first columns now; `gemv_cols` keeps PREFETCH_COLS columns ahead from there.
    let first = j.w.wrapping_add(n0 * j.row_bytes);
    let len = PREFETCH_COLS.min(n1 - n0) * j.row_bytes;
    for off in (0..len).step_by(64) {
        s.prefetch(first.wrapping_add(off));
    }
    let mut n = n0;
    while n + CN <= n1 {
        // SAFETY: columns n..n+CN are within the caller's range.
        unsafe { gemv_cols::<S, F, R, CN>(s, j, n) };
        n += CN;
    }
    while n < n1 {
        // SAFETY: column n is within the caller's range.
        unsafe { gemv_cols::<S, F, R, 1>(s, j, n) };
        n += 1;
    }
}

/// `CN` adjacent columns from `n0`, `R` rows: decode each 16-element chunk once, use it for
/// every row.
// Index loops over the register tile `acc[r][c]` read as the math does; they unroll fully.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn gemv_cols<S: Simd, F: Format, const R: usize, const CN: usize>(s: S, j: &Job, n0: usize) {
    let mut acc = [[s.zero(); CN]; R];
    let mut rowp = [j.w; CN];
    for (c, p) in rowp.iter_mut().enumerate() {
        // SAFETY: n0 + c < n: the row lies inside the weight.
        *p = unsafe { j.w.add((n0 + c) * j.row_bytes) };
    }
    let nblocks = j.k / F::BLOCK;
    // Prefetch the same offset PREFETCH_COLS rows on, one line per 64 bytes consumed.
    // (Measured: decode of the whole model 1.4-1.6x faster than with the hardware prefetcher
    // alone, which stops at page boundaries and ramps up per stream.)
    let ahead = PREFETCH_COLS * j.row_bytes;
    for b in 0..nblocks {
        let mut blk = rowp;
        for p in blk.iter_mut() {
            // SAFETY: block b < nblocks lies inside its row.
            *p = unsafe { p.add(b * F::BYTES) };
        }
        if (b * F::BYTES) % 64 < F::BYTES {
            for p in blk {
                s.prefetch(p.wrapping_add(ahead));
            }
        }
        // SAFETY: whole blocks are readable.
        let mut sc = [unsafe { F::scales(s, blk[0]) }; CN];
        for c in 1..CN {
            // SAFETY: as above.
            sc[c] = unsafe { F::scales(s, blk[c]) };
        }
        for ch in 0..F::BLOCK / 16 {
            let k0 = b * F::BLOCK + 16 * ch;
            let mut xv = [s.zero(); R];
            for (r, v) in xv.iter_mut().enumerate() {
                // SAFETY: k0 + 16 <= kp; row r < rows.
                *v = unsafe { s.load(j.x.add(r * j.kp + k0)) };
            }
            for c in 0..CN {
                // SAFETY: chunk ch of a readable block.
                let w = unsafe { F::chunk(s, blk[c], &sc[c], ch) };
                for r in 0..R {
                    acc[r][c] = s.fma(w, xv[r], acc[r][c]);
                }
            }
        }
    }
    let rem = j.k - nblocks * F::BLOCK;
    if F::TAILED && rem > 0 {
        let k0 = nblocks * F::BLOCK;
        for c in 0..CN {
            // SAFETY: the row's last `rem` elements follow its blocks; x is padded to kp.
            let w = unsafe { F::tail(s, rowp[c].add(nblocks * F::BYTES), rem) };
            for r in 0..R {
                // SAFETY: k0 + 16 <= kp.
                let xv = unsafe { s.load(j.x.add(r * j.kp + k0)) };
                acc[r][c] = s.fma(w, xv, acc[r][c]);
            }
        }
    }
    // The tile's sums, 16 accumulators per `reduce16` (padded with zeros; the same bits as
    // `reduce` one by one, fewer instructions when the tile is large).
    let mut sums = [[0f32; CN]; R];
    if R * CN > 4 {
        let mut i0 = 0;
        while i0 < R * CN {
            let mut v = [s.zero(); 16];
            for (t, x) in v.iter_mut().enumerate().take(R * CN - i0) {
                *x = acc[(i0 + t) / CN][(i0 + t) % CN];
            }
            let o = s.reduce16(&v);
            for (t, &x) in o.iter().enumerate().take(R * CN - i0) {
                sums[(i0 + t) / CN][(i0 + t) % CN] = x;
            }
            i0 += 16;
        }
    } else {
        for r in 0..R {
            for c in 0..CN {
                sums[r][c] = s.reduce(acc[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..CN {
            // SAFETY: r < rows, n0 + c < n, columns owned by this thread.
            unsafe { j.put(r, n0 + c, sums[r][c]) };
        }
    }
}

/// Columns `n0..n1` (at most `GEMM_COLS`) of a product of any number of rows, through a
/// panel decoded into `panel`.
///
/// # Safety
/// As `gemv_range`, without the row limit; `n1 - n0 <= GEMM_COLS`.
#[inline(always)]
pub(crate) unsafe fn gemm_range<S: Simd, F: Format>(
    s: S,
    j: &Job,
    n0: usize,
    n1: usize,
    panel: &mut Vec<f32>,
) {
    let nc = n1 - n0;
    if panel.len() < nc * j.kp {
        panel.resize(nc * j.kp, 0.0);
    }
    let p = panel.as_mut_ptr();
    for c in 0..nc {
        // SAFETY: row n0 + c is inside the weight; the panel has kp slots per column.
        unsafe {
            super::formats::decode_row_into::<S, F>(
                s,
                j.w.add((n0 + c) * j.row_bytes),
                j.k,
                p.add(c * j.kp),
            )
        };
    }
    let (mr_max, nr_max) = (S::GEMM_MR, S::GEMM_NR);
    let mut r0 = 0;
    while r0 < j.rows {
        let mr = mr_max.min(j.rows - r0);
        let mut c0 = 0;
        while c0 < nc {
            let nr = nr_max.min(nc - c0);
            // SAFETY: rows r0..r0+mr and panel columns c0..c0+nr exist.
            unsafe { micro_dispatch(s, j, p, r0, mr, n0, c0, nr) };
            c0 += nr;
        }
        r0 += mr;
    }
}

#[allow(clippy::too_many_arguments)] // the tile's coordinates; a struct would only rename them
#[inline(always)]
unsafe fn micro_dispatch<S: Simd>(
    s: S,
    j: &Job,
    p: *const f32,
    r0: usize,
    mr: usize,
    n0: usize,
    c0: usize,
    nr: usize,
) {
    macro_rules! tiles {
        ($(($m:literal, $n:literal)),*) => {
            match (mr, nr) {
                // SAFETY: forwarded from the caller.
                $(($m, $n) => unsafe { micro::<S, $m, $n>(s, j, p, r0, n0, c0) },)*
                _ => unreachable!("tile {mr}x{nr} exceeds 4x4"),
            }
        };
    }
    tiles!(
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 1),
        (2, 2),
        (2, 3),
        (2, 4),
        (3, 1),
        (3, 2),
        (3, 3),
        (3, 4),
        (4, 1),
        (4, 2),
        (4, 3),
        (4, 4)
    )
}

/// One `MR x NR` tile: rows `r0..`, panel columns `c0..` (output columns `n0 + c0..`).
#[allow(clippy::needless_range_loop)] // see `gemv_cols`
#[inline(always)]
unsafe fn micro<S: Simd, const MR: usize, const NR: usize>(
    s: S,
    j: &Job,
    p: *const f32,
    r0: usize,
    n0: usize,
    c0: usize,
) {
    let mut acc = [[s.zero(); NR]; MR];
    let kp = j.kp;
    // SAFETY: row r0 of x and column c0 of the panel exist (checked by the caller).
    let (xb, pb) = unsafe { (j.x.add(r0 * kp), p.add(c0 * kp)) };
    let mut k0 = 0;
    while k0 < kp {
        let mut xv = [s.zero(); MR];
        for (r, v) in xv.iter_mut().enumerate() {
            // SAFETY: k0 + 16 <= kp within row r0 + r.
            *v = unsafe { s.load(xb.add(r * kp + k0)) };
        }
        for c in 0..NR {
            // SAFETY: k0 + 16 <= kp within panel column c0 + c.
            let w = unsafe { s.load(pb.add(c * kp + k0)) };
            for r in 0..MR {
                acc[r][c] = s.fma(w, xv[r], acc[r][c]);
            }
        }
        k0 += 16;
    }
    for r in 0..MR {
        for c in 0..NR {
            // SAFETY: r0 + r < rows, n0 + c0 + c < n, columns owned by this thread.
            unsafe { j.put(r0 + r, n0 + c0 + c, s.reduce(acc[r][c])) };
        }
    }
}
