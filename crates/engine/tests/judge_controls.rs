//! Controls of the teacher-forced judge (`tf_engine::judge`) on synthetic rows: every rule of
//! DESIGN.md §2 must be able to fail.
//!
//! - a genuine near-tie (contenders within one bf16 step on both sides) passes;
//! - a wider margin on either side fails;
//! - a third contender fails: the engine's top-1 is the reference's third, or outside the
//!   reference's top-k altogether;
//! - NaN, +Inf and -Inf on each side (reference full rows, reference top-k summary, engine,
//!   float64), at the winner and off it, are refused naming side and position, also when the
//!   winning token is unchanged;
//! - full reference rows that do not match their JSON summary are refused;
//! - KL is exact with full rows (checked against the textbook formula on probabilities,
//!   written here independently) and a lower bound without them.
//!
//! Rows are built here from chosen logits; the expected verdicts follow from the construction
//! (bf16 step at 16..32 is 0.125), not from the code under test.

use tf_engine::judge::{
    judge, FullRows, JudgeError, JudgeInput, KlMethod, RefFile, RefRow, Reference, Side, Verdict,
};

const VOCAB: usize = 8;
const K: usize = 4;

/// The reference summary of a full row, computed here independently of the judge: top-K by
/// a stable sort (descending, lowest id first among equals), float64 log-sum-exp, minimum.
fn summary(row: &[f64]) -> RefRow {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&i, &j| row[j].partial_cmp(&row[i]).unwrap_or(std::cmp::Ordering::Equal));
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    RefRow {
        ids: idx[..K].iter().map(|&i| i as u32).collect(),
        logits: idx[..K].iter().map(|&i| row[i]).collect(),
        lse,
        min: row.iter().cloned().fold(f64::INFINITY, f64::min),
    }
}

fn file(rows: &[Vec<f64>]) -> RefFile {
    RefFile {
        format: "tensorfold-ref-logits/1".into(),
        model: "synthetic".into(),
        dtype: "bf16".into(),
        attn: None,
        versions: Default::default(),
        k: K,
        vocab_size: VOCAB,
        tokens: (0..rows.len() as u32).collect(),
        full_logits: None,
        positions: rows.iter().map(|r| summary(r)).collect(),
    }
}

fn reference(rows: &[Vec<f64>], with_full: bool) -> Reference {
    let full = with_full.then(|| FullRows::from_f64(rows).unwrap());
    Reference::new(file(rows), full).unwrap()
}

fn flat(rows: &[Vec<f64>]) -> Vec<f32> {
    rows.iter().flatten().map(|&v| v as f32).collect()
}

/// Three positions; position 1 is where the contenders are varied.
fn base() -> Vec<Vec<f64>> {
    vec![
        vec![20.0, 18.0, 3.0, 1.0, 0.5, -1.0, -2.0, -4.0],
        vec![1.0, 16.0, 2.0, 15.0, 0.0, 14.0, -3.0, -1.0],
        vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 25.0],
    ]
}

fn run(
    r: &Reference,
    engine: &[Vec<f64>],
    f64_rows: Option<&[Vec<f64>]>,
) -> tf_engine::judge::Report {
    let e = flat(engine);
    let f = f64_rows.map(flat);
    judge(&JudgeInput { reference: r, engine: &e, float64: f.as_deref(), positions: 3 }).unwrap()
}

#[test]
fn identical_rows_pass_with_zero_kl() {
    for with_full in [true, false] {
        let rows = base();
        let rep = run(&reference(&rows, with_full), &rows, None);
        assert!(rep.passed() && rep.differences.is_empty(), "{rep:?}");
        // Exactly 0 from full rows; from the top-k the reference's rest mass comes from its lse
        // (-expm1) and the engine's from a direct sum, which differ by rounding only.
        assert_eq!(rep.top1_agree, 3);
        assert!(rep.mean_kl == 0.0 || (!with_full && rep.mean_kl < 1e-13), "{}", rep.mean_kl);
        let method = if with_full { KlMethod::Full } else { KlMethod::TopkRest };
        assert_eq!(rep.kl_method, method);
    }
}

