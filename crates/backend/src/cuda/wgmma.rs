//! The Hopper prefill GEMMs (sm_90a only): `linear_bf16_ws` (`kernels/gemm90ws.cu`, served)
//! and `linear_bf16_wg` (`kernels/gemm90.cu`): their launch shapes, the activation packing
//! and weight tensor map the first needs, and the lookup that lets
//! `CudaBackend::linear_with_kernel` force a product onto either.
//!
//! Invariant: both give the bits of `linear_bf16` for every element (same K split from
//! `k_split`, one wgmma k16 step per mma.sync of linear_bf16's chain over the same 16
//! products, same slice order, bias, one rounding; tests/cuda_wgmma.rs first shows a wgmma step
//! equals an mma.sync step bit for bit, then compares the kernels). Where a product takes a
//! prefill kernel (`tiled_for`), `linear.rs` `prefill_config` takes `linear_bf16_ws` on sm_90a
//! (the contract's row gate compares it with the decode kernels on every shape). Other
//! architectures compile the family to empty entry points, never launched
//! (`kernels::launched_on`), and are refused here by name.
//!
//! Speed (H200, 2026-12-02, 2,048 rows, llama3-8b shapes, packing included): `linear_bf16_ws`
//! 230-451 TFLOP/s, `linear_bf16_wg` 283-355 in the same run; cuBLAS reaches 678-818, so the
//! issue's 60% is not reached yet (figures per shape in gemm90ws.cu).
//!
//! Rejected: a tensor map for the activations (a per-call map of a buffer the previous kernel
//! wrote, and the k regrouping would need 8-byte boxes; the packing makes one bulk copy a tile
//! instead); weights permuted once at load (decode's 16-byte lane loads need the natural
//! layout).

use std::sync::{Arc, OnceLock};

use cudarc::driver::{sys, CudaSlice, LaunchConfig};

use super::kernels::{Entry, TiledShape};
use super::tensor::dptr;
use super::{CudaBackend, KArg};
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

/// `linear_bf16_ws` (gemm90ws.cu): persistent CTAs of a copy warpgroup and two wgmma
/// warpgroups over 128 x 128 tiles, 6 stages of (128 + 128) rows x 64 k, their 12 mbarriers
/// and 1 KiB of alignment slack (`WS_SMEM`). `features`/`tokens` are its tile.
pub(crate) const LINEAR_WS: TiledShape = TiledShape {
    name: "linear_bf16_ws",
    features: WS_TILE,
    tokens: WS_TILE,
    threads: 384,
    smem: (WS_STAGES * 2 * WS_TILE * 128 + 2 * WS_STAGES * 8 + 1024) as u32,
};
/// gemm90ws.cu's `WS_BM` = `WS_BN` and `WS_STAGES`.
const WS_TILE: usize = 128;
const WS_STAGES: usize = 6;
// One CTA an SM: 227 KiB of shared memory a block on sm_90.
const _: () = assert!(LINEAR_WS.smem <= 227 * 1024);
/// The activation packing that feeds it (a block an image tile of 128 rows x 64 k).
pub(crate) const PACK_WS: Entry =
    Entry { name: "pack_act_ws", family: FAMILY, threads: 256, dyn_smem: 0 };

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

/// One product on `linear_bf16_ws`: the operands, as `linear_bf16` takes them.
pub(crate) struct WsCall {
    pub op: &'static str,
    /// Device addresses: weight, input, row map (0: identity), bias (0: none), output.
    pub w: u64,
    pub x: u64,
    pub row_idx: u64,
    pub bias: u64,
    pub out: u64,
    pub out_mode: i32,
    pub n: u32,
    pub k: u32,
    pub rows: u32,
    pub slice_len: u32,
    pub slices: u32,
}

/// Whether `linear_bf16_ws` can take a weight at device address `w`: a tensor map needs a
/// 16-byte aligned base (K is a multiple of 8, so every row then is too).
pub(crate) fn ws_takes(be: &CudaBackend, w: u64) -> bool {
    runs_on(be.arch()) && w.is_multiple_of(16)
}

