//! Decode ahead (`Backend::argmax_ahead`, `kernels/sample.cu`'s `argmax_ahead`): a greedy step
//! of one row ends with a kernel that writes its token into the step metadata's token slot and
//! advances the position, so the next step's metadata is on the device before the host knows
//! the token. The host issues step n + 1 (its graph: the same launches, the same arguments,
//! since the metadata buffer did not move) while step n runs, then reads step n's token from
//! host-mapped pinned memory that the kernel wrote: no copy, no upload and no host round trip
//! between the GPU's steps (session 34 measured ~20-26 us of GPU idle a step without it).
//!
//! What stays exact: every kernel of a step reads the metadata the step would have had from
//! an upload (the token the host would have sent is the token the device chose, by
//! `argmax_f32`'s rule; the position is one more), and `argmax_ahead` runs last in its step,
//! after every kernel that reads the metadata has completed (each waits for its predecessor).
//! A graph launch starts after the previous one completes; without graphs the next step's
//! first kernel (`embed`) waits for `argmax_ahead` before it reads the token.
//!
//! The ring: `RING` slots of u32 in pinned host memory mapped into the device; the token for
//! position q lands in slot q % RING. The host marks the slot empty (`EMPTY`) when it issues
//! the step that fills it and spins on it in `ahead_token`, checking the stream for errors.
//! Slots are reused RING positions later; the engine keeps at most two steps in flight and
//! synchronizes before another sequence starts (`Generator`), so no late write from an
//! earlier sequence can land in a slot after it was marked.

use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use cudarc::driver::LaunchConfig;

use super::tensor::{dptr, CudaBatch, CudaTensor};
use super::{drv, CudaBackend};
use crate::error::{BackendError, Result};

/// Slots of the token ring.
const RING: u32 = 16;
/// An empty slot (no vocabulary has this many ids).
const EMPTY: u32 = u32::MAX;
/// Threads of `argmax_ahead` (ARGMAX_THREADS in sample.cu).
const THREADS: u32 = 1024;
/// Longest wait for one token before `ahead_token` reports the device stuck.
const WAIT: Duration = Duration::from_secs(300);

/// Pinned host memory of `RING` u32, mapped into the device's address space.
pub(crate) struct HostRing {
    host: *mut u32,
    dev: u64,
    /// The stream whose kernels write it (synchronized before the memory is freed).
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
}

// SAFETY: the ring is plain pinned memory; the backend serializes its use behind a Mutex and
// every access is a volatile read or write of an aligned u32.
unsafe impl Send for HostRing {}

impl HostRing {
    fn new(be: &CudaBackend) -> Result<HostRing> {
        be.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let bytes = RING as usize * 4;
        // SAFETY: a plain allocation; every slot is written below before any read.
        let host = unsafe { cudarc::driver::result::malloc_host(bytes, flags) }
            .map_err(drv("allocating the decode-ahead ring"))? as *mut u32;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP, the call's contract.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0) };
        let ring = HostRing { host, dev, stream: be.stream.clone() };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(BackendError::Device(format!(
                "cuda: mapping the decode-ahead ring: {r:?}"
            )));
        }
        for i in 0..RING {
            ring.set(i, EMPTY);
        }
        Ok(ring)
    }

    fn set(&self, slot: u32, v: u32) {
        // SAFETY: slot < RING (callers take positions modulo RING), an aligned u32 of the
        // allocation.
        unsafe { std::ptr::write_volatile(self.host.add((slot % RING) as usize), v) }
    }

    fn get(&self, slot: u32) -> u32 {
        // SAFETY: as `set`.
        unsafe { std::ptr::read_volatile(self.host.add((slot % RING) as usize)) }
    }
}

impl Drop for HostRing {
    fn drop(&mut self) {
        // No kernel may still write here once it is freed.
        let _ = self.stream.synchronize();
        // SAFETY: `host` came from cuMemHostAlloc and is freed once, after the stream is idle.
        let _ = unsafe { cudarc::driver::result::free_host(self.host.cast()) };
    }
}

