//! The Hopper prefill GEMM `linear_bf16_wg` (`kernels/gemm90.cu`, sm_90a only): its launch
//! shapes and the lookup that lets `CudaBackend::linear_with_kernel` force a product onto it.
//!
//! Invariant: the kernel gives the bits of `linear_bf16` for every element (same K split from
//! `k_split`, one wgmma k16 step per mma.sync of linear_bf16's chain over the same 16
//! products, same slice order, bias, one rounding; tests/cuda_wgmma.rs first shows a wgmma step
//! equals an mma.sync step bit for bit, then compares the kernels). It shares
//! `linear_bf16_tiled`'s arguments and launch arithmetic (1-D grid of feature x token tiles,
//! `slices` as the one extra argument), so it launches through the same `TiledShape` path.
//!
//! Served on sm_90a: where `tiled_for` picks a tiled product, `linear.rs` `prefill_config`
//! takes `LINEAR_WG` (the contract's row gate compares it with the decode kernels on every
//! shape). Other architectures compile the family to empty entry points, never launched
//! (`kernels::launched_on`), and are refused here by name.
//!
//! Speed (H200, 2026-11-30, 2,048 rows, llama3-8b shapes): `linear_bf16_wg` 284-355 TFLOP/s
//! against `linear_bf16_tiled`'s 143-267 in the same run (figures per shape in gemm90.cu);
//! cuBLAS reaches 610-809, so the 60% is not reached yet.
//!
//! Rejected: TMA tensor maps for the tile loads (a copy box's innermost extent is at least 16
//! bytes, but the k regrouping that makes a wgmma step take linear_bf16's 16 products moves
//! 8-byte units; and a per-call tensor map for the activations would need a new kind of
//! kernel argument); wgmma with A from registers (the weight tile would pass through
//! registers for every token tile).

use super::kernels::{Entry, TiledShape};
use super::CudaBackend;
use crate::error::{BackendError, Result};

/// The kernel family (`kernels/gemm90.cu`).
pub(crate) const FAMILY: &str = "gemm90";

/// Whether the wgmma kernels run for NVRTC architecture `arch` (sm_90a only: elsewhere the
/// family compiles to empty entry points that are never launched).
pub(crate) fn runs_on(arch: &str) -> bool {
    arch == "sm_90a"
}

/// The shape of `WG_ENTRY(name, wgs, bn, stages)` (gemm90.cu's `WgCfg`): 64 WGS features
/// x BN tokens a CTA, 128 WGS threads, STAGES tiles of (features + tokens) rows x 64 k bf16,
/// plus 1 KiB to align the tiles to the 1,024-byte swizzle atom.
const fn wg_shape_of(name: &'static str, wgs: u32, bn: u32, stages: u32) -> TiledShape {
    let bm = 64 * wgs;
    TiledShape {
        name,
        features: bm as usize,
        tokens: bn as usize,
        threads: 128 * wgs,
        smem: stages * (bm + bn) * 128 + 1024,
    }
}

/// 128 features x 128 tokens, 2 warpgroups, 5 stages; one CTA an SM.
pub(crate) const LINEAR_WG: TiledShape = wg_shape_of("linear_bf16_wg", 2, 128, 5);
/// 192 features x 128 tokens, 3 warpgroups, 4 stages; one CTA an SM.
pub(crate) const LINEAR_WG_M192: TiledShape = wg_shape_of("linear_bf16_wg_m192", 3, 128, 4);

/// Every configuration (gemm90.cu's `WG_ENTRY`s, both giving linear_bf16's bits).
pub(crate) const WG_SHAPES: [TiledShape; 2] = [LINEAR_WG, LINEAR_WG_M192];

/// Every configuration, as registry entries of the `gemm90` family.
pub(crate) const fn wg_entry(t: TiledShape) -> Entry {
    Entry { name: t.name, family: FAMILY, threads: t.threads, dyn_smem: t.smem }
}

/// The configuration of entry point `name`: `Ok(None)` when `name` is not a wgmma kernel, an
/// error when it is but the device is not sm_90a (its entry points are empty there).
pub(crate) fn wg_shape(be: &CudaBackend, name: &str) -> Result<Option<TiledShape>> {
    let Some(t) = WG_SHAPES.into_iter().find(|t| t.name == name) else {
        return Ok(None);
    };
    if !runs_on(be.arch()) {
        return Err(BackendError::Device(format!(
            "{name} needs sm_90a (wgmma); this device compiles for {}",
            be.arch()
        )));
    }
    Ok(Some(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_fit_one_cta_an_sm_on_hopper() {
        for t in WG_SHAPES {
            // 227 KiB of shared memory a block on sm_90; tiles stay 1,024-byte multiples.
            assert!(t.smem <= 227 * 1024, "{}: {}", t.name, t.smem);
            assert_eq!((t.smem - 1024) % 1024, 0, "{}", t.name);
            assert_eq!(t.threads as usize, 2 * t.features, "{}", t.name);
        }
    }
}
