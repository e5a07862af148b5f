//! The fused decode ops as [`RowCase`]s: `add_rms_norm`, `linear_group` (q, k, v),
//! `linear_swiglu` (gate, up, act) and `rope_kv_store` (q, k rotated; k, v read back from the
//! pool: each row is its own sequence whose every block is the block of its id, so each
//! row's slot is its own in every call).
//!
//! A fused op writes every value its unfused composition writes, so each unit's output row
//! is those values side by side (`[acc | normed]`, `[q | k | v]`, `[gate | up | act]`) and
//! gate 3 compares all of them across row counts (1 .. 2,048: decode rows take the fused
//! kernels, prefill-sized calls the unfused launches, and every row must have the same bits).
//! Gate 2 judges each stage against its float64 reference with the bound of the op it is:
//! acc, q, k, v, gate, up against `add` / `linear` of the inputs; normed and act against
//! `rms_norm` / `swiglu` of the op's own bf16 intermediates (acc; gate and up) from the
//! 2,048-row call, which gate 2 checks in the same unit. Rejected: a float64 reference of the
//! whole chain (the intermediate rounding to bf16 is a rounding point of the model, not an
//! error of the kernel: no bound derived from the arithmetic would cover a flipped bf16 step
//! of gate amplified by silu); comparing with the unfused ops of the same backend (not an
//! independent reference).

use super::data::{read, Bf16Mat, Rng, Scratch, BLOCK_SIZE};
use super::fused_norm::NormProducts;
use super::fused_rope::QkvRopeCase;
use super::geometry::{Geometry, Unit};
use super::ops::{offset, rope_table, Io};
use super::reference::{self, Expect};
use super::rows::{RowCase, UNIVERSE};
use super::ContractError;
use crate::batch::{BatchMeta, KvGeometry, SeqMeta};
use crate::{ActDType, AddNormArgs, Backend, LinearPart, RopeKvArgs, SwigluArgs};
use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::TensorView;

/// The case of a fused unit; `io` holds the rows' positions (no inputs yet).
pub fn build<'b, B: Backend + 'b>(
    be: &B,
    g: &Geometry,
    unit: &Unit,
    s: &Scratch,
    rng: &mut Rng,
    io: Io<B>,
) -> Result<Box<dyn RowCase<B> + 'b>, ContractError> {
    Ok(match *unit {
        Unit::AddNorm => {
            let scale = |r: usize| 2f32.powi(r as i32 % 9 - 4);
            let io = io.with(be, s, rng, ("acc", g.hidden), |r, _, z| 4.0 * z * scale(r))?;
            let io = io.with(be, s, rng, ("x", g.hidden), |r, _, z| z * scale(r))?;
            let w = s.bf16("norm.weight", &[g.hidden], |_| 1.0 + 0.25 * rng.normalish())?;
            let wd = be.load_weight(&w)?;
            let out = be.alloc(ActDType::Bf16, UNIVERSE, g.hidden)?;
            Box::new(AddNormCase { io, w, wd, eps: g.rms_eps, out, acc: Vec::new() })
        }
        Unit::LinearGroup { bias } => {
            let (q, kv) = (g.heads * g.head_dim, g.kv_heads * g.head_dim);
            let shape = Shape { ns: &[q, kv, kv], k: g.hidden, bias, swiglu: false };
            Box::new(Products::new(be, s, rng, io, shape)?)
        }
        Unit::LinearSwiglu => {
            let n = g.intermediate;
            let shape = Shape { ns: &[n, n], k: g.hidden, bias: false, swiglu: true };
            Box::new(Products::new(be, s, rng, io, shape)?)
        }
        Unit::RopeKv { style } => Box::new(RopeKvCase::new(be, g, s, rng, io, style)?),
        Unit::AddNormGroup => Box::new(NormProducts::new(be, g, s, rng, io, false)?),
        Unit::AddNormSwiglu => Box::new(NormProducts::new(be, g, s, rng, io, true)?),
        Unit::QkvRope { norm, style } => {
            Box::new(QkvRopeCase::new(be, g, s, rng, io, (norm, style))?)
        }
        _ => return Err(ContractError::Setup(format!("{unit:?} is not a fused unit"))),
    })
}

