//! The Hopper prefill GEMMs (sm_90a only): `linear_bf16_ws` (`kernels/gemm90ws.cu`, served)
//! and `linear_bf16_wg` (`kernels/gemm90.cu`): their launch shapes, the tensor maps the first
//! takes, and the lookup that lets `CudaBackend::linear_with_kernel` force a product onto
//! either.
//!
//! Invariant: both give the bits of `linear_bf16` for every element (same K split from
//! `k_split`, one wgmma k16 step per mma.sync of linear_bf16's chain over the same 16
//! consecutive k, same slice order, bias, one rounding; tests/cuda_wgmma.rs first shows a
//! wgmma step equals an mma.sync step bit for bit, then compares the kernels). Where a product
//! takes a prefill kernel (`tiled_for`), `linear.rs` `prefill_config` takes `linear_bf16_ws` on
//! sm_90a (the contract's row gate compares it with the decode kernels on every shape). Other
//! architectures compile the family to empty entry points, never launched
//! (`kernels::launched_on`), and are refused here by name.
//!
//! Both operands reach `linear_bf16_ws` by 2-D tensor copies of maps encoded per call (a few
//! microseconds of host time; prefill steps are never graphed). A call that maps output rows to
//! input rows (logits) or whose input is not 16-byte aligned first gathers its rows into a
//! buffer of the backend's (`gather_rows`).
//!
//! Rejected: cuBLAS (its kernel choice, and so each element's summation order, depends on
//! the row count); an activation image packed by an extra kernel (the earlier definition's
//! step sets needed it: a full read and write of every product's input).

use std::sync::Arc;

use cudarc::driver::{sys, LaunchConfig};

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
/// warpgroups over 128 x 128 tiles, 3 stages of (128 + 128) rows x 128 k, the two consumers'
/// epilogue staging (128 tokens x 128 bytes each, which their tensor stores read), the stages'
/// mbarriers (two a stage, counted in 64-k stages so the `TF_WS_KT=64` knob's 6 stages fit
/// too) and 1 KiB of alignment slack (`WS_SMEM`). `features`/`tokens` are its tile.
pub(crate) const LINEAR_WS: TiledShape = TiledShape {
    name: "linear_bf16_ws",
    features: WS_TILE,
    tokens: WS_TILE,
    threads: 384,
    smem: (WS_STAGES * 2 * WS_TILE * 2 * WS_KT
        + 2 * (WS_STAGES * WS_KT / 64) * 8
        + 2 * WS_TILE * 128
        + 1024) as u32,
};
/// gemm90ws.cu's `WS_BM` = `WS_BN`, `TF_WS_KT` and `WS_STAGES`.
const WS_TILE: usize = 128;
const WS_KT: usize = 128;
const WS_STAGES: usize = 3;
// One CTA an SM: 227 KiB of shared memory a block on sm_90.
const _: () = assert!(LINEAR_WS.smem <= 227 * 1024);
/// The row gather for calls the input's map cannot take directly (16 bytes a thread).
pub(crate) const GATHER: Entry =
    Entry { name: "gather_rows", family: FAMILY, threads: 256, dyn_smem: 0 };

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

