//! The sampling definition: which token a row of logits gives for one [`Draw`] (temperature,
//! top-k, top-p, min-p and a uniform number). Written once here in Rust and once in CUDA
//! (`kernels/sample.cu`, `sample_rows`); the two agree bit for bit *by construction*:
//!
//! - **weights are integers.** A finite logit `v` (with -0.0 read as +0.0) has
//!   `x = (v - max) / t` in f64 (IEEE subtract and divide), `w = exp_portable(x)` — a
//!   range-reduced Taylor polynomial using only IEEE add, multiply and exact scaling (no fma:
//!   Rust never contracts, the kernel uses `__dadd_rn`/`__dmul_rn`), exactly 1.0 at 0 — and
//!   the integer weight `W = min(floor(w 2^S), 2^S)` with `S = weight_bits(vocab)` (40 below
//!   2^23 tokens), so a whole row sums below 2^63. `x < -64` gives `W = 0`. Candidates are the
//!   finite logits with `W > 0`; the row's maximum has `W = 2^S`.
//! - **order**: logit descending, then id ascending ([`order_key`]).
//! - **top-k** keeps the first k candidates; **top-p** keeps the shortest prefix whose weight
//!   sum reaches `ceil(P total / 2^24)` (at least 1), `P = round(top_p 2^24)`, total over the
//!   top-k survivors; **min-p** keeps `W >= M 2^(S-24)`, `M = round(min_p 2^24)` (the top
//!   weight is `2^S`); the **draw** takes `target = floor(b total / 2^53)` for the uniform
//!   `u = b / 2^53`, and the token is the first survivor in order whose running sum exceeds
//!   `target`.
//! - temperature `<= 0` (or NaN) is greedy: [`crate::argmax_row`]. A row holding +inf, or no
//!   finite value, also answers `argmax_row` (the lowest id of its +inf).
//!
//! Every sum is an exact integer, so any order or reduction tree gives the same total: the
//! GPU and this host code both find each cut by radix selection over the order key (histograms
//! of counts and weight sums per 11-bit digit, then the id inside the chosen logit), never
//! a sort. [`sample_row_sorted`] is the slow definition-as-written (sort, walk) the tests and
//! the property test compare against.
//!
//! Rejected: f64 probability sums in sorted order (the previous host sampler): a parallel
//! reduction cannot reproduce them; libm `exp` (differs from CUDA's `exp` in the last bit).

use crate::argmax_row;
use crate::error::{BackendError, Result};

/// Fraction bits of the top-p and min-p parameters.
const PARAM_BITS: u32 = 24;
/// Below this `x = (v - max) / t` a weight is 0 (e^-64 is far below 2^-40).
const X_MIN: f64 = -64.0;

/// One row's sampling parameters and its uniform number.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    /// `<= 0` (or NaN): greedy, [`crate::argmax_row`].
    pub temperature: f32,
    /// 0: off.
    pub top_k: u32,
    /// `>= 1`: off.
    pub top_p: f32,
    /// `<= 0`: off.
    pub min_p: f32,
    /// The uniform number in [0, 1) (the engine's Philox draw for (seed, position)); only
    /// `floor(uniform 2^53)` is used.
    pub uniform: f64,
}

impl Draw {
    /// Greedy: the row's argmax.
    pub fn greedy() -> Draw {
        Draw { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, uniform: 0.0 }
    }

    /// The integers the definition uses (computed on the host for both implementations).
    pub fn quantize(&self) -> Quantized {
        let q24 = |v: f32| -> u32 {
            // NaN or <= 0 -> 0; >= 1 -> 2^24. In between, v 2^24 is exact in f32.
            let s = (v.clamp(0.0, 1.0) * (1u32 << PARAM_BITS) as f32).round();
            if s.is_nan() {
                0
            } else {
                s as u32
            }
        };
        let top_p = if self.top_p.is_nan() { 1 << PARAM_BITS } else { q24(self.top_p).max(1) };
        Quantized {
            greedy: self.temperature.is_nan() || self.temperature <= 0.0,
            temperature: f64::from(self.temperature),
            top_k: self.top_k,
            top_p,
            min_p: q24(self.min_p),
            bits: (self.uniform.clamp(0.0, 1.0) * (1u64 << 53) as f64) as u64 & ((1 << 53) - 1),
        }
    }
}

/// A [`Draw`] as integers (the kernel's per-row parameters).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantized {
    pub greedy: bool,
    pub temperature: f64,
    pub top_k: u32,
    /// `P` in `1..=2^24`; `2^24` is off.
    pub top_p: u32,
    /// `M` in `0..=2^24`; 0 is off.
    pub min_p: u32,
    /// `b = floor(uniform 2^53)`.
    pub bits: u64,
}

/// `S`: weight fraction bits for a row of `vocab` tokens, so that `vocab 2^S < 2^63`.
pub fn weight_bits(vocab: usize) -> u32 {
    let len = usize::BITS - vocab.leading_zeros();
    40u32.min(63u32.saturating_sub(len)).max(PARAM_BITS)
}

