//! Causal attention over the paged KV pool, one (row, head) at a time.
//!
//! For row r at position p and query head h (KV head `h / (heads/kv_heads)`), with every
//! step in a fixed order that depends only on p and the head:
//! 1. `s_j = dot(q, k_j) * scale` for j in 0..=p, the dot a single fma chain over dims
//!    0..head_dim (16 positions are scored at once, one lane each, from the transposed K);
//! 2. `m` = max of the s_j: 16 lanes (lane = j mod 16), then the tree 8/4/2/1 of `a > b ? a : b`;
//! 3. `e_j = exp(s_j - m)`, `l` = their sum in 16 lanes (lane = j mod 16) and the fixed tree;
//! 4. `o_d = sum_j e_j * v_jd` as an fma chain over j in increasing order, then `bf16(o_d / l)`.
//!
//! Rows and heads never interact, so the pool splits (row, tile of a KV head's query heads)
//! items, tiles small enough to keep every thread busy on a decode row, without changing any
//! bits; heads of a tile share each K and V load.
//! Scores are kept in full (two passes) rather than an online softmax: the same arithmetic,
//! no rescaling, and the scratch is a few KiB per thread.

use std::ops::Range;

use super::act::{Dst, Src};
use super::kv::CpuKv;
use super::simd::{math, Kernel, Simd};
use super::tensor::{CpuBatch, CpuTensor};
use super::CpuBackend;
use crate::error::Result;

/// Query heads scored together (sharing each K load).
const HEAD_TILE: usize = 4;

thread_local! {
    /// Each thread's scores and widened queries.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Everything an item needs, shared by all threads.
struct Ctx<'a> {
    q: Src,
    out: Dst,
    kv: &'a CpuKv,
    layer: usize,
    batch: &'a CpuBatch,
    heads: usize,
    group: usize,
    scale: f32,
    /// Heads per work item (at most HEAD_TILE), and items per KV head's group.
    tile: usize,
    tiles: usize,
}

/// Shape parameters of [`attention`] (the `AttnArgs` fields besides buffers).
pub(crate) struct AttnShape {
    pub layer: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

pub(crate) fn attention(
    be: &CpuBackend,
    q: &CpuTensor,
    kv: &CpuKv,
    batch: &CpuBatch,
    sh: AttnShape,
    out: &mut CpuTensor,
) -> Result<()> {
    kv.check_batch("attention", sh.layer, batch)?;
    let g = &kv.geom;
    let rows = batch.rows();
    g.check_attention(sh.heads, sh.kv_heads, sh.head_dim, (q.rows, q.cols), rows)?;
    out.check_out("attention", rows, q.cols)?;
    // Split each KV head's group of query heads into tiles (sharing each K/V load), small
    // enough that there are about two items per thread when rows are few (decode).
    let group = sh.heads / sh.kv_heads;
    let want = (2 * be.pool.threads()).div_ceil(rows * sh.kv_heads);
    let splits = want.clamp(group.div_ceil(HEAD_TILE), group.max(1));
    let tile = group.div_ceil(splits);
    let tiles = group.div_ceil(tile);
    let items = rows * sh.kv_heads * tiles;
    let work: usize = batch.meta.positions.iter().map(|&p| p as usize + 1).sum::<usize>() * q.cols;
    let ctx = Ctx {
        q: Src::of(q),
        out: Dst::of(out),
        kv,
        layer: sh.layer,
        batch,
        heads: sh.heads,
        group,
        scale: sh.scale,
        tile,
        tiles,
    };
    be.for_ranges(items, 1, work >= 1 << 15, &|range| {
        SCRATCH.with(|s| {
            let mut scratch = s.borrow_mut();
            be.level.dispatch(Items { ctx: &ctx, range, scratch: &mut scratch })
        })
    });
    out.rows = rows;
    Ok(())
}

struct Items<'a> {
    ctx: &'a Ctx<'a>,
    range: Range<usize>,
    scratch: &'a mut Vec<f32>,
}

impl Kernel for Items<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let c = self.ctx;
        let kvh = c.heads / c.group;
        for item in self.range.clone() {
            let (r, g, t) = (item / (kvh * c.tiles), item / c.tiles % kvh, item % c.tiles);
            let h_end = (g + 1) * c.group;
            let heads = g * c.group + t * c.tile..(g * c.group + (t + 1) * c.tile).min(h_end);
            let mut h0 = heads.start;
            while h0 < heads.end {
                let hg = HEAD_TILE.min(heads.end - h0);
                // SAFETY: `attention` checked q, out, the pool and the batch for every row
                // and head; this thread owns row r's heads h0..h0+hg of `out`.
                unsafe {
                    match hg {
                        1 => attend::<S, 1>(s, c, r, h0, self.scratch),
                        2 => attend::<S, 2>(s, c, r, h0, self.scratch),
                        3 => attend::<S, 3>(s, c, r, h0, self.scratch),
                        _ => attend::<S, 4>(s, c, r, h0, self.scratch),
                    }
                }
                h0 += hg;
            }
        }
    }
}

