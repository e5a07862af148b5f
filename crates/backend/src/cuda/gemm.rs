//! Launch of the prefill GEMM `linear_bf16_tiled` (`kernels/gemm.cu`): when a product takes
//! it (`tiled_for`), its grid, block and shared memory, and the arguments it adds to the ones
//! it shares with `linear_bf16`.
//!
//! Invariant: only speed depends on anything here. The kernel gives the bits of
//! `linear_bf16` for every element (same K split from `k_split`, same mma.sync chains, same
//! slice order), so the row count may pick the kernel without changing a result.
//!
//! Two configurations compute it (gemm.cu's `TL_ENTRY`s, the same per-element arithmetic,
//! each compared bit for bit with `linear_bf16` by tests/cuda_linear.rs): `linear_bf16_tiled`
//! (4-warp CTAs, two an SM) for large grids, `linear_bf16_tiled_r` (8-warp CTAs, one an SM)
//! where the grid would leave SMs idle. Both tile 128 features x 128 tokens.
//!
//! Rejected: larger CTA tiles (128 x 256, 256 x 128: slower on an H200 and over sm_89's shared
//! memory); a third stage for the served kernel (1% faster on an H200, over sm_89's 99 KiB).

use cudarc::driver::LaunchConfig;

use super::kernels::{TiledShape, LINEAR_TILED, LINEAR_TILED_R};
use super::KArg;
use crate::error::{BackendError, Result};

/// Calls of fewer rows never take `linear_bf16_tiled`: a 128-token tile would be mostly
/// padding, while `linear_bf16` streams the weights at full bandwidth.
pub const TILED_MIN_ROWS: usize = 128;
/// From `TILED_MIN_ROWS` rows the tiled kernel is taken when its grid has at least this many
/// CTAs (H200, 2026-11-30: at 32 CTAs `linear_bf16` was faster, from 48 the tiled kernel)...
const TILED_MIN_CTAS: usize = 48;
/// ...or the call has at least this many rows (a prefill chunk, whatever the weight).
/// Both limits lie inside the contract's row counts (1 .. 2,048), so its row gate compares
/// the two kernels on every shape.
const TILED_ALWAYS_ROWS: usize = 1024;

/// Whether a product of `rows` rows of an `n`-feature weight takes the tiled kernel. Only
/// speed depends on it: both kernels give the same bits.
pub(super) fn tiled_for(rows: usize, n: usize) -> bool {
    let t = LINEAR_TILED;
    let ctas = n.div_ceil(t.features) * rows.div_ceil(t.tokens);
    rows >= TILED_MIN_ROWS && (ctas >= TILED_MIN_CTAS || rows >= TILED_ALWAYS_ROWS)
}

/// Grids of at most this many 128 x 128 CTAs take `linear_bf16_tiled_r` (one 8-warp CTA an
/// SM; H200, 2026-11-30: faster there on every llama3-8b shape, e.g. 183 vs 131 TFLOP/s on
/// 1024 x 4096 at 2,048 rows, 187 vs 138 on 4096 x 4096 at 512), larger ones
/// `linear_bf16_tiled` (two 4-warp CTAs an SM: 244 vs 195 on 14336 x 4096 at 2,048).
const R_MAX_CTAS: usize = 128;

/// The configuration of a product of `rows` rows of an `n`-feature weight (speed only).
pub(super) fn tiled_config(rows: usize, n: usize) -> TiledShape {
    let ctas = n.div_ceil(LINEAR_TILED.features) * rows.div_ceil(LINEAR_TILED.tokens);
    if ctas <= R_MAX_CTAS {
        LINEAR_TILED_R
    } else {
        LINEAR_TILED
    }
}

/// The configuration of entry point `name`.
pub(super) fn tiled_shape(name: &str) -> Option<TiledShape> {
    [LINEAR_TILED, LINEAR_TILED_R].into_iter().find(|t| t.name == name)
}

/// One launch of a `linear_bf16_tiled*` kernel.
pub(super) struct TiledLaunch {
    pub name: &'static str,
    pub cfg: LaunchConfig,
    /// Arguments after the ones shared with `linear_bf16` (`w .. slice_len`).
    pub extra: Vec<KArg>,
}

/// The launch on `t` of a product `op` of `rows` rows, `n` features, `slices` K slices.
pub(super) fn tiled_launch(
    t: TiledShape,
    op: &'static str,
    rows: usize,
    n: usize,
    slices: u32,
) -> Result<TiledLaunch> {
    let ctas = n.div_ceil(t.features) * rows.div_ceil(t.tokens);
    if ctas > i32::MAX as usize {
        return Err(BackendError::shape(op, format!("{rows} rows exceed the kernel's grid")));
    }
    let cfg = LaunchConfig {
        grid_dim: (ctas as u32, 1, 1),
        block_dim: (t.threads, 1, 1),
        shared_mem_bytes: t.smem,
    };
    Ok(TiledLaunch { name: t.name, cfg, extra: vec![slices.into()] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_rows_stream_and_prefill_chunks_tile_on_every_model_shape() {
        // The contract's row gate compares calls of 1 .. 128 rows with a 2,048-row call: both
        // kernels must be inside that range for each llama3-8b and SmolLM2 shape.
        let shapes = [4096, 1024, 6144, 14336, 128256, 576, 192, 1536, 49152];
        for n in shapes {
            assert!(!tiled_for(17, n) && !tiled_for(TILED_MIN_ROWS - 1, n), "{n}");
            assert!(tiled_for(2048, n) && tiled_for(1024, n), "{n}");
        }
        assert!(tiled_for(128, 14336) && !tiled_for(128, 4096) && tiled_for(256, 4096));
    }

    #[test]
    fn both_configurations_tile_alike_and_small_grids_take_the_8_warp_one() {
        let (p, r) = (LINEAR_TILED, LINEAR_TILED_R);
        assert_eq!((p.features, p.tokens), (r.features, r.tokens));
        assert_eq!(tiled_config(2048, 1024).name, r.name);
        assert_eq!(tiled_config(512, 4096).name, r.name);
        assert_eq!(tiled_config(2048, 4096).name, p.name);
        assert_eq!(tiled_config(512, 14336).name, p.name);
        assert!(tiled_shape(p.name).is_some() && tiled_shape(r.name).is_some());
        assert!(tiled_shape("linear_bf16").is_none());
    }
}
