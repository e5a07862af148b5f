//! Fused decode ops: fewer launches per layer, the bits of the unfused composition.
//!
//! - `add_rms_norm` (`kernels/norm.cu`): the residual add and the following RMSNorm in one
//!   launch; per element the `add` kernel's formula, per group the `rms_norm` kernel's block
//!   size and sum order.
//! - `linear_group` (`linear_bf16_group`): q, k and v (up to three weights over one input) in
//!   one launch; `linear_swiglu` (`linear_bf16_swiglu`): gate and up for the same features in
//!   one CTA with the SwiGLU epilogue. Each weight keeps its own `k_split(N, K)`, and each
//!   slice is the same mma chain as in `linear_bf16`, so every element has the bits of the
//!   separate `linear` (and `swiglu`).
//! - `rope_kv_store` (`kernels/rope.cu`): rope of q and k and the KV write in one launch,
//!   the `rope` kernel's pair formula and the `kv_store` kernel's pool layout; 16-byte
//!   units of 8 pairs, one a thread, when head_dim % 16 == 0 (`rope_kv_parts`).
//!
//! Where a fused kernel does not apply (a call whose products take the tiled prefill kernel,
//! f32 activations, more slices than the fused kernel holds), the op runs the unfused
//! launches: the same bits, so the choice is speed only, never the row count's business.
//! Rejected: fusing across rows of different kernels (the tiled prefill path keeps its own
//! launches: its CTAs cover 128 tokens, fusing would only save a launch per 128 rows).

use cudarc::driver::LaunchConfig;

use super::gemm::tiled_for;
use super::kernels::{LINEAR_DECODE_ROWS, LINEAR_GROUP_WARPS, LINEAR_MAX_SLICES, LINEAR_NT};
use super::linear::{self, k_split};
use super::ops::{self, check_same, to_u32};
use super::tensor::{dptr, CudaBatch, CudaKv, CudaTensor, CudaWeight, WeightKind};
use super::{CudaBackend, KArg, KvWrite};
use crate::error::{BackendError, Result};
use tf_checkpoint::spec::RopeStyle;

use crate::{ActDType, AddNormArgs, LinearPart, RopeArgs, RopeKvArgs, SwigluArgs};

/// Bytes of one slice job's partials per token tile in the grouped kernels' shared memory.
pub(crate) const JOB_SMEM: u32 = 32 * 4 * 4;
/// CTAs per row of `rope_kv_store`'s element path (each thread owns whole pairs: the split
/// changes no bit).
const ROPE_KV_PARTS: u32 = 8;
/// Threads of a `rope_kv_store` CTA.
const ROPE_KV_THREADS: u32 = 256;

/// CTAs per row of `rope_kv_store`: one unit (8 pairs or 8 v elements) a thread when its
/// 16-byte path applies (rope.cu; the kernel checks alignment too), else ROPE_KV_PARTS.
/// Speed only: every grid covers every unit of a row.
fn rope_kv_parts(heads: usize, kv_heads: usize, head_dim: usize) -> u32 {
    static OLD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let old =
        *OLD.get_or_init(|| super::compile::kernel_define("TF_VEC16").is_some_and(|v| v == "0"));
    if old || !head_dim.is_multiple_of(16) {
        return ROPE_KV_PARTS;
    }
    let units = (heads + kv_heads) * head_dim / 16 + kv_heads * head_dim / 8;
    units.div_ceil(ROPE_KV_THREADS as usize).clamp(1, 65535) as u32
}
/// The grouped products serve calls of at most this many rows (decode steps; H200: at 128
/// rows the separate launches were faster). Larger calls take the unfused launches.
pub(crate) const FUSED_MAX_ROWS: usize = 64;

/// The entry point (`base` or its one-token-tile `_d8` variant) and token tiles per CTA.
fn variant(base: &'static str, d8: &'static str, rows: usize) -> (&'static str, u32) {
    if rows <= LINEAR_DECODE_ROWS {
        (d8, 1)
    } else {
        (base, LINEAR_NT)
    }
}

