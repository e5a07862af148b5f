//! The row-wise units as [`RowCase`]s: embed, rms_norm, linear, logits, rope, swiglu, add
//! (and argmax, in `sample.rs`).
//!
//! Each case makes its inputs once (tables of the 2,048 universe rows, weights), all bf16
//! from the unit's seeded generator, written to scratch safetensors files and loaded through
//! the backend. A call places the rows it is given with `embed` (checked bit for bit), runs
//! the op into buffers allocated once for 2,048 rows (so every smaller call also exercises
//! reuse with fewer rows), and reads the output back. Every row has an absolute position
//! (0 and 8,191 among them) and is its own sequence, as decode rows of many requests are.
//!
//! Data: inputs and weights are approximately normal, with a mean offset on odd rows of
//! linear inputs and weights (see the `contract` module doc); norm inputs vary in magnitude
//! by row (2^-4 .. 2^4), swiglu gates span about +-10.

use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::TensorView;

use super::data::{read, row_batch, Bf16Mat, Rng, Scratch, Table};
use super::geometry::{Geometry, Unit};
use super::reference::{self, Expect};
use super::rows::{RowCase, UNIVERSE};
use super::ContractError;
use crate::{ActDType, Backend, NormArgs, RopeArgs};

/// Positions of the RoPE table (and so of every row).
const MAX_POSITIONS: usize = 8192;

/// The mean offset of odd rows of linear inputs and weights.
pub(super) fn offset(i: usize) -> f32 {
    if i % 2 == 1 {
        2.0
    } else {
        0.0
    }
}

/// The case of a row-wise unit (every unit but attention).
pub fn build<'b, B: Backend + 'b>(
    be: &B,
    g: &Geometry,
    unit: &Unit,
    s: &Scratch,
    rng: &mut Rng,
) -> Result<Box<dyn RowCase<B> + 'b>, ContractError> {
    let mut positions: Vec<u32> = (0..UNIVERSE).map(|_| rng.below(MAX_POSITIONS) as u32).collect();
    (positions[0], positions[1]) = (0, MAX_POSITIONS as u32 - 1);
    let io = Io { positions, tables: Vec::new(), bufs: Vec::new() };
    let bf16_out = |cols| be.alloc(ActDType::Bf16, UNIVERSE, cols);
    Ok(match unit {
        Unit::Embed => {
            let table = s.bf16("embed_tokens", &[g.vocab, g.hidden], |_| rng.normalish())?;
            let mut tokens: Vec<u32> = (0..UNIVERSE).map(|_| rng.below(g.vocab) as u32).collect();
            (tokens[0], tokens[1]) = (0, g.vocab as u32 - 1);
            let w = be.load_weight(&table)?;
            Box::new(EmbedCase { io, table, w, tokens, out: bf16_out(g.hidden)? })
        }
        &Unit::Norm { cols, group, .. } => {
            let scale = |r: usize| 2f32.powi(r as i32 % 9 - 4);
            let io = io.with(be, s, rng, ("x", cols), |r, _, z| z * scale(r))?;
            let w = s.bf16("norm.weight", &[group], |_| 1.0 + 0.25 * rng.normalish())?;
            let wd = be.load_weight(&w)?;
            Box::new(NormCase { io, w, wd, eps: g.rms_eps, out: bf16_out(cols)? })
        }
        &Unit::Linear { n, k, bias, .. } => {
            Box::new(LinearCase::new(be, s, rng, io, (n, k), bias, false)?)
        }
        Unit::Logits => {
            Box::new(LinearCase::new(be, s, rng, io, (g.vocab, g.hidden), false, true)?)
        }
        &Unit::Rope { heads, style, .. } => {
            Box::new(RopeCase::new(be, g, s, rng, io, heads, style)?)
        }
        Unit::Swiglu => {
            let cols = g.intermediate;
            let io = io.with(be, s, rng, ("gate", cols), |_, _, z| 3.0 * z)?;
            let io = io.with(be, s, rng, ("up", cols), |_, _, z| z)?;
            Box::new(Elementwise { io, cols, out: Some(bf16_out(cols)?) })
        }
        Unit::Add => {
            let io = io.with(be, s, rng, ("acc", g.hidden), |_, _, z| 4.0 * z)?;
            let io = io.with(be, s, rng, ("x", g.hidden), |_, _, z| z)?;
            Box::new(Elementwise { io, cols: g.hidden, out: None })
        }
        Unit::Argmax => Box::new(super::sample::ArgmaxCase::new(be, g.vocab, s, rng)?),
        Unit::AddNorm
        | Unit::LinearGroup { .. }
        | Unit::LinearSwiglu
        | Unit::RopeKv { .. }
        | Unit::AddNormGroup
        | Unit::QkvRope { .. }
        | Unit::AddNormSwiglu => return super::fused::build(be, g, unit, s, rng, io),
        Unit::Attention => {
            return Err(ContractError::Setup("attention is not a row-wise unit".into()))
        }
    })
}

