//! Sampling on the GPU (`kernels/sample.cu`): greedy argmax of logits rows, so a greedy row
//! copies back one u32 instead of the vocabulary.
//!
//! The rule is the host's (`crate::argmax_row`, the engine's `sampler::argmax`): the highest
//! value, ties to the lowest id, NaN never wins, 0 when nothing is above -inf. The kernel's
//! reduction order cannot change the answer (see sample.cu), so one block per row with any
//! tree gives the host's token; `tests/cuda_graphs.rs` checks it against the host on random,
//! tied, NaN and -inf rows.
//! Not yet here: temperature / top-k / top-p / min-p sampling with the Philox draw (those rows
//! still copy their logits back and sample on the host).

use cudarc::driver::LaunchConfig;

use super::tensor::{dptr, CudaTensor};
use super::{drv, CudaBackend};
use crate::error::{BackendError, Result};

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
    let mut host = vec![0u32; rows];
    be.stream.memcpy_dtoh(&out.slice(0..rows), &mut host).map_err(drv("argmax"))?;
    be.stream.synchronize().map_err(drv("argmax"))?;
    Ok(host)
}