#[test]
fn a_genuine_near_tie_passes() {
    let mut r = base();
    r[1][3] = 15.875; // reference: 16.0 vs 15.875, one step apart at 16
    let mut e = base();
    e[1][1] = 15.875;
    e[1][3] = 16.0; // engine: the same pair, swapped
    for with_full in [true, false] {
        let rep = run(&reference(&r, with_full), &e, None);
        assert_eq!(rep.differences.len(), 1, "{rep:?}");
        assert_eq!(rep.differences[0].verdict, Verdict::NearTie);
        assert!(rep.passed());
        assert_eq!((rep.differences[0].a, rep.differences[0].b), (1, 3));
        assert!(rep.receipt().contains("near-ties 1 / failures 0"), "{}", rep.receipt());
    }
}

#[test]
fn a_wider_margin_fails_on_either_side() {
    // Reference side wide: 16.0 vs 15.75 (two steps); the engine has them one step apart.
    let mut r = base();
    r[1][3] = 15.75;
    let mut e = base();
    e[1][1] = 15.875;
    e[1][3] = 16.0;
    let rep = run(&reference(&r, true), &e, None);
    assert_eq!(rep.differences[0].verdict, Verdict::Wide { side: Side::Reference });
    assert!(!rep.passed());
    // Engine side wide: the reference has a near-tie, the engine flips by two steps.
    let mut r = base();
    r[1][3] = 15.875;
    let mut e = base();
    e[1][1] = 15.75;
    e[1][3] = 16.0;
    for with_full in [true, false] {
        let rep = run(&reference(&r, with_full), &e, None);
        assert_eq!(rep.differences[0].verdict, Verdict::Wide { side: Side::Engine });
        assert!(!rep.passed() && rep.receipt().contains("failures 1"), "{}", rep.receipt());
    }
}

#[test]
fn a_third_contender_fails() {
    // The engine's top-1 (id 5) is the reference's third (16.0, 15.9375, 15.875), though all
    // three are within one step: the rule names two contenders, not three.
    let mut r = base();
    r[1][3] = 15.9375;
    r[1][5] = 15.875;
    let mut e = base();
    e[1][1] = 15.875;
    e[1][5] = 16.0;
    for with_full in [true, false] {
        let rep = run(&reference(&r, with_full), &e, None);
        assert_eq!(rep.differences[0].verdict, Verdict::ThirdContender { side: Side::Reference });
        assert!(!rep.passed());
    }
    // The engine's top-1 (id 7) is outside the reference's top-4 altogether.
    let mut e = base();
    e[1][7] = 16.5;
    let rep = run(&reference(&base(), false), &e, None);
    let d = &rep.differences[0];
    assert_eq!(d.verdict, Verdict::ThirdContender { side: Side::Reference });
    assert_eq!((d.reference.b, d.reference.rank_b), (None, None));
    // The reference's top-1 is the engine's third.
    let mut r = base();
    r[1][3] = 15.875;
    let mut e = base();
    e[1][3] = 16.25;
    e[1][5] = 16.125;
    let rep = run(&reference(&r, true), &e, None);
    assert_eq!(rep.differences[0].verdict, Verdict::ThirdContender { side: Side::Engine });
}

fn expect_refusal(res: Result<tf_engine::judge::Report, JudgeError>, side: Side, v: f64) {
    match res {
        Err(JudgeError::NonFinite(list)) => {
            assert_eq!(list.len(), 1, "{list:?}");
            assert_eq!((list[0].side, list[0].position), (side, 1));
            assert!(list[0].value.is_nan() == v.is_nan() && (v.is_nan() || list[0].value == v));
            let msg = JudgeError::NonFinite(list).to_string();
            assert!(msg.contains(&format!("{side} position 1")), "{msg}");
        }
        other => panic!("{side} {v}: expected a refusal, got {other:?}"),
    }
}

