//! The checkers can fail: models with deliberate row-count-dependent bugs must make them
//! report FAIL, with the differing rows located where the bug puts them, while the planted
//! control is still caught.
//!
//! The models are `tf_engine::check::fault::Faulty` wrappers of the real one: with
//! `RowDependentLogits` (KV untouched) only logits rows may be reported; with
//! `RowDependentToken` (a bug that reaches the KV) K and V rows must be reported.

mod check_common;

use check_common::{model, progress, tokens};
use tf_backend::cpu::CpuBackend;
use tf_engine::check::fault::{Fault, Faulty};
use tf_engine::check::{self, CheckOutcome, Part};
use tf_engine::family::CausalLm;

fn buggy(fault: Fault) -> Faulty<CpuBackend> {
    Faulty { inner: model().unwrap(), fault }
}

/// The check failed on differing rows only (not on its plant), and every reported row's part
/// satisfies `allowed`.
fn assert_fails_on_rows(o: &CheckOutcome, allowed: impl Fn(Part) -> bool) {
    println!("{o}");
    assert!(!o.passed(), "the buggy model passed: {o}");
    assert!(o.plant.caught(), "the plant must still be caught: {}", o.plant);
    assert!(o.differing_rows() > 0);
    for c in &o.comparisons {
        for d in &c.diffs {
            assert!(allowed(d.row.part), "{}: unexpected {d}", c.label);
        }
    }
}

#[test]
fn row_dependent_logits_fail_windows_and_concurrent() {
    let mut m = buggy(Fault::RowDependentLogits);
    let toks = tokens(40);
    let opts = check::WindowsOpts { seed: 7, ..Default::default() };
    let o = check::windows(&mut m, &toks, &opts, &mut progress("neg windows")).unwrap();
    assert_fails_on_rows(&o, |p| p == Part::Logits);
    let by_label = |l: &str| o.comparisons.iter().find(|c| c.label.starts_with(l)).unwrap();
    // One-row calls differ from the 40-row baseline in every row; one call of 40 rows
    // (chunks of 128) is the baseline's shape and must not differ.
    assert_eq!(by_label("chunks of 1 ").diffs.len(), 40);
    assert_eq!(by_label("chunks of 128").diffs.len(), 0);

    let copts = check::ConcurrentOpts { mixes: 1, max_seqs: 6, max_len: 20, max_chunk: 8, seed: 7 };
    let o = check::concurrent(&mut m, &toks, &copts, &mut progress("neg concurrent")).unwrap();
    assert_fails_on_rows(&o, |p| p == Part::Logits);
}

#[test]
fn row_dependent_logits_fail_resumed_and_seeded() {
    let mut m = buggy(Fault::RowDependentLogits);
    let toks = tokens(64);
    let ropts = check::ResumedOpts { cases: 1, extra_steps: 2, seed: 8 };
    let o = check::resumed(&mut m, &toks, &ropts, &mut progress("neg resumed")).unwrap();
    assert_fails_on_rows(&o, |p| p == Part::Logits);

    let sopts = check::SeededOpts {
        prompt_len: 12,
        gen_tokens: 4,
        others: 2,
        seed: 8,
        ..Default::default()
    };
    let mut restart = || -> tf_engine::Result<Box<dyn CausalLm<CpuBackend>>> {
        Ok(Box::new(buggy(Fault::RowDependentLogits)))
    };
    let o =
        check::seeded(&mut m, &mut restart, &toks, &sopts, &mut progress("neg seeded")).unwrap();
    // The restart has the same bug, so only the shared-calls run can differ; a flipped low
    // bit may or may not change a sampled token (and then the KV after it).
    assert_fails_on_rows(&o, |_| true);
    let restart_cmp = o.comparisons.iter().find(|c| c.label.contains("restart")).unwrap();
    assert!(restart_cmp.diffs.is_empty());
}

#[test]
fn row_dependent_token_fails_windows_and_concurrent_in_kv() {
    let mut m = buggy(Fault::RowDependentToken);
    let toks = tokens(40);
    let opts = check::WindowsOpts { chunks: vec![1, 16], ragged: false, seed: 9 };
    let o = check::windows(&mut m, &toks, &opts, &mut progress("neg windows kv")).unwrap();
    assert_fails_on_rows(&o, |_| true);
    let reported: Vec<Part> =
        o.comparisons.iter().flat_map(|c| c.diffs.iter().map(|d| d.row.part)).collect();
    assert!(reported.iter().any(|p| matches!(p, Part::K(_))));
    assert!(reported.iter().any(|p| matches!(p, Part::V(_))));

    let copts =
        check::ConcurrentOpts { mixes: 1, max_seqs: 8, max_len: 24, max_chunk: 12, seed: 9 };
    let o = check::concurrent(&mut m, &toks, &copts, &mut progress("neg concurrent kv")).unwrap();
    assert_fails_on_rows(&o, |_| true);
    assert!(o.comparisons[0].diffs.iter().any(|d| matches!(d.row.part, Part::K(_))));
}
