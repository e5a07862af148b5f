//! `qkv_rope_kv_store` as a [`RowCase`]: q, k, v of the rows (after the residual add and norm
//! in the `norm` form, whose acc and normed rows are outputs too), q and k rotated, and k, v
//! read back from the pool (each row its own sequence, every block of which is the block of
//! its id, as `fused.rs`'s rope_kv case). A GPU runs decode-sized calls in one launch with the
//! rope and the KV write in the products' epilogue and larger calls as the unfused ops, so
//! gate 3 compares the two bit for bit. Gate 2: acc against `add`, normed against `rms_norm`
//! of the anchor's kept acc, v against `linear` of the products' input (the kept normed rows,
//! or the inputs), q and k against the rope of `linear` with the product's bound carried
//! through the rotation (`reference::rope_of`: the rotated values' bf16 inputs are not
//! outputs of the fused op), the pool's k and v as the rotated k and v.

use super::data::{read, Bf16Mat, Rng, Scratch, BLOCK_SIZE};
use super::fused::{join, keep, kept_rows, own_blocks, pool_rows, side_by_side};
use super::fused_norm::norm_inputs;
use super::geometry::Geometry;
use super::ops::{offset, rope_table, Io};
use super::reference::{self, Expect};
use super::rows::{RowCase, UNIVERSE};
use super::ContractError;
use crate::batch::KvGeometry;
use crate::{ActDType, AddNormArgs, Backend, LinearPart, QkvInput, QkvRopeArgs};
use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::TensorView;

pub struct QkvRopeCase<B: Backend> {
    /// Inputs: acc and x (the norm form) or the normed rows.
    io: Io<B>,
    /// The norm weight (the norm form) and its output buffer.
    norm: Option<(TensorView, B::Weight)>,
    eps: f32,
    normed: B::Tensor,
    /// q, k, v: `(n_j, hidden)` weights, `(n_j)` biases (the normed form only), outputs.
    w: Vec<(TensorView, B::Weight)>,
    bias: Vec<(TensorView, B::Weight)>,
    outs: Vec<B::Tensor>,
    table: TensorView,
    td: B::Weight,
    kv: B::Kv,
    geom: KvGeometry,
    heads: usize,
    style: RopeStyle,
    /// The anchor's acc and normed rows (the norm form), by id.
    kept: Vec<Vec<f32>>,
}

impl<B: Backend> QkvRopeCase<B> {
    pub fn new(
        be: &B,
        g: &Geometry,
        s: &Scratch,
        rng: &mut Rng,
        io: Io<B>,
        (norm, style): (bool, RopeStyle),
    ) -> Result<Self, ContractError> {
        let h = g.hidden;
        let (io, norm) = if norm {
            let (io, n) = norm_inputs(be, g, s, rng, io)?;
            (io, Some(n))
        } else {
            (io.with(be, s, rng, ("x", h), |r, _, z| z + offset(r))?, None)
        };
        let (hd, kvh) = (g.head_dim, g.kv_heads);
        let k_scale = 1.0 / (h as f32).sqrt();
        let (mut w, mut bias, mut outs) = (Vec::new(), Vec::new(), Vec::new());
        for (j, n) in [g.heads * hd, kvh * hd, kvh * hd].into_iter().enumerate() {
            let v = s.bf16(&format!("w{j}"), &[n, h], |_| rng.normalish() * k_scale)?;
            let d = be.load_weight(&v)?;
            w.push((v, d));
            if norm.is_none() {
                let v = s.bf16(&format!("b{j}"), &[n], |_| 0.5 * rng.normalish())?;
                let d = be.load_weight(&v)?;
                bias.push((v, d));
            }
            outs.push(be.alloc(ActDType::Bf16, UNIVERSE, n)?);
        }
        let table = rope_table(g, s)?;
        let td = be.load_weight(&table)?;
        let geom = KvGeometry {
            layers: 1,
            kv_heads: kvh,
            head_dim: hd,
            block_size: BLOCK_SIZE,
            num_blocks: UNIVERSE,
        };
        let kv = be.alloc_kv(&geom)?;
        let normed = be.alloc(ActDType::Bf16, UNIVERSE, h)?;
        let heads = g.heads;
        Ok(QkvRopeCase {
            io,
            norm,
            eps: g.rms_eps,
            normed,
            w,
            bias,
            outs,
            table,
            td,
            kv,
            geom,
            heads,
            style,
            kept: Vec::new(),
        })
    }

    fn hidden(&self) -> usize {
        self.w[0].0.rows_cols().1
    }

    /// Widths of the output row's parts: (acc, normed,) q, k, v, the pool's k and v.
    fn widths(&self) -> Vec<usize> {
        let (h, kvw) = (self.hidden(), self.geom.kv_heads * self.geom.head_dim);
        let mut v = if self.norm.is_some() { vec![h, h] } else { Vec::new() };
        v.extend([self.heads * self.geom.head_dim, kvw, kvw, kvw, kvw]);
        v
    }
}