/// Values of the universe rows of the last 2,048-row call, by id (the anchor's intermediates).
pub(super) fn keep(
    kept: &mut Vec<Vec<f32>>,
    ids: &[u32],
    out: &[f32],
    (at, width, cols): (usize, usize, usize),
) {
    if ids.len() != UNIVERSE {
        return;
    }
    kept.clear();
    kept.resize(UNIVERSE, Vec::new());
    for (r, &id) in ids.iter().enumerate() {
        kept[id as usize] = out[r * cols + at..r * cols + at + width].to_vec();
    }
}

/// Rows of `kept` as f64 (empty when the anchor did not run: gate 2 then fails on length).
pub(super) fn kept_rows(kept: &[Vec<f32>], ids: &[u32]) -> Vec<Vec<f64>> {
    ids.iter()
        .map(|&i| {
            kept.get(i as usize).map_or(Vec::new(), |r| r.iter().map(|&v| v as f64).collect())
        })
        .collect()
}

/// Row-major expectations of equal-length rows, side by side: row r is `parts[0]`'s row r,
/// then `parts[1]`'s, ...
pub(super) fn side_by_side(rows: usize, parts: &[Expect]) -> Expect {
    let mut e = Expect::default();
    for r in 0..rows {
        for p in parts {
            let w = p.value.len() / rows.max(1);
            e.value.extend_from_slice(&p.value[r * w..(r + 1) * w]);
            e.bound.extend_from_slice(&p.bound[r * w..(r + 1) * w]);
        }
    }
    e
}

/// Interleaves per-part outputs `(rows, width_j)` into rows of `[part0 | part1 | ...]`.
pub(super) fn join(rows: usize, parts: &[Vec<f32>]) -> Vec<f32> {
    let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for r in 0..rows {
        for p in parts {
            let w = p.len() / rows.max(1);
            out.extend_from_slice(&p[r * w..(r + 1) * w]);
        }
    }
    out
}

struct AddNormCase<B: Backend> {
    io: Io<B>,
    w: TensorView,
    wd: B::Weight,
    eps: f32,
    out: B::Tensor,
    /// The anchor's sums (acc after the add), by id.
    acc: Vec<Vec<f32>>,
}

impl<B: Backend> RowCase<B> for AddNormCase<B> {
    fn cols(&self) -> usize {
        2 * self.w.rows_cols().1
    }
    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        self.io.place(be, ids)?;
        let hidden = self.w.rows_cols().1;
        let (a, b) = self.io.bufs.split_at_mut(1);
        let (acc, x) = (&mut a[0], &b[0]);
        let (weight, eps, out) = (&self.wd, self.eps, &mut self.out);
        be.add_rms_norm(AddNormArgs { acc, x, weight, eps, group: hidden, out })?;
        let shape = (ids.len(), hidden);
        let sums = read(be, &self.io.bufs[0], shape, "add_rms_norm acc")?;
        let normed = read(be, &self.out, shape, "add_rms_norm output")?;
        let all = join(ids.len(), &[sums, normed]);
        keep(&mut self.acc, ids, &all, (0, hidden, 2 * hidden));
        Ok(all)
    }
    fn reference(&self, ids: &[u32]) -> Expect {
        let w = Bf16Mat::of(&self.w).row(0);
        let mut e = Expect::default();
        let (a, x, s) = (self.io.rows(0, ids), self.io.rows(1, ids), kept_rows(&self.acc, ids));
        for ((a, x), s) in a.iter().zip(&x).zip(&s) {
            e.append(reference::add(a, x));
            e.append(reference::rms_norm(s, &w, self.eps));
        }
        e
    }
}

/// `linear_group` (q, k, v, optionally with biases) or `linear_swiglu` (gate, up, act).
struct Products<B: Backend> {
    io: Io<B>,
    /// `(n_j, k)` weights and `(n_j)` biases.
    w: Vec<(TensorView, B::Weight)>,
    bias: Vec<(TensorView, B::Weight)>,
    outs: Vec<B::Tensor>,
    swiglu: bool,
    /// The anchor's `[gate | up]` (swiglu only), by id.
    kept: Vec<Vec<f32>>,
}

/// Weights of a [`Products`] case: `(n_j, k)` each, with biases or not; `swiglu`: two
/// weights, gate and up.
struct Shape<'a> {
    ns: &'a [usize],
    k: usize,
    bias: bool,
    swiglu: bool,
}

