//! KL(P || Q) per position, P the reference's softmax and Q the engine's, in float64.
//!
//! Two methods, chosen by what the reference holds (`tools/reference/README.md` derives them):
//! - **full**: with the reference's full rows, exactly over the whole vocabulary:
//!   `KL = sum_v p_v (log p_v - log q_v)`, `log p_v = l_v - L`, `log q_v = l'_v - L'`, each
//!   log-sum-exp computed max-shifted in f64.
//! - **top-k + rest**: with only the top-k ids S, their logits and `L`: the exact part over S,
//!   `KL_S = sum_{s in S} p_s (log p_s - log q_s)`, plus the rest of the vocabulary lumped into
//!   one outcome: `r_P log(r_P / r_Q)`, `r_P = 1 - sum_S p_s` (as `-expm1(lse_S log p)`, no
//!   cancellation), `r_Q` summed directly over the engine's logits outside S. The sum is the
//!   KL of the two distributions coarse-grained to S + {rest}, a LOWER bound of the full KL
//!   (log-sum inequality); the gap is `r_P KL(P_rest || Q_rest)`. An upper bound is also
//!   given: every `p_v` outside S is at most `p_(k)` (the k-th stored probability) and every
//!   `q_v` at least the engine's smallest probability outside S, so
//!   `KL <= KL_S + r_P ((l_(k) - L) - (min_{v not in S} l'_v - L'))`. It is loose (tens of
//!   nats times `r_P`) and reported only so the lower bound is not mistaken for the value.
//!
//! The same coarse-graining ([`Lumped`], [`kl_lumped`]) compares the float64 pass with either
//! side on one partition (the reference's top-k + rest), so "how far is the reference from
//! float64" and "how far is the engine" are figures of the same kind even without full rows.
//!
//! Invariants: inputs are finite (the judge refuses non-finite rows before calling this);
//! the engine row is a full row. Results are clamped at 0 from below (rounding of terms that
//! sum to 0 can leave -1e-17).

/// `log(sum exp(x))` in f64, max-shifted.
pub fn logsumexp(x: impl Iterator<Item = f64> + Clone) -> f64 {
    let m = x.clone().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + x.map(|v| (v - m).exp()).sum::<f64>().ln()
}

/// Exact KL(P || Q) over full rows of logits `p` and `q`.
pub fn kl_full<P: Copy + Into<f64>, Q: Copy + Into<f64>>(p: &[P], q: &[Q]) -> f64 {
    let lp = logsumexp(p.iter().map(|&v| v.into()));
    let lq = logsumexp(q.iter().map(|&v| v.into()));
    let kl: f64 = p
        .iter()
        .zip(q)
        .map(|(&a, &b)| {
            let log_p = a.into() - lp;
            log_p.exp() * (log_p - (b.into() - lq))
        })
        .sum();
    kl.max(0.0)
}

/// A distribution coarse-grained to a partition S + {rest}: log-probabilities on S (in S's
/// order) and the rest's probability mass.
#[derive(Clone, Debug, PartialEq)]
pub struct Lumped {
    pub log_s: Vec<f64>,
    pub rest: f64,
}

impl Lumped {
    /// From the reference's top-k summary: S = its ids, rest = `1 - sum_S p` as
    /// `-expm1(lse(log p_S))` (no cancellation); exactly 0 when S is the whole vocabulary.
    pub fn from_topk(r: TopkRow<'_>, vocab: usize) -> Lumped {
        let log_s: Vec<f64> = r.logits.iter().map(|l| l - r.lse).collect();
        let rest = if r.ids.len() >= vocab {
            0.0
        } else {
            (-logsumexp(log_s.iter().copied()).exp_m1()).max(0.0)
        };
        Lumped { log_s, rest }
    }

    /// From a full row, coarse-grained to `ids`; the rest is summed directly over the others.
    /// Every id must be `< row.len()` (the judge's ids come from a validated reference whose
    /// vocabulary equals the row length).
    pub fn from_full<T: Copy + Into<f64>>(row: &[T], ids: &[u32]) -> Lumped {
        let l = logsumexp(row.iter().map(|&v| v.into()));
        let mut in_s = vec![false; row.len()];
        let log_s = ids
            .iter()
            .map(|&id| {
                in_s[id as usize] = true;
                row[id as usize].into() - l
            })
            .collect();
        let rest = row
            .iter()
            .zip(&in_s)
            .filter(|(_, &s)| !s)
            .map(|(&v, _)| (v.into() - l).exp())
            .sum::<f64>();
        Lumped { log_s, rest }
    }
}

