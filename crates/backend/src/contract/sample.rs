//! The `sample` unit: [`Backend::argmax`] (greedy sampling on the device) as a row-wise case.
//!
//! Inputs: each universe row is a `(rows, vocab)` f32 logits row made on the device by the
//! `logits` op from a bf16 input row `x` of `WIDTH` values and a weight whose vocabulary
//! row `v` is one-hot: `2^e(v)` at column `c(v)`. Every logit is then `x[c(v)] 2^e(v)`
//! EXACTLY (one nonzero product, the other products +-0, in any summation order, and a bf16
//! value times a power of two rounds to itself), so the float64 reference knows each logit
//! bit for bit and its argmax is the exact answer — no tolerance. Columns and exponents are
//! drawn with few distinct values, so every row has exact ties (many vocabulary rows share
//! `(c, e)`), which the rule breaks to the lowest id; `x` holds both signs and +-0.
//!
//! Output: the token of each row as f32 (ids below 2^24 are exact), reference = the
//! lowest id of the maximum. Gate 2's bound is 0; the 1%-off control scales the ids (red
//! whenever a sampled row's answer is not id 0); gate 3 and the row control are the generic
//! ones. Rejected: reading the device's own logits back as the reference input (the check
//! would then share the device's values instead of knowing them).

use super::data::{read, row_batch, Bf16Mat, Rng, Scratch, Table};
use super::reference::Expect;
use super::rows::{RowCase, UNIVERSE};
use super::ContractError;
use crate::{ActDType, Backend};

/// Columns of the input rows (the logits op's K).
const WIDTH: usize = 64;
/// Exponents of the one-hot weights: 2^-2 .. 2^1.
const EXPONENTS: i32 = 4;

pub struct ArgmaxCase<B: Backend> {
    x: Table<B>,
    xbuf: B::Tensor,
    /// One-hot `(vocab, WIDTH)` weight.
    w: tf_checkpoint::TensorView,
    wd: B::Weight,
    logits: B::Tensor,
}

impl<B: Backend> ArgmaxCase<B> {
    pub fn new(be: &B, vocab: usize, s: &Scratch, rng: &mut Rng) -> Result<Self, ContractError> {
        // A few input columns per row carry large values so that the winners are contested.
        let x = Table::new(be, s, "x", (UNIVERSE, WIDTH), |r, c| match (r + c) % 7 {
            0 => 0.0,
            1 => -0.0,
            _ => rng.normalish() * if c % 16 == r % 16 { 8.0 } else { 1.0 },
        })?;
        let hot: Vec<(usize, i32)> = (0..vocab)
            .map(|_| (rng.below(WIDTH), rng.below(EXPONENTS as usize) as i32 - 2))
            .collect();
        let w = s.bf16("onehot", &[vocab, WIDTH], |i| {
            let (c, e) = hot[i / WIDTH];
            if i % WIDTH == c {
                2f32.powi(e)
            } else {
                0.0
            }
        })?;
        let wd = be.load_weight(&w)?;
        let xbuf = be.alloc(ActDType::Bf16, UNIVERSE, WIDTH)?;
        let logits = be.alloc(ActDType::F32, UNIVERSE, vocab)?;
        Ok(ArgmaxCase { x, xbuf, w, wd, logits })
    }
}

impl<B: Backend> RowCase<B> for ArgmaxCase<B> {
    fn cols(&self) -> usize {
        1
    }

    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError> {
        let batch = be.prepare_batch(&row_batch(ids, &vec![0; ids.len()]))?;
        self.x.embed(be, &batch, ids, &mut self.xbuf)?;
        be.logits(&self.xbuf, &self.wd, &batch, &mut self.logits)?;
        let tokens = be.argmax(&self.logits, ids.len())?;
        if tokens.len() != ids.len() {
            return Err(ContractError::Setup(format!(
                "argmax of {} rows returned {} tokens",
                ids.len(),
                tokens.len()
            )));
        }
        // The logits themselves must be the exact products the reference assumes.
        let (vocab, _) = self.w.rows_cols();
        let got = read(be, &self.logits, (ids.len(), vocab), "logits")?;
        let want = self.exact_logits(ids);
        if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            return Err(ContractError::Setup(format!(
                "logit {} of row {} is {} but the one-hot product is exactly {}",
                i % vocab,
                ids[i / vocab],
                got[i],
                want[i]
            )));
        }
        Ok(tokens.into_iter().map(|t| t as f32).collect())
    }

    fn reference(&self, ids: &[u32]) -> Expect {
        let (vocab, _) = self.w.rows_cols();
        let logits = self.exact_logits(ids);
        let winners = logits.chunks_exact(vocab).map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best as f64
        });
        Expect::exact(winners.collect())
    }
}

impl<B: Backend> ArgmaxCase<B> {
    /// The logits of rows `ids`, known exactly: `x[c(v)] 2^e(v)`, +0 for a +-0 product.
    fn exact_logits(&self, ids: &[u32]) -> Vec<f32> {
        let (x, w) = (self.x.mat(), Bf16Mat::of(&self.w));
        let (vocab, width) = (w.rows, w.cols);
        let hot: Vec<(usize, f64)> = (0..vocab)
            .map(|v| {
                let row = w.row(v);
                let c = row.iter().position(|&e| e != 0.0).unwrap_or(0);
                (c, row[c])
            })
            .collect();
        let mut out = Vec::with_capacity(ids.len() * vocab);
        for &id in ids {
            let xr = x.row(id as usize);
            debug_assert_eq!(xr.len(), width);
            // +0.0: a sum whose products are all zeros starts from +0 or adds a +0 somewhere.
            out.extend(hot.iter().map(|&(c, e)| (xr[c] * e) as f32 + 0.0));
        }
        out
    }
}
