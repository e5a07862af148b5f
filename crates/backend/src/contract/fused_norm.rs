//! The norm-fused decode products as [`RowCase`]s: `add_norm_linear_group` (acc, normed, q, k,
//! v) and `add_norm_linear_swiglu` (acc, normed, gate, up, act). A GPU computes the norm in the
//! products' prologue for decode-sized calls and runs the two launches for larger ones, so gate
//! 3 (rows 1 .. 2,048 against the 2,048-row call) compares the fused kernels with the unfused
//! ops bit for bit. Gate 2 judges each stage against float64 with its own op's bound, on the
//! anchor call's own bf16 intermediates (as `fused.rs`): acc against `add`, normed against
//! `rms_norm` of the kept acc, the products against `linear` of the kept normed rows, act
//! against `swiglu` of the kept gate and up.

use super::data::{read, Bf16Mat, Rng, Scratch};
use super::fused::{join, keep, kept_rows, side_by_side};
use super::geometry::Geometry;
use super::ops::{offset, Io};
use super::reference::{self, Expect};
use super::rows::{RowCase, UNIVERSE};
use super::ContractError;
use crate::{ActDType, AddNormArgs, Backend, LinearPart};
use tf_checkpoint::TensorView;

pub struct NormProducts<B: Backend> {
    /// Inputs: the residual (acc) and the block output added to it (x).
    io: Io<B>,
    norm: (TensorView, B::Weight),
    eps: f32,
    normed: B::Tensor,
    /// q, k, v or gate, up: `(n_j, hidden)`.
    w: Vec<(TensorView, B::Weight)>,
    outs: Vec<B::Tensor>,
    swiglu: bool,
    /// The anchor's whole output rows, by id.
    kept: Vec<Vec<f32>>,
}

/// A norm weight: its values and its device copy.
pub(super) type NormWeight<B> = (TensorView, <B as Backend>::Weight);

/// The residual (acc) and block output (x) input tables of a norm-fused case, rows at scales
/// 2^-4 .. 2^4, and its norm weight.
pub(super) fn norm_inputs<B: Backend>(
    be: &B,
    g: &Geometry,
    s: &Scratch,
    rng: &mut Rng,
    io: Io<B>,
) -> Result<(Io<B>, NormWeight<B>), ContractError> {
    let h = g.hidden;
    let scale = |r: usize| 2f32.powi(r as i32 % 9 - 4);
    let io = io.with(be, s, rng, ("acc", h), |r, _, z| 4.0 * z * scale(r))?;
    let io = io.with(be, s, rng, ("x", h), |r, _, z| z * scale(r) + offset(r))?;
    let nv = s.bf16("norm.weight", &[h], |_| 1.0 + 0.25 * rng.normalish())?;
    let nd = be.load_weight(&nv)?;
    Ok((io, (nv, nd)))
}

impl<B: Backend> NormProducts<B> {
    pub fn new(
        be: &B,
        g: &Geometry,
        s: &Scratch,
        rng: &mut Rng,
        io: Io<B>,
        swiglu: bool,
    ) -> Result<Self, ContractError> {
        let h = g.hidden;
        let (io, norm) = norm_inputs(be, g, s, rng, io)?;
        let ns = match swiglu {
            true => vec![g.intermediate, g.intermediate],
            false => vec![g.heads * g.head_dim, g.kv_heads * g.head_dim, g.kv_heads * g.head_dim],
        };
        let k_scale = 1.0 / (h as f32).sqrt();
        let (mut w, mut outs) = (Vec::new(), Vec::new());
        for (j, &n) in ns.iter().enumerate() {
            let v = s.bf16(&format!("w{j}"), &[n, h], |_| rng.normalish() * k_scale)?;
            let d = be.load_weight(&v)?;
            w.push((v, d));
            outs.push(be.alloc(ActDType::Bf16, UNIVERSE, n)?);
        }
        if swiglu {
            outs.push(be.alloc(ActDType::Bf16, UNIVERSE, ns[0])?);
        }
        let normed = be.alloc(ActDType::Bf16, UNIVERSE, h)?;
        Ok(NormProducts { io, norm, eps: g.rms_eps, normed, w, outs, swiglu, kept: Vec::new() })
    }

    fn hidden(&self) -> usize {
        self.norm.0.rows_cols().1
    }

    /// Widths of the output row's parts: acc, normed, then each product.
    fn widths(&self) -> Vec<usize> {
        let h = self.hidden();
        let mut v = vec![h, h];
        v.extend(self.w.iter().map(|(t, _)| t.rows_cols().0));
        if self.swiglu {
            v.push(self.w[0].0.rows_cols().0);
        }
        v
    }
}

impl<B: Backend> RowCase<B> for NormProducts<B> {
    fn cols(&self) -> usize {
        self.widths().iter().sum()
    }

    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        self.io.place(be, ids)?;
        let h = self.hidden();
        let (a, b) = self.io.bufs.split_at_mut(1);
        let (acc, x, out) = (&mut a[0], &b[0], &mut self.normed);
        let n = AddNormArgs { acc, x, weight: &self.norm.1, eps: self.eps, group: h, out };
        if self.swiglu {
            let [gate, up, act] = &mut self.outs[..] else {
                return Err(ContractError::Setup("swiglu case without three outputs".into()));
            };
            be.add_norm_linear_swiglu(n, &self.w[0].1, &self.w[1].1, gate, up, act)?;
        } else {
            let mut parts: Vec<LinearPart<'_, B>> = self
                .outs
                .iter_mut()
                .zip(&self.w)
                .map(|(out, (_, w))| LinearPart { w, bias: None, out })
                .collect();
            be.add_norm_linear_group(n, &mut parts)?;
        }
        let widths = self.widths();
        let rows = ids.len();
        let mut parts = vec![
            read(be, &self.io.bufs[0], (rows, h), "fused acc")?,
            read(be, &self.normed, (rows, h), "fused normed")?,
        ];
        for (t, &w) in self.outs.iter().zip(&widths[2..]) {
            parts.push(read(be, t, (rows, w), "fused output")?);
        }
        let all = join(rows, &parts);
        let cols = widths.iter().sum();
        keep(&mut self.kept, ids, &all, (0, cols, cols));
        Ok(all)
    }

    fn reference(&self, ids: &[u32]) -> Expect {
        let widths = self.widths();
        let h = self.hidden();
        let kept = kept_rows(&self.kept, ids);
        if kept.iter().any(|r| r.len() != widths.iter().sum::<usize>()) {
            return Expect::default();
        }
        let nw = Bf16Mat::of(&self.norm.0).row(0);
        let (a, x) = (self.io.rows(0, ids), self.io.rows(1, ids));
        let (mut acc, mut normed) = (Expect::default(), Expect::default());
        for ((a, x), k) in a.iter().zip(&x).zip(&kept) {
            acc.append(reference::add(a, x));
            normed.append(reference::rms_norm(&k[..h], &nw, self.eps));
        }
        let kept_normed: Vec<Vec<f64>> = kept.iter().map(|k| k[h..2 * h].to_vec()).collect();
        let mut parts = vec![acc, normed];
        for (w, _) in &self.w {
            parts.push(reference::linear(&kept_normed, &Bf16Mat::of(w), None));
        }
        if self.swiglu {
            let (n, at) = (widths[2], 2 * h);
            let mut act = Expect::default();
            for k in &kept {
                act.append(reference::swiglu(&k[at..at + n], &k[at + n..at + 2 * n]));
            }
            parts.push(act);
        }
        side_by_side(ids.len(), &parts)
    }
}
