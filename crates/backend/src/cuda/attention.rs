//! The paged KV pool on the GPU: `kv_store`, `attention`, `read_kv` (`kernels/kv.cu`,
//! `kernels/attention.cu`).
//!
//! Attention splits each row's positions at fixed absolute boundaries (`SPLIT` positions),
//! one block per (row, head, split); rows needing more than one split are combined in split
//! order by `attention_combine`. The number of splits of a row depends on its position only;
//! the grid's split count (the batch's largest) changes no row's arithmetic.

use cudarc::driver::LaunchConfig;

use super::tensor::{dptr, CudaBatch, CudaKv, CudaTensor};
use super::{drv, CudaBackend, KArg};
use crate::error::{BackendError, Result};
use crate::{ActDType, AttnArgs};

/// Positions per KV split (`SPLIT` in attention.cu).
const SPLIT: usize = 512;

pub(crate) fn kv_store(
    be: &CudaBackend,
    kv: &mut CudaKv,
    layer: usize,
    (k, v): (&CudaTensor, &CudaTensor),
    batch: &CudaBatch,
) -> Result<()> {
    kv.check_batch("kv_store", layer, batch)?;
    let g = kv.geom;
    let rows = batch.rows();
    for t in [k, v] {
        if t.cols != g.kv_heads * g.head_dim || t.rows != rows {
            return Err(BackendError::shape(
                "kv_store",
                format!(
                    "k/v are ({}, {}), expected ({rows}, {})",
                    t.rows,
                    t.cols,
                    g.kv_heads * g.head_dim
                ),
            ));
        }
    }
    if rows == 0 {
        return Ok(());
    }
    let s = &be.stream;
    let (pool, kp, kf, vp, vf) =
        (dptr(&kv.buf, s), dptr(&k.buf, s), k.is_f32(), dptr(&v.buf, s), v.is_f32());
    let (pos, rt, tab) = (
        batch.ptr(s, batch.at.positions),
        batch.ptr(s, batch.at.row_table),
        batch.ptr(s, batch.at.tables),
    );
    let dims =
        [g.layers as u32, layer as u32, g.kv_heads as u32, g.head_dim as u32, g.block_size as u32];
    let cfg =
        LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut args: Vec<KArg> = vec![pool.into(), kp.into(), kf.into(), vp.into(), vf.into()];
    args.extend([pos, rt, tab].map(KArg::U64));
    args.extend(dims.map(KArg::U32));
    be.launch("kv_store", cfg, &args)
}

fn entry_for(head_dim: usize) -> Result<&'static str> {
    Ok(match head_dim {
        64 => "attention_hd64",
        96 => "attention_hd96",
        128 => "attention_hd128",
        256 => "attention_hd256",
        _ => {
            return Err(BackendError::Device(format!(
                "attention: head_dim {head_dim} is not implemented on the CUDA backend (64, 96, 128, 256 are)"
            )))
        }
    })
}

pub(crate) fn attention(be: &CudaBackend, a: AttnArgs<'_, CudaBackend>) -> Result<()> {
    let (kv, batch) = (a.kv, a.batch);
    kv.check_batch("attention", a.layer, batch)?;
    let g = &kv.geom;
    let rows = batch.rows();
    g.check_attention(a.heads, a.kv_heads, a.head_dim, (a.q.rows, a.q.cols), rows)?;
    a.out.check_out("attention", rows, a.q.cols)?;
    if a.q.dtype != ActDType::Bf16 || a.out.dtype != ActDType::Bf16 {
        return Err(BackendError::shape("attention", "q and out must be bf16 on the CUDA backend"));
    }
    let name = entry_for(a.head_dim)?;
    if rows > 0 {
        let nsplit = (batch.max_pos as usize + 1).div_ceil(SPLIT);
        let part_len = rows * a.heads * nsplit * (a.head_dim + 2);
        let mut scratch = be.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if nsplit > 1 && scratch.as_ref().is_none_or(|b| b.len() < part_len) {
            *scratch = Some(be.raw::<f32>(part_len, "attention split partials")?);
        }
        let s = &be.stream;
        let part = scratch.as_ref().map_or(0u64, |b| dptr(b, s));
        let (q, pool, out) = (dptr(&a.q.buf, s), dptr(&kv.buf, s), dptr(&a.out.buf, s));
        let (pos, rt, tab) = (
            batch.ptr(s, batch.at.positions),
            batch.ptr(s, batch.at.row_table),
            batch.ptr(s, batch.at.tables),
        );
        let dims = [
            g.layers as u32,
            a.layer as u32,
            a.heads as u32,
            a.kv_heads as u32,
            g.block_size as u32,
        ];
        let scale = a.scale;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, a.heads as u32, nsplit as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args: Vec<KArg> = [q, pool, out, part, pos, rt, tab].map(KArg::U64).to_vec();
        args.extend(dims.map(KArg::U32));
        args.push(scale.into());
        be.launch(name, cfg, &args)?;
        if nsplit > 1 {
            let (heads, hd, ns) = (a.heads as u32, a.head_dim as u32, nsplit as u32);
            let cfg = LaunchConfig {
                grid_dim: (rows as u32, heads, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let args = [out.into(), part.into(), pos.into(), heads.into(), hd.into(), ns.into()];
            be.launch("attention_combine", cfg, &args)?;
        }
    }
    a.out.rows = rows;
    Ok(())
}

pub(crate) fn read_kv(
    be: &CudaBackend,
    kv: &CudaKv,
    layer: usize,
    block_table: &[u32],
    len: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let g = &kv.geom;
    let (kvh, hd, bs) = (g.kv_heads, g.head_dim, g.block_size);
    if layer >= g.layers || block_table.len() < len.div_ceil(bs) {
        return Err(BackendError::shape(
            "read_kv",
            format!("layer {layer}, {len} positions in {} blocks of {bs}", block_table.len()),
        ));
    }
    if let Some(b) = block_table.iter().find(|&&b| b as usize >= g.num_blocks) {
        return Err(BackendError::shape("read_kv", format!("block {b} of {}", g.num_blocks)));
    }
    let (mut k, mut v) = (vec![0f32; len * kvh * hd], vec![0f32; len * kvh * hd]);
    let mut planes = vec![0u16; 2 * kv.plane];
    for (bi, &blk) in block_table[..len.div_ceil(bs)].iter().enumerate() {
        let off = (blk as usize * g.layers + layer) * 2 * kv.plane;
        let view = kv.buf.slice(off..off + 2 * kv.plane);
        be.stream.memcpy_dtoh(&view, &mut planes).map_err(drv("read_kv"))?;
        be.stream.synchronize().map_err(drv("read_kv"))?;
        for slot in 0..bs.min(len - bi * bs) {
            let pos = bi * bs + slot;
            for h in 0..kvh {
                for d in 0..hd {
                    let at = (h * bs + slot) * hd + d;
                    let i = pos * kvh * hd + h * hd + d;
                    k[i] = f32::from_bits((planes[at] as u32) << 16);
                    v[i] = f32::from_bits((planes[kv.plane + at] as u32) << 16);
                }
            }
        }
    }
    Ok((k, v))
}