pub(crate) fn add_rms_norm(be: &CudaBackend, a: AddNormArgs<'_, CudaBackend>) -> Result<()> {
    check_same("add_rms_norm", a.acc, a.x)?;
    let (rows, cols, group) = (a.acc.rows, a.acc.cols, a.group);
    if group == 0 || cols % group != 0 {
        return Err(BackendError::shape(
            "add_rms_norm",
            format!("group {group} does not divide {cols} columns"),
        ));
    }
    a.weight.check_vector("add_rms_norm", group)?;
    a.out.check_out("add_rms_norm", rows, cols)?;
    let blocks = rows * (cols / group);
    if blocks > 0 {
        let s = &be.stream;
        let (ap, af, xp, xf) =
            (dptr(&a.acc.buf, s), a.acc.is_f32(), dptr(&a.x.buf, s), a.x.is_f32());
        let (wp, op, of) = (dptr(&a.weight.buf, s), dptr(&a.out.buf, s), a.out.is_f32());
        let (g32, eps) = (to_u32("add_rms_norm", "group", group)?, a.eps);
        let grid = to_u32("add_rms_norm", "groups", blocks)?;
        let (cfg, [vt, vec]) = ops::norm_launch(grid, group, af + xf + of == 0, &[ap, xp, wp, op]);
        let args: [KArg; 11] = [
            ap.into(),
            af.into(),
            xp.into(),
            xf.into(),
            wp.into(),
            op.into(),
            of.into(),
            g32.into(),
            eps.into(),
            vt,
            vec,
        ];
        be.launch("add_rms_norm", cfg, &args)?;
    }
    a.out.rows = rows;
    Ok(())
}

/// Whether `w` can be one product of a grouped decode launch over `x` (bf16 everything,
/// shapes `linear` would accept, and a call that `linear` would give to `linear_bf16`).
fn streams(op: &'static str, x: &CudaTensor, w: &CudaWeight, out: &CudaTensor) -> Result<bool> {
    if w.kind != WeightKind::Bf16Matrix || x.dtype != ActDType::Bf16 || out.dtype != ActDType::Bf16
    {
        return Ok(false);
    }
    if w.k != x.cols || !w.k.is_multiple_of(8) || w.n > u32::MAX as usize || w.k > u32::MAX as usize
    {
        return Ok(false);
    }
    if x.rows == 0 || x.rows > FUSED_MAX_ROWS || tiled_for(x.rows, w.n) {
        return Ok(false);
    }
    out.check_out(op, x.rows, w.n)?;
    Ok(true)
}

/// A grouped product's launch: its kernel arguments (the entry's own, in order), CTAs, block
/// threads and the partials' shared memory for `nt` token tiles a CTA.
pub(crate) struct GroupLaunch {
    pub args: Vec<KArg>,
    pub grid_x: u32,
    pub threads: u32,
    pub part_smem: u32,
}

