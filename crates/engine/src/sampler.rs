//! Choosing the next token from a row of logits.
//!
//! Order of transforms (HF `generate`'s): repetition penalty (over prompt and output),
//! presence/frequency penalties (OpenAI semantics, over output tokens), then temperature,
//! top-k, top-p, min-p and one draw by `tf_backend::sample::sample_row`, the one definition
//! the GPU's `Backend::sample` also computes (integer weights, exact integer sums: the same
//! token on either side by construction). Greedy (temperature 0) takes the highest logit,
//! ties to the lowest token id. The draw's uniform is `philox::uniform(seed, position)`, so
//! the token is a pure function of (logits, params, seed, position): the `seeded == seeded`
//! invariant.
//!
//! Penalties are `tf_backend::penalty`'s definition (its f32 operations written once for the
//! host and once for the GPU, so the device's penalized row is the host's): a lane keeps its
//! ids in a [`Seen`] token by token, and every row, penalized or not, may be sampled where its
//! logits are ([`Sampler::draw`] + [`Sampler::penalties`] + `CausalLm::forward_sample`) with
//! [`Sampler::sample`]'s result.
//! Rejected: f64 probabilities summed in sorted order (the sampler before 2026-11-30): no
//! parallel reduction reproduces them, so a GPU could not give the host's token.

use tf_backend::penalty::{Penalties, Seen};
use tf_backend::sample::{sample_row, Draw};

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
    /// OpenAI's `logit_bias`: added to the logits after the penalties; ids strictly
    /// ascending, biases -100..=100. Empty means off.
    pub logit_bias: Vec<(u32, f32)>,
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
            logit_bias: Vec::new(),
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
        if let Some(&(_, b)) = self.logit_bias.iter().find(|e| !(-100.0..=100.0).contains(&e.1)) {
            return bad("logit_bias", b, "-100 to 100");
        }
        if self.logit_bias.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(EngineError::Refused("logit_bias: token ids must be distinct".into()));
        }
        Ok(())
    }

    /// Whether any of the repetition, presence and frequency penalties is on.
    fn uses_seen(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    fn uses_penalties(&self) -> bool {
        self.uses_seen() || !self.logit_bias.is_empty()
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
        if self.uses_penalties() {
            let seen = Seen::of(prompt, output);
            let mut penalized = logits.to_vec();
            self.penalties(&seen).apply(&mut penalized);
            return sample_row(&penalized, &self.draw(position));
        }
        sample_row(logits, &self.draw(position))
    }

    /// This sampler's penalties over the ids `seen` so far (the prompt's and the output's),
    /// and its logit bias.
    pub fn penalties<'a>(&'a self, seen: &'a Seen) -> Penalties<'a> {
        let p = &self.params;
        Penalties {
            repetition: p.repetition_penalty,
            presence: p.presence_penalty,
            frequency: p.frequency_penalty,
            seen: if p.uses_seen() { seen.as_slice() } else { &[] },
            bias: &p.logit_bias,
        }
    }

    /// The draw of the token at `position` (temperature, cuts and the Philox uniform), for
    /// `Backend::sample`; without penalties `sample` is `sample_row(logits, &draw(position))`.
    pub fn draw(&self, position: u64) -> Draw {
        let p = &self.params;
        Draw {
            temperature: p.temperature,
            top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
            top_p: p.top_p,
            min_p: p.min_p,
            uniform: if p.temperature > 0.0 { philox::uniform(p.seed, position, 0) } else { 0.0 },
        }
    }

    /// Whether this sampler changes the logits before drawing.
    pub fn uses_penalties(&self) -> bool {
        self.params.uses_penalties()
    }
}

/// Highest logit, ties to the lowest id. NaN never wins. The one rule, shared with the
/// backends' device argmax (`tf_backend::argmax_row`).
pub fn argmax(logits: &[f32]) -> u32 {
    tf_backend::argmax_row(logits)
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
    fn penalties_are_off_without_parameters_and_borrow_the_lane_ids() {
        let seen = Seen::of(&[4, 2], &[2]);
        let plain = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(plain.penalties(&seen), Penalties::NONE);
        let p = SamplingParams { repetition_penalty: 1.2, frequency_penalty: 0.5, ..sampled(3) };
        let sampler = Sampler::new(p).unwrap();
        let pen = sampler.penalties(&seen);
        assert_eq!(pen.seen, &[(2, 1), (4, 0)]);
        assert_eq!((pen.repetition, pen.presence, pen.frequency), (1.2, 0.0, 0.5));
        let b = SamplingParams { logit_bias: vec![(1, -100.0)], ..sampled(3) };
        let s = Sampler::new(b).unwrap();
        assert!(s.uses_penalties());
        assert_eq!(
            (s.penalties(&seen).seen, s.penalties(&seen).bias),
            (&[][..], &[(1, -100.0)][..])
        );
    }

    #[test]
    fn logit_bias_bans_and_forces_tokens() {
        let logits = [2.0, 1.9, -1.0];
        let ban = SamplingParams { logit_bias: vec![(0, -100.0)], ..Default::default() };
        assert_eq!(Sampler::new(ban).unwrap().sample(&logits, &[], &[], 0), 1);
        let force = SamplingParams { logit_bias: vec![(2, 100.0)], ..sampled(4) };
        let s = Sampler::new(force).unwrap();
        assert!((0..50).all(|pos| s.sample(&logits, &[], &[], pos) == 2));
        let bad = SamplingParams { logit_bias: vec![(0, 101.0)], ..Default::default() };
        assert!(Sampler::new(bad).unwrap_err().to_string().contains("logit_bias"));
        let dup = SamplingParams { logit_bias: vec![(3, 1.0), (3, 2.0)], ..Default::default() };
        assert!(Sampler::new(dup).is_err());
    }

    #[test]
    fn sample_is_sample_row_of_the_draw_without_penalties() {
        let logits: Vec<f32> = (0..500).map(|i| ((i * 7919) % 97) as f32 * 0.125 - 3.0).collect();
        let s = Sampler::new(SamplingParams {
            temperature: 0.9,
            top_k: 50,
            top_p: 0.9,
            min_p: 0.02,
            seed: 5,
            ..Default::default()
        })
        .unwrap();
        for pos in [0u64, 3, 99, 1 << 33] {
            let d = s.draw(pos);
            assert_eq!(d.uniform, philox::uniform(5, pos, 0));
            assert_eq!(s.sample(&logits, &[], &[], pos), sample_row(&logits, &d));
        }
        assert!(!s.uses_penalties());
    }

    #[test]
    fn draws_follow_the_softmax() {
        // Weights 1 : 1/2 : 1/4 (logits 0, -ln2, -2 ln2 at t = 1): frequencies 4/7, 2/7, 1/7.
        let l2 = std::f32::consts::LN_2;
        let logits = [0.0, -l2, -2.0 * l2];
        let s = Sampler::new(sampled(9)).unwrap();
        let mut n = [0usize; 3];
        let draws = 70_000;
        for pos in 0..draws {
            n[s.sample(&logits, &[], &[], pos) as usize] += 1;
        }
        for (i, want) in [4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0].iter().enumerate() {
            let got = n[i] as f64 / draws as f64;
            assert!((got - want).abs() < 0.006, "token {i}: {got} vs {want}");
        }
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
