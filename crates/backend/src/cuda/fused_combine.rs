//! The attention block's back in two launches where it was three: the decode attention's
//! split partials are merged in the o product's prologue (`kernels/linear_combine.cu`,
//! `linear_bf16_d8_combine`) instead of by `attention_combine`. Each CTA of the product merges
//! the call's rows element by element exactly as `attention_combine` does (same operations in
//! the same split order), stages them in shared memory and runs `linear_bf16_d8`'s slice chains
//! over them; CTA 0 writes the merged rows to the attention output. So the call leaves the
//! attention output and the product as `attention` then `linear` would, bit for bit
//! (`tests/cuda_fused_combine.rs`). Decode calls only: at most `LINEAR_DECODE_ROWS` rows
//! whose attention rows fit `STAGE_MAX` bytes, in split mode, with the product on
//! `linear_bf16_d8`; any other call runs the two ops. `TENSORFOLD_COMBINE_FUSE=1` turns it
//! on (an A/B switch: the same bits either way); off by default.
//!
//! H200, session 29: the first prologue (a thread an element, its splits' loads in flight but
//! its elements one after another) gave the two ops' bits (the test, check exact's
//! fingerprints) but took attention + o 19.8 -> 27.5 us at one row, position 300, and bench
//! decode 217.0-220.0 -> 202.4-204.8 tok/s: each of o's 256 CTAs merges the whole row, 16
//! dependent L2 round trips a thread. This prologue takes runs of 16 features of a head a
//! thread (one set of merge factors a run, 16-byte-aligned pairs of loads, two splits in
//! flight) and reads the rows' split counts before the wait.

use super::attention::{attention_with, Unmerged};
use super::fused_norm::STAGE_MAX;
use super::kernels::{LINEAR_DECODE_ROWS, LINEAR_MAX_SLICES};
use super::linear::{d8_launch, linear};
use super::tensor::{dptr, CudaTensor, CudaWeight};
use super::{CudaBackend, KArg};
use crate::error::Result;
use crate::{ActDType, AttnArgs};

/// Dynamic shared memory of the largest launch: the rows' split counts, the stage and the
/// partials of 16 slices.
pub(crate) const COMBINE_SMEM_MAX: u32 = 32 + STAGE_MAX as u32 + LINEAR_MAX_SLICES * 32 * 4 * 4;

/// Whether the combine runs in the o product (`TENSORFOLD_COMBINE_FUSE=1`; off by default
/// until it measures faster, see the module note).
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TENSORFOLD_COMBINE_FUSE").is_ok_and(|v| v == "1"))
}

/// Whether a call of `rows` rows of `a` can take the fused path (before any launch).
fn fusable(be: &CudaBackend, a: &AttnArgs<'_, CudaBackend>, rows: usize) -> bool {
    let k = a.heads * a.head_dim;
    let aligned = |t: &CudaTensor| dptr(&t.buf, &be.stream).is_multiple_of(16);
    enabled()
        && (1..=LINEAR_DECODE_ROWS).contains(&rows)
        && rows * k * 2 <= STAGE_MAX
        && a.head_dim.is_multiple_of(16)
        && a.out.dtype == ActDType::Bf16
        && aligned(a.out)
}

pub(crate) fn attention_linear(
    be: &CudaBackend,
    a: AttnArgs<'_, CudaBackend>,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
    proj: &mut CudaTensor,
) -> Result<()> {
    let rows = a.batch.rows();
    let fuse = fusable(be, &a, rows);
    let AttnArgs { q, kv, layer, batch, heads, kv_heads, head_dim, scale, out } = a;
    // The product's launch is settled before the attention's, so that a call that cannot fuse
    // never leaves its partials unmerged.
    // (The attention sets `out.rows` so too; its own checks run before any launch.)
    let launch = match fuse {
        true => {
            out.rows = rows;
            d8_launch(be, out, w, bias, proj, 32 + (rows * heads * head_dim * 2) as u32)?
        }
        false => None,
    };
    let a = AttnArgs { q, kv, layer, batch, heads, kv_heads, head_dim, scale, out: &mut *out };
    let Some((cfg, mut args)) = launch else {
        attention_with(be, a, true)?;
        return linear(be, out, w, bias, proj);
    };
    let Some(Unmerged { part, nsplit, split }) = attention_with(be, a, false)? else {
        // Not in split mode: the attention wrote its output whole.
        return linear(be, out, w, bias, proj);
    };
    let s = &be.stream;
    args.extend([
        KArg::U64(dptr(&out.buf, s)),
        KArg::U64(part),
        KArg::U64(batch.ptr(s, batch.at.positions)),
        KArg::U32(heads as u32),
        KArg::U32(head_dim as u32),
        KArg::U32(nsplit as u32),
        KArg::U32(split as u32),
    ]);
    be.launch("linear_bf16_d8_combine", cfg, &args)?;
    proj.rows = rows;
    Ok(())
}
