//! Row-local ops of the float64 reference: `embed`, `rms_norm`, `rope`, `swiglu`, `add`.
//!
//! Each is its formula in f64, each output element from its own row only:
//! - embed: the token's decoded row, as is;
//! - rms_norm: `ss = sum x_i^2` (i in order), `w_i * (x_i / sqrt(ss / n + eps))`;
//! - rope: angle `pos * inv_freq_i` in f64, `y1 = x1 cos - x2 sin`, `y2 = x2 cos + x1 sin`
//!   over the pairs of the style (Neox: (i, i + d/2); Interleaved: (2i, 2i + 1));
//! - swiglu: `g / (1 + exp(-g)) * u`; add: `a + b`.
//!
//! Rows are split over the pool when there are enough of them; no value depends on the split.

use rayon::prelude::*;
use tf_checkpoint::spec::RopeStyle;

use super::tensor::{F64Batch, F64Tensor, F64Weight};
use super::F64Backend;
use crate::error::{BackendError, Result};

/// Elements below which an op runs on the calling thread.
const PAR_MIN: usize = 1 << 14;

/// `out[r] = table[tokens[r]]`.
pub(crate) fn embed(table: &F64Weight, tokens: &[u32], out: &mut F64Tensor) -> Result<()> {
    table.matrix("embed", out.cols)?;
    out.check_out("embed", tokens.len(), table.k)?;
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.n) {
        return Err(BackendError::shape(
            "embed",
            format!("token {t} of a {}-row table `{}`", table.n, table.name),
        ));
    }
    for (dst, &t) in out.data.chunks_exact_mut(table.k).zip(tokens) {
        dst.copy_from_slice(table.row(t as usize));
    }
    out.rows = tokens.len();
    Ok(())
}

/// RMSNorm over groups of `group` columns.
pub(crate) fn rms_norm(
    be: &F64Backend,
    x: &F64Tensor,
    weight: &F64Weight,
    eps: f64,
    group: usize,
    out: &mut F64Tensor,
) -> Result<()> {
    let (rows, cols) = (x.rows, x.cols);
    if group == 0 || cols % group != 0 {
        return Err(BackendError::shape(
            "rms_norm",
            format!("group {group} does not divide {cols} columns"),
        ));
    }
    let w = weight.vector("rms_norm", group)?;
    out.check_out("rms_norm", rows, cols)?;
    let src = &x.data[..rows * cols];
    let norm = |(o, xs): (&mut [f64], &[f64])| {
        let ss: f64 = xs.iter().fold(0.0, |a, &v| a + v * v);
        let s = (ss / group as f64 + eps).sqrt();
        for ((o, &v), &wi) in o.iter_mut().zip(xs).zip(w) {
            *o = wi * (v / s);
        }
    };
    let dst = &mut out.data[..rows * cols];
    if rows * cols < PAR_MIN {
        dst.chunks_exact_mut(group).zip(src.chunks_exact(group)).for_each(norm);
    } else {
        be.pool.install(|| {
            dst.par_chunks_exact_mut(group).zip(src.par_chunks_exact(group)).for_each(norm)
        });
    }
    out.rows = rows;
    Ok(())
}

/// The geometry fields of `RopeArgs`.
pub(crate) struct RopeShape {
    pub heads: usize,
    pub head_dim: usize,
    pub style: RopeStyle,
}