/// The arguments of `linear_bf16_group*` over `x` (the norm entries take them too and read
/// their staged rows instead of `x`), or None where the grouped kernel does not apply.
pub(crate) fn group_launch(
    be: &CudaBackend,
    x: &CudaTensor,
    parts: &[LinearPart<'_, CudaBackend>],
    nt: u32,
) -> Result<Option<GroupLaunch>> {
    let mut fused = (1..=3).contains(&parts.len());
    for p in parts.iter() {
        fused = fused && streams("linear_group", x, p.w, p.out)?;
        if let Some(b) = p.bias {
            b.check_vector("linear_group", p.w.n)?;
        }
    }
    if !fused {
        return Ok(None);
    }
    let s = &be.stream;
    let mut args: Vec<KArg> =
        vec![dptr(&x.buf, s).into(), (x.cols as u32).into(), (x.rows as u32).into()];
    let (mut ctas, mut max_slices) = (0usize, 1u32);
    for j in 0..3 {
        match parts.get(j) {
            Some(p) => {
                let (slices, len) = k_split(p.w.n, p.w.k);
                let tiles = p.w.n.div_ceil(16);
                let bp = p.bias.map_or(0u64, |b| dptr(&b.buf, s));
                args.extend([
                    KArg::U64(dptr(&p.w.buf, s)),
                    KArg::U64(bp),
                    KArg::U64(dptr(&p.out.buf, s)),
                ]);
                args.extend([KArg::U32(p.w.n as u32), KArg::U32(slices), KArg::U32(len)]);
                if j < 2 {
                    args.push((tiles as u32).into());
                }
                ctas += tiles;
                max_slices = max_slices.max(slices);
            }
            None => {
                args.extend([KArg::U64(0), KArg::U64(0), KArg::U64(0)]);
                args.extend([KArg::U32(0), KArg::U32(1), KArg::U32(32)]);
                if j < 2 {
                    args.push(KArg::U32(0));
                }
            }
        }
    }
    if max_slices > LINEAR_MAX_SLICES || ctas > u32::MAX as usize {
        return Err(BackendError::shape(
            "linear_group",
            format!("{max_slices} slices, {ctas} tiles"),
        ));
    }
    Ok(Some(GroupLaunch {
        args,
        grid_x: ctas as u32,
        threads: 32 * max_slices.min(LINEAR_GROUP_WARPS),
        part_smem: max_slices * nt * JOB_SMEM,
    }))
}

pub(crate) fn linear_group(
    be: &CudaBackend,
    x: &CudaTensor,
    parts: &mut [LinearPart<'_, CudaBackend>],
) -> Result<()> {
    // The one-tile variant only on request (`TENSORFOLD_GROUP_D8=1`, same bits): on the
    // llama3-8b q/k/v at one row the general kernel took 16.7 us, the `_d8` one 19.8 us
    // (H200, 2026-11-30, before the regroup).
    static GROUP_D8: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let d8 = *GROUP_D8.get_or_init(|| std::env::var("TENSORFOLD_GROUP_D8").is_ok_and(|v| v == "1"));
    let (name, nt) = match d8 && x.rows <= LINEAR_DECODE_ROWS {
        true => ("linear_bf16_group_d8", 1),
        false => ("linear_bf16_group", LINEAR_NT),
    };
    let Some(l) = group_launch(be, x, parts, nt)? else {
        return linear::linear_parts(be, x, parts);
    };
    let cfg = LaunchConfig {
        grid_dim: (l.grid_x, x.rows.div_ceil(8 * nt as usize) as u32, 1),
        block_dim: (l.threads, 1, 1),
        shared_mem_bytes: l.part_smem,
    };
    be.launch(name, cfg, &l.args)?;
    for p in parts.iter_mut() {
        p.out.rows = x.rows;
    }
    Ok(())
}

/// The arguments of `linear_bf16_swiglu*` (as `group_launch`), or None where the fused
/// kernel does not apply.
pub(crate) fn swiglu_launch(
    be: &CudaBackend,
    x: &CudaTensor,
    [gw, uw]: [&CudaWeight; 2],
    [gate, up, out]: [&CudaTensor; 3],
    nt: u32,
) -> Result<Option<GroupLaunch>> {
    let (slices, len) = k_split(gw.n, gw.k);
    let fused = gw.n == uw.n
        && gw.k == uw.k
        && 2 * slices <= LINEAR_MAX_SLICES
        && out.dtype == ActDType::Bf16
        && streams("linear_swiglu", x, gw, gate)?
        && streams("linear_swiglu", x, uw, up)?;
    if !fused {
        return Ok(None);
    }
    out.check_out("linear_swiglu", x.rows, gw.n)?;
    let s = &be.stream;
    let args = vec![
        dptr(&x.buf, s).into(),
        (x.cols as u32).into(),
        (x.rows as u32).into(),
        dptr(&gw.buf, s).into(),
        dptr(&uw.buf, s).into(),
        dptr(&gate.buf, s).into(),
        dptr(&up.buf, s).into(),
        dptr(&out.buf, s).into(),
        (gw.n as u32).into(),
        slices.into(),
        len.into(),
    ];
    Ok(Some(GroupLaunch {
        args,
        grid_x: gw.n.div_ceil(16) as u32,
        threads: 32 * (2 * slices).min(LINEAR_GROUP_WARPS),
        part_smem: 2 * slices * nt * JOB_SMEM,
    }))
}

/// Launches grouped product `name` with `smem` bytes of dynamic shared memory over `grid_y`
/// blocks of token tiles; `persistent`: as many CTAs as the GPU holds at once (at most one a
/// tile), each walking tiles blockIdx.x, + gridDim.x, ...; else one CTA a tile.
pub(crate) fn launch_group(
    be: &CudaBackend,
    name: &'static str,
    l: GroupLaunch,
    smem: u32,
    grid_y: u32,
    persistent: bool,
) -> Result<()> {
    let grid_x = match persistent {
        true => persistent_grid(l.grid_x, be.persistent_ctas(name, l.threads, smem)?),
        false => l.grid_x,
    };
    let cfg = LaunchConfig {
        grid_dim: (grid_x, grid_y, 1),
        block_dim: (l.threads, 1, 1),
        shared_mem_bytes: smem,
    };
    be.launch(name, cfg, &l.args)
}

/// The CTAs of a persistent launch over `tiles` tiles where the GPU holds `slots` at once: the
/// fewest CTAs that need as many rounds as `min(tiles, slots)` would, so every CTA walks the
/// same number of tiles (llama3-8b gate/up: 896 tiles on an H200's 264 slots; `min` gives 3.4
/// rounds, 104 CTAs running a fourth tile while 160 are done; even, 224 CTAs of 4 tiles each;
/// q/k/v 384 tiles: 192 CTAs of 2). Which CTA runs a tile changes no bit.
/// `TENSORFOLD_PERSIST_EVEN=0` launches `min(tiles, slots)` (an A/B switch). H200, session 33
/// (bench decode, 3 alternated rounds in each of two calls): llama3-8b 220.7-225.3 tok/s
/// against 213.3-221.4, the 33B geometry 58.2-58.6 against 57.5-58.0; H100, session 32: 166.4
/// against 166.1 (neutral). Check exact's fingerprints equal both ways.
pub(crate) fn persistent_grid(tiles: u32, slots: u32) -> u32 {
    static EVEN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let even =
        *EVEN.get_or_init(|| std::env::var("TENSORFOLD_PERSIST_EVEN").map_or(true, |v| v != "0"));
    grid_for(tiles, slots, even)
}

fn grid_for(tiles: u32, slots: u32, even: bool) -> u32 {
    let slots = slots.max(1);
    match even {
        true => tiles.div_ceil(tiles.div_ceil(slots).max(1)),
        false => tiles.min(slots),
    }
}

/// Whether `linear_bf16_swiglu_d8` and `linear_bf16_swiglu` (9 to 64 rows) run persistent
/// CTAs (linear_group.cu's swiglu_chained: each warp issues its next tile's first weights as
/// a chain ends); `TENSORFOLD_SWIGLU_PERSIST=0` launches a CTA a tile (an A/B switch: the
/// same bits). H200, session 26 (tools/gpu/stepbw.py, the bare load pattern on llama3-8b's
/// gate/up, 32 matrices back to back): 58.5 us a matrix persistent against 61.9 a CTA a tile.
fn swiglu_persistent() -> bool {
    static P: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *P.get_or_init(|| std::env::var("TENSORFOLD_SWIGLU_PERSIST").map_or(true, |v| v != "0"))
}

pub(crate) fn linear_swiglu(be: &CudaBackend, a: SwigluArgs<'_, CudaBackend>) -> Result<()> {
    let (name, nt) = variant("linear_bf16_swiglu", "linear_bf16_swiglu_d8", a.x.rows);
    let l = swiglu_launch(be, a.x, [a.gate_w, a.up_w], [&*a.gate, &*a.up, &*a.out], nt)?;
    let Some(l) = l else {
        let mut parts = [
            LinearPart { w: a.gate_w, bias: None, out: &mut *a.gate },
            LinearPart { w: a.up_w, bias: None, out: &mut *a.up },
        ];
        linear::linear_parts(be, a.x, &mut parts)?;
        return ops::swiglu(be, a.gate, a.up, a.out);
    };
    let (smem, grid_y) = (l.part_smem, a.x.rows.div_ceil(8 * nt as usize) as u32);
    launch_group(be, name, l, smem, grid_y, swiglu_persistent())?;
    for t in [a.gate, a.up, a.out] {
        t.rows = a.x.rows;
    }
    Ok(())
}

pub(crate) fn rope_kv_store(be: &CudaBackend, a: RopeKvArgs<'_, CudaBackend>) -> Result<()> {
    let (head_dim, style, table, batch) = (a.head_dim, a.style, a.table, a.batch);
    let bf16 = [&*a.q, &*a.k, a.v].iter().all(|t| t.dtype == ActDType::Bf16);
    if !bf16 {
        ops::rope(be, RopeArgs { x: a.q, heads: a.heads, head_dim, style, table, batch })?;
        ops::rope(be, RopeArgs { x: a.k, heads: a.kv_heads, head_dim, style, table, batch })?;
        return super::attention::kv_store(be, a.kv, a.layer, (a.k, a.v), batch);
    }
    ops::check_rope(&RopeArgs { x: a.q, heads: a.heads, head_dim, style, table, batch })?;
    ops::check_rope(&RopeArgs { x: a.k, heads: a.kv_heads, head_dim, style, table, batch })?;
    let kv = &*a.kv;
    kv.check_batch("rope_kv_store", a.layer, batch)?;
    let (g, rows) = (kv.geom, batch.rows());
    let width = g.kv_heads * g.head_dim;
    if a.kv_heads != g.kv_heads || head_dim != g.head_dim || a.v.cols != width || a.v.rows != rows {
        return Err(BackendError::shape(
            "rope_kv_store",
            format!(
                "k/v ({rows}, {}) as {} heads of {head_dim}; the pool has {} kv heads of {}",
                a.v.cols, a.kv_heads, g.kv_heads, g.head_dim
            ),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let s = &be.stream;
    let u = |what, v| to_u32("rope_kv_store", what, v);
    let (pool_args, wrote) = kv_write_args(be, kv, a.layer, batch, "rope_kv_store")?;
    let mut args: Vec<KArg> = [&*a.q, &*a.k, a.v].map(|t| KArg::U64(dptr(&t.buf, s))).to_vec();
    args.extend([dptr(&table.buf, s).into(), wrote.positions.into()]);
    args.extend(
        [u("heads", a.heads)?, u("kv heads", a.kv_heads)?, u("head_dim", head_dim)?].map(KArg::U32),
    );
    args.push(KArg::I32((style == RopeStyle::Interleaved) as i32));
    args.extend(pool_args);
    let first = super::attention::copies_early(be, &g, a.heads, rows);
    args.push(KArg::I32(first as i32));
    // A decode row is latency-bound in one CTA: its units go over several.
    let grid = (u("rows", rows)?, rope_kv_parts(a.heads, a.kv_heads, head_dim), 1);
    be.launch("rope_kv_store", ops::cfg(grid, ROPE_KV_THREADS), &args)?;
    be.wrote_kv(wrote);
    Ok(())
}

/// The pool arguments of a kernel that writes a call's KV rows of `layer` (the tail rope.cu's
/// rope_kv_store and linear_rope.cu's entries share: pool, row table, block tables, block
/// stride, layer offset, block size) and the write to record with `CudaBackend::wrote_kv`
/// once it is launched.
pub(crate) fn kv_write_args(
    be: &CudaBackend,
    kv: &CudaKv,
    layer: usize,
    batch: &CudaBatch,
    op: &'static str,
) -> Result<([KArg; 6], KvWrite)> {
    let s = &be.stream;
    let (bstride, loff) = kv.region(op, layer)?;
    let pool = dptr(&kv.buf, s);
    let args = [
        pool.into(),
        batch.ptr(s, batch.at.row_table).into(),
        batch.ptr(s, batch.at.tables).into(),
        bstride.into(),
        loff.into(),
        (kv.geom.block_size as u32).into(),
    ];
    let positions = batch.ptr(s, batch.at.positions);
    Ok((args, KvWrite { pool, positions, region: (bstride, loff) }))
}

#[cfg(test)]
mod tests {
    use super::grid_for;

    #[test]
    fn even_grids_keep_the_rounds_and_balance_them() {
        // llama3-8b on an H200's 264 slots: gate/up, q/k/v, o.
        assert_eq!(grid_for(896, 264, false), 264);
        assert_eq!(grid_for(896, 264, true), 224);
        assert_eq!(grid_for(384, 264, true), 192);
        assert_eq!(grid_for(256, 264, true), 256);
        assert_eq!(grid_for(100, 264, false), 100);
        for tiles in 1..2000u32 {
            for slots in [1u32, 7, 132, 264, 528] {
                let g = grid_for(tiles, slots, true);
                let rounds = tiles.div_ceil(slots);
                assert!(g >= 1 && g <= slots.min(tiles), "{tiles} tiles, {slots} slots: {g}");
                assert_eq!(tiles.div_ceil(g), rounds, "{tiles} tiles, {slots} slots: {g} CTAs");
                // No CTA walks more than one tile beyond another.
                assert!(tiles.div_ceil(g) - tiles / g <= 1);
            }
        }
        assert_eq!(grid_for(0, 264, true), 0);
    }
}
