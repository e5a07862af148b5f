//! `linear_bf16_ring` (`kernels/linear_ring.cu`): a decode product (at most 8 rows) whose
//! weights stream through a shared-memory ring filled by bulk copies, in CTAs of at most half
//! an SM, so the next launch's CTA fits beside one and streams its own weights before its
//! `pdl_wait` (weights are immutable). Same bits as `linear_bf16` for every element (the same
//! k16 sets, slices and combine order; `tests/cuda_ring.rs` compares them bit for bit).
//!
//! Off until the GPU has measured it: `TENSORFOLD_DEC_RING=1` makes `linear` and `logits` take
//! it where [`fits`] (sm_90a; the shape's every K slice full and a multiple of 128 k, features
//! a multiple of 16). Speed only: which entry computes a product changes no bit.

use cudarc::driver::LaunchConfig;

use super::CudaBackend;

/// The entry point.
pub(crate) const ENTRY: &str = "linear_bf16_ring";
/// Threads a CTA: 8 consumer warps and a producer warp.
pub(crate) const THREADS: u32 = 288;
/// Ring stages (the kernel's `TF_RING_STAGES`).
const STAGES: u32 = 3;
/// Bytes of a stage: 8 jobs x 16 rows x a 256-byte run at a pitch of 272 (`RING_PITCH`).
const STAGE_BYTES: u32 = 8 * 16 * 272;
/// Most jobs of a bundle whose partials the CTA holds (`RING_JOBS`): 16 slices.
const JOBS: u32 = 16;
/// Dynamic shared memory: the stages, the partials (128 floats a job), two mbarriers a stage.
pub(crate) const SMEM: u32 = STAGES * STAGE_BYTES + JOBS * 128 * 4 + 2 * STAGES * 8;
// Two CTAs fit an H100/H200 SM: 228 KB of shared memory, 1 KB of it reserved a CTA.
const _: () = assert!(2 * (SMEM + 1024) <= 228 * 1024);

/// Whether `TENSORFOLD_DEC_RING=1` asks for the ring entry (default: off).
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TENSORFOLD_DEC_RING").is_ok_and(|v| v == "1"))
}

/// Whether the ring entry computes a product of `rows` rows with weight `(n, k)` and K split
/// `(slices, slice_len)` on `arch`.
pub(crate) fn fits(arch: &str, rows: usize, n: usize, k: usize, split: (u32, u32)) -> bool {
    let (slices, len) = (split.0 as usize, split.1 as usize);
    super::wgmma::runs_on(arch)
        && rows <= super::kernels::LINEAR_DECODE_ROWS
        && n.is_multiple_of(16)
        && slices.is_power_of_two()
        && slices <= JOBS as usize
        && len.is_multiple_of(128)
        && slices * len == k
}

/// The launch of a product with `n` features and `slices` slices: one CTA an SM at most, each
/// walking bundles of `max(1, 8 / slices)` tiles.
pub(crate) fn config(be: &CudaBackend, n: usize, slices: u32) -> LaunchConfig {
    let per_bundle = (8 / slices as usize).max(1);
    let bundles = (n / 16).div_ceil(per_bundle).max(1);
    LaunchConfig {
        grid_dim: (bundles.min(be.sms.max(1)) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: SMEM,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_takes_the_shapes_of_full_128_k_slices() {
        let k = super::super::linear::k_split;
        for (n, kk) in [(4096, 4096), (4096, 14336), (128_256, 4096), (1024, 4096), (14336, 4096)] {
            assert!(fits("sm_90a", 1, n, kk, k(n, kk)), "{n} x {kk}: {:?}", k(n, kk));
            assert!(!fits("sm_89", 1, n, kk, k(n, kk)));
            assert!(!fits("sm_90a", 9, n, kk, k(n, kk)));
        }
        // smollm2's 576: slices of 288 k are not whole 128-k runs.
        assert!(!fits("sm_90a", 1, 576, 576, k(576, 576)));
        assert!(!fits("sm_90a", 1, 4100, 4096, k(4100, 4096)));
    }
}
