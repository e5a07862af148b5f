//! The `sample` unit: [`Backend::argmax`] (greedy sampling on the device) and
//! [`Backend::sample`] (temperature / top-k / top-p / min-p under a per-row draw) as one
//! row-wise case.
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
//! Output: the greedy token of each row, then its tokens under `DRAWS` draws made from the
//! row's id alone (so gate 3 sees the same draws in any batch), then one token under a draw
//! with penalties (`crate::penalty`; greedy or sampled, repetition / presence / frequency, a
//! token history and a logit bias made from the row's id and its exact logits, so its winners
//! are penalized, banned or outbid), as f32 (ids below 2^24 are exact); reference = the
//! lowest id of the maximum, then `sample::sample_row_sorted` (the definition as written: sort
//! and walk) on the exact logits, for the penalized draw after the penalties and biases as
//! written (from the history itself: HF's repetition over every id of it, OpenAI's counts
//! over its output). Gate 2's bound is 0; the 1%-off control scales the ids (red whenever a
//! sampled row's answer is not id 0); gate 3 and the row control are the generic ones.
//! Rejected: reading the device's own logits back as the reference input (the check would
//! then share the device's values instead of knowing them).

use super::data::{read, row_batch, Bf16Mat, Rng, Scratch, Table};
use super::reference::Expect;
use super::rows::{RowCase, UNIVERSE};
use super::ContractError;
use crate::penalty::{Penalties, Seen};
use crate::sample::{sample_row_sorted, Draw};
use crate::{ActDType, Backend};

/// Sampled tokens per row after the greedy one.
const DRAWS: usize = 3;