impl<B: Backend> RowCase<B> for QkvRopeCase<B> {
    fn cols(&self) -> usize {
        self.widths().iter().sum()
    }

    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        self.io.place(be, ids)?;
        let meta = own_blocks(ids, &self.io.positions);
        let batch = be.prepare_batch(&meta)?;
        let h = self.hidden();
        let (a, b) = self.io.bufs.split_at_mut(1);
        let input = match &self.norm {
            Some((_, weight)) => {
                let (acc, x, out, eps) = (&mut a[0], &b[0], &mut self.normed, self.eps);
                QkvInput::AddNorm(AddNormArgs { acc, x, weight, eps, group: h, out })
            }
            None => QkvInput::Normed(&a[0]),
        };
        let [q, k, v] = &mut self.outs[..] else {
            return Err(ContractError::Setup("qkv_rope case without three outputs".into()));
        };
        let part = |j: usize, out| LinearPart {
            w: &self.w[j].1,
            bias: self.bias.get(j).map(|b| &b.1),
            out,
        };
        be.qkv_rope_kv_store(QkvRopeArgs {
            input,
            parts: [part(0, q), part(1, k), part(2, v)],
            kv: &mut self.kv,
            layer: 0,
            heads: self.heads,
            kv_heads: self.geom.kv_heads,
            head_dim: self.geom.head_dim,
            style: self.style,
            table: &self.td,
            batch: &batch,
        })?;
        let (rows, widths) = (ids.len(), self.widths());
        let mut parts = Vec::new();
        if self.norm.is_some() {
            parts.push(read(be, &self.io.bufs[0], (rows, h), "qkv_rope acc")?);
            parts.push(read(be, &self.normed, (rows, h), "qkv_rope normed")?);
        }
        let at = parts.len();
        for (t, &w) in self.outs.iter().zip(&widths[at..]) {
            parts.push(read(be, t, (rows, w), "qkv_rope output")?);
        }
        let kvw = self.geom.kv_heads * self.geom.head_dim;
        let (kp, vp) = pool_rows(be, &self.kv, kvw, ids, &meta.positions)?;
        parts.extend([kp, vp]);
        let all = join(rows, &parts);
        let cols = widths.iter().sum();
        if self.norm.is_some() {
            keep(&mut self.kept, ids, &all, (0, 2 * h, cols));
        }
        Ok(all)
    }

    fn reference(&self, ids: &[u32]) -> Expect {
        let (h, hd) = (self.hidden(), self.geom.head_dim);
        let mut front: Vec<Expect> = Vec::new();
        let x = match &self.norm {
            Some((nv, _)) => {
                let kept = kept_rows(&self.kept, ids);
                if kept.iter().any(|r| r.len() != 2 * h) {
                    return Expect::default();
                }
                let nw = Bf16Mat::of(nv).row(0);
                let (a, x) = (self.io.rows(0, ids), self.io.rows(1, ids));
                let (mut acc, mut normed) = (Expect::default(), Expect::default());
                for ((a, x), k) in a.iter().zip(&x).zip(&kept) {
                    acc.append(reference::add(a, x));
                    normed.append(reference::rms_norm(&k[..h], &nw, self.eps));
                }
                front.extend([acc, normed]);
                kept.iter().map(|k| k[h..].to_vec()).collect()
            }
            None => self.io.rows(0, ids),
        };
        let lin: Vec<Expect> = (0..3)
            .map(|j| {
                let b = self.bias.get(j).map(|(b, _)| Bf16Mat::of(b).row(0));
                reference::linear(&x, &Bf16Mat::of(&self.w[j].0), b.as_deref())
            })
            .collect();
        let t = Bf16Mat::of(&self.table);
        let half = t.cols / 2;
        let (mut q, mut k) = (Expect::default(), Expect::default());
        for (r, &id) in ids.iter().enumerate() {
            let cs = t.row(self.io.positions[id as usize] as usize);
            let row = |e: &Expect| {
                let w = e.value.len() / ids.len();
                let (value, bound) =
                    (e.value[r * w..(r + 1) * w].to_vec(), e.bound[r * w..(r + 1) * w].to_vec());
                Expect { value, bound }
            };
            q.append(reference::rope_of(&row(&lin[0]), &cs[..half], &cs[half..], hd, self.style));
            k.append(reference::rope_of(&row(&lin[1]), &cs[..half], &cs[half..], hd, self.style));
        }
        let v = &lin[2];
        front.extend([q, k.clone(), v.clone(), k, v.clone()]);
        side_by_side(ids.len(), &front)
    }
}
