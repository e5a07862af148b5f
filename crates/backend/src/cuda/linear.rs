//! `linear` and `logits` on the tensor cores (`kernels/linear.cu`, `kernels/gemm.cu`).
//!
//! Every output element is a chain of mma.sync m16n8k16 steps (bf16 products, f32
//! accumulation) over fixed K slices, the slices' partials added in order, then the bias,
//! then one rounding. The slices come from [`k_split`], a function of the weight shape
//! `(N, K)` alone: the same arithmetic for 1 row or 2,048 (DESIGN.md §4). Two kernels compute
//! it: `linear_bf16` (operands from global memory, one warp per slice; decode and small
//! batches) and `linear_bf16_tiled` (shared-memory tiles of 128 features x 128 tokens, one CTA
//! walking the slices in order; prefill). They give the same bits for every element, so the
//! row count may pick the kernel (`tiled_for`) without changing any result.
//!
//! Rejected: cuBLAS (its kernel choice, and so its summation order, depends on the row
//! count); atomics for the K split (their order depends on timing); split-K across CTAs for
//! the tiled kernel (a CTA holds the running total in registers instead).

use cudarc::driver::LaunchConfig;

use super::gemm::{tiled_config, tiled_for, tiled_launch, tiled_shape};
use super::kernels::{TiledShape, LINEAR_DECODE_ROWS, LINEAR_MAX_SLICES, LINEAR_NT};
use super::tensor::{dptr, CudaBatch, CudaTensor, CudaWeight};
use super::wgmma::WsCall;
use super::{CudaBackend, KArg};
use crate::error::{BackendError, Result};
use crate::{ActDType, LinearPart};

/// Warps wanted in flight per product on a large GPU: enough to stream weights at full
/// bandwidth on a decode row (132 SMs x 16 warps on an H100/H200).
const TARGET_WARPS: usize = 2048;
/// [`TARGET_WARPS`], or `TENSORFOLD_LINEAR_WARPS` (a measurement knob: it changes every GPU
/// product's K split, so every GPU result's bits, the same way on every path of a process).
/// H200, 2026-12-03, bench decode (tok/s, one call): 193-202 at 2,048 (two runs), 197 at
/// 4,096, 182-189 at 1,024, 179 at 8,192. Prefill products (`linear_bf16_ws`, 2,048 rows)
/// run faster with fewer slices: 4096 x 4096 605 -> 628 TFLOP/s at 512, 517 at 8,192.
/// Session 21 (with the L2 line hint): 4,096 against 2,048, decode 205-209 vs 210-213 tok/s,
/// the 33B geometry 54.0-54.2 vs 56.9.
fn target_warps() -> usize {
    static W: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *W.get_or_init(|| {
        let v = std::env::var("TENSORFOLD_LINEAR_WARPS").ok();
        v.and_then(|v| v.parse().ok()).filter(|&w: &usize| w > 0).unwrap_or(TARGET_WARPS)
    })
}
/// Shortest K slice worth a warp (8 super-steps of 32).
const MIN_SLICE: usize = 256;
/// The K split of a weight `(n, k)`: `(slices, slice_len)`. Slices are a power of two, at
/// most 16, enough that `ceil(n/16) * slices` warps fill the GPU, but none shorter than
/// `MIN_SLICE`; `slice_len` is a multiple of 32. Keyed by the shape only, never the rows.
pub fn k_split(n: usize, k: usize) -> (u32, u32) {
    let tiles = n.div_ceil(16).max(1);
    let want = target_warps().div_ceil(tiles).next_power_of_two();
    let cap = prev_power_of_two((k / MIN_SLICE).max(1));
    let slices = want.min(cap).min(LINEAR_MAX_SLICES as usize).max(1);
    let slice_len = k.div_ceil(slices).div_ceil(32) * 32;
    (slices as u32, slice_len as u32)
}

fn prev_power_of_two(x: usize) -> usize {
    1 << (usize::BITS - 1 - x.max(1).leading_zeros())
}

