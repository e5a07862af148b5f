//! `linear_bf16_ring` (`kernels/linear_ring.cu`): a decode product (at most 8 rows) whose
//! weights stream through a shared-memory ring filled by bulk copies, in CTAs of at most half
//! an SM, so the next launch's CTA fits beside one and streams its own weights before its
//! `pdl_wait` (weights are immutable). Same bits as `linear_bf16` for every element (the same
//! k16 sets, slices and combine order; `tests/cuda_ring.rs` compares them bit for bit).
//!
//! `linear_bf16_swiglu_ring` is `linear_bf16_swiglu_d8`'s product (gate and up for the same 16
//! features, the SwiGLU epilogue) the same way.
//!
//! Off until the GPU has measured it: `TENSORFOLD_DEC_RING=1` (bulk copies) or `=tma` (tensor
//! copies) makes `linear`, `logits` and `linear_swiglu` take them where [`fits`] (sm_90a; the shape's every K slice full and a
//! multiple of 128 k, features a multiple of 16). Speed only: which entry computes a product
//! changes no bit.

use std::sync::Arc;

use cudarc::driver::LaunchConfig;

use super::{CudaBackend, KArg};
use crate::error::Result;

/// How the ring is filled: 256-byte row runs by 1-D bulk copies from producer warps
/// (`TENSORFOLD_DEC_RING=1`), or boxes of 16 rows x 64 k by 2-D tensor copies of a map of the
/// weight, from one thread (`=tma`). The same bits either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeRing {
    Off = 0,
    Bulk = 1,
    Tensor = 2,
}

/// The entry points: `linear` / `logits`, and gate + up + SwiGLU (`linear_swiglu`), each in
/// both forms.
pub(crate) const ENTRY: &str = "linear_bf16_ring";
pub(crate) const ENTRY_TMA: &str = "linear_bf16_ring_tma";
pub(crate) const SWIGLU_ENTRY: &str = "linear_bf16_swiglu_ring";
pub(crate) const SWIGLU_ENTRY_TMA: &str = "linear_bf16_swiglu_ring_tma";
pub(crate) const ENTRIES: [&str; 4] = [ENTRY, ENTRY_TMA, SWIGLU_ENTRY, SWIGLU_ENTRY_TMA];
/// Threads a CTA: 8 consumer warps and 2 producer warps (the kernels' default
/// `TF_RING_PRODUCERS`; the knob's 1 or 4 launch 288 or 384, the tensor form 288, [`config`]).
pub(crate) const THREADS: u32 = 256 + 32 * 2;
/// Ring stages (the kernel's `TF_RING_STAGES`).
const STAGES: u32 = 3;
/// Bytes of a stage: 8 jobs x 16 rows x a 256-byte run at a pitch of 272 (`RING_PITCH`); the
/// tensor form's 8 x 4 KB and 1 KB of alignment fit in the same.
const STAGE_BYTES: u32 = 8 * 16 * 272;
/// Most jobs of a tile (slices times matrices) whose partials the CTA holds (`RING_JOBS`).
const JOBS: u32 = 16;
/// Dynamic shared memory: the stages, the partials (128 floats a job), two mbarriers a stage.
pub(crate) const SMEM: u32 = STAGES * STAGE_BYTES + JOBS * 128 * 4 + 2 * STAGES * 8;
// Two CTAs fit an H100/H200 SM: 228 KB of shared memory, 1 KB of it reserved a CTA; the tensor
// form's stages start at the first 1,024-aligned byte.
const _: () = assert!(2 * (SMEM + 1024) <= 228 * 1024);
const _: () = assert!(1023 + STAGES * 8 * 4096 <= STAGES * STAGE_BYTES);

/// The form `TENSORFOLD_DEC_RING` asks for (`1`: bulk copies, `tma`: tensor copies; default
/// off); the backend's switch starts from it (`CudaBackend::set_decode_ring`).
pub(crate) fn from_env() -> DecodeRing {
    match std::env::var("TENSORFOLD_DEC_RING").as_deref() {
        Ok("1") => DecodeRing::Bulk,
        Ok("tma") => DecodeRing::Tensor,
        _ => DecodeRing::Off,
    }
}

/// The backend's switch.
pub(crate) fn form(be: &CudaBackend) -> DecodeRing {
    match be.dec_ring.load(std::sync::atomic::Ordering::Relaxed) {
        1 => DecodeRing::Bulk,
        2 => DecodeRing::Tensor,
        _ => DecodeRing::Off,
    }
}

/// Whether the backend's switch is on.
pub(crate) fn enabled(be: &CudaBackend) -> bool {
    form(be) != DecodeRing::Off
}