/// Input tables, their device buffers and each universe row's position.
pub(super) struct Io<B: Backend> {
    pub(super) positions: Vec<u32>,
    pub(super) tables: Vec<Table<B>>,
    pub(super) bufs: Vec<B::Tensor>,
}

impl<B: Backend> Io<B> {
    /// Adds a `(UNIVERSE, cols)` input table: element (r, c) is `bf16(gen(r, c, z))`, z a
    /// fresh approximately normal draw.
    pub(super) fn with(
        mut self,
        be: &B,
        s: &Scratch,
        rng: &mut Rng,
        (name, cols): (&str, usize),
        gen: impl Fn(usize, usize, f32) -> f32,
    ) -> Result<Self, ContractError> {
        let t = Table::new(be, s, name, (UNIVERSE, cols), |r, c| gen(r, c, rng.normalish()))?;
        self.bufs.push(be.alloc(ActDType::Bf16, UNIVERSE, cols)?);
        self.tables.push(t);
        Ok(self)
    }

    /// A batch of rows `ids` with every input table embedded into its buffer.
    pub(super) fn place(&mut self, be: &B, ids: &[u32]) -> Result<B::Batch, ContractError> {
        let pos: Vec<u32> = ids.iter().map(|&i| self.positions[i as usize]).collect();
        let batch = be.prepare_batch(&row_batch(ids, &pos))?;
        for (t, buf) in self.tables.iter().zip(self.bufs.iter_mut()) {
            t.embed(be, &batch, ids, buf)?;
        }
        Ok(batch)
    }

    /// Rows `ids` of input table `t` as f64.
    pub(super) fn rows(&self, t: usize, ids: &[u32]) -> Vec<Vec<f64>> {
        let m = self.tables[t].mat();
        ids.iter().map(|&i| m.row(i as usize)).collect()
    }
}

struct EmbedCase<B: Backend> {
    io: Io<B>,
    table: TensorView,
    w: B::Weight,
    /// Token of each universe row (0 and vocab - 1 among them).
    tokens: Vec<u32>,
    out: B::Tensor,
}

impl<B: Backend> RowCase<B> for EmbedCase<B> {
    fn cols(&self) -> usize {
        self.table.rows_cols().1
    }
    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        let toks: Vec<u32> = ids.iter().map(|&i| self.tokens[i as usize]).collect();
        let pos: Vec<u32> = ids.iter().map(|&i| self.io.positions[i as usize]).collect();
        let batch = be.prepare_batch(&row_batch(&toks, &pos))?;
        be.embed(&self.w, &batch, &mut self.out)?;
        read(be, &self.out, (ids.len(), self.cols()), "op output")
    }
    fn reference(&self, ids: &[u32]) -> Expect {
        let m = Bf16Mat::of(&self.table);
        Expect::exact(ids.iter().flat_map(|&i| m.row(self.tokens[i as usize] as usize)).collect())
    }
}

struct NormCase<B: Backend> {
    io: Io<B>,
    /// `(group)` weight.
    w: TensorView,
    wd: B::Weight,
    eps: f32,
    out: B::Tensor,
}

impl<B: Backend> RowCase<B> for NormCase<B> {
    fn cols(&self) -> usize {
        self.io.tables[0].mat().cols
    }
    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        self.io.place(be, ids)?;
        let (x, group) = (&self.io.bufs[0], self.w.rows_cols().1);
        be.rms_norm(NormArgs { x, weight: &self.wd, eps: self.eps, group, out: &mut self.out })?;
        read(be, &self.out, (ids.len(), self.cols()), "op output")
    }
    fn reference(&self, ids: &[u32]) -> Expect {
        let w = Bf16Mat::of(&self.w).row(0);
        let mut e = Expect::default();
        for x in self.io.rows(0, ids) {
            e.append(reference::rms_norm(&x, &w, self.eps));
        }
        e
    }
}

/// `linear` (with or without bias) or `logits` (every row a logit row, f32 output).
struct LinearCase<B: Backend> {
    io: Io<B>,
    /// `(n, k)` weight and `(n)` bias.
    w: TensorView,
    wd: B::Weight,
    bias: Option<(TensorView, B::Weight)>,
    logits: bool,
    out: B::Tensor,
}

impl<B: Backend> LinearCase<B> {
    fn new(
        be: &B,
        s: &Scratch,
        rng: &mut Rng,
        io: Io<B>,
        (n, k): (usize, usize),
        bias: bool,
        logits: bool,
    ) -> Result<Self, ContractError> {
        let io = io.with(be, s, rng, ("x", k), |r, _, z| z + offset(r))?;
        let scale = 1.0 / (k as f32).sqrt();
        let w = s.bf16("weight", &[n, k], |i| (rng.normalish() + offset(i / k)) * scale)?;
        let wd = be.load_weight(&w)?;
        let bias = match bias {
            true => {
                let b = s.bf16("bias", &[n], |_| 0.5 * rng.normalish())?;
                let bd = be.load_weight(&b)?;
                Some((b, bd))
            }
            false => None,
        };
        let dtype = if logits { ActDType::F32 } else { ActDType::Bf16 };
        let out = be.alloc(dtype, UNIVERSE, n)?;
        Ok(LinearCase { io, w, wd, bias, logits, out })
    }
}

