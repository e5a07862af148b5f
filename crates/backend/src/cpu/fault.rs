//! The `fault-row-dependent` build: a deliberately broken `linear` whose schedule depends on
//! the number of rows in the call, so the exactness checkers can be shown to fail on a real
//! kernel fault (issue 3: "a build with a row-dependent kernel fails windows and concurrent").
//! Never enabled by default; only `crates/engine/tests/fault_build.rs` builds it, in its own
//! target directory.
//!
//! The fault is a genuine change of schedule, not a bit flip: a call of one row runs the
//! normal kernel; a call of several rows splits the reduction axis K in two halves (split-K,
//! the classic row-count-dependent schedule of GEMM libraries), computes each half's partial
//! sums in f32 with the normal kernel (the other half's inputs zeroed, which adds exact zeros),
//! and adds the two partials before the bias and the one rounding. Every element is still a
//! faithful f32 dot product, but its summation order, and so its last bits, now depend on
//! whether the row shared its call with others. Decode steps (one row) and prefill chunks (many
//! rows) then disagree, as do sequences batched together and run alone.

use std::ops::Range;

use super::simd::math;
use super::tensor::{CpuTensor, Data};
use super::weight::CpuWeight;
use super::CpuBackend;
use crate::error::{BackendError, Result};
use crate::ActDType;

/// `out = x @ w^T (+ bias)`: the normal kernel for one row, split-K over two halves for more.
pub(crate) fn linear(
    be: &CpuBackend,
    x: &CpuTensor,
    w: &CpuWeight,
    bias: Option<&CpuWeight>,
    out: &mut CpuTensor,
) -> Result<()> {
    if x.rows <= 1 {
        return super::linear::linear(be, x, w, bias, out);
    }
    let (rows, n, half) = (x.rows, w.n, x.cols / 2);
    out.check_out("linear", rows, n)?;
    let bias = match bias {
        Some(b) => Some(b.vector("linear", n)?),
        None => None,
    };
    let mut parts = Vec::with_capacity(2);
    for keep in [0..half, half..x.cols] {
        let mut part = CpuTensor::zeros(ActDType::F32, rows, n)?;
        super::linear::linear(be, &keep_columns(x, keep), w, None, &mut part)?;
        parts.push(part);
    }
    let (Data::F32(lo), Data::F32(hi)) = (&parts[0].data, &parts[1].data) else {
        return Err(BackendError::shape("linear", "split-K partials must be f32"));
    };
    for (i, (&a, &b)) in lo[..rows * n].iter().zip(&hi[..rows * n]).enumerate() {
        let sum = a + b;
        let y = bias.map_or(sum, |bv| sum + bv[i % n]);
        match &mut out.data {
            Data::Bf16(v) => v[i] = math::f32_to_bf16(y),
            Data::F32(v) => v[i] = y,
        }
    }
    out.rows = rows;
    Ok(())
}

/// A copy of the valid rows of `x` with every column outside `keep` set to zero.
fn keep_columns(x: &CpuTensor, keep: Range<usize>) -> CpuTensor {
    let (rows, cols) = (x.rows, x.cols);
    let data = match &x.data {
        Data::Bf16(v) => Data::Bf16(masked(&v[..rows * cols], cols, &keep, 0u16)),
        Data::F32(v) => Data::F32(masked(&v[..rows * cols], cols, &keep, 0.0f32)),
    };
    CpuTensor { data, rows, max_rows: rows, cols }
}

fn masked<T: Copy>(v: &[T], cols: usize, keep: &Range<usize>, zero: T) -> Vec<T> {
    v.iter().enumerate().map(|(i, &e)| if keep.contains(&(i % cols)) { e } else { zero }).collect()
}