/// KL(P || Q) of two distributions coarse-grained to the same partition: a lower bound of
/// their full KL (log-sum inequality), equal to it when S is the whole vocabulary. A rest
/// mass of Q that underflowed to 0 is taken as the smallest positive f64, so the result
/// stays finite (and huge) rather than infinite.
pub fn kl_lumped(p: &Lumped, q: &Lumped) -> f64 {
    let on_s: f64 = p.log_s.iter().zip(&q.log_s).map(|(&lp, &lq)| lp.exp() * (lp - lq)).sum();
    let rest =
        if p.rest > 0.0 { p.rest * (p.rest / q.rest.max(f64::MIN_POSITIVE)).ln() } else { 0.0 };
    (on_s + rest).max(0.0)
}

/// KL from the reference's top-k: the lumped lower bound and the loose upper bound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopkKl {
    /// `KL_S + r_P log(r_P / r_Q)`: KL of the top-k + rest coarse-graining (<= full KL).
    pub lower: f64,
    /// `KL_S + r_P ((l_(k) - L) - (m'_rest - L'))` (>= full KL).
    pub upper: f64,
    /// The reference's probability mass outside its top-k.
    pub rest_mass: f64,
}

/// The reference's top-k ids and logits with its full-row log-sum-exp.
#[derive(Clone, Copy, Debug)]
pub struct TopkRow<'a> {
    pub ids: &'a [u32],
    pub logits: &'a [f64],
    pub lse: f64,
}

/// KL bounds of one position from the reference's top-k and the engine's full row `q`.
pub fn kl_topk(r: TopkRow<'_>, q: &[f32]) -> TopkKl {
    let p = Lumped::from_topk(r, q.len());
    let ql = Lumped::from_full(q, r.ids);
    let lower = kl_lumped(&p, &ql);
    let on_s: f64 = p.log_s.iter().zip(&ql.log_s).map(|(&lp, &lq)| lp.exp() * (lp - lq)).sum();
    let lq = logsumexp(q.iter().map(|&v| f64::from(v)));
    let mut in_s = vec![false; q.len()];
    r.ids.iter().for_each(|&id| in_s[id as usize] = true);
    let min_rest = q
        .iter()
        .zip(&in_s)
        .filter(|(_, &s)| !s)
        .map(|(&v, _)| f64::from(v))
        .fold(f64::INFINITY, f64::min);
    let kth = r.logits.last().copied().unwrap_or(r.lse);
    let spread = if min_rest.is_finite() { (kth - r.lse) - (min_rest - lq) } else { 0.0 };
    TopkKl { lower, upper: (on_s + p.rest * spread.max(0.0)).max(0.0), rest_mass: p.rest }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax(x: &[f64]) -> Vec<f64> {
        let l = logsumexp(x.iter().copied());
        x.iter().map(|v| (v - l).exp()).collect()
    }

    /// KL by the textbook formula on probabilities, for small rows.
    fn kl_naive(p: &[f64], q: &[f64]) -> f64 {
        softmax(p).iter().zip(softmax(q)).map(|(a, b)| a * (a / b).ln()).sum()
    }

    #[test]
    fn full_kl_matches_the_textbook_formula_and_is_zero_on_equal_rows() {
        let p = [2.0, 1.0, 0.5, -1.0, 0.25];
        let q32 = [1.75f32, 1.25, 0.5, -1.5, 0.0];
        let q: Vec<f64> = q32.iter().map(|&v| f64::from(v)).collect();
        let want = kl_naive(&p, &q);
        assert!((kl_full(&p, &q32) - want).abs() < 1e-15, "{} vs {want}", kl_full(&p, &q32));
        let same: Vec<f32> = p.iter().map(|&v| v as f32).collect();
        assert_eq!(kl_full(&p, &same), 0.0);
    }

    #[test]
    fn topk_bounds_bracket_the_full_kl_and_meet_it_with_k_equal_vocab() {
        let p = [3.0, 2.5, 1.0, 0.5, -0.5, -2.0];
        let q32 = [2.75f32, 2.75, 1.5, 0.0, -0.25, -3.0];
        let full = kl_full(&p, &q32);
        let lse = logsumexp(p.iter().copied());
        for k in 2..=p.len() {
            let ids: Vec<u32> = (0..k as u32).collect(); // p is already descending
            let b = kl_topk(TopkRow { ids: &ids, logits: &p[..k], lse }, &q32);
            assert!(b.lower <= full + 1e-15 && full <= b.upper + 1e-15, "k={k}: {b:?} {full}");
        }
        let ids: Vec<u32> = (0..p.len() as u32).collect();
        let b = kl_topk(TopkRow { ids: &ids, logits: &p, lse }, &q32);
        assert!((b.lower - full).abs() < 1e-15 && b.rest_mass < 1e-15);
    }
}