#[test]
fn non_finite_rows_are_refused_on_every_side_even_when_the_winner_is_unchanged() {
    for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        for at_winner in [true, false] {
            // Position 1's winner is id 1; +Inf there keeps it the winner, and so does any
            // value planted off it (id 6).
            let mut bad = base();
            bad[1][if at_winner { 1 } else { 6 }] = v;
            let good = base();
            // Engine side.
            let e = flat(&bad);
            let r = reference(&good, true);
            let input = JudgeInput { reference: &r, engine: &e, float64: None, positions: 3 };
            expect_refusal(judge(&input), Side::Engine, v);
            // Float64 side.
            let g = flat(&good);
            let input = JudgeInput { reference: &r, engine: &g, float64: Some(&e), positions: 3 };
            expect_refusal(judge(&input), Side::Float64, v);
            // Reference side, full rows (the summary is from the good rows, so only the
            // full rows carry the planted value).
            let full = FullRows::from_f64(&bad).unwrap();
            let r = Reference::new(file(&good), Some(full)).unwrap();
            let input = JudgeInput { reference: &r, engine: &g, float64: None, positions: 3 };
            expect_refusal(judge(&input), Side::Reference, v);
        }
        // Reference side, top-k summary only: in a stored logit (where the order stays
        // descending: +Inf first, -Inf last, NaN off the winner), and in lse.
        let mut f = file(&base());
        let j = if v == f64::INFINITY {
            0
        } else if v == f64::NEG_INFINITY {
            K - 1
        } else {
            2
        };
        f.positions[1].logits[j] = v;
        let g = flat(&base());
        let r = Reference::new(f, None).unwrap();
        let input = JudgeInput { reference: &r, engine: &g, float64: None, positions: 3 };
        expect_refusal(judge(&input), Side::Reference, v);
        let mut f = file(&base());
        f.positions[1].lse = v;
        let r = Reference::new(f, None).unwrap();
        let input = JudgeInput { reference: &r, engine: &g, float64: None, positions: 3 };
        expect_refusal(judge(&input), Side::Reference, v);
    }
}

#[test]
fn full_rows_from_another_run_are_refused() {
    let mut other = base();
    other[2][6] = 6.5; // changes position 2's top-k logits and lse
    let full = FullRows::from_f64(&other).unwrap();
    let r = Reference::new(file(&base()), Some(full)).unwrap();
    let e = flat(&base());
    let res = judge(&JudgeInput { reference: &r, engine: &e, float64: None, positions: 3 });
    match res {
        Err(JudgeError::Reference(m)) => assert!(m.contains("position 2"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// KL(softmax(p) || softmax(q)) from probabilities, the textbook way.
fn kl_textbook(p: &[f64], q: &[f64]) -> f64 {
    let norm = |x: &[f64]| {
        let e: Vec<f64> = x.iter().map(|v| v.exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|v| v / s).collect::<Vec<f64>>()
    };
    norm(p).iter().zip(norm(q)).map(|(a, b)| a * (a / b).ln()).sum()
}

#[test]
fn kl_is_exact_with_full_rows_and_a_lower_bound_without() {
    let r = base();
    let mut e = base();
    e[0][1] = 18.5;
    e[1][5] = 14.5;
    e[2][6] = 6.25;
    // The engine's rows as the judge sees them (f32; these values are exact in f32).
    let want: f64 = (0..3).map(|i| kl_textbook(&r[i], &e[i])).sum::<f64>() / 3.0;
    let full = run(&reference(&r, true), &e, None);
    assert!((full.mean_kl - want).abs() < 1e-12 * want.max(1e-300), "{} vs {want}", full.mean_kl);
    let topk = run(&reference(&r, false), &e, None);
    assert!(topk.mean_kl <= want + 1e-15 && topk.mean_kl > 0.0, "{} vs {want}", topk.mean_kl);
    assert!(topk.topk.mean_upper >= want);
}

#[test]
fn float64_says_which_side_it_agrees_with() {
    let mut r = base();
    r[1][3] = 15.875;
    let mut e = base();
    e[1][1] = 15.875;
    e[1][3] = 16.0;
    let mut f = base();
    f[1][3] = 15.95; // float64: id 1 (the reference's) above id 3, within a step
    let rep = run(&reference(&r, true), &e, Some(&f));
    let d = &rep.differences[0];
    assert_eq!(d.float64_agrees, Some(tf_engine::judge::Agrees::Reference));
    assert_eq!(d.float64_near_tie, Some(true));
    f[1][3] = 16.3; // float64 above by more than a step, on the engine's side
    let rep = run(&reference(&r, true), &e, Some(&f));
    let d = &rep.differences[0];
    assert_eq!(d.float64_agrees, Some(tf_engine::judge::Agrees::Engine));
    assert_eq!(d.float64_near_tie, Some(false));
    assert!(rep.passed(), "float64 is reported, not failed on");
    let ff = rep.float64.unwrap();
    assert_eq!((ff.top1_reference, ff.top1_engine, ff.sides_with_engine), (2, 3, 1));
}