/// `e^x` for `x <= 0` with IEEE add/multiply only (no fma), exactly 1.0 at 0: `x = k ln2 + r`
/// (Cody-Waite, fdlibm's split of ln2), a degree-12 Taylor polynomial of `e^r` (|r| <= 0.35,
/// truncation error 2e-16 relative), times `2^k`. The CUDA twin is `exp_portable` in
/// sample.cu, operation for operation.
pub fn exp_portable(x: f64) -> f64 {
    if x.is_nan() || x < X_MIN {
        return 0.0;
    }
    let k = (x * INV_LN2 + 0.5).floor();
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let mut p = f64::from_bits(TAYLOR[12]);
    for c in TAYLOR[..12].iter().rev() {
        p = p * r + f64::from_bits(*c);
    }
    // k in -93..=0: 2^k is a normal f64.
    p * f64::from_bits(((1023 + k as i64) as u64) << 52)
}

const INV_LN2: f64 = f64::from_bits(0x3ff7_1547_652b_82fe);
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// `1/n!` for n = 0..=12, correctly rounded.
const TAYLOR: [u64; 13] = [
    0x3ff0000000000000,
    0x3ff0000000000000,
    0x3fe0000000000000,
    0x3fc5555555555555,
    0x3fa5555555555555,
    0x3f81111111111111,
    0x3f56c16c16c16c17,
    0x3f2a01a01a01a01a,
    0x3efa01a01a01a01a,
    0x3ec71de3a556c734,
    0x3e927e4fb7789f5c,
    0x3e5ae64567f544e4,
    0x3e21eed8eff8d898,
];

/// The integer weight of finite `v` under row maximum `max` and temperature `t > 0`.
#[inline]
pub fn weight(v: f32, max: f32, t: f64, s: u32) -> u64 {
    let x = (f64::from(v + 0.0) - f64::from(max + 0.0)) / t;
    let w = (exp_portable(x) * (1u64 << s) as f64) as u64;
    w.min(1 << s)
}

/// A u32 whose ascending order is the descending order of finite `v`, -0.0 read as +0.0.
#[inline]
pub fn order_key(v: f32) -> u32 {
    let b = (v + 0.0).to_bits();
    let ascending = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    !ascending
}

/// The row's finite maximum (as +0.0 for a zero), or `None` when the row samples its argmax
/// instead: it holds +inf, or nothing finite.
fn finite_max(row: &[f32]) -> Option<f32> {
    let mut max = f32::NEG_INFINITY;
    for &v in row {
        if v == f32::INFINITY {
            return None;
        }
        if v > max {
            max = v;
        }
    }
    (max > f32::NEG_INFINITY).then_some(max + 0.0)
}

/// One candidate: its order key, id and integer weight.
#[derive(Clone, Copy, Debug)]
struct Cand {
    key: u32,
    id: u32,
    w: u64,
}

/// Refuses a `Backend::sample` call whose draws do not match its rows, one draw a row.
pub(crate) fn check_draws(rows: usize, draws: &[Draw]) -> Result<()> {
    if draws.len() != rows {
        return Err(BackendError::shape(
            "sample",
            format!("{} draws for {rows} rows", draws.len()),
        ));
    }
    Ok(())
}

/// The token of one row under `d`: the definition above, by radix selection (no sort).
pub fn sample_row(row: &[f32], d: &Draw) -> u32 {
    let q = d.quantize();
    let max = match finite_max(row) {
        Some(m) if !q.greedy => m,
        _ => return argmax_row(row),
    };
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let Scratch { cands, memo } = &mut *scratch;
        if cands.len() < row.len() {
            cands.resize(row.len(), Cand { key: 0, id: 0, w: 0 });
        }
        let s = weight_bits(row.len());
        let mut n = candidates(row, max, q.temperature, s, cands, memo);
        let c = &mut cands[..];
        if q.top_k > 0 && (q.top_k as usize) < n {
            let cut = select(&c[..n], u64::from(q.top_k) - 1, false);
            n = compact(&mut c[..n], |x| (x.key, x.id) <= cut);
        }
        if q.top_p < 1 << PARAM_BITS {
            let need = top_p_need(q.top_p, c[..n].iter().map(|x| x.w).sum());
            let cut = select(&c[..n], need - 1, true);
            n = compact(&mut c[..n], |x| (x.key, x.id) <= cut);
        }
        if q.min_p > 0 {
            let floor = u64::from(q.min_p) << (s - PARAM_BITS);
            n = compact(&mut c[..n], |x| x.w >= floor);
        }
        let total: u64 = c[..n].iter().map(|x| x.w).sum();
        select(&c[..n], draw_target(q.bits, total), true).1
    })
}

/// Per-thread buffers of [`sample_row`], kept between rows (no allocation per row).
struct Scratch {
    cands: Vec<Cand>,
    memo: Vec<(u32, u64)>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> =
        const { std::cell::RefCell::new(Scratch { cands: Vec::new(), memo: Vec::new() }) };
}

/// Moves the candidates `keep` accepts to the front (order kept); returns their count.
/// Branch-free: every candidate is written, the index advances only for kept ones.
fn compact(c: &mut [Cand], keep: impl Fn(&Cand) -> bool) -> usize {
    let mut n = 0;
    for i in 0..c.len() {
        let x = c[i];
        c[n] = x;
        n += usize::from(keep(&x));
    }
    n
}