/// Heads `h0..h0+HG` (one KV head) of row `r`.
///
/// # Safety
/// See `Items::run`.
#[inline(always)]
unsafe fn attend<S: Simd, const HG: usize>(
    s: S,
    c: &Ctx,
    r: usize,
    h0: usize,
    scratch: &mut Vec<f32>,
) {
    let g = &c.kv.geom;
    let (hd, bs) = (g.head_dim, g.block_size);
    let m = &c.batch.meta;
    let n = m.positions[r] as usize + 1;
    let np = n.div_ceil(16) * 16;
    let table = &m.seqs[m.row_seq[r] as usize].block_table[..n.div_ceil(bs)];
    let kvh = h0 / c.group;
    if scratch.len() < HG * (np + hd) {
        scratch.resize(HG * (np + hd), 0.0);
    }
    let (scores, qf) = scratch.split_at_mut(HG * np);
    let qrow = r * c.heads * hd;
    for (i, v) in qf[..HG * hd].iter_mut().enumerate() {
        // SAFETY: heads h0..h0+HG of row r are inside the checked q.
        *v = unsafe { c.q.get(qrow + h0 * hd + i) };
    }
    // SAFETY: the caller's checks cover every block of `table` and the plane offsets.
    unsafe { score::<S, HG>(s, c, (table, n, kvh), &qf[..HG * hd], scores, np) };
    let mut l = [0f32; HG];
    for (i, li) in l.iter_mut().enumerate() {
        *li = softmax_numerators(s, &mut scores[i * np..(i + 1) * np], n);
    }
    let pv = Pv { table, n, kvh, scores, np, l: &l, qrow };
    // SAFETY: as above; the tiles below cover heads h0..h0+HG.
    unsafe {
        match hd {
            64 => pv.run::<S, HG, 4>(s, c, h0, 0),
            128 => {
                for i in (0..HG).step_by(2) {
                    if i + 1 < HG {
                        pv.run::<S, 2, 8>(s, c, h0, i);
                    } else {
                        pv.run::<S, 1, 8>(s, c, h0, i);
                    }
                }
            }
            _ => pv.any::<S, HG>(s, c, h0),
        }
    }
}

/// The weighted sum over V of one row's heads, given the softmax numerators and sums.
struct Pv<'a> {
    table: &'a [u32],
    n: usize,
    kvh: usize,
    /// Head i's numerators at `scores[i * np..]`.
    scores: &'a [f32],
    np: usize,
    l: &'a [f32],
    qrow: usize,
}

impl Pv<'_> {
    /// Heads `h0 + i0 ..+ HG` of a head_dim of `16 * DC`, all accumulators in registers.
    ///
    /// # Safety
    /// See `attend`; `HG * DC <= 16`.
    // Index loops over the register tile `acc[head][dim chunk]`; they unroll fully.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn run<S: Simd, const HG: usize, const DC: usize>(
        &self,
        s: S,
        c: &Ctx,
        h0: usize,
        i0: usize,
    ) {
        let g = &c.kv.geom;
        let (hd, bs) = (g.head_dim, g.block_size);
        let mut acc = [[s.zero(); DC]; HG];
        for (bi, &blk) in self.table.iter().enumerate() {
            let vp = c.kv.k_plane(blk as usize, c.layer) + c.kv.plane + self.kvh * bs * hd;
            for slot in 0..bs.min(self.n - bi * bs) {
                let j = bi * bs + slot;
                let mut v = [s.zero(); DC];
                for (dc, x) in v.iter_mut().enumerate() {
                    // SAFETY: (block, layer, kv head, slot, dims) is inside the pool.
                    *x = unsafe { s.load_bf16(c.kv.data.as_ptr().add(vp + slot * hd + 16 * dc)) };
                }
                for i in 0..HG {
                    let e = s.splat(self.scores[(i0 + i) * self.np + j]);
                    for dc in 0..DC {
                        acc[i][dc] = s.fma(e, v[dc], acc[i][dc]);
                    }
                }
            }
        }
        for i in 0..HG {
            let l = s.splat(self.l[i0 + i]);
            for dc in 0..DC {
                let at = self.qrow + (h0 + i0 + i) * hd + 16 * dc;
                // SAFETY: inside row r's heads, owned by this thread.
                unsafe { c.out.store(s, at, s.div(acc[i][dc], l)) };
            }
        }
    }

    /// Any head_dim: one 16-dim slice at a time (the same fma chain per output element).
    ///
    /// # Safety
    /// See `attend`.
    #[inline(always)]
    unsafe fn any<S: Simd, const HG: usize>(&self, s: S, c: &Ctx, h0: usize) {
        let g = &c.kv.geom;
        let (hd, bs) = (g.head_dim, g.block_size);
        for d0 in (0..hd).step_by(16) {
            let w = 16.min(hd - d0);
            let mut acc = [s.zero(); HG];
            for (bi, &blk) in self.table.iter().enumerate() {
                let vp = c.kv.k_plane(blk as usize, c.layer) + c.kv.plane + self.kvh * bs * hd;
                for slot in 0..bs.min(self.n - bi * bs) {
                    let j = bi * bs + slot;
                    // SAFETY: (block, layer, kv head, slot) is inside the pool; d0 + w <= hd.
                    let v = unsafe {
                        let p = c.kv.data.as_ptr().add(vp + slot * hd + d0);
                        if w == 16 {
                            s.load_bf16(p)
                        } else {
                            s.load_bf16_n(p, w)
                        }
                    };
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = s.fma(s.splat(self.scores[i * self.np + j]), v, *a);
                    }
                }
            }
            for (i, a) in acc.iter().enumerate() {
                let y = s.div(*a, s.splat(self.l[i]));
                let at = self.qrow + (h0 + i) * hd + d0;
                // SAFETY: inside row r's heads, owned by this thread.
                unsafe {
                    if w == 16 {
                        c.out.store(s, at, y)
                    } else {
                        c.out.store_n(s, at, y, w)
                    }
                }
            }
        }
    }
}

