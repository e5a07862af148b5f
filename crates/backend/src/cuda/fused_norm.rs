//! The residual add and RMSNorm fused into the products that read the normed rows
//! (`kernels/linear_norm.cu`): `add_norm_linear_group` (q, k, v) and `add_norm_linear_swiglu`
//! (gate, up). Each CTA of the grouped product computes the call's normed rows itself, in
//! `add_rms_norm`'s 16-byte path's order (same adds, same sum of squares by the same virtual
//! threads, same roundings), so its slices read the bits the separate launch would have
//! written; the grid's last CTA writes the residual and the normed rows back. Decode-sized
//! calls only (at most `LINEAR_DECODE_ROWS` rows whose normed rows fit `STAGE_MAX` bytes of
//! shared memory); anything else runs `add_rms_norm` and then the product, the same bits.
//! `TENSORFOLD_NORM_FUSE` picks which products fuse (`qkv`, the default; `all`; `0`: none).
//!
//! H200, session 17 (`tests/cuda_step_marginals.rs`, the graphed llama3-8b decode step at
//! position 300): the step took 4.89 ms with the norm launches and 4.64 ms without them. A
//! CTA a tile, each computing the norm, was slower (5.06 ms: gate/up's 896 CTAs run 3.4 waves,
//! each paying the prologue); persistent CTAs with the norm weights brought before the wait:
//! at one row (tests/cuda_fused_norm.rs) norm + q/k/v 22.8 -> 19.7 us, norm + gate/up 65.7 ->
//! 69.4 us, so the step was unchanged with both fused (4.92 ms) and gate/up stays unfused.

use super::fused::{
    group_launch, launch_group, linear_group, linear_swiglu, swiglu_launch, GroupLaunch, JOB_SMEM,
};
use super::kernels::LINEAR_DECODE_ROWS;
use super::ops::norm_threads;
use super::tensor::{dptr, CudaTensor, CudaWeight};
use super::{CudaBackend, KArg};
use crate::error::Result;
use crate::{ActDType, AddNormArgs, LinearPart, SwigluArgs};

/// Most bytes of normed rows a fused CTA stages (rows * hidden * 2); the norm weights (hidden
/// * 4 bytes) may take twice that.
pub(crate) const STAGE_MAX: usize = 16 * 1024;
/// Dynamic shared memory of the norm entries' largest launch: the weights, the sums and the
/// stage, and the partials of 16 slice jobs.
pub(crate) const NORM_SMEM_MAX: u32 = 4 * STAGE_MAX as u32 + 16 * JOB_SMEM;

/// Which products take the norm in their prologue (`TENSORFOLD_NORM_FUSE`): `qkv` (the
/// default: q/k/v only), `all` (gate/up too) or `0` (none). Speed only.
#[derive(Clone, Copy, PartialEq)]
enum Fuse {
    None,
    Qkv,
    All,
}

fn fuse_mode() -> Fuse {
    static MODE: std::sync::OnceLock<Fuse> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| {
        if super::compile::kernel_define("TF_VEC16").as_deref() == Some("0") {
            return Fuse::None;
        }
        match std::env::var("TENSORFOLD_NORM_FUSE").as_deref() {
            Ok("0") => Fuse::None,
            Ok("all") => Fuse::All,
            _ => Fuse::Qkv,
        }
    })
}

/// Whether the norm can run in the prologue of a product over the rows of `n.acc` (`swiglu`:
/// the gate/up product).
pub(crate) fn fusable(be: &CudaBackend, n: &AddNormArgs<'_, CudaBackend>, swiglu: bool) -> bool {
    let off = match fuse_mode() {
        Fuse::None => true,
        Fuse::Qkv => swiglu,
        Fuse::All => false,
    };
    let (rows, k) = (n.acc.rows, n.acc.cols);
    let s =
        |t: &CudaTensor| t.dtype == ActDType::Bf16 && dptr(&t.buf, &be.stream).is_multiple_of(16);
    !off && (1..=LINEAR_DECODE_ROWS).contains(&rows)
        && n.x.rows == rows
        && n.x.cols == k
        && n.group == k
        && k.is_multiple_of(8)
        && rows * k * 2 <= STAGE_MAX
        && k * 4 <= 2 * STAGE_MAX
        && n.out.cols == k
        && n.out.max_rows >= rows
        && s(n.acc)
        && s(n.x)
        && s(n.out)
}