/// Producer warps a CTA of the bulk form: the kernels' `TF_RING_PRODUCERS` (2, or 1 / 4
/// through `TENSORFOLD_KERNEL_DEFINES`).
fn producers() -> u32 {
    static P: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *P.get_or_init(|| match super::compile::kernel_define("TF_RING_PRODUCERS").as_deref() {
        Some("1") => 1,
        Some("4") => 4,
        _ => 2,
    })
}

/// Whether a ring entry computes a product of `rows` rows of `matrices` weights `(n, k)` (1:
/// linear / logits, 2: gate and up) with K split `(slices, slice_len)` on `arch`.
pub(crate) fn fits(
    arch: &str,
    rows: usize,
    (n, k): (usize, usize),
    split: (u32, u32),
    matrices: usize,
) -> bool {
    let (slices, len) = (split.0 as usize, split.1 as usize);
    super::wgmma::runs_on(arch)
        && rows <= super::kernels::LINEAR_DECODE_ROWS
        && n.is_multiple_of(16)
        && slices.is_power_of_two()
        && slices * matrices <= JOBS as usize
        && len.is_multiple_of(128)
        && slices * len == k
        && n <= u32::MAX as usize
}

/// The launch of a product with `n` features and `jobs` jobs a tile: one CTA an SM at most,
/// each walking bundles of `max(1, 8 / jobs)` tiles.
/// `tensor`: the tensor form (one producer warp).
pub(crate) fn config(be: &CudaBackend, n: usize, jobs: u32, tensor: bool) -> LaunchConfig {
    let per_bundle = (8 / jobs as usize).max(1);
    let bundles = (n / 16).div_ceil(per_bundle).max(1);
    let producers = if tensor { 1 } else { producers() };
    LaunchConfig {
        grid_dim: (bundles.min(be.sms.max(1)) as u32, 1, 1),
        block_dim: (256 + 32 * producers, 1, 1),
        shared_mem_bytes: SMEM,
    }
}

/// The entry of `linear` (`swiglu` false) or `linear_swiglu` in the bulk or the `tensor` form,
/// and the extra arguments of the tensor form: the maps of `weights` (device address, n, k).
pub(crate) fn entry(
    be: &CudaBackend,
    swiglu: bool,
    tensor: bool,
    weights: &[(u64, usize, usize)],
) -> Result<(&'static str, Vec<KArg>)> {
    let name = match (swiglu, tensor) {
        (false, false) => ENTRY,
        (false, true) => ENTRY_TMA,
        (true, false) => SWIGLU_ENTRY,
        (true, true) => SWIGLU_ENTRY_TMA,
    };
    let mut maps = Vec::new();
    if tensor {
        for &(w, n, k) in weights {
            maps.push(KArg::Map(weight_map(be, w, n, k)?));
        }
    }
    Ok((name, maps))
}

/// The tensor map of a weight for the tensor form (boxes of 16 rows x 64 k, the 128-byte
/// swizzle), encoded once a weight: weights are immutable, so a map keyed by (address, n, k)
/// stays valid, and a decode step encodes none.
fn weight_map(
    be: &CudaBackend,
    w: u64,
    n: usize,
    k: usize,
) -> Result<Arc<cudarc::driver::sys::CUtensorMap>> {
    let mut maps = be.ring_maps.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = maps.get(&(w, n, k)) {
        return Ok(m.clone());
    }
    let m = Arc::new(super::wgmma::box_map("linear", "ring weight", w, n as u32, k as u32, 16)?);
    maps.insert((w, n, k), m.clone());
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_takes_the_shapes_of_full_128_k_slices() {
        let k = super::super::linear::k_split;
        for (n, kk) in [(4096, 4096), (4096, 14336), (128_256, 4096), (1024, 4096), (14336, 4096)] {
            assert!(fits("sm_90a", 1, (n, kk), k(n, kk), 1), "{n} x {kk}: {:?}", k(n, kk));
            assert!(!fits("sm_89", 1, (n, kk), k(n, kk), 1));
            assert!(!fits("sm_90a", 9, (n, kk), k(n, kk), 1));
        }
        // gate and up: 4 slices each; k and v's 16 slices would be 32 jobs.
        assert!(fits("sm_90a", 8, (14336, 4096), k(14336, 4096), 2));
        assert!(!fits("sm_90a", 1, (1024, 4096), k(1024, 4096), 2));
        // smollm2's 576: slices of 288 k are not whole 128-k runs.
        assert!(!fits("sm_90a", 1, (576, 576), k(576, 576), 1));
        assert!(!fits("sm_90a", 1, (4100, 4096), k(4100, 4096), 1));
    }
}
