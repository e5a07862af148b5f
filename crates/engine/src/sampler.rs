//! Choosing the next token from a row of logits.
//!
//! Order of transforms (HF `generate`'s): repetition penalty (over prompt and output),
//! presence/frequency penalties (OpenAI semantics, over output tokens), temperature, top-k,
//! top-p, min-p, then one draw. Greedy (temperature 0) takes the highest logit, ties to the
//! lowest token id. A sampled draw is `philox::uniform(seed, position)` walked over the
//! survivors in (probability desc, id asc) order with f64 sums, so the token is a pure function
//! of (logits, params, seed, position): the `seeded == seeded` invariant.

use std::collections::HashMap;

use crate::error::{EngineError, Result};
use crate::philox;

/// Sampling parameters of one request. `Default` is greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means off.
    pub top_k: usize,
    /// 1 means off.
    pub top_p: f32,
    /// 0 means off.
    pub min_p: f32,
    /// 1 means off (HF semantics: positive logits divided, negative multiplied).
    pub repetition_penalty: f32,
    /// OpenAI semantics, -2..2.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Refuses values no sampler can honour, naming the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |f: &str, v: f32, want: &str| {
            Err(EngineError::Refused(format!("{f} = {v} is out of range ({want})")))
        };
        if !(0.0..=100.0).contains(&self.temperature) || self.temperature.is_nan() {
            return bad("temperature", self.temperature, "0 to 100");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "greater than 0, at most 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "0 to 1");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 10.0) {
            return bad(
                "repetition_penalty",
                self.repetition_penalty,
                "greater than 0, at most 10",
            );
        }
        for (f, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(f, v, "-2 to 2");
            }
        }
        Ok(())
    }

    fn uses_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// Per-request sampler.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub params: SamplingParams,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Sampler { params })
    }

    /// The token at absolute `position` of the sequence, from `logits` (one row, vocab wide),
    /// given the prompt and the tokens generated so far.
    pub fn sample(&self, logits: &[f32], prompt: &[u32], output: &[u32], position: u64) -> u32 {
        let p = &self.params;
        let penalized;
        let logits = if p.uses_penalties() {
            penalized = apply_penalties(logits, p, prompt, output);
            &penalized[..]
        } else {
            logits
        };
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        let survivors = filter(logits, p);
        let u = philox::uniform(p.seed, position, 0);
        let total: f64 = survivors.iter().map(|c| c.1).sum();
        let target = u * total;
        let mut cum = 0.0;
        for &(id, w) in &survivors {
            cum += w;
            if cum > target {
                return id;
            }
        }
        // u < 1 so the walk ends inside; the last survivor covers rounding at the top.
        survivors.last().map_or_else(|| argmax(logits), |c| c.0)
    }
}

/// Highest logit, ties to the lowest id. NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

fn apply_penalties(logits: &[f32], p: &SamplingParams, prompt: &[u32], output: &[u32]) -> Vec<f32> {
    let mut l = logits.to_vec();
    if p.repetition_penalty != 1.0 {
        let mut seen: Vec<u32> = prompt.iter().chain(output).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for &t in &seen {
            if let Some(v) = l.get_mut(t as usize) {
                *v = if *v > 0.0 { *v / p.repetition_penalty } else { *v * p.repetition_penalty };
            }
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, n) in counts {
            if let Some(v) = l.get_mut(t as usize) {
                *v -= p.presence_penalty + p.frequency_penalty * n as f32;
            }
        }
    }
    l
}

/// Survivors of temperature, top-k, top-p and min-p as (id, unnormalized weight), in
/// (weight desc, id asc) order.
fn filter(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let max = logits.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    let t = f64::from(p.temperature);
    let mut c: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as u32, ((f64::from(v) - f64::from(max)) / t).exp()))
        .filter(|c| c.1 > 0.0)
        .collect();
    let order = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if p.top_k > 0 && p.top_k < c.len() {
        c.select_nth_unstable_by(p.top_k - 1, order);
        c.truncate(p.top_k);
    }
    c.sort_unstable_by(order);
    if p.top_p < 1.0 {
        let total: f64 = c.iter().map(|x| x.1).sum();
        let mut cum = 0.0;
        let mut keep = c.len();
        for (i, x) in c.iter().enumerate() {
            cum += x.1;
            if cum >= f64::from(p.top_p) * total {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep);
    }
    if p.min_p > 0.0 {
        if let Some(&(_, top)) = c.first() {
            let floor = top * f64::from(p.min_p);
            c.retain(|x| x.1 >= floor);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(seed: u64) -> SamplingParams {
        SamplingParams { temperature: 1.0, seed, ..Default::default() }
    }

    #[test]
    fn greedy_ties_go_to_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), 1);
        let s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[0.0, 2.0, 2.0], &[], &[], 0), 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |seed| {
            let s = Sampler::new(sampled(seed)).unwrap();
            (0..200).map(|pos| s.sample(&logits, &[], &[], pos)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn top_k_top_p_min_p_restrict_support() {
        let logits = [5.0, 4.0, 3.0, 0.0, -1.0];
        let draws = |p: SamplingParams| {
            let s = Sampler::new(p).unwrap();
            (0..500)
                .map(|pos| s.sample(&logits, &[], &[], pos))
                .collect::<std::collections::BTreeSet<_>>()
        };
        assert_eq!(draws(SamplingParams { top_k: 2, ..sampled(1) }), [0, 1].into());
        assert_eq!(draws(SamplingParams { top_k: 1, ..sampled(1) }), [0].into());
        // p(0) = 0.66, p(0)+p(1) = 0.91: top_p 0.8 keeps two.
        assert_eq!(draws(SamplingParams { top_p: 0.8, ..sampled(1) }), [0, 1].into());
        // min_p 0.2: e^-1 = 0.37 and e^-2 = 0.135 relative to the top.
        assert_eq!(draws(SamplingParams { min_p: 0.2, ..sampled(1) }), [0, 1].into());
        assert_eq!(draws(sampled(1)).len(), 5);
    }

    #[test]
    fn penalties_change_the_choice() {
        let logits = [2.0, 1.9, -1.0];
        let rep =
            Sampler::new(SamplingParams { repetition_penalty: 1.5, ..Default::default() }).unwrap();
        assert_eq!(rep.sample(&logits, &[0], &[], 0), 1);
        let pres =
            Sampler::new(SamplingParams { presence_penalty: 0.2, ..Default::default() }).unwrap();
        assert_eq!(pres.sample(&logits, &[], &[0], 0), 1);
        assert_eq!(pres.sample(&logits, &[0], &[], 0), 0, "presence counts output tokens only");
        let freq =
            Sampler::new(SamplingParams { frequency_penalty: 0.06, ..Default::default() }).unwrap();
        assert_eq!(freq.sample(&logits, &[], &[0], 0), 0);
        assert_eq!(freq.sample(&logits, &[], &[0, 0], 0), 1);
    }

    #[test]
    fn validate_names_the_field() {
        let e = Sampler::new(SamplingParams { top_p: 0.0, ..Default::default() }).unwrap_err();
        assert!(e.to_string().contains("top_p"), "{e}");
        assert!(Sampler::new(SamplingParams { temperature: -1.0, ..Default::default() }).is_err());
        assert!(
            Sampler::new(SamplingParams { presence_penalty: 3.0, ..Default::default() }).is_err()
        );
    }
}
