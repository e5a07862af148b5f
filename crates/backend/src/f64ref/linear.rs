//! `linear` and `logits` of the float64 reference: `out[r][n] = sum_k x[r][k] * w[n][k]`
//! (+ `bias[n]`), every sum taken over k sequentially from 0 in f64, the bias added after.
//!
//! Threads take tiles of output columns (never the reduction); inside a tile, 4 rows x 4
//! columns are computed together (16 independent sums, so the CPU overlaps them) without
//! changing any sum's order. A row's result therefore depends on nothing but its own inputs.
//! On x86-64 the same kernel is also compiled with AVX2 enabled and picked at run time: wider
//! vector registers, the same separate multiply and add per term (Rust never contracts them
//! into an fma), so the bits are the same.
//! Rejected: a blocked or pairwise summation (more accurate, but then the order is no longer
//! the plain one a test can replay), and an f64 GEMM crate (another dependency for a reference
//! that only has to be fast enough for a 135M test model).

use rayon::prelude::*;

use super::tensor::{try_zeros, F64Tensor, F64Weight};
use super::F64Backend;
use crate::error::{BackendError, Result};

/// Output columns per task.
const COL_TILE: usize = 32;
/// Rows and columns computed together by the kernel.
const RT: usize = 4;
const CT: usize = 4;

/// `out[i] = x[rows[i]] @ w^T (+ bias)` for every listed row of `x`.
pub(crate) fn product(
    be: &F64Backend,
    op: &'static str,
    x: &F64Tensor,
    rows: &[usize],
    w: &F64Weight,
    bias: Option<&F64Weight>,
    out: &mut F64Tensor,
) -> Result<()> {
    w.matrix(op, x.cols)?;
    let bias = bias.map(|b| b.vector(op, w.n)).transpose()?;
    if let Some(&r) = rows.iter().find(|&&r| r >= x.rows) {
        return Err(BackendError::shape(op, format!("row {r} of {} valid", x.rows)));
    }
    out.check_out(op, rows.len(), w.n)?;
    let (n, m) = (w.n, rows.len());
    out.rows = m;
    if m == 0 {
        return Ok(());
    }
    let xs: Vec<&[f64]> = rows.iter().map(|&r| x.row(r)).collect();
    let mut tmp = try_zeros(m * n, || format!("{op} output ({m}, {n})"))?;
    // tmp is column-tile-major: tile t holds (m, tile width) row-major.
    be.pool.install(|| {
        tmp.par_chunks_mut(m * COL_TILE).enumerate().for_each(|(t, block)| {
            let c0 = t * COL_TILE;
            let width = block.len() / m;
            tile(&xs, w, c0..c0 + width, block);
        })
    });
    for (t, block) in tmp.chunks(m * COL_TILE).enumerate() {
        let c0 = t * COL_TILE;
        let width = block.len() / m;
        for (i, src) in block.chunks_exact(width).enumerate() {
            let dst = &mut out.data[i * n + c0..i * n + c0 + width];
            match bias {
                Some(b) => {
                    for ((d, &s), &bv) in dst.iter_mut().zip(src).zip(&b[c0..c0 + width]) {
                        *d = s + bv;
                    }
                }
                None => dst.copy_from_slice(src),
            }
        }
    }
    Ok(())
}

/// Sums of every row of `xs` with weight rows `cols`, into `block` (rows, cols.len()).
fn tile(xs: &[&[f64]], w: &F64Weight, cols: std::ops::Range<usize>, block: &mut [f64]) {
    let width = cols.len();
    let mut r0 = 0;
    while r0 < xs.len() {
        let rr = RT.min(xs.len() - r0);
        let mut c = cols.start;
        while c < cols.end {
            let cc = CT.min(cols.end - c);
            let mut emit = |vals: &[[f64; CT]; RT]| {
                for (i, row) in vals.iter().enumerate().take(rr) {
                    for (j, &v) in row.iter().enumerate().take(cc) {
                        block[(r0 + i) * width + (c - cols.start) + j] = v;
                    }
                }
            };
            // A partial column group repeats its last column (computed, not stored).
            let ws: [&[f64]; CT] = std::array::from_fn(|j| w.row(c + j.min(cc - 1)));
            if rr == RT {
                let x4: [&[f64]; RT] = std::array::from_fn(|i| xs[r0 + i]);
                emit(&sums(x4, ws));
            } else {
                let mut vals = [[0.0; CT]; RT];
                for (i, v) in vals.iter_mut().enumerate().take(rr) {
                    v.copy_from_slice(&sums([xs[r0 + i]], ws)[0]);
                }
                emit(&vals);
            }
            c += cc;
        }
        r0 += rr;
    }
}

/// The `R x CT` sums `sum_k x_i[k] * w_j[k]`, each over k in order; picks the AVX2 build of
/// the kernel where the CPU has it (same bits, see the module doc).
fn sums<const R: usize>(x: [&[f64]; R], w: [&[f64]; CT]) -> [[f64; CT]; R] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { sums_avx2(x, w) };
        }
    }
    sums_generic(x, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sums_avx2<const R: usize>(x: [&[f64]; R], w: [&[f64]; CT]) -> [[f64; CT]; R] {
    sums_generic(x, w)
}

#[inline(always)]
fn sums_generic<const R: usize>(x: [&[f64]; R], w: [&[f64]; CT]) -> [[f64; CT]; R] {
    let k = x[0].len();
    // Equal lengths let the compiler drop the bounds checks inside the loop.
    let x: [&[f64]; R] = std::array::from_fn(|i| &x[i][..k]);
    let w: [&[f64]; CT] = std::array::from_fn(|j| &w[j][..k]);
    let mut acc = [[0.0f64; CT]; R];
    for kk in 0..k {
        let wv: [f64; CT] = std::array::from_fn(|j| w[j][kk]);
        for (a, xi) in acc.iter_mut().zip(&x) {
            let xv = xi[kk];
            for (aj, &wj) in a.iter_mut().zip(&wv) {
                *aj += xv * wj;
            }
        }
    }
    acc
}