/// The `j`-th draw of universe row `id`: mixed parameters, the uniform hashed from both.
fn draw_of(id: u32, j: usize) -> Draw {
    let h = (u64::from(id) << 8 | j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let pick = |n: u64, k: u32| ((h >> (8 * k)) % n) as usize;
    Draw {
        temperature: [0.5, 1.0, 2.0, 7.0][pick(4, 1)],
        top_k: [0, 0, 3, 40][pick(4, 2)],
        top_p: [1.0, 0.9, 0.5][pick(3, 3)],
        min_p: [0.0, 0.0, 0.1][pick(3, 4)],
        uniform: (h >> 11) as f64 / (1u64 << 53) as f64,
    }
}

/// What a penalized draw needs: the draw, the penalties (without ids), the history (prompt,
/// output) and the logit bias.
type Penalized = (Draw, Penalties<'static>, Vec<u32>, Vec<u32>, Vec<(u32, f32)>);

/// The penalized draw of universe row `id` whose exact logits are `row`. The output repeats
/// the row's first maximum and a few other ids, and the bias may ban or demote that maximum or
/// raise another id, so the penalties move the winners.
fn penalized_of(id: u32, row: &[f32]) -> Penalized {
    let h = (u64::from(id) << 8 | 0xff).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let pick = |n: u64, k: u32| ((h >> (8 * k)) % n) as usize;
    let mut d = draw_of(id, 7);
    d.temperature = [0.0, 0.0, 0.7, 1.5][pick(4, 1)];
    let p = Penalties {
        repetition: [1.0, 1.3, 0.8, 1.05][pick(4, 2)],
        presence: [0.0, 0.5, -0.5][pick(3, 3)],
        frequency: [0.0, 0.25, 1.0, 0.1][pick(4, 4)],
        ..Penalties::NONE
    };
    let vocab = row.len().max(1) as u64;
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    let id_at =
        |k: u64| ((h.rotate_left(k as u32 % 64) ^ k.wrapping_mul(0x2545_f491)) % vocab) as u32;
    let prompt: Vec<u32> = (0..24).map(id_at).chain([best as u32]).collect();
    let mut output: Vec<u32> = (0..12).map(|k| id_at(100 + k % 5)).collect();
    output.extend(std::iter::repeat_n(best as u32, 1 + pick(3, 5)));
    let best = best as u32;
    let mut bias = match pick(4, 6) {
        0 => vec![],
        1 => vec![(best, -100.0)],
        2 => vec![(id_at(7), 3.0), (best, -0.75)],
        _ => vec![(id_at(9), 0.3)],
    };
    bias.sort_by_key(|e| e.0);
    bias.dedup_by_key(|e| e.0);
    (d, p, prompt, output, bias)
}

/// The penalties as written, from a history: every id of prompt and output divided /
/// multiplied by the repetition penalty once, then each output id's count subtracted with
/// presence and frequency, then each bias added (f32, each operation rounded once).
fn penalize_as_written(row: &mut [f32], h: &Penalized) {
    let (_, p, prompt, output, bias) = h;
    let mut ids: Vec<u32> = prompt.iter().chain(output).copied().collect();
    ids.sort_unstable();
    ids.dedup();
    for t in ids {
        let n = output.iter().filter(|&&o| o == t).count() as u32;
        let Some(v) = row.get_mut(t as usize) else { continue };
        if p.repetition != 1.0 {
            *v = if *v > 0.0 { *v / p.repetition } else { *v * p.repetition };
        }
        if n > 0 && (p.presence != 0.0 || p.frequency != 0.0) {
            *v -= p.presence + p.frequency * n as f32;
        }
    }
    for &(t, b) in bias {
        if let Some(v) = row.get_mut(t as usize) {
            *v += b;
        }
    }
}

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
        2 + DRAWS
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
        let draws: Vec<Draw> =
            ids.iter().flat_map(|&id| (0..DRAWS).map(move |j| draw_of(id, j))).collect();
        // Each draw of a row reads the same logits row: sample DRAWS rounds over the rows.
        let mut sampled = vec![0u32; ids.len() * DRAWS];
        for j in 0..DRAWS {
            let round: Vec<Draw> = draws.iter().skip(j).step_by(DRAWS).copied().collect();
            let toks = be.sample(&self.logits, ids.len(), &round, &[])?;
            if toks.len() != ids.len() {
                return Err(ContractError::Setup(format!("sample returned {} tokens", toks.len())));
            }
            for (r, t) in toks.into_iter().enumerate() {
                sampled[r * DRAWS + j] = t;
            }
        }
        // One more round under each row's penalties (ids from its history, as the engine keeps
        // them: `Seen`).
        let hist: Vec<_> =
            want.chunks_exact(vocab).zip(ids).map(|(r, &id)| penalized_of(id, r)).collect();
        let seen: Vec<Seen> = hist.iter().map(|(_, _, p, o, _)| Seen::of(p, o)).collect();
        let pens: Vec<Penalties<'_>> = hist
            .iter()
            .zip(&seen)
            .map(|(h, s)| Penalties { seen: s.as_slice(), bias: &h.4, ..h.1 })
            .collect();
        let pdraws: Vec<Draw> = hist.iter().map(|h| h.0).collect();
        let penalized = be.sample(&self.logits, ids.len(), &pdraws, &pens)?;
        if penalized.len() != ids.len() {
            return Err(ContractError::Setup(format!(
                "sample returned {} tokens",
                penalized.len()
            )));
        }
        let mut out = Vec::with_capacity(ids.len() * (2 + DRAWS));
        for (r, &t) in tokens.iter().enumerate() {
            out.push(t as f32);
            out.extend(sampled[r * DRAWS..(r + 1) * DRAWS].iter().map(|&s| s as f32));
            out.push(penalized[r] as f32);
        }
        Ok(out)
    }

    fn reference(&self, ids: &[u32]) -> Expect {
        let (vocab, _) = self.w.rows_cols();
        let logits = self.exact_logits(ids);
        let mut want = Vec::with_capacity(ids.len() * (2 + DRAWS));
        for (row, &id) in logits.chunks_exact(vocab).zip(ids) {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            want.push(best as f64);
            want.extend((0..DRAWS).map(|j| f64::from(sample_row_sorted(row, &draw_of(id, j)))));
            let h = penalized_of(id, row);
            let mut own = row.to_vec();
            penalize_as_written(&mut own, &h);
            want.push(f64::from(sample_row_sorted(&own, &h.0)));
        }
        Expect::exact(want)
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
