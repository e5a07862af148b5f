//! Tests of the sampling definition (`sample.rs`): tiny rows checked by hand, boundaries
//! exactly at each threshold, and the radix-select sampler against the sort-and-walk
//! definition on random rows.

use super::*;

fn draw(t: f32, u: f64) -> Draw {
    Draw { temperature: t, top_k: 0, top_p: 1.0, min_p: 0.0, uniform: u }
}

/// Both implementations, which must agree; returns the token.
fn both(row: &[f32], d: &Draw) -> u32 {
    let (fast, slow) = (sample_row(row, d), sample_row_sorted(row, d));
    assert_eq!(fast, slow, "radix vs sorted on {row:?} with {d:?}");
    fast
}

/// The largest f64 below 1.
const ALMOST_ONE: f64 = 1.0 - 1.0 / (1u64 << 53) as f64;

#[test]
fn exp_portable_is_exp_and_exact_at_zero() {
    assert_eq!(exp_portable(0.0), 1.0);
    assert_eq!(exp_portable(-0.0), 1.0);
    assert_eq!(exp_portable(-64.5), 0.0);
    assert_eq!(exp_portable(f64::NAN), 0.0);
    let mut worst = 0.0f64;
    for i in 0..=640_000 {
        let x = -(i as f64) * 1e-4;
        let (got, want) = (exp_portable(x), x.exp());
        worst = worst.max(((got - want) / want).abs());
    }
    assert!(worst < 4e-16, "relative error {worst}");
}

#[test]
fn weight_bits_keep_a_row_below_2_63() {
    assert_eq!(weight_bits(49_152), 40);
    assert_eq!(weight_bits(128_256), 40);
    assert_eq!(weight_bits((1 << 23) - 1), 40);
    assert_eq!(weight_bits(1 << 23), 39);
    for v in [1usize, 1000, 1 << 22, 1 << 30, (1 << 38) + 5] {
        assert!((v as u128) << weight_bits(v) < 1u128 << 63, "vocab {v}");
    }
}

#[test]
fn equal_logits_split_the_unit_interval_evenly() {
    let row = [0.5f32; 4];
    assert_eq!(both(&row, &draw(1.0, 0.0)), 0);
    assert_eq!(both(&row, &draw(1.0, 0.25 - 1.0 / (1u64 << 53) as f64)), 0);
    // u = 1/4: target = 2^S exactly; the first running sum 2^S does not exceed it.
    assert_eq!(both(&row, &draw(1.0, 0.25)), 1);
    assert_eq!(both(&row, &draw(1.0, 0.5)), 2);
    assert_eq!(both(&row, &draw(1.0, ALMOST_ONE)), 3);
}

#[test]
fn signed_zeros_tie_and_specials_never_sample() {
    // -0.0 and +0.0 are one logit: ids ascending across them.
    let row = [-0.0f32, 0.0, -0.0];
    assert_eq!(both(&row, &draw(0.7, 0.0)), 0);
    assert_eq!(both(&row, &draw(0.7, 0.34)), 1);
    assert_eq!(both(&row, &draw(0.7, 0.67)), 2);
    // NaN and -inf are never candidates.
    let row = [f32::NAN, 0.0, f32::NEG_INFINITY, 0.0, f32::NAN];
    for u in [0.0, 0.49, 0.5, ALMOST_ONE] {
        let t = both(&row, &draw(1.0, u));
        assert_eq!(t, if u < 0.5 { 1 } else { 3 }, "u {u}");
    }
    // +inf: the row answers its argmax (lowest +inf id); nothing finite: argmax too.
    assert_eq!(both(&[1.0, f32::INFINITY, f32::INFINITY], &draw(1.0, 0.9)), 1);
    assert_eq!(both(&[f32::NAN, f32::NEG_INFINITY], &draw(1.0, 0.9)), 0);
    // Temperature 0 is greedy whatever the draw.
    assert_eq!(both(&[1.0, 3.0, 3.0, 2.0], &draw(0.0, 0.99)), 1);
}

#[test]
fn far_below_the_maximum_weighs_nothing() {
    // (v - max) / t = -100: weight 0, never drawn even at u -> 1.
    let row = [0.0f32, -100.0];
    assert_eq!(both(&row, &draw(1.0, ALMOST_ONE)), 0);
    // At t = 10 the same gap is -10: weight e^-10 2^40 > 0, drawn near u = 1.
    assert_eq!(both(&row, &draw(10.0, ALMOST_ONE)), 1);
}

#[test]
fn top_k_keeps_the_first_k_in_logit_then_id_order() {
    let row = [1.0f32, 3.0, 3.0, 2.0, 3.0];
    let d = |k, u| Draw { top_k: k, ..draw(1.0, u) };
    assert_eq!(both(&row, &d(1, ALMOST_ONE)), 1);
    // k = 2: ids 1 and 2 (equal logits), evenly.
    assert_eq!(both(&row, &d(2, 0.49)), 1);
    assert_eq!(both(&row, &d(2, 0.5)), 2);
    assert_eq!(both(&row, &d(2, ALMOST_ONE)), 2);
    assert_eq!(both(&row, &d(3, ALMOST_ONE)), 4);
    // k at or past the candidate count is off.
    assert_eq!(both(&[0.0, 0.0], &d(2, ALMOST_ONE)), 1);
    assert_eq!(both(&[0.0, 0.0], &d(9, ALMOST_ONE)), 1);
}