/// Output rounding of the kernel (its `out_mode`).
#[derive(Clone, Copy, Debug)]
enum OutMode {
    Bf16 = 0,
    F32 = 1,
    F32RoundBf16 = 2,
}

/// One product to launch.
struct Product<'a> {
    op: &'static str,
    x: &'a CudaTensor,
    /// Device u32 array mapping output row i to an input row (logits), or 0 for identity.
    row_idx: u64,
    rows: usize,
    w: &'a CudaWeight,
    bias: Option<&'a CudaWeight>,
    mode: OutMode,
}

pub(crate) fn linear(
    be: &CudaBackend,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
    out: &mut CudaTensor,
) -> Result<()> {
    let mode = match out.dtype {
        ActDType::Bf16 => OutMode::Bf16,
        ActDType::F32 => OutMode::F32,
    };
    let rows = x.rows;
    run(be, Product { op: "linear", x, row_idx: 0, rows, w, bias, mode }, out)
}

pub(crate) fn logits(
    be: &CudaBackend,
    x: &CudaTensor,
    w: &CudaWeight,
    batch: &CudaBatch,
    out: &mut CudaTensor,
) -> Result<()> {
    if x.rows != batch.rows() {
        return Err(BackendError::shape(
            "logits",
            format!("{} rows but the batch has {}", x.rows, batch.rows()),
        ));
    }
    if out.dtype != ActDType::F32 {
        return Err(BackendError::shape("logits", "the output tensor must be f32"));
    }
    let rows = batch.meta.logit_rows.len();
    let row_idx = batch.ptr(&be.stream, batch.at.logit_rows);
    let p = Product { op: "logits", x, row_idx, rows, w, bias: None, mode: OutMode::F32RoundBf16 };
    run(be, p, out)
}

/// Which kernel computes a product.
#[derive(Clone, Copy, Debug)]
enum Kernel {
    /// `linear_bf16`.
    Streaming,
    /// `linear_bf16_tiled` (or a candidate configuration of it).
    Tiled(TiledShape),
    /// `linear_bf16_ws` (sm_90a; `gather_rows` first where its input map needs it).
    Ws,
}

impl CudaBackend {
    /// `linear` forced onto the kernel entry point `name` (`linear_bf16`, a
    /// `linear_bf16_tiled*`, or on sm_90a `linear_bf16_wg*` / `linear_bf16_ws`, the last with
    /// its row gather where needed), whatever the row count. For tests and benchmarks only
    /// (all give the same bits; the served path lets `tiled_for` and `prefill_config` choose).
    #[doc(hidden)]
    pub fn linear_with_kernel(
        &self,
        name: &str,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let kernel = match name {
            "linear_bf16" => Kernel::Streaming,
            "linear_bf16_ws" if super::wgmma::runs_on(self.arch()) => Kernel::Ws,
            n => match tiled_shape(n).or(super::wgmma::wg_shape(self, n)?) {
                Some(t) => Kernel::Tiled(t),
                None => return Err(BackendError::Device(format!("no linear kernel `{name}`"))),
            },
        };
        let mode = match out.dtype {
            ActDType::Bf16 => OutMode::Bf16,
            ActDType::F32 => OutMode::F32,
        };
        let p = Product { op: "linear", x, row_idx: 0, rows: x.rows, w, bias, mode };
        run_with(self, p, out, Some(kernel))
    }
}

fn run(be: &CudaBackend, p: Product<'_>, out: &mut CudaTensor) -> Result<()> {
    run_with(be, p, out, None)
}

fn run_with(
    be: &CudaBackend,
    p: Product<'_>,
    out: &mut CudaTensor,
    force: Option<Kernel>,
) -> Result<()> {
    check(&p, out)?;
    if p.rows > 0 {
        launch(be, &p, out, force.unwrap_or(default_kernel(be, &p)))?;
    }
    out.rows = p.rows;
    Ok(())
}