/// Rotates `x` in place at each row's position, from f64 angles (the bf16 `table` is checked
/// for shape and coverage only, see the module doc of `f64ref`).
pub(crate) fn rope(
    be: &F64Backend,
    x: &mut F64Tensor,
    sh: RopeShape,
    table: &F64Weight,
    batch: &F64Batch,
) -> Result<()> {
    let (rows, cols, hd) = (x.rows, x.cols, sh.head_dim);
    let positions = &batch.meta.positions;
    if hd == 0 || hd % 2 != 0 || sh.heads * hd != cols || positions.len() != rows {
        return Err(BackendError::shape(
            "rope",
            format!(
                "({rows}, {cols}) as {} heads of {hd} for {} positions",
                sh.heads,
                positions.len()
            ),
        ));
    }
    if be.inv_freq.len() * 2 != hd {
        return Err(BackendError::shape(
            "rope",
            format!("head_dim {hd}, but the backend's RoPE rotates {} dims", be.inv_freq.len() * 2),
        ));
    }
    if table.vector || table.k != hd {
        return Err(BackendError::shape(
            "rope",
            format!("table `{}` must be [positions, {hd}]", table.name),
        ));
    }
    if let Some(&p) = positions.iter().find(|&&p| p as usize >= table.n) {
        return Err(BackendError::shape(
            "rope",
            format!("position {p} beyond the table's {}", table.n),
        ));
    }
    let half = hd / 2;
    let inv = &be.inv_freq;
    let rotate = |(row, &pos): (&mut [f64], &u32)| {
        let cs: Vec<(f64, f64)> = inv.iter().map(|&f| (f64::from(pos) * f).sin_cos()).collect();
        for head in row.chunks_exact_mut(hd) {
            for (i, &(s, c)) in cs.iter().enumerate() {
                let (i1, i2) = match sh.style {
                    RopeStyle::Neox => (i, i + half),
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                };
                let (x1, x2) = (head[i1], head[i2]);
                head[i1] = x1 * c - x2 * s;
                head[i2] = x2 * c + x1 * s;
            }
        }
    };
    let data = &mut x.data[..rows * cols];
    if rows * cols < PAR_MIN {
        data.chunks_exact_mut(cols).zip(positions).for_each(rotate);
    } else {
        be.pool.install(|| data.par_chunks_exact_mut(cols).zip(positions).for_each(rotate));
    }
    Ok(())
}

fn silu_mul(g: f64, u: f64) -> f64 {
    g / (1.0 + (-g).exp()) * u
}

/// `out = silu(gate) * up`.
pub(crate) fn swiglu(
    be: &F64Backend,
    gate: &F64Tensor,
    up: &F64Tensor,
    out: &mut F64Tensor,
) -> Result<()> {
    let (rows, cols) = (gate.rows, gate.cols);
    if up.rows != rows || up.cols != cols {
        return Err(BackendError::shape(
            "swiglu",
            format!("operands are ({rows}, {cols}) and ({}, {})", up.rows, up.cols),
        ));
    }
    out.check_out("swiglu", rows, cols)?;
    let n = rows * cols;
    let (g, u, o) = (&gate.data[..n], &up.data[..n], &mut out.data[..n]);
    let apply = |((o, &g), &u): ((&mut f64, &f64), &f64)| *o = silu_mul(g, u);
    if n < PAR_MIN {
        o.iter_mut().zip(g).zip(u).for_each(apply);
    } else {
        be.pool.install(|| {
            o.par_iter_mut().zip(g.par_iter()).zip(u.par_iter()).with_min_len(4096).for_each(apply)
        });
    }
    out.rows = rows;
    Ok(())
}

/// `acc = acc + x`.
pub(crate) fn add(be: &F64Backend, acc: &mut F64Tensor, x: &F64Tensor) -> Result<()> {
    let (rows, cols) = (acc.rows, acc.cols);
    if x.rows != rows || x.cols != cols {
        return Err(BackendError::shape(
            "add",
            format!("operands are ({rows}, {cols}) and ({}, {})", x.rows, x.cols),
        ));
    }
    let n = rows * cols;
    let (a, b) = (&mut acc.data[..n], &x.data[..n]);
    if n < PAR_MIN {
        a.iter_mut().zip(b).for_each(|(a, &b)| *a += b);
    } else {
        be.pool.install(|| {
            a.par_iter_mut().zip(b.par_iter()).with_min_len(4096).for_each(|(a, &b)| *a += b)
        });
    }
    Ok(())
}