/// Writes every candidate (finite, weight > 0) in id order to the front of `out` (at least
/// `row.len()` long); returns their count. Real logits are bf16 values, so a row holds few
/// distinct ones: a direct-mapped memo of (logit bits, weight) computes each weight once per
/// distinct value (a miss costs only the `weight` it would have cost anyway).
fn candidates(
    row: &[f32],
    max: f32,
    t: f64,
    s: u32,
    out: &mut [Cand],
    memo: &mut Vec<(u32, u64)>,
) -> usize {
    const SLOTS: usize = 4096;
    memo.clear();
    memo.resize(SLOTS, (u32::MAX, 0)); // f32 bits u32::MAX are a NaN: never a finite key
    let Some(out) = out.get_mut(..row.len()) else { return 0 };
    let mut n = 0; // n <= i < out.len()
    for (i, &v) in row.iter().enumerate() {
        let bits = (v + 0.0).to_bits();
        let slot = &mut memo[(bits.wrapping_mul(0x9e37_79b1) >> 20) as usize]; // 12 bits
        let w = if slot.0 == bits {
            slot.1
        } else if v.is_finite() {
            let w = weight(v, max, t, s);
            *slot = (bits, w);
            w
        } else {
            0
        };
        out[n] = Cand { key: order_key(v), id: i as u32, w };
        n += usize::from(w > 0);
    }
    n
}

/// `max(1, ceil(P total / 2^24))`: the weight the top-p prefix must reach.
pub fn top_p_need(p: u32, total: u64) -> u64 {
    let n = u128::from(p) * u128::from(total);
    (n.div_ceil(1 << PARAM_BITS) as u64).max(1)
}

/// `floor(b total / 2^53)`: the draw's target, below `total` for `b < 2^53`.
pub fn draw_target(bits: u64, total: u64) -> u64 {
    ((u128::from(bits) * u128::from(total)) >> 53) as u64
}

/// The (key, id) of the first candidate in order whose running count (`by_weight` false) or
/// weight sum exceeds `t`. `t` is below the slice's count/total (every caller's invariant);
/// past it the last candidate of the last group examined is returned.
fn select(c: &[Cand], mut t: u64, by_weight: bool) -> (u32, u32) {
    let mut members: Vec<Cand> = Vec::new();
    for (level, (shift, bits)) in [(21u32, 11u32), (10, 11), (0, 10)].into_iter().enumerate() {
        let from: &[Cand] = if level == 0 { c } else { &members };
        let mask = (1u32 << bits) - 1;
        let mut hist = [0u64; 2048];
        for x in from {
            hist[((x.key >> shift) & mask) as usize] += if by_weight { x.w } else { 1 };
        }
        let mut digit = 0;
        while digit < mask && t >= hist[digit as usize] {
            t -= hist[digit as usize];
            digit += 1;
        }
        members = from.iter().filter(|x| (x.key >> shift) & mask == digit).copied().collect();
    }
    // One logit now: equal weights, ids ascending.
    let Some(first) = members.first() else { return (u32::MAX, u32::MAX) };
    let m = if by_weight { t / first.w } else { t } as usize;
    let pick = members.get(m).or(members.last()).unwrap_or(first);
    (pick.key, pick.id)
}

/// The definition as written, slowly: sort every candidate, cut, walk. The reference of the
/// tests (and of nothing in production).
pub fn sample_row_sorted(row: &[f32], d: &Draw) -> u32 {
    let q = d.quantize();
    let max = match finite_max(row) {
        Some(m) if !q.greedy => m,
        _ => return argmax_row(row),
    };
    let s = weight_bits(row.len());
    let mut c: Vec<(u32, u32, u64)> = row
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (order_key(v), i as u32, weight(v, max, q.temperature, s)))
        .filter(|x| x.2 > 0)
        .collect();
    c.sort_unstable();
    if q.top_k > 0 {
        c.truncate(q.top_k as usize);
    }
    if q.top_p < 1 << PARAM_BITS {
        let total: u128 = c.iter().map(|x| u128::from(x.2)).sum();
        let mut run = 0u128;
        let keep = c.iter().position(|x| {
            run += u128::from(x.2);
            run << PARAM_BITS >= u128::from(q.top_p) * total
        });
        c.truncate(keep.map_or(c.len(), |i| i + 1));
    }
    // The top weight is the first candidate's (2^S, the maximum's).
    let top = c.first().map_or(0, |x| u128::from(x.2));
    c.retain(|x| u128::from(x.2) << PARAM_BITS >= u128::from(q.min_p) * top);
    let total: u128 = c.iter().map(|x| u128::from(x.2)).sum();
    let target = (u128::from(q.bits) * total) >> 53;
    let mut run = 0u128;
    c.iter()
        .find(|x| {
            run += u128::from(x.2);
            run > target
        })
        .map_or(u32::MAX, |x| x.1)
}

#[cfg(test)]
#[path = "sample_tests.rs"]
mod tests;