/// The shape checks of a product (its weight, input, output and bias).
fn check(p: &Product<'_>, out: &CudaTensor) -> Result<()> {
    let (w, x, op) = (p.w, p.x, p.op);
    w.check_matrix(op)?;
    let (n, k) = (w.n, w.k);
    if x.cols != k {
        return Err(BackendError::shape(
            op,
            format!("input has {} columns, weight `{}` is [{n}, {k}]", x.cols, w.name),
        ));
    }
    if x.dtype != ActDType::Bf16 {
        return Err(BackendError::shape(
            op,
            "f32 inputs are not implemented on the CUDA backend (bf16 only)",
        ));
    }
    if !k.is_multiple_of(8) || n > u32::MAX as usize || k > u32::MAX as usize {
        return Err(BackendError::shape(
            op,
            format!("weight `{}` is [{n}, {k}]: the CUDA kernel needs K a multiple of 8", w.name),
        ));
    }
    out.check_out(op, p.rows, n)?;
    if p.rows > u32::MAX as usize {
        return Err(BackendError::shape(op, format!("{} rows exceed the kernels' u32", p.rows)));
    }
    if let Some(b) = p.bias {
        b.check_vector(op, n)?;
    }
    Ok(())
}

/// The kernel a product takes unless forced: the streaming kernel for few rows, else the
/// prefill kernel (`prefill_config`).
fn default_kernel(be: &CudaBackend, p: &Product<'_>) -> Kernel {
    match tiled_for(p.rows, p.w.n) {
        true => prefill_config(be, p.rows, p.w.n, dptr(&p.w.buf, &be.stream)),
        false => Kernel::Streaming,
    }
}