/// The norm arguments (linear_norm.cu's NORM_PARAMS) after a product's own.
fn norm_args(be: &CudaBackend, n: &AddNormArgs<'_, CudaBackend>, args: &mut Vec<KArg>) {
    let s = &be.stream;
    args.extend([
        KArg::U64(dptr(&n.acc.buf, s)),
        KArg::U64(dptr(&n.x.buf, s)),
        KArg::U64(dptr(&n.weight.buf, s)),
        KArg::U64(dptr(&n.out.buf, s)),
        KArg::U64(dptr(&be.norm_counter, s)),
        KArg::F32(n.eps),
        KArg::U32(norm_threads(n.group)),
    ]);
}

/// Launches `name` with the product's and the norm's arguments, then `extra`'s: persistent CTAs
/// (as many as the GPU holds at once, at most one a tile) over one token tile.
pub(crate) fn launch(
    be: &CudaBackend,
    name: &'static str,
    mut l: GroupLaunch,
    n: &AddNormArgs<'_, CudaBackend>,
    extra: &[KArg],
) -> Result<()> {
    norm_args(be, n, &mut l.args);
    l.args.extend_from_slice(extra);
    let (rows, k) = (n.acc.rows as u32, n.acc.cols as u32);
    let smem = 4 * k + 4 * rows * k + l.part_smem;
    launch_group(be, name, l, smem, 1, true)
}

pub(crate) fn add_norm_linear_group(
    be: &CudaBackend,
    n: AddNormArgs<'_, CudaBackend>,
    parts: &mut [LinearPart<'_, CudaBackend>],
) -> Result<()> {
    n.weight.check_vector("add_norm_linear_group", n.group)?;
    let l = match fusable(be, &n, false) {
        true => {
            n.out.rows = n.acc.rows;
            group_launch(be, n.out, parts, 1)?
        }
        false => None,
    };
    let Some(l) = l else {
        let AddNormArgs { acc, x, weight, eps, group, out } = n;
        super::fused::add_rms_norm(be, AddNormArgs { acc, x, weight, eps, group, out: &mut *out })?;
        return linear_group(be, out, parts);
    };
    launch(be, "linear_bf16_group_norm", l, &n, &[])?;
    for p in parts.iter_mut() {
        p.out.rows = n.acc.rows;
    }
    Ok(())
}

pub(crate) fn add_norm_linear_swiglu(
    be: &CudaBackend,
    n: AddNormArgs<'_, CudaBackend>,
    [gate_w, up_w]: [&CudaWeight; 2],
    [gate, up, out]: [&mut CudaTensor; 3],
) -> Result<()> {
    n.weight.check_vector("add_norm_linear_swiglu", n.group)?;
    let rows = n.acc.rows;
    let fuse = fusable(be, &n, true);
    if fuse {
        n.out.rows = rows;
    }
    // The product reads the normed rows (the norm entry reads them staged).
    let l = match fuse {
        true => swiglu_launch(be, n.out, [gate_w, up_w], [&*gate, &*up, &*out], 1)?,
        false => None,
    };
    let Some(l) = l else {
        let AddNormArgs { acc, x, weight, eps, group, out: normed } = n;
        let norm = AddNormArgs { acc, x, weight, eps, group, out: &mut *normed };
        super::fused::add_rms_norm(be, norm)?;
        return linear_swiglu(be, SwigluArgs { x: normed, gate_w, up_w, gate, up, out });
    };
    launch(be, "linear_bf16_swiglu_norm", l, &n, &[])?;
    for t in [gate, up, out] {
        t.rows = rows;
    }
    Ok(())
}