/// Packs the input into the backend's image buffer (`pack_act_ws`), then launches
/// `linear_bf16_ws` on it. Only direct (unrecorded) steps reach here: products of at least
/// `TILED_MIN_ROWS` rows, more than a recorded step holds, so the image may grow in place.
/// Inside [`CudaBackend::sharing_packed_input`], a product whose input the image already holds
/// skips the packing.
pub(crate) fn ws_launch(be: &CudaBackend, c: &WsCall) -> Result<()> {
    let (tile_rows, ktiles) = ((c.rows as usize).div_ceil(WS_TILE), c.k.div_ceil(64) as usize);
    if tile_rows > 65_535 {
        return Err(BackendError::shape(c.op, format!("{} rows exceed the kernel's grid", c.rows)));
    }
    let key = (c.x, c.row_idx, c.k, c.rows);
    let mut image = be.act_image.lock().unwrap_or_else(|e| e.into_inner());
    let img = image.buffer(be, tile_rows * WS_TILE * ktiles * 64)?;
    let reuse = image.sharing && image.holds == Some(key);
    if !reuse {
        image.holds = image.sharing.then_some(key);
        let cfg = LaunchConfig {
            grid_dim: (ktiles as u32, tile_rows as u32, 1),
            block_dim: (PACK_WS.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [c.x.into(), c.row_idx.into(), img.into(), c.k.into(), c.rows.into()];
        be.launch(PACK_WS.name, cfg, &args)?;
    }
    drop(image);
    let tiles = (c.n as usize).div_ceil(WS_TILE) * tile_rows;
    let cfg = LaunchConfig {
        grid_dim: (tiles.min(be.sms.max(1)) as u32, 1, 1),
        block_dim: (LINEAR_WS.threads, 1, 1),
        shared_mem_bytes: LINEAR_WS.smem,
    };
    let args: [KArg; 11] = [
        c.w.into(),
        KArg::Map(Arc::new(weight_map(c)?)),
        img.into(),
        c.bias.into(),
        c.out.into(),
        c.out_mode.into(),
        c.n.into(),
        c.k.into(),
        c.rows.into(),
        c.slice_len.into(),
        c.slices.into(),
    ];
    be.launch(LINEAR_WS.name, cfg, &args)
}

/// The weight's tensor map for `linear_bf16_ws` (gemm90ws.cu `TF_WS_ACOPY` 2): bf16
/// `[n][k]` row-major, boxes of 64 k x 128 rows, no swizzle or interleave, zeros outside.
fn weight_map(c: &WsCall) -> Result<sys::CUtensorMap> {
    use sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 as BF16;
    use sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE as ZEROS;
    use sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE as PLAIN;
    use sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B as L2_256;
    use sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE as NO_SWIZZLE;
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims = [c.k as u64, c.n as u64];
    let strides = [c.k as u64 * 2];
    let (boxes, steps) = ([64u32, 128], [1u32, 1]);
    // SAFETY: the arrays hold `rank` (2) dims, box sizes and element strides and `rank - 1`
    // byte strides, as the call reads; `c.w` is a 16-byte aligned device address of n x k
    // bf16 (`ws_takes`), K a multiple of 8 so the row stride is a multiple of 16 bytes. The
    // encoding only writes `map`.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            BF16,
            2,
            c.w as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            PLAIN,
            NO_SWIZZLE,
            L2_256,
            ZEROS,
        )
        .result()
    }
    .map_err(|e| {
        BackendError::Device(format!("cuda: {}: encoding the weight's tensor map: {e}", c.op))
    })?;
    Ok(map)
}

/// The packed activations (`CudaBackend::act_image`): the buffer, grown on demand, and while
/// products share an input (`sharing`), which input it holds (input, row map, k, rows).
#[derive(Default)]
pub(crate) struct ActImage {
    buf: Option<CudaSlice<u16>>,
    sharing: bool,
    holds: Option<(u64, u64, u32, u32)>,
}

impl ActImage {
    /// The buffer of at least `elems` bf16 (ops run in stream order, and a freed buffer is
    /// released in stream order too, after the launches that read it). Growing forgets what
    /// it held.
    fn buffer(&mut self, be: &CudaBackend, elems: usize) -> Result<u64> {
        if self.buf.as_ref().is_none_or(|b| b.len() < elems) {
            self.buf = None;
            self.holds = None;
            self.buf = Some(be.raw::<u16>(elems, "packed prefill activations")?);
        }
        Ok(self.buf.as_ref().map_or(0u64, |b| dptr(b, &be.stream)))
    }
}

impl CudaBackend {
    /// Runs `f`, products over one input that nothing writes meanwhile (q, k and v; gate and
    /// up), packing that input for `linear_bf16_ws` once instead of once a product
    /// (`TENSORFOLD_SHARE_PACK=0`: once a product, for A/B timing). Speed only: the image is
    /// the same bytes either way.
    pub(crate) fn sharing_packed_input<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        static ON: OnceLock<bool> = OnceLock::new();
        let on =
            *ON.get_or_init(|| std::env::var("TENSORFOLD_SHARE_PACK").map_or(true, |v| v != "0"));
        let set = |sharing| {
            let mut image = self.act_image.lock().unwrap_or_else(|e| e.into_inner());
            (image.sharing, image.holds) = (sharing, None);
        };
        set(on);
        let r = f();
        set(false);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ws_shape_mirrors_the_kernel_source() {
        let src = include_str!("../../kernels/gemm90ws.cu");
        for (name, v) in [("WS_BM", WS_TILE), ("WS_BN", WS_TILE), ("WS_STAGES", WS_STAGES)] {
            assert!(
                src.contains(&format!("#define {name} {v}\n")),
                "{name} is not {v} in gemm90ws.cu"
            );
        }
        assert!(src.contains("__launch_bounds__(384, 1)") && LINEAR_WS.threads == 384);
    }

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