/// Several products of one input (q, k and v; gate and up), each element linear_bf16's: one
/// `linear_bf16_ws3` launch where every part would take `linear_bf16_ws` alone with a bf16
/// output (prefill on sm_90a), else one launch a part. `TENSORFOLD_WS_GROUP=0` keeps one
/// launch a part (A/B timing; the same bits either way).
pub(crate) fn linear_parts(
    be: &CudaBackend,
    x: &CudaTensor,
    parts: &mut [LinearPart<'_, CudaBackend>],
) -> Result<()> {
    static GROUP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *GROUP.get_or_init(|| std::env::var("TENSORFOLD_WS_GROUP").map_or(true, |v| v != "0"));
    let products: Vec<Product<'_>> = parts
        .iter()
        .map(|p| Product {
            op: "linear",
            x,
            row_idx: 0,
            rows: x.rows,
            w: p.w,
            bias: p.bias,
            mode: OutMode::Bf16,
        })
        .collect();
    let grouped = on
        && (2..=3).contains(&parts.len())
        && x.rows > 0
        && dptr(&x.buf, &be.stream).is_multiple_of(16)
        && parts.iter().zip(&products).all(|(p, prod)| {
            p.out.dtype == ActDType::Bf16
                && check(prod, p.out).is_ok()
                && matches!(default_kernel(be, prod), Kernel::Ws)
        });
    if !grouped {
        return parts.iter_mut().try_for_each(|p| linear(be, x, p.w, p.bias, p.out));
    }
    let calls: Vec<WsCall> =
        parts.iter().zip(&products).map(|(p, prod)| ws_call(be, prod, p.out)).collect();
    super::wgmma::ws_launch_group(be, &calls)?;
    for p in parts.iter_mut() {
        p.out.rows = x.rows;
    }
    Ok(())
}

/// A product's `linear_bf16_ws` operands.
fn ws_call(be: &CudaBackend, p: &Product<'_>, out: &CudaTensor) -> WsCall {
    let (n, k) = (p.w.n, p.w.k);
    let (slices, slice_len) = k_split(n, k);
    let s = &be.stream;
    WsCall {
        op: p.op,
        w: dptr(&p.w.buf, s),
        x: dptr(&p.x.buf, s),
        row_idx: p.row_idx,
        bias: p.bias.map_or(0u64, |b| dptr(&b.buf, s)),
        out: dptr(&out.buf, s),
        out_mode: p.mode as i32,
        n: n as u32,
        k: k as u32,
        rows: p.rows as u32,
        slice_len,
        slices,
    }
}

/// The prefill kernel of a product of weight address `w` (speed only; every candidate gives
/// linear_bf16's bits): on sm_90a `linear_bf16_ws`, else `tiled_config`'s choice.
/// `TENSORFOLD_WGMMA` picks another for A/B timing: `0` the mma.sync tiles, `ss` the
/// shared-memory-operand wgmma kernel `linear_bf16_wg`.
fn prefill_config(be: &CudaBackend, rows: usize, n: usize, w: u64) -> Kernel {
    static WGMMA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let v = WGMMA.get_or_init(|| std::env::var("TENSORFOLD_WGMMA").unwrap_or_default());
    let hopper = super::wgmma::runs_on(be.arch());
    match v.as_str() {
        "0" => Kernel::Tiled(tiled_config(rows, n)),
        "ss" if hopper => Kernel::Tiled(super::wgmma::LINEAR_WG),
        _ if super::wgmma::ws_takes(be, w) => Kernel::Ws,
        _ if hopper => Kernel::Tiled(super::wgmma::LINEAR_WG),
        _ => Kernel::Tiled(tiled_config(rows, n)),
    }
}

/// Launches one product on `kernel` (shapes already checked by `run_with`).
fn launch(be: &CudaBackend, p: &Product<'_>, out: &CudaTensor, kernel: Kernel) -> Result<()> {
    let (n, k) = (p.w.n, p.w.k);
    let (slices, slice_len) = k_split(n, k);
    let s = &be.stream;
    let (wp, xp, op_) = (dptr(&p.w.buf, s), dptr(&p.x.buf, s), dptr(&out.buf, s));
    let bp = p.bias.map_or(0u64, |b| dptr(&b.buf, s));
    let (mode, n32, k32, r32) = (p.mode as i32, n as u32, k as u32, p.rows as u32);
    let mut extra = Vec::new();
    let (entry, cfg) = match kernel {
        Kernel::Streaming => {
            // Decode rows take the one-token-tile variant (same bits, fewer registers).
            let (name, nt) = match p.rows <= LINEAR_DECODE_ROWS {
                true => ("linear_bf16_d8", 1),
                false => ("linear_bf16", LINEAR_NT),
            };
            let grid_y = p.rows.div_ceil(8 * nt as usize);
            if grid_y > 65535 {
                return Err(BackendError::shape(
                    p.op,
                    format!("{} rows exceed the kernel's grid", p.rows),
                ));
            }
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(16) as u32, grid_y as u32, 1),
                block_dim: (32 * slices, 1, 1),
                shared_mem_bytes: slices * nt * 32 * 4 * 4,
            };
            (name, cfg)
        }
        Kernel::Tiled(shape) => {
            let t = tiled_launch(shape, p.op, p.rows, n, slices)?;
            extra = t.extra;
            (t.name, t.cfg)
        }
        Kernel::Ws => return super::wgmma::ws_launch(be, &ws_call(be, p, out)),
    };
    let mut args: Vec<KArg> = vec![
        wp.into(),
        xp.into(),
        p.row_idx.into(),
        bp.into(),
        op_.into(),
        mode.into(),
        n32.into(),
        k32.into(),
        r32.into(),
        slice_len.into(),
    ];
    args.extend(extra);
    be.launch(entry, cfg, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_split_depends_on_the_shape_and_covers_k() {
        for (n, k) in [
            (576, 576),
            (1536, 576),
            (49152, 576),
            (4096, 4096),
            (1024, 4096),
            (14336, 4096),
            (4096, 14336),
            (8, 8),
            (16, 40),
        ] {
            let (s, len) = k_split(n, k);
            assert!(s.is_power_of_two() && s <= LINEAR_MAX_SLICES, "{n}x{k}: {s}");
            assert_eq!(len % 32, 0);
            assert!((s * len) as usize >= k, "{n}x{k}: {s} x {len}");
        }
        assert_eq!(k_split(4096, 4096), (8, 512));
        assert_eq!(k_split(1024, 4096), (16, 256));
        assert_eq!(k_split(576, 576), (2, 288));
    }
}
