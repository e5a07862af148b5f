//! `linear` and `logits`: `y = x @ w^T (+ bias)` over any weight format.
//!
//! The driver checks shapes, widens the input rows exactly to f32 (padded to a multiple of 16
//! with zeros, so every kernel reads whole chunks), and splits the output columns among the
//! pool's threads in fixed-size work items taken from an atomic counter. Threads never split
//! the reduction axis, and the split changes no element's arithmetic (see `kernels`).

pub(crate) mod formats;
pub(crate) mod kernels;
#[cfg(test)]
mod rows;

use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::simd::{Kernel, Simd};
use super::tensor::{CpuTensor, Data};
use super::weight::CpuWeight;
use super::CpuBackend;
use crate::error::{BackendError, Result};
use formats::{with_format, Format};
use kernels::{gemv_max_rows, Job, OutKind, GEMM_COLS, GEMV_COLS};

/// Products smaller than this many multiply-adds run on the calling thread alone.
const PARALLEL_MIN_MACS: usize = 1 << 16;

thread_local! {
    /// Each thread's GEMM panel (decoded columns), reused across calls.
    static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `out = x @ w^T (+ bias)` for every valid row of `x`.
pub(crate) fn linear(
    be: &CpuBackend,
    x: &CpuTensor,
    w: &CpuWeight,
    bias: Option<&CpuWeight>,
    out: &mut CpuTensor,
) -> Result<()> {
    let rows: Vec<usize> = (0..x.rows).collect();
    let kind = match out.dtype() {
        crate::ActDType::Bf16 => OutKind::Bf16,
        crate::ActDType::F32 => OutKind::F32,
    };
    product(be, "linear", x, &rows, w, bias, out, kind)
}

/// `out[i] = bf16(x[rows[i]] @ w^T)` stored as f32.
pub(crate) fn logits(
    be: &CpuBackend,
    x: &CpuTensor,
    rows: &[u32],
    w: &CpuWeight,
    out: &mut CpuTensor,
) -> Result<()> {
    if out.dtype() != crate::ActDType::F32 {
        return Err(BackendError::shape("logits", "the output tensor must be f32"));
    }
    if let Some(&r) = rows.iter().find(|&&r| r as usize >= x.rows) {
        return Err(BackendError::shape(
            "logits",
            format!("logit row {r} of {} valid rows", x.rows),
        ));
    }
    let rows: Vec<usize> = rows.iter().map(|&r| r as usize).collect();
    product(be, "logits", x, &rows, w, None, out, OutKind::F32RoundBf16)
}

#[allow(clippy::too_many_arguments)] // the op's operands plus its name and output rounding
fn product(
    be: &CpuBackend,
    op: &'static str,
    x: &CpuTensor,
    rows: &[usize],
    w: &CpuWeight,
    bias: Option<&CpuWeight>,
    out: &mut CpuTensor,
    kind: OutKind,
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    if w.vector.is_some() || x.cols != k {
        return Err(BackendError::shape(
            op,
            format!("input has {} columns, weight `{}` is [{n}, {k}]", x.cols, w.name()),
        ));
    }
    out.check_out(op, rows.len(), n)?;
    let bias = match bias {
        Some(b) => Some(b.vector(op, n)?),
        None => None,
    };
    let kp = k.div_ceil(16) * 16;
    let mut xbuf = be.xbuf.lock().unwrap_or_else(|e| e.into_inner());
    widen_rows(x, rows, kp, &mut xbuf);
    let out_ptr = match &mut out.data {
        Data::Bf16(v) => v.as_mut_ptr().cast::<u8>(),
        Data::F32(v) => v.as_mut_ptr().cast::<u8>(),
    };
    let job = Job {
        w: w.view.bytes().as_ptr(),
        row_bytes: w.row_bytes,
        k,
        kp,
        x: xbuf.as_ptr(),
        rows: rows.len(),
        n,
        bias: bias.map_or(std::ptr::null(), |b| b.as_ptr()),
        out: out_ptr,
        out_kind: kind,
    };
    if !rows.is_empty() {
        with_format!(w.format, F => run::<F>(be, &job));
    }
    out.rows = rows.len();
    Ok(())
}

/// Copies the selected rows of `x` into `buf` as f32, `kp` per row, zero-padded.
fn widen_rows(x: &CpuTensor, rows: &[usize], kp: usize, buf: &mut Vec<f32>) {
    buf.clear();
    buf.resize(rows.len() * kp, 0.0);
    let k = x.cols;
    for (i, &r) in rows.iter().enumerate() {
        let dst = &mut buf[i * kp..i * kp + k];
        match &x.data {
            Data::Bf16(v) => {
                for (d, &h) in dst.iter_mut().zip(&v[r * k..(r + 1) * k]) {
                    *d = f32::from_bits((h as u32) << 16);
                }
            }
            Data::F32(v) => dst.copy_from_slice(&v[r * k..(r + 1) * k]),
        }
    }
}

fn run<F: Format>(be: &CpuBackend, job: &Job) {
    let next = AtomicUsize::new(0);
    let work = |_tid: usize| {
        PANEL.with(|p| {
            let mut panel = p.borrow_mut();
            be.level.dispatch(Worker::<F> { job, next: &next, panel: &mut panel, _f: PhantomData });
        })
    };
    if job.rows * job.n * job.k < PARALLEL_MIN_MACS {
        work(0);
    } else {
        be.pool.run(&work);
    }
}

/// One thread's share: work items of columns until none is left.
struct Worker<'a, F> {
    job: &'a Job,
    next: &'a AtomicUsize,
    panel: &'a mut Vec<f32>,
    _f: PhantomData<F>,
}

impl<F: Format> Kernel for Worker<'_, F> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let j = self.job;
        let fused = j.rows <= gemv_max_rows::<S>();
        let cols = if fused { GEMV_COLS } else { GEMM_COLS };
        loop {
            let n0 = self.next.fetch_add(1, Ordering::Relaxed) * cols;
            if n0 >= j.n {
                break;
            }
            let n1 = (n0 + cols).min(j.n);
            // SAFETY: the driver checked every shape against the buffers behind `j`, and the
            // atomic counter hands each column range to exactly one thread.
            unsafe {
                if fused {
                    kernels::gemv_range::<S, F>(s, j, n0, n1);
                } else {
                    kernels::gemm_range::<S, F>(s, j, n0, n1, self.panel);
                }
            }
        }
    }
}