/// Whether decode ahead is on: unless `TENSORFOLD_DECODE_AHEAD=0` (an A/B switch: the same
/// tokens either way), once the ring is made (a driver that maps no host memory says why on
/// stderr, once, and decode runs plain steps).
pub(crate) fn enabled(be: &CudaBackend) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ON.get_or_init(|| std::env::var("TENSORFOLD_DECODE_AHEAD").map_or(true, |v| v != "0")) {
        return false;
    }
    static FAILED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if FAILED.get().is_some() {
        return false;
    }
    if let Err(e) = ring(be) {
        eprintln!("tensorfold: decode ahead off: {e}");
        let _ = FAILED.set(());
        return false;
    }
    true
}

/// The backend's ring, made on first use.
fn ring(be: &CudaBackend) -> Result<MutexGuard<'_, Option<HostRing>>> {
    let mut ring = be.ahead_ring.lock().unwrap_or_else(|e| e.into_inner());
    if ring.is_none() {
        *ring = Some(HostRing::new(be)?);
    }
    Ok(ring)
}

fn refuse(why: String) -> BackendError {
    BackendError::shape("argmax_ahead", why)
}

/// `Backend::argmax_ahead`: launches (records, inside the open step) `argmax_ahead` over the
/// one logits row and returns the next step's batch.
pub(crate) fn argmax_ahead(be: &CudaBackend, t: &CudaTensor, b: &CudaBatch) -> Result<CudaBatch> {
    let m = &b.meta;
    if m.rows() != 1 || m.logit_rows != [0] || m.seqs.len() != 1 {
        return Err(refuse(format!(
            "{} rows, logit rows {:?}: one of each",
            m.rows(),
            m.logit_rows
        )));
    }
    if t.rows < 1 || t.cols == 0 {
        return Err(refuse(format!("{} logits rows of {}", t.rows, t.cols)));
    }
    let cols = u32::try_from(t.cols).map_err(|_| refuse(format!("{} columns", t.cols)))?;
    let q = m.positions[0] + 1;
    let mut next = m.clone();
    next.tokens = vec![0];
    next.positions = vec![q];
    next.validate(None)?;
    let ring = ring(be)?;
    let Some(ring) = ring.as_ref() else {
        return Err(BackendError::Device("cuda: decode-ahead ring missing".into()));
    };
    ring.set(q, EMPTY);
    let s = &be.stream;
    let (tok_at, pos_at) = (b.at.tokens as u32, b.at.positions as u32);
    let args = [
        dptr(&t.buf, s).into(),
        t.is_f32().into(),
        cols.into(),
        b.ptr(s, 0).into(),
        tok_at.into(),
        pos_at.into(),
        ring.dev.into(),
        RING.into(),
    ];
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    be.launch("argmax_ahead", cfg, &args)?;
    let max_block = CudaBatch::max_block(&next);
    Ok(CudaBatch { meta: next, max_block, dev: b.dev.clone(), at: b.at, fixed: b.fixed })
}

/// `Backend::ahead_token`: spins on the ring slot of `position` until the step's kernel fills
/// it, checking the stream for a failed launch every few thousand reads.
pub(crate) fn ahead_token(be: &CudaBackend, position: usize) -> Result<u32> {
    // Launches recorded into a step not yet closed would never run: close it.
    be.graph_step_end()?;
    let ring = be.ahead_ring.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ring) = ring.as_ref() else {
        return Err(BackendError::Device("cuda: ahead_token before any argmax_ahead".into()));
    };
    let slot = (position % RING as usize) as u32;
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let v = ring.get(slot);
        if v != EMPTY {
            return Ok(v);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) {
            // SAFETY: a query of the backend's own live stream.
            let r = unsafe { sys::cuStreamQuery(be.stream.cu_stream()) };
            match r {
                sys::CUresult::CUDA_SUCCESS if ring.get(slot) == EMPTY => {
                    return Err(BackendError::Device(format!(
                        "cuda: the stream is idle but no token came for position {position}"
                    )))
                }
                sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(BackendError::Device(format!("cuda: waiting for a token: {e:?}"))),
            }
            if start.elapsed() > WAIT {
                return Err(BackendError::Device(format!(
                    "cuda: no token for position {position} after {} s",
                    WAIT.as_secs()
                )));
            }
        }
        std::hint::spin_loop();
    }
}
