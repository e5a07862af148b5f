//! The paged KV pool and causal attention of the float64 reference.
//!
//! Pool layout: block-major, then layer, then K before V, each `(block_size, kv_heads *
//! head_dim)` f64 row-major (one row per slot). Position p of a sequence lives in block
//! `block_table[p / block_size]`, slot `p % block_size`, as in every backend.
//!
//! Attention of row r (position p), query head h, KV head `h / (heads / kv_heads)`:
//! `s_j = scale * sum_d q_d k_jd` (d in order) for j in 0..=p, `m = max s_j`,
//! `e_j = exp(s_j - m)`, `l = sum_j e_j` (j in order), `o_d = sum_j (e_j / l) v_jd` (j in
//! order): HF's eager softmax then weighted sum, in f64. Threads take (row, head) items,
//! which never interact. Scores are kept in full (two passes), not an online softmax, so
//! there is no rescaling arithmetic to reason about.

use rayon::prelude::*;

use super::tensor::{try_zeros, F64Batch, F64Tensor};
use super::F64Backend;
use crate::batch::KvGeometry;
use crate::error::{BackendError, Result};

/// The pool of every layer's KV blocks, in f64.
pub struct F64Kv {
    geom: KvGeometry,
    data: Vec<f64>,
    /// `block_size * kv_heads * head_dim`: one K (or V) plane.
    plane: usize,
}

impl std::fmt::Debug for F64Kv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "F64Kv({:?})", self.geom)
    }
}

impl F64Kv {
    pub(crate) fn new(geom: &KvGeometry) -> Result<F64Kv> {
        let g = *geom;
        if g.layers == 0 || g.kv_heads == 0 || g.head_dim == 0 || g.block_size == 0 {
            return Err(BackendError::shape("alloc_kv", format!("empty geometry {g:?}")));
        }
        let overflow = || BackendError::shape("alloc_kv", format!("{g:?} overflows"));
        let plane = g
            .kv_heads
            .checked_mul(g.head_dim)
            .and_then(|x| x.checked_mul(g.block_size))
            .ok_or_else(overflow)?;
        let n = plane
            .checked_mul(2 * g.layers)
            .and_then(|x| x.checked_mul(g.num_blocks))
            .ok_or_else(overflow)?;
        let data = try_zeros(n, || format!("f64 KV pool {g:?}"))?;
        Ok(F64Kv { geom: g, data, plane })
    }

    pub fn geometry(&self) -> KvGeometry {
        self.geom
    }

    /// Offset of the K row of (block, layer, slot); its V row is `plane` further.
    fn k_row(&self, block: usize, layer: usize, slot: usize) -> usize {
        (block * self.geom.layers + layer) * 2 * self.plane + slot * self.kv_dim()
    }

    fn kv_dim(&self) -> usize {
        self.geom.kv_heads * self.geom.head_dim
    }

    /// Checks the layer, the block size and every block any row of `batch` reaches.
    fn check_batch(&self, op: &'static str, layer: usize, batch: &F64Batch) -> Result<()> {
        self.geom.check_batch(op, layer, &batch.meta, None)?;
        batch.meta.validate(Some(self.geom.num_blocks))
    }

    /// Writes each row's k and v into its slot of `layer`.
    pub(crate) fn store(
        &mut self,
        layer: usize,
        k: &F64Tensor,
        v: &F64Tensor,
        batch: &F64Batch,
    ) -> Result<()> {
        self.check_batch("kv_store", layer, batch)?;
        let (kvd, bs, rows) = (self.kv_dim(), self.geom.block_size, batch.rows());
        for t in [k, v] {
            if t.cols != kvd || t.rows != rows {
                return Err(BackendError::shape(
                    "kv_store",
                    format!("k/v are ({}, {}), expected ({rows}, {kvd})", t.rows, t.cols),
                ));
            }
        }
        let m = &batch.meta;
        for r in 0..rows {
            let pos = m.positions[r] as usize;
            let block = m.seqs[m.row_seq[r] as usize].block_table[pos / bs] as usize;
            let at = self.k_row(block, layer, pos % bs);
            self.data[at..at + kvd].copy_from_slice(k.row(r));
            let at = at + self.plane;
            self.data[at..at + kvd].copy_from_slice(v.row(r));
        }
        Ok(())
    }

