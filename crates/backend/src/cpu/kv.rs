//! The paged KV pool: bf16 K and V of every layer, in fixed blocks of `block_size` tokens.
//!
//! Layout: block-major, then layer, then K before V; each is a "plane" of
//! `kv_heads * head_dim * block_size` values. K planes are stored transposed,
//! `[kv_head][dim][slot]`, so attention scores 16 consecutive positions with one vector load
//! per dimension; V planes are `[kv_head][slot][dim]`, so the weighted sum reads a row per
//! position. Rejected: one `[slot][kv_head][dim]` layout for both (each score would then need
//! a 16-lane horizontal reduction).

use crate::batch::KvGeometry;
use crate::error::{BackendError, Result};

use super::act::Src;
use super::simd::math;
use super::tensor::{CpuBatch, CpuTensor};

/// The pool of every layer's KV blocks.
pub struct CpuKv {
    pub(crate) geom: KvGeometry,
    /// bf16 bit patterns, `num_blocks * layers * 2` planes.
    pub(crate) data: Vec<u16>,
    pub(crate) plane: usize,
}

impl std::fmt::Debug for CpuKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuKv({:?})", self.geom)
    }
}

impl CpuKv {
    pub(crate) fn new(geom: &KvGeometry) -> Result<CpuKv> {
        let g = *geom;
        if g.layers == 0 || g.kv_heads == 0 || g.head_dim == 0 || g.block_size == 0 {
            return Err(BackendError::shape("alloc_kv", format!("empty geometry {g:?}")));
        }
        let plane = g
            .kv_heads
            .checked_mul(g.head_dim)
            .and_then(|x| x.checked_mul(g.block_size))
            .ok_or_else(|| BackendError::shape("alloc_kv", format!("{g:?} overflows")))?;
        let n = plane
            .checked_mul(2 * g.layers)
            .and_then(|x| x.checked_mul(g.num_blocks))
            .ok_or_else(|| BackendError::shape("alloc_kv", format!("{g:?} overflows")))?;
        let mut data = Vec::new();
        data.try_reserve_exact(n).map_err(|_| BackendError::OutOfMemory {
            what: format!("KV pool {g:?}"),
            bytes: n * 2,
        })?;
        data.resize(n, 0);
        Ok(CpuKv { geom: g, data, plane })
    }

    /// Offset of the K plane of (block, layer); the V plane follows it.
    #[inline(always)]
    pub(crate) fn k_plane(&self, block: usize, layer: usize) -> usize {
        (block * self.geom.layers + layer) * 2 * self.plane
    }

    /// Checks that `batch` fits this pool and `layer` exists.
    pub(crate) fn check_batch(
        &self,
        op: &'static str,
        layer: usize,
        batch: &CpuBatch,
    ) -> Result<()> {
        self.geom.check_batch(op, layer, &batch.meta, batch.max_block)
    }

    /// Writes each row's k and v into its slot of `layer`.
    pub(crate) fn store(
        &mut self,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        batch: &CpuBatch,
    ) -> Result<()> {
        self.check_batch("kv_store", layer, batch)?;
        let (kvh, hd, bs) = (self.geom.kv_heads, self.geom.head_dim, self.geom.block_size);
        let rows = batch.rows();
        for t in [k, v] {
            if t.cols != kvh * hd || t.rows != rows {
                return Err(BackendError::shape(
                    "kv_store",
                    format!("k/v are ({}, {}), expected ({rows}, {})", t.rows, t.cols, kvh * hd),
                ));
            }
        }
        let (ks, vs) = (Src::of(k), Src::of(v));
        let m = &batch.meta;
        for r in 0..rows {
            let pos = m.positions[r] as usize;
            let block = m.seqs[m.row_seq[r] as usize].block_table[pos / bs] as usize;
            let slot = pos % bs;
            let kp = self.k_plane(block, layer);
            let vp = kp + self.plane;
            for g in 0..kvh {
                for d in 0..hd {
                    let i = r * kvh * hd + g * hd + d;
                    // SAFETY: i < rows * cols of both checked tensors.
                    let (kx, vx) = unsafe { (ks.get(i), vs.get(i)) };
                    self.data[kp + (g * hd + d) * bs + slot] = math::f32_to_bf16(kx);
                    self.data[vp + (g * bs + slot) * hd + d] = math::f32_to_bf16(vx);
                }
            }
        }
        Ok(())
    }

    /// K and V of positions `0..len` of one sequence, each `(len, kv_heads * head_dim)` f32.
    pub(crate) fn read(
        &self,
        layer: usize,
        block_table: &[u32],
        len: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (kvh, hd, bs) = (self.geom.kv_heads, self.geom.head_dim, self.geom.block_size);
        if layer >= self.geom.layers || block_table.len() < len.div_ceil(bs) {
            return Err(BackendError::shape(
                "read_kv",
                format!("layer {layer}, {len} positions in {} blocks of {bs}", block_table.len()),
            ));
        }
        if let Some(b) = block_table.iter().find(|&&b| b as usize >= self.geom.num_blocks) {
            return Err(BackendError::shape(
                "read_kv",
                format!("block {b} of {}", self.geom.num_blocks),
            ));
        }
        let mut k = vec![0f32; len * kvh * hd];
        let mut v = vec![0f32; len * kvh * hd];
        for pos in 0..len {
            let kp = self.k_plane(block_table[pos / bs] as usize, layer);
            let (vp, slot) = (kp + self.plane, pos % bs);
            for g in 0..kvh {
                for d in 0..hd {
                    let i = pos * kvh * hd + g * hd + d;
                    k[i] = math::bf16_to_f32(self.data[kp + (g * hd + d) * bs + slot]);
                    v[i] = math::bf16_to_f32(self.data[vp + (g * bs + slot) * hd + d]);
                }
            }
        }
        Ok((k, v))
    }
}