impl<B: Backend> Products<B> {
    fn new(
        be: &B,
        s: &Scratch,
        rng: &mut Rng,
        io: Io<B>,
        Shape { ns, k, bias, swiglu }: Shape<'_>,
    ) -> Result<Self, ContractError> {
        let io = io.with(be, s, rng, ("x", k), |r, _, z| z + offset(r))?;
        let scale = 1.0 / (k as f32).sqrt();
        let (mut w, mut b, mut outs) = (Vec::new(), Vec::new(), Vec::new());
        for (j, &n) in ns.iter().enumerate() {
            let v =
                s.bf16(&format!("w{j}"), &[n, k], |i| (rng.normalish() + offset(i / k)) * scale)?;
            let d = be.load_weight(&v)?;
            w.push((v, d));
            if bias {
                let v = s.bf16(&format!("b{j}"), &[n], |_| 0.5 * rng.normalish())?;
                let d = be.load_weight(&v)?;
                b.push((v, d));
            }
            outs.push(be.alloc(ActDType::Bf16, UNIVERSE, n)?);
        }
        if swiglu {
            outs.push(be.alloc(ActDType::Bf16, UNIVERSE, ns[0])?);
        }
        Ok(Products { io, w, bias: b, outs, swiglu, kept: Vec::new() })
    }

    fn widths(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.w.iter().map(|(t, _)| t.rows_cols().0).collect();
        if self.swiglu {
            v.push(v[0]);
        }
        v
    }
}

impl<B: Backend> RowCase<B> for Products<B> {
    fn cols(&self) -> usize {
        self.widths().iter().sum()
    }
    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        self.io.place(be, ids)?;
        let x = &self.io.bufs[0];
        if self.swiglu {
            let [gate, up, out] = &mut self.outs[..] else {
                return Err(ContractError::Setup("swiglu case without three outputs".into()));
            };
            let (gate_w, up_w) = (&self.w[0].1, &self.w[1].1);
            be.linear_swiglu(SwigluArgs { x, gate_w, up_w, gate, up, out })?;
        } else {
            let mut parts: Vec<LinearPart<'_, B>> = self
                .outs
                .iter_mut()
                .enumerate()
                .map(|(j, out)| LinearPart {
                    w: &self.w[j].1,
                    bias: self.bias.get(j).map(|b| &b.1),
                    out,
                })
                .collect();
            be.linear_group(x, &mut parts)?;
        }
        let widths = self.widths();
        let mut parts = Vec::new();
        for (t, &w) in self.outs.iter().zip(&widths) {
            parts.push(read(be, t, (ids.len(), w), "fused output")?);
        }
        let all = join(ids.len(), &parts);
        if self.swiglu {
            let cols = widths.iter().sum();
            keep(&mut self.kept, ids, &all, (0, 2 * widths[0], cols));
        }
        Ok(all)
    }
    fn reference(&self, ids: &[u32]) -> Expect {
        let x = self.io.rows(0, ids);
        let mut parts: Vec<Expect> = self
            .w
            .iter()
            .enumerate()
            .map(|(j, (w, _))| {
                let b = self.bias.get(j).map(|(b, _)| Bf16Mat::of(b).row(0));
                reference::linear(&x, &Bf16Mat::of(w), b.as_deref())
            })
            .collect();
        if self.swiglu {
            let n = self.widths()[0];
            let mut act = Expect::default();
            for gu in kept_rows(&self.kept, ids) {
                if gu.len() == 2 * n {
                    act.append(reference::swiglu(&gu[..n], &gu[n..]));
                }
            }
            parts.push(act);
        }
        if parts.iter().any(|p| p.value.len() % ids.len().max(1) != 0) {
            return Expect::default();
        }
        side_by_side(ids.len(), &parts)
    }
}

/// Rows `ids` at their positions, row i its own sequence, every block of which is block
/// `ids[i]` (so each row's slot is its own in every call).
pub(super) fn own_blocks(ids: &[u32], positions: &[u32]) -> BatchMeta {
    let n = ids.len() as u32;
    let positions: Vec<u32> = ids.iter().map(|&i| positions[i as usize]).collect();
    let seqs = ids
        .iter()
        .zip(&positions)
        .map(|(&id, &p)| SeqMeta { block_table: vec![id; p as usize / BLOCK_SIZE + 1] })
        .collect();
    BatchMeta {
        tokens: ids.to_vec(),
        positions,
        row_seq: (0..n).collect(),
        seqs,
        logit_rows: (0..n).collect(),
        block_size: BLOCK_SIZE,
    }
}

