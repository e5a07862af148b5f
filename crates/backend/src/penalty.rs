//! Logit penalties, applied to a row of f32 logits before [`crate::sample::sample_row`]:
//! HF `generate`'s repetition penalty over every id of the prompt and the output (a positive
//! logit divided by it, any other multiplied), then OpenAI's presence and frequency penalties
//! over the output's ids (`v - (presence + frequency n)`, `n` the id's count in the output),
//! then OpenAI's `logit_bias` (`v + b` for each biased id).
//! Written once here and once in CUDA (`kernels/sample.cu`, `penalize_rows`) with the same f32
//! operations, each rounded once (the kernel spells them `__fdiv_rn`, `__fmul_rn`,
//! `__fadd_rn`, `__fsub_rn`, so nothing is contracted into an fma), so the device's penalized
//! row is the host's bit for bit and its token the host sampler's.
//!
//! A row's ids come as one ascending list of `(id, output count)` ([`Seen`]), each id once,
//! and its biases as one ascending list of `(id, bias)`, each id once: each logit is touched
//! at most once a pass, so the order of ids cannot matter; ids past the row are ignored.

use crate::error::{BackendError, Result};

/// One row's penalties and the ids they touch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties<'a> {
    /// 1: off.
    pub repetition: f32,
    /// 0: off (with `frequency`).
    pub presence: f32,
    /// 0: off (with `presence`).
    pub frequency: f32,
    /// Every id of the prompt and the output once, ascending, with its count in the output.
    pub seen: &'a [(u32, u32)],
    /// Added after the penalties: ids ascending, each once.
    pub bias: &'a [(u32, f32)],
}

impl Penalties<'static> {
    /// No penalty.
    pub const NONE: Penalties<'static> =
        Penalties { repetition: 1.0, presence: 0.0, frequency: 0.0, seen: &[], bias: &[] };
}

impl Penalties<'_> {
    /// Whether applying these changes no logit.
    pub fn is_off(&self) -> bool {
        self.bias.is_empty()
            && (self.seen.is_empty() || !(self.repetition != 1.0 || self.additive()))
    }

    fn additive(&self) -> bool {
        self.presence != 0.0 || self.frequency != 0.0
    }

    /// The penalized logit of an id whose output count is `n` (`penalize_value` in sample.cu).
    pub fn value(&self, v: f32, n: u32) -> f32 {
        let mut v = v;
        if self.repetition != 1.0 {
            v = if v > 0.0 { v / self.repetition } else { v * self.repetition };
        }
        if n > 0 && self.additive() {
            v -= self.presence + self.frequency * n as f32;
        }
        v
    }

    /// Penalizes `row` in place.
    pub fn apply(&self, row: &mut [f32]) {
        if self.is_off() {
            return;
        }
        for &(id, n) in self.seen {
            if let Some(v) = row.get_mut(id as usize) {
                *v = self.value(*v, n);
            }
        }
        for &(id, b) in self.bias {
            if let Some(v) = row.get_mut(id as usize) {
                *v += b;
            }
        }
    }
}

/// Checks a call's penalties: none (empty) or one a row, each row's ids strictly ascending.
pub(crate) fn check(rows: usize, penalties: &[Penalties<'_>]) -> Result<()> {
    if !penalties.is_empty() && penalties.len() != rows {
        return Err(BackendError::shape(
            "sample",
            format!("{} penalty rows for {rows} rows", penalties.len()),
        ));
    }
    for (r, p) in penalties.iter().enumerate() {
        if p.seen.windows(2).any(|w| w[0].0 >= w[1].0)
            || p.bias.windows(2).any(|w| w[0].0 >= w[1].0)
        {
            return Err(BackendError::shape(
                "sample",
                format!("row {r}'s penalized or biased ids are not strictly ascending"),
            ));
        }
    }
    Ok(())
}

/// The ids of one sequence so far, each once and ascending, with its count in the output:
/// what [`Penalties::seen`] borrows. Kept up to date token by token (a binary search and at
/// most one insertion a token) rather than rebuilt from the history every step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    ids: Vec<(u32, u32)>,
}

impl Seen {
    /// The prompt's ids, each with count 0.
    pub fn new(prompt: &[u32]) -> Seen {
        let mut ids: Vec<(u32, u32)> = prompt.iter().map(|&t| (t, 0)).collect();
        ids.sort_unstable();
        ids.dedup();
        Seen { ids }
    }

    /// Counts one generated token.
    pub fn push_output(&mut self, tok: u32) {
        match self.ids.binary_search_by_key(&tok, |e| e.0) {
            Ok(i) => self.ids[i].1 = self.ids[i].1.saturating_add(1),
            Err(i) => self.ids.insert(i, (tok, 1)),
        }
    }

    /// The prompt's and the output's ids so far.
    pub fn of(prompt: &[u32], output: &[u32]) -> Seen {
        let mut s = Seen::new(prompt);
        for &t in output {
            s.push_output(t);
        }
        s
    }

    pub fn as_slice(&self) -> &[(u32, u32)] {
        &self.ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_counts_output_only() {
        let s = Seen::of(&[5, 3, 5, 9], &[3, 7, 3]);
        assert_eq!(s.as_slice(), &[(3, 2), (5, 0), (7, 1), (9, 0)]);
    }

    #[test]
    fn value_follows_hf_then_openai() {
        let p = Penalties { repetition: 2.0, presence: 0.5, frequency: 0.25, ..Penalties::NONE };
        assert_eq!(p.value(3.0, 0), 1.5);
        assert_eq!(p.value(-3.0, 0), -6.0);
        assert_eq!(p.value(3.0, 2), 1.5 - (0.5 + 0.5));
        assert_eq!(p.value(-0.0, 0).to_bits(), (-0.0f32).to_bits());
        assert!(p.value(f32::NAN, 1).is_nan());
    }

    #[test]
    fn apply_touches_seen_ids_only_and_ignores_ids_past_the_row() {
        let seen = [(0, 1), (2, 0), (9, 4)];
        let p = Penalties { presence: 1.0, seen: &seen, ..Penalties::NONE };
        let mut row = [1.0, 1.0, 1.0];
        p.apply(&mut row);
        assert_eq!(row, [0.0, 1.0, 1.0]);
        assert!(Penalties { seen: &seen, ..Penalties::NONE }.is_off());
        assert!(!p.is_off());
        // The bias comes after the penalty, on the penalized value.
        let bias = [(0, 0.5), (1, -100.0), (50, 3.0)];
        let pb = Penalties { bias: &bias, ..p };
        let mut row = [1.0, 1.0, 1.0];
        pb.apply(&mut row);
        assert_eq!(row, [0.5, -99.0, 1.0]);
        assert!(!Penalties { bias: &bias, ..Penalties::NONE }.is_off());
    }

    #[test]
    fn check_refuses_unsorted_ids_and_wrong_row_counts() {
        let bad = [(3, 0), (3, 1)];
        let p = Penalties { seen: &bad, ..Penalties::NONE };
        assert!(check(1, &[p]).is_err());
        let p = Penalties { bias: &[(4, 1.0), (2, 1.0)], ..Penalties::NONE };
        assert!(check(1, &[p]).is_err());
        assert!(check(2, &[Penalties::NONE]).is_err());
        assert!(check(2, &[]).is_ok());
        assert!(check(1, &[Penalties::NONE]).is_ok());
    }
}