#[test]
fn top_p_cuts_exactly_at_the_threshold() {
    // Four equal weights: top_p 0.5 needs exactly two of them (the sum reaches the bound).
    let row = [0.0f32; 4];
    let d = |p, u| Draw { top_p: p, ..draw(1.0, u) };
    assert_eq!(both(&row, &d(0.5, ALMOST_ONE)), 1);
    // One step of 2^-24 above half needs a third.
    let above = 0.5 + 1.0 / (1u32 << 24) as f32;
    assert_eq!(both(&row, &d(above, ALMOST_ONE)), 2);
    assert_eq!(both(&row, &d(0.75, ALMOST_ONE)), 2);
    // A tiny top_p still keeps the first candidate.
    assert_eq!(both(&row, &d(1e-9, ALMOST_ONE)), 0);
    assert_eq!(both(&row, &d(1.0, ALMOST_ONE)), 3);
}

#[test]
fn min_p_keeps_weights_at_the_threshold() {
    let row = [0.0f32, -1.0, -1.0];
    let w = weight(-1.0, 0.0, 1.0, 40);
    // e^-1 2^40 within a few units (an independent check of the weight).
    assert!(((w as f64) - (-1f64).exp() * 2f64.powi(40)).abs() < 4.0, "{w}");
    let m = (w >> 16) as f32 / (1u32 << 24) as f32; // threshold M 2^16 <= w: kept
    let d = |mp, u| Draw { min_p: mp, ..draw(1.0, u) };
    assert_eq!(both(&row, &d(m, ALMOST_ONE)), 2);
    let m_up = ((w >> 16) + 1) as f32 / (1u32 << 24) as f32; // threshold above w: dropped
    assert_eq!(both(&row, &d(m_up, ALMOST_ONE)), 0);
    // min_p 1 keeps exactly the ties of the maximum.
    assert_eq!(both(&[5.0, 5.0, 4.999], &d(1.0, ALMOST_ONE)), 1);
}

/// splitmix64, for the random rows.
pub(super) struct Mix(pub u64);
impl Mix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// bf16-rounded, plain f32 or few-valued logits, with +-0, NaN, +-inf and huge negatives.
fn random_row(g: &mut Mix, n: usize) -> Vec<f32> {
    let style = g.next() % 4;
    let scale = [0.5, 4.0, 20.0, 200.0][(g.next() % 4) as usize];
    (0..n)
        .map(|_| {
            let x = ((g.unit() * 2.0 - 1.0) * scale) as f32;
            let v = match style {
                0 => f32::from_bits(x.to_bits() & 0xffff_0000),
                1 => x,
                2 => (x * 0.25).round(),
                _ => f32::from_bits(x.to_bits() & 0xfff0_0000),
            };
            match g.next() % 64 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::NAN,
                3 if g.next().is_multiple_of(16) => f32::INFINITY,
                4 => f32::NEG_INFINITY,
                5 => -1.0e30,
                _ => v,
            }
        })
        .collect()
}

fn random_draw(g: &mut Mix) -> Draw {
    Draw {
        temperature: [0.0, 0.05, 0.3, 0.8, 1.0, 1.7, 100.0][(g.next() % 7) as usize],
        top_k: [0, 0, 1, 2, 5, 40, 1000][(g.next() % 7) as usize],
        top_p: [1.0, 1.0, 0.95, 0.5, 0.01, 0.999_999][(g.next() % 6) as usize],
        min_p: [0.0, 0.0, 0.05, 0.5, 1.0][(g.next() % 5) as usize],
        uniform: match g.next() % 8 {
            0 => 0.0,
            1 => ALMOST_ONE,
            _ => g.unit(),
        },
    }
}

#[test]
fn radix_select_equals_sort_and_walk_on_random_rows() {
    let mut g = Mix(7);
    let mut tokens = std::collections::BTreeSet::new();
    for case in 0..1500 {
        let n = [1, 2, 5, 64, 300, 4096, 49_152][(g.next() % 7) as usize];
        let row = random_row(&mut g, n);
        for _ in 0..3 {
            let d = random_draw(&mut g);
            let (fast, slow) = (sample_row(&row, &d), sample_row_sorted(&row, &d));
            assert_eq!(fast, slow, "case {case}: n {n}, {d:?}");
            assert!((fast as usize) < n, "case {case}: token {fast} of {n}");
            tokens.insert(fast);
        }
    }
    assert!(tokens.len() > 200, "the cases draw varied tokens: {}", tokens.len());
}

/// Host cost per 49,152-token row (bf16 logits, t 0.8, top_p 0.95), printed; run with
/// `--ignored --nocapture`.
#[test]
#[ignore]
fn host_speed_49k() {
    let mut g = Mix(3);
    let rows: Vec<Vec<f32>> = (0..64)
        .map(|_| {
            (0..49_152)
                .map(|_| {
                    let x = (g.unit() * g.unit() * 30.0 - 10.0) as f32;
                    f32::from_bits(x.to_bits() & 0xffff_0000)
                })
                .collect()
        })
        .collect();
    let d = Draw { temperature: 0.8, top_k: 0, top_p: 0.95, min_p: 0.0, uniform: 0.3 };
    let mut sink = 0u64;
    let t0 = std::time::Instant::now();
    for r in 0..640 {
        sink += u64::from(sample_row(&rows[r % 64], &d));
    }
    let per = t0.elapsed().as_secs_f64() * 1e3 / 640.0;
    println!("host sample_row: {per:.3} ms per 49,152-token row (sink {sink})");
}
