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
//! Rows and heads never interact, so the pool splits (row, kv-head) items — or (row, head)
//! items when there are too few rows to keep the threads busy — without changing any bits.
//! Scores are kept in full (two passes) rather than an online softmax: the same arithmetic,
//! no rescaling, and the scratch is a few KiB per thread.

use std::ops::Range;

use super::act::{Dst, Src};
use super::kv::CpuKv;
use super::simd::{math, Kernel, Simd};
use super::tensor::{CpuBatch, CpuTensor};
use super::CpuBackend;
use crate::error::{BackendError, Result};

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
    /// Items are (row, head) instead of (row, kv head).
    per_head: bool,
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
    if sh.kv_heads != g.kv_heads
        || sh.head_dim != g.head_dim
        || sh.kv_heads == 0
        || sh.heads % sh.kv_heads != 0
        || q.cols != sh.heads * sh.head_dim
        || q.rows != rows
    {
        return Err(BackendError::shape(
            "attention",
            format!(
                "q ({}, {}) as {} heads of {} over {} kv heads; the pool has {} kv heads of {}",
                q.rows, q.cols, sh.heads, sh.head_dim, sh.kv_heads, g.kv_heads, g.head_dim
            ),
        ));
    }
    out.check_out("attention", rows, q.cols)?;
    let per_head = rows * sh.kv_heads < 4 * be.pool.threads();
    let items = if per_head { rows * sh.heads } else { rows * sh.kv_heads };
    let work: usize = batch.meta.positions.iter().map(|&p| p as usize + 1).sum::<usize>() * q.cols;
    let ctx = Ctx {
        q: Src::of(q),
        out: Dst::of(out),
        kv,
        layer: sh.layer,
        batch,
        heads: sh.heads,
        group: sh.heads / sh.kv_heads,
        scale: sh.scale,
        per_head,
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
        for item in self.range.clone() {
            let (r, heads) = if c.per_head {
                let (r, h) = (item / c.heads, item % c.heads);
                (r, h..h + 1)
            } else {
                let (r, g) = (item / (c.heads / c.group), item % (c.heads / c.group));
                (r, g * c.group..(g + 1) * c.group)
            };
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
    let o = c.out;
    for d0 in (0..hd).step_by(16) {
        let w = 16.min(hd - d0);
        let mut acc = [s.zero(); HG];
        for (bi, &blk) in table.iter().enumerate() {
            let vp = c.kv.k_plane(blk as usize, c.layer) + c.kv.plane + kvh * bs * hd;
            for slot in 0..bs.min(n - bi * bs) {
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
                    *a = s.fma(s.splat(scores[i * np + j]), v, *a);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            let y = s.div(*a, s.splat(l[i]));
            let at = qrow + (h0 + i) * hd + d0;
            // SAFETY: inside row r's heads, owned by this thread.
            unsafe {
                if w == 16 {
                    o.store(s, at, y)
                } else {
                    o.store_n(s, at, y, w)
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