/// The k and v rows (`kvw` wide) that layer 0 of `kv` holds at each row's slot (`own_blocks`).
pub(super) fn pool_rows<B: Backend>(
    be: &B,
    kv: &B::Kv,
    kvw: usize,
    ids: &[u32],
    positions: &[u32],
) -> Result<(Vec<f32>, Vec<f32>), ContractError> {
    let (mut kp, mut vp) = (Vec::with_capacity(ids.len() * kvw), Vec::new());
    for (&id, &p) in ids.iter().zip(positions) {
        let len = p as usize % BLOCK_SIZE + 1;
        let (ks, vs) = be.read_kv(kv, 0, &[id], len)?;
        if ks.len() != len * kvw || vs.len() != len * kvw {
            return Err(ContractError::Setup(format!(
                "read_kv of {len} positions returned {} and {} values",
                ks.len(),
                vs.len()
            )));
        }
        kp.extend_from_slice(&ks[(len - 1) * kvw..]);
        vp.extend_from_slice(&vs[(len - 1) * kvw..]);
    }
    Ok((kp, vp))
}

/// `rope_kv_store` of q, k, v rows at their positions into a pool of one layer.
struct RopeKvCase<B: Backend> {
    io: Io<B>,
    table: TensorView,
    td: B::Weight,
    kv: B::Kv,
    geom: KvGeometry,
    heads: usize,
    style: RopeStyle,
}

impl<B: Backend> RopeKvCase<B> {
    fn new(
        be: &B,
        g: &Geometry,
        s: &Scratch,
        rng: &mut Rng,
        io: Io<B>,
        style: RopeStyle,
    ) -> Result<Self, ContractError> {
        let (hd, kvw) = (g.head_dim, g.kv_heads * g.head_dim);
        let io = io.with(be, s, rng, ("q", g.heads * hd), |_, _, z| 2.0 * z)?;
        let io = io.with(be, s, rng, ("k", kvw), |_, _, z| 2.0 * z)?;
        let io = io.with(be, s, rng, ("v", kvw), |_, _, z| z)?;
        let table = rope_table(g, s)?;
        let td = be.load_weight(&table)?;
        let geom = KvGeometry {
            layers: 1,
            kv_heads: g.kv_heads,
            head_dim: hd,
            block_size: BLOCK_SIZE,
            num_blocks: UNIVERSE,
        };
        let kv = be.alloc_kv(&geom)?;
        Ok(RopeKvCase { io, table, td, kv, geom, heads: g.heads, style })
    }
}

impl<B: Backend> RowCase<B> for RopeKvCase<B> {
    fn cols(&self) -> usize {
        let kvw = self.geom.kv_heads * self.geom.head_dim;
        self.heads * self.geom.head_dim + 3 * kvw
    }
    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        self.io.place(be, ids)?;
        let meta = own_blocks(ids, &self.io.positions);
        let batch = be.prepare_batch(&meta)?;
        let (hd, kvh) = (self.geom.head_dim, self.geom.kv_heads);
        let [q, k, v] = &mut self.io.bufs[..] else {
            return Err(ContractError::Setup("rope_kv case without three inputs".into()));
        };
        be.rope_kv_store(RopeKvArgs {
            q,
            k,
            v,
            kv: &mut self.kv,
            layer: 0,
            heads: self.heads,
            kv_heads: kvh,
            head_dim: hd,
            style: self.style,
            table: &self.td,
            batch: &batch,
        })?;
        let (n, kvw) = (ids.len(), kvh * hd);
        let qr = read(be, &self.io.bufs[0], (n, self.heads * hd), "rope_kv q")?;
        let kr = read(be, &self.io.bufs[1], (n, kvw), "rope_kv k")?;
        let (kp, vp) = pool_rows(be, &self.kv, kvw, ids, &meta.positions)?;
        Ok(join(n, &[qr, kr, kp, vp]))
    }
    fn reference(&self, ids: &[u32]) -> Expect {
        let t = Bf16Mat::of(&self.table);
        let half = t.cols / 2;
        let (q, k, v) = (self.io.rows(0, ids), self.io.rows(1, ids), self.io.rows(2, ids));
        let mut e = Expect::default();
        for (r, &id) in ids.iter().enumerate() {
            let cs = t.row(self.io.positions[id as usize] as usize);
            let (c, s) = (&cs[..half], &cs[half..]);
            e.append(reference::rope(&q[r], c, s, t.cols, self.style));
            let kr = reference::rope(&k[r], c, s, t.cols, self.style);
            e.append(kr.clone());
            e.append(kr);
            e.append(Expect::exact(v[r].clone()));
        }
        e
    }
}
