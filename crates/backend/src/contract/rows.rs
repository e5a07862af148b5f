//! Gates 2 and 3 and both planted controls for a row-wise op (every op but attention, whose
//! rows belong to sequences: `attention.rs`).
//!
//! The universe is 2,048 input rows (ids). The anchor is one call of all of them in a
//! shuffled order; then one call of each smaller row count takes that many distinct ids,
//! drawn at random, in random order; every row of every call must have the bits of the same
//! id in the anchor. Gate 2 checks the anchor's rows of `SAMPLE` against the float64
//! reference (every other row of every call is proven equal to an anchor row by gate 3, so
//! one sample covers them all), which keeps the reference cheap at the largest shapes.

use super::compare::{check_bound, differing_rows, plant_row, Anchor};
use super::data::Rng;
use super::reference::Expect;
use super::report::{Judged, Verdict};
use super::ContractError;
use crate::Backend;

/// Rows per call in gate 3 (DESIGN.md §1: decode rows, odd sizes, tiles and their
/// neighbours, a large prefill).
pub const ROW_COUNTS: [usize; 8] = [1, 2, 3, 8, 16, 17, 128, 2048];
/// Distinct input rows; the largest call takes all of them.
pub const UNIVERSE: usize = 2048;
/// Rows of the anchor that gate 2 checks: both ends and the middle, even ids (zero-mean
/// inputs) and odd ids (offset inputs, where a 1% error stands out of the bound).
pub const SAMPLE: [u32; 8] = [0, 1, 2, 3, 1022, 1023, 2046, 2047];

/// A row-wise op on inputs the case placed itself.
pub trait RowCase<B: Backend> {
    /// Output columns.
    fn cols(&self) -> usize;
    /// One call of the op on universe rows `ids`, in that order: `(ids.len(), cols)`.
    fn run(&mut self, be: &B, ids: &[u32]) -> Result<Vec<f32>, ContractError>;
    /// The float64 reference of rows `ids` (row-major).
    fn reference(&self, ids: &[u32]) -> Expect;
}

/// Runs gates 2 and 3 and the two controls of one case.
pub fn drive<B: Backend>(be: &B, case: &mut dyn RowCase<B>, rng: &mut Rng) -> Judged {
    let mut ids: Vec<u32> = (0..UNIVERSE as u32).collect();
    rng.shuffle(&mut ids);
    let anchor = match case.run(be, &ids) {
        Ok(d) => Anchor::new(ids, d, case.cols()),
        Err(e) => return Judged::error(&e),
    };
    let rows = row_gate(be, case, &anchor, rng);
    let sample: Vec<f32> =
        SAMPLE.iter().filter_map(|&id| anchor.row(id)).flatten().copied().collect();
    let want = case.reference(&SAMPLE);
    let (bound, ctl_bound) = bound_gate(&sample, &want, SAMPLE.len());
    Judged { bound, rows, ctl_bound, ctl_row: row_control(&anchor, rng) }
}

/// Gate 3: every smaller call against the anchor.
fn row_gate<B: Backend>(
    be: &B,
    case: &mut dyn RowCase<B>,
    anchor: &Anchor,
    rng: &mut Rng,
) -> Verdict {
    let mut bad: Vec<String> = Vec::new();
    let mut rows = 0;
    for n in ROW_COUNTS.into_iter().filter(|&n| n < UNIVERSE) {
        let ids = rng.sample(n, UNIVERSE);
        let out = match case.run(be, &ids) {
            Ok(o) => o,
            Err(e) => return Verdict::fail(format!("the {n}-row call failed: {e}")),
        };
        rows += n;
        let diff = differing_rows(anchor, &ids, &out);
        bad.extend(diff.iter().map(|&r| format!("id {} (row {r} of {n})", ids[r])));
    }
    if bad.is_empty() {
        Verdict::pass(format!(
            "calls of {} rows: all {rows} rows equal the {UNIVERSE}-row call bit for bit",
            counts()
        ))
    } else {
        let shown = bad.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
        Verdict::fail(format!(
            "{} of {rows} rows differ from the {UNIVERSE}-row call: {shown}",
            bad.len()
        ))
    }
}

/// Gate 2 on sampled outputs and its 1%-off control.
pub fn bound_gate(out: &[f32], want: &Expect, rows: usize) -> (Verdict, Verdict) {
    let (Some(gate), Some(ctl)) = (check_bound(out, want, 1.0), check_bound(out, want, 1.01))
    else {
        let what = format!("{} outputs but {} reference values", out.len(), want.value.len());
        return (Verdict::fail(what.clone()), Verdict::fail(what));
    };
    let gate = Verdict { ok: gate.ok(), detail: format!("{rows} rows: {}", gate.describe()) };
    let red = ctl.exceed > 0;
    let ctl = Verdict {
        ok: red,
        detail: format!(
            "reference x1.01 {}: {}",
            if red { "exceeds the bound" } else { "stays within the bound" },
            ctl.describe()
        ),
    };
    (gate, ctl)
}

/// The planted row control on a copy of the anchor.
pub fn row_control(anchor: &Anchor, rng: &mut Rng) -> Verdict {
    let (planted, found) = plant_row(anchor, rng);
    let detail = format!(
        "one bit flipped in row {planted} of {}: comparator reported rows {found:?}",
        anchor.ids.len()
    );
    Verdict { ok: found == [planted], detail }
}

/// "1, 2, 3, 8, 16, 17, 128 and 2048".
pub fn counts() -> String {
    let s: Vec<String> = ROW_COUNTS.iter().map(|n| n.to_string()).collect();
    format!("{} and {}", s[..s.len() - 1].join(", "), s[s.len() - 1])
}
