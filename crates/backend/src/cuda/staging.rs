//! Weight upload through pinned staging buffers: the bytes of a matrix (usually a mapped
//! checkpoint file) are copied by the rayon pool into one of `BUFS` page-locked buffers of
//! `CHUNK` bytes, and the device copies each buffer asynchronously while the next is filled.
//!
//! Why: a copy from pageable memory goes through the driver's own staging with one CPU
//! thread, which also takes the mapped file's page faults. H200, llama3-8b (16 GB) in the page
//! cache, session 25 (`docs/bench/2026-12-04-h200.md`): load to first token 0.50-0.53 s
//! staged against 2.57-2.79 s by the driver's path. The bytes are the same either way: only
//! who copies them changes.
//! `TENSORFOLD_UPLOAD=direct` keeps the driver's path (A/B timing); so does any matrix under
//! `DIRECT_BELOW` bytes, and a machine that refuses the pinned allocation. The buffers (96 MiB
//! page-locked) are made at the first large matrix and kept for the backend's life.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{result, CudaEvent, CudaSlice, DevicePtrMut, PinnedHostSlice};
use rayon::prelude::*;

use super::{drv, CudaBackend};
use crate::error::Result;

/// Bytes a staging buffer holds (one asynchronous copy each).
const CHUNK: usize = 32 << 20;
/// Staging buffers: one filling while the others' copies run.
const BUFS: usize = 3;
/// Bytes one rayon task copies into a staging buffer.
const PIECE: usize = 2 << 20;
/// Matrices smaller than this take the driver's path (no pinned buffers for a small model).
const DIRECT_BELOW: usize = 8 << 20;

/// The page-locked buffers and, per buffer, the event recorded after its last copy.
pub(crate) struct Staging {
    bufs: Vec<(PinnedHostSlice<u8>, CudaEvent)>,
    next: usize,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The buffers are freed after this: no copy may still read them.
        for (_, ev) in &self.bufs {
            let _ = ev.synchronize();
        }
    }
}

impl Staging {
    fn new(be: &CudaBackend) -> Option<Self> {
        let mut bufs = Vec::with_capacity(BUFS);
        for _ in 0..BUFS {
            // SAFETY: the buffer is written (a chunk copied into it) before any copy reads it.
            let buf = unsafe { be.ctx.alloc_pinned_with_flags::<u8>(CHUNK, 0) }.ok()?;
            let ev = be.ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).ok()?;
            bufs.push((buf, ev));
        }
        Some(Staging { bufs, next: 0 })
    }
}

fn direct_only() -> bool {
    static D: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *D.get_or_init(|| std::env::var("TENSORFOLD_UPLOAD").is_ok_and(|v| v == "direct"))
}

/// Copies `src` into `dst` (at least `src.len()` bytes) on the backend's stream; `what` names
/// the weight in errors. Returns once `src` may be released: its bytes are in the device
/// buffer or in a staging buffer whose copy is queued.
pub(crate) fn upload(
    be: &CudaBackend,
    src: &[u8],
    dst: &mut CudaSlice<u8>,
    what: &str,
) -> Result<()> {
    let mut staging = be.staging.lock().unwrap_or_else(|e| e.into_inner());
    let staged = src.len() >= DIRECT_BELOW && !direct_only();
    if staged && staging.is_none() {
        *staging = Staging::new(be);
    }
    let st = match staging.as_mut() {
        Some(st) if staged => st,
        _ => return be.stream.memcpy_htod(src, dst).map_err(drv(what)),
    };
    let (base, _written) = dst.device_ptr_mut(&be.stream);
    for (i, chunk) in src.chunks(CHUNK).enumerate() {
        let (buf, ev) = &mut st.bufs[st.next];
        st.next = (st.next + 1) % BUFS;
        ev.synchronize().map_err(drv(what))?; // the copy that last read this buffer is done
        let host = &mut buf.as_mut_slice().map_err(drv(what))?[..chunk.len()];
        host.par_chunks_mut(PIECE)
            .zip(chunk.par_chunks(PIECE))
            .for_each(|(d, s)| d.copy_from_slice(s));
        // SAFETY: `host` is page-locked and stays untouched until `ev` (recorded right after
        // this copy) has completed; the destination range lies inside `dst`, which holds at
        // least `src.len()` bytes.
        unsafe {
            result::memcpy_htod_async(base + (i * CHUNK) as u64, &host[..], be.stream.cu_stream())
        }
        .map_err(drv(what))?;
        ev.record(&be.stream).map_err(drv(what))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Staged uploads leave each device buffer equal to its source bytes: several matrices
    /// back to back (more chunks than staging buffers, so each buffer is refilled while
    /// copies are queued), lengths off the chunk size, and one under `DIRECT_BELOW`. Run it
    /// without `TENSORFOLD_UPLOAD=direct`.
    #[test]
    #[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
    fn staged_uploads_are_the_bytes() {
        let be = CudaBackend::new(0).expect("a GPU");
        let lens = [2 * CHUNK + CHUNK / 3 + 5, CHUNK, DIRECT_BELOW - 1, 3 * CHUNK + 1];
        let srcs: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(j, &n)| (0..n).map(|i| ((i * 2_654_435_761 + j * 97) >> 13) as u8).collect())
            .collect();
        let mut dsts = Vec::new();
        for src in &srcs {
            let mut dst = be.raw::<u8>(src.len(), "test matrix").unwrap();
            upload(&be, src, &mut dst, "test matrix").unwrap();
            dsts.push(dst);
        }
        // The large matrices went through the staging buffers, not the driver's fallback.
        assert!(be.staging.lock().unwrap().is_some(), "no staging buffers: nothing was staged");
        for (src, dst) in srcs.iter().zip(&dsts) {
            let back = be.stream.clone_dtoh(dst).unwrap();
            assert_eq!(back.len(), src.len());
            let first = back.iter().zip(src).position(|(a, b)| a != b);
            assert_eq!(first, None, "{} bytes: first differing byte", src.len());
        }
    }
}
