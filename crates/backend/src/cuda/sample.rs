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
//!
//! Rows with penalties (`crate::penalty`) are sampled here too: `penalize_rows` first copies
//! every row of the call to an f32 scratch with its penalties applied (the host definition's
//! f32 operations, each rounded once), then `sample_rows` reads that scratch. The upload is
//! the rows' parameters (4 u64 a row), their ascending `(id, output count)` lists (one u64
//! an id, every step: a lane's ids live on the host, so 64 penalized streams of 2,000
//! distinct ids upload ~1 MB a step, against ~32 MB of logits read back before) and their
//! `(id, bias)` lists; nothing but the tokens comes back. `tests/cuda_sample.rs` checks the
//! tokens against the host's on penalized rows, the contract unit `sample` on the model's.

use cudarc::driver::LaunchConfig;

use super::tensor::{dptr, CudaTensor};
use super::{drv, CudaBackend};
use crate::error::{BackendError, Result};
use crate::penalty::{self, Penalties};
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
    penalties: &[Penalties<'_>],
) -> Result<Vec<u32>> {
    if rows > t.rows || draws.len() != rows {
        return Err(BackendError::shape(
            "sample",
            format!("{rows} rows of {} valid, {} draws", t.rows, draws.len()),
        ));
    }
    penalty::check(rows, penalties)?;
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
    let penalized = penalties.iter().any(|p| !p.is_off());
    if penalized {
        pack_penalties(penalties, &mut prm);
    }
    // Scratch (u64 words): the parameters, then the weights, then (penalized calls) the f32
    // rows at a 16-byte boundary.
    let wofs = prm.len().next_multiple_of(2);
    let fofs = (wofs + rows * t.cols).next_multiple_of(2);
    let need = fofs + if penalized { (rows * t.cols).div_ceil(2) } else { 0 };
    be.graph_step_end()?;
    let mut slot = be.sample_buf.lock().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().is_none_or(|b| b.len() < need) {
        *slot = Some(be.raw::<u64>(need.next_power_of_two(), "sample scratch")?);
    }
    let Some(buf) = slot.as_mut() else {
        return Err(BackendError::Device("cuda: sample scratch missing".into()));
    };
    let n = prm.len();
    be.stream.memcpy_htod(&prm, &mut buf.slice_mut(0..n)).map_err(drv("sample params"))?;
    let mut toks = be.tokens.lock().unwrap_or_else(|e| e.into_inner());
    if toks.as_ref().is_none_or(|b| b.len() < rows) {
        *toks = Some(be.raw::<u32>(rows.next_power_of_two().max(64), "sample tokens")?);
    }
    let Some(out) = toks.as_ref() else {
        return Err(BackendError::Device("cuda: sample token buffer missing".into()));
    };
    let s = &be.stream;
    let base = dptr(buf, s);
    let (mut lp, mut lf, op) = (dptr(&t.buf, s), t.is_f32(), dptr(out, s));
    let at = |words: usize| base + 8 * words as u64;
    let (pp, wp) = (base, at(wofs));
    let bits = weight_bits(t.cols);
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (SAMPLE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    if penalized {
        let (pen, seen, dst) = (at(4 * rows), at(8 * rows), at(fofs));
        let args = [lp.into(), lf.into(), pen.into(), seen.into(), dst.into(), cols.into()];
        be.launch("penalize_rows", cfg, &args)?;
        (lp, lf) = (dst, 1);
    }
    let args = [lp.into(), lf.into(), pp.into(), wp.into(), op.into(), cols.into(), bits.into()];
    be.launch("sample_rows", cfg, &args)?;
    super::step_events::step_tokens(be);
    let mut host = vec![0u32; rows];
    be.stream.memcpy_dtoh(&out.slice(0..rows), &mut host).map_err(drv("sample"))?;
    be.stream.synchronize().map_err(drv("sample"))?;
    Ok(host)
}

/// Appends `penalize_rows`'s parameters to `prm` (4 u64 a row so far): 4 u64 a row
/// (repetition | presence << 32, penalized id count << 32 | frequency, first penalized entry,
/// first biased entry | biased id count << 32), then every row's `id | n << 32` entries, then
/// every row's `id | bias bits << 32` entries. A row without either gets repetition 1 and no
/// entries.
fn pack_penalties(penalties: &[Penalties<'_>], prm: &mut Vec<u64>) {
    let bits = |v: f32| u64::from(v.to_bits());
    let on: Vec<Penalties<'_>> =
        penalties.iter().map(|p| if p.is_off() { Penalties::NONE } else { *p }).collect();
    let seen: u64 = on.iter().map(|p| p.seen.len() as u64).sum();
    let (mut first, mut first_bias) = (0u64, seen);
    for p in &on {
        prm.extend([
            bits(p.repetition) | bits(p.presence) << 32,
            bits(p.frequency) | (p.seen.len() as u64) << 32,
            first,
            first_bias | (p.bias.len() as u64) << 32,
        ]);
        first += p.seen.len() as u64;
        first_bias += p.bias.len() as u64;
    }
    for p in &on {
        prm.extend(p.seen.iter().map(|&(id, n)| u64::from(id) | u64::from(n) << 32));
    }
    for p in &on {
        prm.extend(p.bias.iter().map(|&(id, b)| u64::from(id) | bits(b) << 32));
    }
}