/// `scores[i*np + j] = dot(q_i, k_j) * scale` for j < n; lanes past n are left as they are.
///
/// # Safety
/// Every block of `seq.0` is inside the pool.
#[inline(always)]
unsafe fn score<S: Simd, const HG: usize>(
    s: S,
    c: &Ctx,
    seq: (&[u32], usize, usize),
    qf: &[f32],
    scores: &mut [f32],
    np: usize,
) {
    let (table, n, kvh) = seq;
    let g = &c.kv.geom;
    let (hd, bs) = (g.head_dim, g.block_size);
    let scale = s.splat(c.scale);
    for (bi, &blk) in table.iter().enumerate() {
        let kp = c.kv.k_plane(blk as usize, c.layer) + kvh * hd * bs;
        let slots = bs.min(n - bi * bs);
        for s0 in (0..slots).step_by(16) {
            let valid = 16.min(slots - s0);
            let full = s0 + 16 <= bs;
            let mut acc = [s.zero(); HG];
            for d in 0..hd {
                // SAFETY: slots s0.. of dim d of this K plane (partial near the block's end).
                let kt = unsafe {
                    let p = c.kv.data.as_ptr().add(kp + d * bs + s0);
                    if full {
                        s.load_bf16(p)
                    } else {
                        s.load_bf16_n(p, bs - s0)
                    }
                };
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = s.fma(s.splat(qf[i * hd + d]), kt, *a);
                }
            }
            let j0 = bi * bs + s0;
            for (i, a) in acc.iter().enumerate() {
                let v = s.mul(*a, scale);
                let dst = scores[i * np + j0..].as_mut_ptr();
                // SAFETY: j0 + valid <= n <= np: inside head i's scores.
                unsafe {
                    if valid == 16 {
                        s.store(dst, v)
                    } else {
                        s.store_n(dst, v, valid)
                    }
                }
            }
        }
    }
}

/// Replaces `sc[..n]` by `exp(s_j - max)` and returns their sum (fixed lanes and tree).
#[inline(always)]
fn softmax_numerators<S: Simd>(s: S, sc: &mut [f32], n: usize) -> f32 {
    for v in &mut sc[n..] {
        *v = f32::NEG_INFINITY;
    }
    let mut mv = s.splat(f32::NEG_INFINITY);
    for c in sc.chunks_exact(16) {
        // SAFETY: a whole chunk of 16.
        mv = s.max(mv, unsafe { s.load(c.as_ptr()) });
    }
    let mut t = [0f32; 16];
    // SAFETY: t holds 16.
    unsafe { s.store(t.as_mut_ptr(), mv) };
    for w in [8, 4, 2, 1] {
        for i in 0..w {
            t[i] = if t[i] > t[i + w] { t[i] } else { t[i + w] };
        }
    }
    let m = s.splat(t[0]);
    let mut lv = s.zero();
    for c in sc.chunks_exact_mut(16) {
        // SAFETY: a whole chunk of 16, read then overwritten.
        unsafe {
            let e = math::exp(s, s.sub(s.load(c.as_ptr()), m));
            s.store(c.as_mut_ptr(), e);
            lv = s.add(lv, e);
        }
    }
    s.reduce(lv)
}