    /// K and V of positions `0..len` of one sequence, each `(len, kv_heads * head_dim)`.
    pub(crate) fn read(
        &self,
        layer: usize,
        block_table: &[u32],
        len: usize,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        let (kvd, bs) = (self.kv_dim(), self.geom.block_size);
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
        let (mut k, mut v) = (Vec::with_capacity(len * kvd), Vec::with_capacity(len * kvd));
        for pos in 0..len {
            let at = self.k_row(block_table[pos / bs] as usize, layer, pos % bs);
            k.extend_from_slice(&self.data[at..at + kvd]);
            v.extend_from_slice(&self.data[at + self.plane..at + self.plane + kvd]);
        }
        Ok((k, v))
    }
}

/// Shape parameters of [`attention`] (the `AttnArgs` fields besides buffers).
pub(crate) struct AttnShape {
    pub layer: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f64,
}

pub(crate) fn attention(
    be: &F64Backend,
    q: &F64Tensor,
    kv: &F64Kv,
    batch: &F64Batch,
    sh: AttnShape,
    out: &mut F64Tensor,
) -> Result<()> {
    kv.check_batch("attention", sh.layer, batch)?;
    let g = &kv.geom;
    let rows = batch.rows();
    g.check_attention(sh.heads, sh.kv_heads, sh.head_dim, (q.rows, q.cols), rows)?;
    out.check_out("attention", rows, q.cols)?;
    let hd = sh.head_dim;
    let dst = &mut out.data[..rows * q.cols];
    be.pool.install(|| {
        dst.par_chunks_exact_mut(hd).enumerate().for_each(|(item, o)| {
            let (r, h) = (item / sh.heads, item % sh.heads);
            let qh = &q.row(r)[h * hd..(h + 1) * hd];
            attend(kv, batch, &sh, (r, h), qh, o);
        })
    });
    out.rows = rows;
    Ok(())
}

/// Head `h` of row `r` into `o` (head_dim values).
fn attend(
    kv: &F64Kv,
    batch: &F64Batch,
    sh: &AttnShape,
    rh: (usize, usize),
    q: &[f64],
    o: &mut [f64],
) {
    let (r, h) = rh;
    let (hd, bs) = (sh.head_dim, kv.geom.block_size);
    let m = &batch.meta;
    let n = m.positions[r] as usize + 1;
    let table = &m.seqs[m.row_seq[r] as usize].block_table;
    let off = h / (sh.heads / sh.kv_heads) * hd;
    // K row of position j for this head (V is `plane` further).
    let at = |j: usize| kv.k_row(table[j / bs] as usize, sh.layer, j % bs) + off;
    let mut s = vec![0.0f64; n];
    // Four positions at a time: four independent sums, each over d in order.
    for (c, sc) in s.chunks_mut(4).enumerate() {
        let ks: Vec<&[f64]> = (0..sc.len()).map(|i| &kv.data[at(4 * c + i)..][..hd]).collect();
        let mut acc = [0.0f64; 4];
        for d in 0..hd {
            for (a, k) in acc.iter_mut().zip(&ks) {
                *a += q[d] * k[d];
            }
        }
        for (v, a) in sc.iter_mut().zip(acc) {
            *v = a * sh.scale;
        }
    }
    let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut l = 0.0;
    for v in &mut s {
        *v = (*v - mx).exp();
        l += *v;
    }
    o.fill(0.0);
    for (j, &e) in s.iter().enumerate() {
        let p = e / l;
        let vrow = &kv.data[at(j) + kv.plane..][..hd];
        for (od, &vd) in o.iter_mut().zip(vrow) {
            *od += p * vd;
        }
    }
}