/// Launches `linear_bf16_ws` on one product, gathering its input rows first when the input's
/// map cannot address them directly (a row map, or an unaligned input). Only direct
/// (unrecorded) steps reach here: products of at least `TILED_MIN_ROWS` rows, more than a
/// recorded step holds, so the gather buffer may grow in place.
pub(crate) fn ws_launch(be: &CudaBackend, c: &WsCall) -> Result<()> {
    let tile_rows = (c.rows as usize).div_ceil(WS_TILE);
    let mut x = c.x;
    if c.row_idx != 0 || !x.is_multiple_of(16) {
        if c.rows > 65_535 {
            return Err(BackendError::shape(
                c.op,
                format!("{} rows exceed the gather's grid", c.rows),
            ));
        }
        x = gathered_rows(be, c.rows as usize * c.k as usize)?;
        let cfg = LaunchConfig {
            grid_dim: (c.k.div_ceil(8 * GATHER.threads), c.rows, 1),
            block_dim: (GATHER.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        be.launch(GATHER.name, cfg, &[c.x.into(), c.row_idx.into(), x.into(), c.k.into()])?;
    }
    let tiles = (c.n as usize).div_ceil(WS_TILE) * tile_rows;
    let cfg = LaunchConfig {
        grid_dim: (tiles.min(be.sms.max(1)) as u32, 1, 1),
        block_dim: (LINEAR_WS.threads, 1, 1),
        shared_mem_bytes: LINEAR_WS.smem,
    };
    let args: [KArg; 11] = [
        KArg::Map(Arc::new(tile_map(c.op, "weight", c.w, c.n, c.k)?)),
        KArg::Map(Arc::new(tile_map(c.op, "input", x, c.rows, c.k)?)),
        KArg::Map(Arc::new(out_map(c)?)),
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

/// `linear_bf16_ws3` (gemm90ws.cu): 2 or 3 products of one input in one launch (each part's
/// elements as `ws_launch` alone gives them). The parts share the input (direct rows, 16-byte
/// aligned: the caller checks), K, the row count and a bf16 output mode.
pub(crate) fn ws_launch_group(be: &CudaBackend, calls: &[WsCall]) -> Result<()> {
    let (Some(first), true) = (calls.first(), (2..=3).contains(&calls.len())) else {
        return Err(BackendError::shape("linear_group", format!("{} parts", calls.len())));
    };
    let same = calls.iter().all(|c| {
        c.x == first.x
            && c.k == first.k
            && c.rows == first.rows
            && c.row_idx == 0
            && c.out_mode == 0
    });
    if !same || !first.x.is_multiple_of(16) {
        return Err(BackendError::shape("linear_group", "parts of one direct bf16 input"));
    }
    // A third part of no features where there are two: its map is the second's, never read.
    let part = |j: usize| calls.get(j).unwrap_or(&calls[1]);
    let n = |j: usize| if j < calls.len() { calls[j].n } else { 0 };
    let tiles: usize = calls.iter().map(|c| (c.n as usize).div_ceil(WS_TILE)).sum::<usize>()
        * (first.rows as usize).div_ceil(WS_TILE);
    let cfg = LaunchConfig {
        grid_dim: (tiles.min(be.sms.max(1)) as u32, 1, 1),
        block_dim: (WS3.threads, 1, 1),
        shared_mem_bytes: WS3.dyn_smem,
    };
    let mut args: Vec<KArg> = Vec::with_capacity(25);
    for j in 0..3 {
        let c = part(j);
        args.push(KArg::Map(Arc::new(tile_map(c.op, "weight", c.w, c.n, c.k)?)));
    }
    args.push(KArg::Map(Arc::new(tile_map(first.op, "input", first.x, first.rows, first.k)?)));
    for j in 0..3 {
        args.push(KArg::Map(Arc::new(out_map(part(j))?)));
    }
    args.extend((0..3).map(|j| KArg::from(part(j).bias)));
    args.extend((0..3).map(|j| KArg::from(part(j).out)));
    args.push(0i32.into());
    args.extend((0..3).map(|j| KArg::from(n(j))));
    args.extend((0..3).map(|j| KArg::from(part(j).slice_len)));
    args.extend((0..3).map(|j| KArg::from(part(j).slices)));
    args.extend([KArg::from(first.k), KArg::from(first.rows)]);
    be.launch(WS3.name, cfg, &args)
}

/// The grouped entry (`linear_bf16_ws3`): `linear_bf16_ws`'s block and shared memory.
pub(crate) const WS3: Entry = Entry {
    name: "linear_bf16_ws3",
    family: FAMILY,
    threads: LINEAR_WS.threads,
    dyn_smem: LINEAR_WS.smem,
};

/// The tensor map a `linear_bf16_ws*` consumer stores its staged bf16 tile through (bf16
/// `[rows][n]`, boxes of 64 features x 128 tokens: `tile_map`'s form), where the kernel
/// stages the output (bf16, n % 8 == 0, 16-byte aligned); all zeros elsewhere (never read).
fn out_map(c: &WsCall) -> Result<sys::CUtensorMap> {
    let staged = c.out_mode == 0 && c.n.is_multiple_of(8) && c.out.is_multiple_of(16);
    match staged {
        true => tile_map(c.op, "output", c.out, c.rows, c.n),
        false => Ok(sys::CUtensorMap { opaque: [0; 16] }),
    }
}

/// The tensor map `linear_bf16_ws` reads an operand through: bf16 `[rows][k]` row-major at
/// `base` (16-byte aligned), boxes of 64 k x 128 rows in the 128-byte swizzle (the layout
/// its wgmma descriptors name), zeros outside.
fn tile_map(op: &str, what: &str, base: u64, rows: u32, k: u32) -> Result<sys::CUtensorMap> {
    use sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 as BF16;
    use sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE as ZEROS;
    use sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE as PLAIN;
    use sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B as L2_256;
    use sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B as SWIZZLE_128;
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims = [k as u64, rows as u64];
    let strides = [k as u64 * 2];
    let (boxes, steps) = ([64u32, WS_TILE as u32], [1u32, 1]);
    // SAFETY: the arrays hold `rank` (2) dims, box sizes and element strides and `rank - 1`
    // byte strides, as the call reads; `base` is a 16-byte aligned device address of rows x k
    // bf16 (`ws_takes` for weights, `ws_launch` for inputs, `out_map` for outputs), K a
    // multiple of 8 so the row stride is a multiple of 16 bytes. The encoding only writes `map`.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            BF16,
            2,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            PLAIN,
            SWIZZLE_128,
            L2_256,
            ZEROS,
        )
        .result()
    }
    .map_err(|e| {
        BackendError::Device(format!("cuda: {op}: encoding the {what}'s tensor map: {e}"))
    })?;
    Ok(map)
}

/// The gathered-rows buffer (`CudaBackend::gathered`) of at least `elems` bf16, grown on
/// demand (ops run in stream order, and a freed buffer is released in stream order too, after
/// the launches that read it), as attention's `partials`.
fn gathered_rows(be: &CudaBackend, elems: usize) -> Result<u64> {
    let mut buf = be.gathered.lock().unwrap_or_else(|e| e.into_inner());
    if buf.as_ref().is_none_or(|b| b.len() < elems) {
        *buf = None;
        *buf = Some(be.raw::<u16>(elems.max(1), "gathered prefill rows")?);
    }
    Ok(buf.as_ref().map_or(0u64, |b| dptr(b, &be.stream)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ws_shape_mirrors_the_kernel_source() {
        let src = concat!(
            include_str!("../../kernels/gemm90ws.cu"),
            include_str!("../../kernels/gemm90ws_loop.cu")
        );
        let defs =
            [("WS_BM", WS_TILE), ("WS_BN", WS_TILE), ("TF_WS_KT", WS_KT), ("WS_STAGES", WS_STAGES)];
        for (name, v) in defs {
            assert!(
                src.contains(&format!("#define {name} {v}\n")),
                "{name} is not {v} in gemm90ws.cu / gemm90ws_loop.cu"
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
