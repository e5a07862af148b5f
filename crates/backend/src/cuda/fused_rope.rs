//! q, k and v with rope and the KV write in their epilogue (`kernels/linear_rope.cu`):
//! `qkv_rope_kv_store` in one launch instead of the grouped product and `rope_kv_store`. At
//! most `LINEAR_DECODE_ROWS` rows: `linear_bf16_qkv_rope_norm` (with the add + RMSNorm
//! prologue of `linear_bf16_group_norm`, where the norm fusion applies) or
//! `linear_bf16_qkv_rope`; 9 to `FUSED_MAX_ROWS` rows: `linear_bf16_qkv_rope_nt` (4 token
//! tiles a CTA, as `linear_bf16_group`), after `add_rms_norm` for the norm form. Each product
//! element is the grouped product's (its weight's K split, the same slice chains and combine),
//! each pair rotated by rope_kv_store's formula on those bf16 values, and the pool slots
//! written as it writes them, so q, k, v and the pool hold the unfused ops' bits
//! (`tests/cuda_fused_rope.rs` compares them). Calls that do not suit (f32 activations,
//! head_dim not a multiple of 16, q/k/v not shaped as the pool's heads, prefill-sized rows)
//! run the ops it stands for, the same bits. `TENSORFOLD_ROPE_FUSE=0` always runs them (an
//! A/B switch of one binary).
//!
//! Why: the decode step's `rope_kv_store` cost ~86 us a llama3-8b step on the H200 (session
//! 26's marginals at position 300, ~2.7 us a layer: a launch on the critical path between the
//! q/k/v product and the attention). Not yet measured on a GPU (built in session 27, which had
//! no device); the next GPU session runs the bitwise test and the A/B.

use super::fused::{add_rms_norm, group_launch, kv_write_args, launch_group, FUSED_MAX_ROWS};
use super::fused_norm::{self, fusable};
use super::kernels::{LINEAR_DECODE_ROWS, LINEAR_NT};
use super::ops::{self, to_u32};
use super::tensor::{dptr, CudaTensor};
use super::{CudaBackend, KArg};
use crate::error::Result;
use crate::{qkv_rope_kv_store_unfused, AddNormArgs, QkvInput, QkvRopeArgs, RopeArgs};
use tf_checkpoint::spec::RopeStyle;

/// Whether the fused entries may run (`TENSORFOLD_ROPE_FUSE=0`: never; speed only).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TENSORFOLD_ROPE_FUSE").map_or(true, |v| v != "0"))
}

/// The entry a call takes, its token tiles a CTA and whether it computes the norm itself;
/// None where the call does not suit (the products' own conditions are `group_launch`'s).
fn entry(be: &CudaBackend, a: &QkvRopeArgs<'_, CudaBackend>) -> Option<(&'static str, u32, bool)> {
    let (hd, rows, g) = (a.head_dim, a.batch.rows(), a.kv.geom);
    let input_rows = match &a.input {
        QkvInput::Normed(x) => x.rows,
        QkvInput::AddNorm(n) => n.acc.rows,
    };
    let [q, k, v] = &a.parts;
    let suits = enabled()
        && input_rows == rows
        && hd > 0
        && hd.is_multiple_of(16)
        && g.head_dim == hd
        && g.kv_heads == a.kv_heads
        && q.w.n == a.heads * hd
        && k.w.n == a.kv_heads * hd
        && v.w.n == a.kv_heads * hd;
    match (rows, &a.input) {
        _ if !suits => None,
        (1..=LINEAR_DECODE_ROWS, QkvInput::AddNorm(n)) if fusable(be, n, false) => {
            Some(("linear_bf16_qkv_rope_norm", 1, true))
        }
        (1..=LINEAR_DECODE_ROWS, _) => Some(("linear_bf16_qkv_rope", 1, false)),
        (r, _) if r <= FUSED_MAX_ROWS => Some(("linear_bf16_qkv_rope_nt", LINEAR_NT, false)),
        _ => None,
    }
}

pub(crate) fn qkv_rope_kv_store(
    be: &CudaBackend,
    mut a: QkvRopeArgs<'_, CudaBackend>,
) -> Result<()> {
    let Some((name, nt, fused_norm)) = entry(be, &a) else {
        return qkv_rope_kv_store_unfused(be, a);
    };
    let rows = a.batch.rows();
    // The products' input: the normed rows (staged by the norm entry's prologue, or made here).
    let x: &CudaTensor = match a.input {
        QkvInput::Normed(x) => x,
        QkvInput::AddNorm(ref mut n) if fused_norm => {
            n.weight.check_vector("qkv_rope_kv_store", n.group)?;
            n.out.rows = rows;
            &*n.out
        }
        QkvInput::AddNorm(n) => {
            let AddNormArgs { acc, x, weight, eps, group, out } = n;
            add_rms_norm(be, AddNormArgs { acc, x, weight, eps, group, out: &mut *out })?;
            let out: &CudaTensor = out;
            a.input = QkvInput::Normed(out);
            out
        }
    };
    let Some(mut l) = group_launch(be, x, &a.parts, nt)? else {
        return qkv_rope_kv_store_unfused(be, a);
    };
    // The checks rope_kv_store makes (the outputs hold the call's rows once it runs).
    for p in a.parts.iter_mut() {
        p.out.rows = rows;
    }
    let (hd, style, table, batch) = (a.head_dim, a.style, a.table, a.batch);
    let [q, k, _] = &mut a.parts;
    ops::check_rope(&RopeArgs { x: q.out, heads: a.heads, head_dim: hd, style, table, batch })?;
    ops::check_rope(&RopeArgs { x: k.out, heads: a.kv_heads, head_dim: hd, style, table, batch })?;
    a.kv.check_batch("qkv_rope_kv_store", a.layer, batch)?;
    let (pool_args, wrote) = kv_write_args(be, a.kv, a.layer, batch, "qkv_rope_kv_store")?;
    let mut rope: Vec<KArg> = vec![
        dptr(&table.buf, &be.stream).into(),
        wrote.positions.into(),
        to_u32("qkv_rope_kv_store", "head_dim", hd)?.into(),
        KArg::I32((style == RopeStyle::Interleaved) as i32),
    ];
    rope.extend(pool_args);
    match &a.input {
        QkvInput::AddNorm(n) => fused_norm::launch(be, name, l, n, &rope)?,
        QkvInput::Normed(_) => {
            let (smem, grid_y) = (l.part_smem, rows.div_ceil(8 * nt as usize) as u32);
            l.args.extend(rope);
            launch_group(be, name, l, smem, grid_y, true)?;
        }
    }
    be.wrote_kv(wrote);
    Ok(())
}
