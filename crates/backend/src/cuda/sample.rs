//! Sampling on the GPU (`kernels/sample.cu`): greedy argmax of logits rows, so a greedy row
//! copies back one u32 instead of the vocabulary.
//!
//! The rule is the host's (`crate::argmax_row`, the engine's `sampler::argmax`): the highest
//! value, ties to the lowest id, NaN never wins, 0 when nothing is above -inf. The kernel's
//! reduction order cannot change the answer (see sample.cu), so one block per row with any
//! tree gives the host's token; `tests/cuda_graphs.rs` checks it against the host on random,
//! tied, NaN and -inf rows.
//!
//! `sample` (`sample_rows`): temperature / top-k / top-p / min-p rows, the definition of
//! `crate::sample` (integer weights from a portable f64 exp, radix selection over exact
//! integer sums), so the device's token equals `sample::sample_row`'s by construction;
//! `tests/cuda_sample.rs` checks it on random rows, the contract unit `sample` on the model's.
//! The per-row parameters are quantized on the host (`Draw::quantize`) and uploaded with the
//! launch (4 u64 a row); weights go to a `rows x cols` u64 scratch.

use cudarc::driver::LaunchConfig;

use super::tensor::{dptr, CudaTensor};
use super::{drv, CudaBackend};
use crate::error::{BackendError, Result};
use crate::sample::{weight_bits, Draw};

/// Threads per block of `argmax_f32` (ARGMAX_THREADS in sample.cu).
const THREADS: u32 = 1024;

pub(crate) fn argmax(be: &CudaBackend, t: &CudaTensor, rows: usize) -> Result<Vec<u32>> {
    if rows > t.rows {
        return Err(BackendError::shape("argmax", format!("{rows} rows of {} valid", t.rows)));
    }
    if rows == 0 {
        return Ok(Vec::new());
    }
    if t.cols == 0 {
        return Ok(vec![0; rows]);
    }
    let cols = u32::try_from(t.cols)
        .map_err(|_| BackendError::shape("argmax", format!("{} columns exceed u32", t.cols)))?;
    let grid = u32::try_from(rows)
        .ok()
        .filter(|&r| r <= i32::MAX as u32)
        .ok_or_else(|| BackendError::shape("argmax", format!("{rows} rows exceed the grid")))?;
    be.graph_step_end()?;
    let mut slot = be.tokens.lock().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().is_none_or(|b| b.len() < rows) {
        *slot = Some(be.raw::<u32>(rows.next_power_of_two().max(64), "argmax tokens")?);
    }
    let Some(out) = slot.as_ref() else {
        return Err(BackendError::Device("cuda: argmax token buffer missing".into()));
    };
    let s = &be.stream;
    let (lp, lf, op) = (dptr(&t.buf, s), t.is_f32(), dptr(out, s));
    let cfg =
        LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    be.launch("argmax_f32", cfg, &[lp.into(), lf.into(), op.into(), cols.into()])?;
    super::step_events::step_tokens(be);
    let mut host = vec![0u32; rows];
    be.stream.memcpy_dtoh(&out.slice(0..rows), &mut host).map_err(drv("argmax"))?;
    be.stream.synchronize().map_err(drv("argmax"))?;
    Ok(host)
}

/// Threads per block of `sample_rows` (SAMPLE_THREADS in sample.cu).
const SAMPLE_THREADS: u32 = 1024;

pub(crate) fn sample(
    be: &CudaBackend,
    t: &CudaTensor,
    rows: usize,
    draws: &[Draw],
) -> Result<Vec<u32>> {
    if rows > t.rows || draws.len() != rows {
        return Err(BackendError::shape(
            "sample",
            format!("{rows} rows of {} valid, {} draws", t.rows, draws.len()),
        ));
    }
    if rows == 0 {
        return Ok(Vec::new());
    }
    if t.cols == 0 {
        return Ok(vec![0; rows]);
    }
    let cols = u32::try_from(t.cols).ok().filter(|&c| c < 1 << 24).ok_or_else(|| {
        BackendError::shape("sample", format!("{} columns, at most 2^24 - 1", t.cols))
    })?;
    let grid = u32::try_from(rows)
        .ok()
        .filter(|&r| r <= i32::MAX as u32)
        .ok_or_else(|| BackendError::shape("sample", format!("{rows} rows exceed the grid")))?;
    let mut prm = Vec::with_capacity(4 * rows);
    for d in draws {
        let q = d.quantize();
        let t = if q.greedy { 0.0 } else { q.temperature };
        prm.extend([
            t.to_bits(),
            u64::from(q.top_k) | u64::from(q.top_p) << 32,
            u64::from(q.min_p),
            q.bits,
        ]);
    }
    let need = 4 * rows + rows * t.cols;
    be.graph_step_end()?;
    let mut slot = be.sample_buf.lock().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().is_none_or(|b| b.len() < need) {
        *slot = Some(be.raw::<u64>(need.next_power_of_two(), "sample scratch")?);
    }
    let Some(buf) = slot.as_mut() else {
        return Err(BackendError::Device("cuda: sample scratch missing".into()));
    };
    be.stream.memcpy_htod(&prm, &mut buf.slice_mut(0..4 * rows)).map_err(drv("sample params"))?;
    let mut toks = be.tokens.lock().unwrap_or_else(|e| e.into_inner());
    if toks.as_ref().is_none_or(|b| b.len() < rows) {
        *toks = Some(be.raw::<u32>(rows.next_power_of_two().max(64), "sample tokens")?);
    }
    let Some(out) = toks.as_ref() else {
        return Err(BackendError::Device("cuda: sample token buffer missing".into()));
    };
    let s = &be.stream;
    let base = dptr(buf, s);
    let (lp, lf, op) = (dptr(&t.buf, s), t.is_f32(), dptr(out, s));
    let (pp, wp) = (base, base + 8 * 4 * rows as u64);
    let bits = weight_bits(t.cols);
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (SAMPLE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let args = [lp.into(), lf.into(), pp.into(), wp.into(), op.into(), cols.into(), bits.into()];
    be.launch("sample_rows", cfg, &args)?;
    super::step_events::step_tokens(be);
    let mut host = vec![0u32; rows];
    be.stream.memcpy_dtoh(&out.slice(0..rows), &mut host).map_err(drv("sample"))?;
    be.stream.synchronize().map_err(drv("sample"))?;
    Ok(host)
}
