//! The checkers catch a real kernel fault, not only a faulty model wrapper (issue 3: "a build
//! with a row-dependent kernel fails windows and concurrent"). Built only with the
//! `fault-row-dependent` feature, which makes the CPU backend's `linear` split K in two halves
//! whenever a call has more than one row (`crates/backend/src/cpu/fault.rs`): a schedule that
//! depends on the row count. On the real test model, `windows` and `concurrent` must both FAIL,
//! reporting differing rows (logits and KV: the fault is in every projection), while each
//! still catches its planted control.
//!
//! Run in its own target directory so the normal build stays valid:
//! `CARGO_TARGET_DIR=target/fault cargo test -p tf-engine --features fault-row-dependent
//! --test fault_build`.
#![cfg(feature = "fault-row-dependent")]

mod check_common;

use check_common::{model, progress, tokens};
use tf_engine::check::{self, CheckOutcome, Part};

/// The check failed on differing rows, not on its plant; returns the parts reported.
fn assert_fails_on_rows(o: &CheckOutcome) -> Vec<Part> {
    println!("{o}");
    for c in &o.comparisons {
        for d in c.diffs.iter().take(3) {
            println!("  {}: {d}", c.label);
        }
    }
    assert!(!o.passed(), "the row-dependent build passed: {o}");
    assert!(o.plant.caught(), "the plant must still be caught: {}", o.plant);
    assert!(o.differing_rows() > 0, "failed without reporting a differing row: {o}");
    o.comparisons.iter().flat_map(|c| c.diffs.iter().map(|d| d.row.part)).collect()
}

#[test]
fn row_dependent_linear_fails_windows() {
    let mut m = model().unwrap();
    let toks = tokens(40);
    let opts = check::WindowsOpts { seed: 11, ..Default::default() };
    let o = check::windows(m.as_mut(), &toks, &opts, &mut progress("fault windows")).unwrap();
    let parts = assert_fails_on_rows(&o);
    assert!(parts.contains(&Part::Logits), "no logits row reported: {parts:?}");
    assert!(parts.iter().any(|p| matches!(p, Part::K(_))), "no K row reported: {parts:?}");
    let by_label = |l: &str| o.comparisons.iter().find(|c| c.label.starts_with(l)).unwrap();
    // One-row steps run the unsplit schedule, the 40-row baseline the split one: they differ.
    // One call of 40 rows (chunks of 128) is the baseline's own schedule and must not.
    assert!(!by_label("chunks of 1 ").diffs.is_empty());
    assert!(by_label("chunks of 128").diffs.is_empty());
}

#[test]
fn row_dependent_linear_fails_concurrent() {
    let mut m = model().unwrap();
    let toks = tokens(40);
    let opts = check::ConcurrentOpts { mixes: 1, max_seqs: 6, max_len: 20, max_chunk: 8, seed: 11 };
    let o = check::concurrent(m.as_mut(), &toks, &opts, &mut progress("fault concurrent")).unwrap();
    let parts = assert_fails_on_rows(&o);
    assert!(parts.contains(&Part::Logits), "no logits row reported: {parts:?}");
}