impl<B: Backend> RowCase<B> for LinearCase<B> {
    fn cols(&self) -> usize {
        self.w.rows_cols().0
    }
    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        let batch = self.io.place(be, ids)?;
        let x = &self.io.bufs[0];
        if self.logits {
            be.logits(x, &self.wd, &batch, &mut self.out)?;
        } else {
            be.linear(x, &self.wd, self.bias.as_ref().map(|b| &b.1), &mut self.out)?;
        }
        read(be, &self.out, (ids.len(), self.cols()), "op output")
    }
    fn reference(&self, ids: &[u32]) -> Expect {
        let bias = self.bias.as_ref().map(|(b, _)| Bf16Mat::of(b).row(0));
        reference::linear(&self.io.rows(0, ids), &Bf16Mat::of(&self.w), bias.as_deref())
    }
}

struct RopeCase<B: Backend> {
    io: Io<B>,
    /// bf16 `(MAX_POSITIONS, head_dim)`: cos of the head_dim/2 frequencies, then their sin.
    table: TensorView,
    td: B::Weight,
    heads: usize,
    style: RopeStyle,
}

impl<B: Backend> RopeCase<B> {
    fn new(
        be: &B,
        g: &Geometry,
        s: &Scratch,
        rng: &mut Rng,
        io: Io<B>,
        heads: usize,
        style: RopeStyle,
    ) -> Result<Self, ContractError> {
        let hd = g.head_dim;
        let io = io.with(be, s, rng, ("x", heads * hd), |_, _, z| 2.0 * z)?;
        let table = rope_table(g, s)?;
        let td = be.load_weight(&table)?;
        Ok(RopeCase { io, table, td, heads, style })
    }
}

/// bf16 `(MAX_POSITIONS, head_dim)`: cos of the head_dim/2 frequencies, then their sin.
pub(super) fn rope_table(g: &Geometry, s: &Scratch) -> Result<TensorView, ContractError> {
    let (hd, half) = (g.head_dim, g.head_dim / 2);
    s.bf16("rope.table", &[MAX_POSITIONS, hd], |i| {
        let (p, j) = (i / hd, i % hd);
        let freq = g.rope_theta.powf(-2.0 * (j % half) as f64 / hd as f64);
        let angle = p as f64 * freq;
        (if j < half { angle.cos() } else { angle.sin() }) as f32
    })
}

impl<B: Backend> RowCase<B> for RopeCase<B> {
    fn cols(&self) -> usize {
        self.io.tables[0].mat().cols
    }
    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        let batch = self.io.place(be, ids)?;
        let head_dim = self.table.rows_cols().1;
        let (x, table) = (&mut self.io.bufs[0], &self.td);
        be.rope(RopeArgs {
            x,
            heads: self.heads,
            head_dim,
            style: self.style,
            table,
            batch: &batch,
        })?;
        read(be, &self.io.bufs[0], (ids.len(), self.cols()), "rope output")
    }
    fn reference(&self, ids: &[u32]) -> Expect {
        let t = Bf16Mat::of(&self.table);
        let half = t.cols / 2;
        let mut e = Expect::default();
        for (x, &id) in self.io.rows(0, ids).iter().zip(ids) {
            let cs = t.row(self.io.positions[id as usize] as usize);
            e.append(reference::rope(x, &cs[..half], &cs[half..], t.cols, self.style));
        }
        e
    }
}

/// `swiglu(gate, up)` into `out` (when `out` is some), else `add(acc, x)` in place.
struct Elementwise<B: Backend> {
    io: Io<B>,
    cols: usize,
    out: Option<B::Tensor>,
}

impl<B: Backend> RowCase<B> for Elementwise<B> {
    fn cols(&self) -> usize {
        self.cols
    }
    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        self.io.place(be, ids)?;
        let (a, b) = self.io.bufs.split_at_mut(1);
        let (a, b) = (&mut a[0], &b[0]);
        let shape = (ids.len(), self.cols);
        match &mut self.out {
            Some(out) => {
                be.swiglu(a, b, out)?;
                read(be, out, shape, "swiglu output")
            }
            None => {
                be.add(a, b)?;
                read(be, a, shape, "add output")
            }
        }
    }
    fn reference(&self, ids: &[u32]) -> Expect {
        let mut e = Expect::default();
        for (a, b) in self.io.rows(0, ids).iter().zip(self.io.rows(1, ids)) {
            e.append(match self.out {
                Some(_) => reference::swiglu(a, &b),
                None => reference::add(a, &b),
            });
        }
        e
    }
}
