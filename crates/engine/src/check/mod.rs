//! The exactness checkers (DESIGN.md §1): each runs the same tokens two ways that the contract
//! says cannot differ, and compares logits and the KV of every layer bit for bit.
//!
//! - `windows`: one whole prefill vs chunks of 1 (one-row steps), 7, 16, 128 and ragged sizes;
//! - `concurrent`: several sequences sharing seeded random calls vs each one alone;
//! - `resumed`: a sequence continued on another's cached prefix blocks vs computed fresh;
//! - `seeded`: a sampled generation after a restart and beside other sequences vs alone, and
//!   a different seed must change it.
//!
//! Every checker reports *all* differing rows (`compare`), and runs a planted control: a
//! one-bit difference in a copy of one pseudo-randomly chosen row must be reported as that row
//! and only it, else the check fails however its real comparison came out. Each outcome carries
//! the state fingerprint of its baseline (`fingerprint`), one line to compare across runs.
//!
//! `fault` holds deliberately row-dependent models that every checker must FAIL on.
//!
//! The checkers are generic over `Backend` and work on any `CausalLm`; they own their KV pool
//! and never reuse a block within a check (`pool`). Randomness is a pure function of the seed.
//! Rejected: comparing with a tolerance (the contract is bits), and comparing only the last
//! row's logits (a row-dependent kernel can hide in rows a request never reads, then surface
//! through the KV).

pub mod compare;
pub mod concurrent;
pub mod fault;
pub mod fingerprint;
pub mod history;
mod multigen;
mod pool;
pub mod record;
pub mod resumed;
mod rng;
pub mod seeded;
pub mod windows;

use std::fmt;

pub use compare::{compare, Part, Plant, RowDiff, RowId};
pub use concurrent::{concurrent, ConcurrentOpts};
pub use record::{Record, SeqRecord};
pub use resumed::{resumed, ResumedOpts};
pub use seeded::{seeded, ModelFactory, SeededOpts};
pub use windows::{windows, WindowsOpts};

use rng::Rng;

/// Progress lines of a running check ("windows: chunk 7 ...").
pub type Progress<'a> = &'a mut dyn FnMut(&str);

/// One comparison of a check: a run against its baseline.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub label: String,
    pub diffs: Vec<RowDiff>,
}

impl Comparison {
    /// Differing rows by kind and the earliest differing position, e.g.
    /// "96 differing rows (logits 32, K 32, V 32) from seq 0 pos 5".
    pub fn summary(&self) -> String {
        if self.diffs.is_empty() {
            return "equal".into();
        }
        let count = |f: &dyn Fn(Part) -> bool| self.diffs.iter().filter(|d| f(d.row.part)).count();
        let kinds = [
            ("input tokens", count(&|p| p == Part::Token)),
            ("sampled tokens", count(&|p| p == Part::Sampled)),
            ("logits", count(&|p| p == Part::Logits)),
            ("K", count(&|p| matches!(p, Part::K(_)))),
            ("V", count(&|p| matches!(p, Part::V(_)))),
            ("shape", count(&|p| p == Part::Shape)),
        ];
        let kinds: Vec<String> =
            kinds.iter().filter(|k| k.1 > 0).map(|(n, c)| format!("{n} {c}")).collect();
        let first = self.diffs.iter().map(|d| (d.row.seq, d.row.pos)).min().unwrap_or((0, 0));
        format!(
            "{} differing rows ({}) from seq {} pos {}",
            self.diffs.len(),
            kinds.join(", "),
            first.0,
            first.1
        )
    }

    /// The differing rows in (sequence, position, part) order.
    pub fn by_position(&self) -> Vec<&RowDiff> {
        let mut v: Vec<&RowDiff> = self.diffs.iter().collect();
        v.sort_by_key(|d| d.row);
        v
    }
}

/// What a check compared, summed over its comparisons.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compared {
    pub comparisons: usize,
    pub logit_rows: usize,
    /// Positions whose K and V were compared in every layer.
    pub kv_rows: usize,
    pub layers: usize,
    pub sampled: usize,
}

/// The result of one checker.
#[derive(Clone, Debug)]
pub struct CheckOutcome {
    pub name: &'static str,
    /// What was run against what, e.g. "chunks 1, 7, 16, 128 vs whole prefill of 320 rows".
    pub what: String,
    pub comparisons: Vec<Comparison>,
    pub compared: Compared,
    pub plant: Plant,
    /// Fingerprint of the check's baseline state.
    pub fingerprint: u64,
    /// Facts worth printing (e.g. how many tokens another seed changed).
    pub notes: Vec<String>,
    /// Failures besides differing rows (e.g. a seed that changed nothing).
    pub failures: Vec<String>,
}

impl CheckOutcome {
    pub fn differing_rows(&self) -> usize {
        self.comparisons.iter().map(|c| c.diffs.len()).sum()
    }

    pub fn passed(&self) -> bool {
        self.differing_rows() == 0 && self.plant.caught() && self.failures.is_empty()
    }
}

impl fmt::Display for CheckOutcome {
    /// One line: verdict, what was compared, the plant and the fingerprint.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.compared;
        write!(
            f,
            "{} {}: {}; compared {} logit rows, {} positions x {} layers of K and V",
            if self.passed() { "PASS" } else { "FAIL" },
            self.name,
            self.what,
            c.logit_rows,
            c.kv_rows,
            c.layers
        )?;
        if c.sampled > 0 {
            write!(f, ", {} sampled tokens", c.sampled)?;
        }
        write!(f, "; {} differing rows", self.differing_rows())?;
        for n in &self.notes {
            write!(f, "; {n}")?;
        }
        for n in &self.failures {
            write!(f, "; FAILED: {n}")?;
        }
        write!(f, "; plant {}; fingerprint {:016x}", self.plant, self.fingerprint)
    }
}

/// Collects a check's comparisons and places its planted control in one of them, chosen by
/// the seed before any run, so the plant does not depend on what the runs produce.
pub(crate) struct Collector {
    name: &'static str,
    comparisons: Vec<Comparison>,
    compared: Compared,
    plant: Option<Plant>,
    plant_at: usize,
    rng: Rng,
}

impl Collector {
    pub fn new(name: &'static str, seed: u64, planned: usize, layers: usize) -> Self {
        let mut rng = Rng::derive(seed, name);
        let plant_at = rng.below(planned.max(1));
        let compared = Compared { layers, ..Compared::default() };
        Collector { name, comparisons: Vec::new(), compared, plant: None, plant_at, rng }
    }

    /// Compares `got` against `want` bit for bit, and plants if this is the chosen comparison.
    pub fn compare(&mut self, label: String, want: &Record, got: &Record) {
        let diffs = compare::compare(want, got);
        if self.comparisons.len() == self.plant_at {
            let p = compare::plant(&label, want, got, diffs.is_empty(), &mut self.rng);
            self.plant = Some(p);
        }
        let (logit_rows, kv_rows, sampled) = want.rows();
        self.compared.comparisons += 1;
        self.compared.logit_rows += logit_rows;
        self.compared.kv_rows += kv_rows;
        self.compared.sampled += sampled;
        self.comparisons.push(Comparison { label, diffs });
    }

    pub fn finish(self, what: String, fingerprint: u64, notes: Vec<String>) -> CheckOutcome {
        self.finish_with(what, fingerprint, notes, Vec::new())
    }

    pub fn finish_with(
        self,
        what: String,
        fingerprint: u64,
        notes: Vec<String>,
        mut failures: Vec<String>,
    ) -> CheckOutcome {
        let plant = self.plant.unwrap_or_else(|| {
            failures.push("no comparison received the planted control".into());
            Plant {
                label: "-".into(),
                row: RowId { seq: 0, pos: 0, part: Part::Shape },
                col: 0,
                reported: Vec::new(),
            }
        });
        CheckOutcome {
            name: self.name,
            what,
            comparisons: self.comparisons,
            compared: self.compared,
            plant,
            fingerprint,
            notes,
            failures,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Record {
        let s = SeqRecord {
            tokens: vec![1, 2, 3],
            sampled: vec![],
            logit_start: 0,
            logits: vec![0.25; 3 * 4],
            k: vec![vec![1.0; 3 * 2]; 2],
            v: vec![vec![2.0; 3 * 2]; 2],
        };
        Record { seqs: vec![s], vocab: 4, kv_dim: 2 }
    }

    #[test]
    fn passes_only_with_equal_rows_a_caught_plant_and_no_failures() {
        let a = rec();
        let mut c = Collector::new("t", 1, 2, 2);
        c.compare("first".into(), &a, &a);
        c.compare("second".into(), &a, &a);
        let o = c.finish("x".into(), 0, vec![]);
        assert!(o.passed() && o.plant.caught(), "{o}");
        assert!(o.to_string().starts_with("PASS t: x;"), "{o}");
        assert_eq!((o.compared.comparisons, o.compared.logit_rows, o.compared.kv_rows), (2, 6, 6));

        // An uncaught plant fails the check even though no row differs.
        let mut blind = o.clone();
        blind.plant.reported.clear();
        assert!(!blind.passed() && blind.to_string().starts_with("FAIL"), "{blind}");
        // A plant reported together with another row is not caught either.
        let mut loose = o.clone();
        loose.plant.reported.push(RowId { seq: 0, pos: 2, part: Part::Logits });
        assert!(!loose.passed());
        // A failure besides rows fails it.
        let mut other = o.clone();
        other.failures.push("seed ignored".into());
        assert!(!other.passed() && other.to_string().contains("FAILED: seed ignored"));
    }

    #[test]
    fn a_differing_row_fails_and_the_plant_still_counts_exactly() {
        let a = rec();
        let mut b = a.clone();
        b.seqs[0].v[1][5] = 2.5;
        let mut c = Collector::new("t", 3, 1, 2);
        c.compare("only".into(), &a, &b);
        let o = c.finish("x".into(), 0, vec![]);
        assert!(!o.passed());
        assert_eq!(o.differing_rows(), 1);
        assert_eq!(o.comparisons[0].diffs[0].row, RowId { seq: 0, pos: 2, part: Part::V(1) });
        // Planted into the baseline's copy (the candidate differs), so exactly one row.
        assert!(o.plant.caught(), "{}", o.plant);
        assert_eq!(o.comparisons[0].summary(), "1 differing rows (V 1) from seq 0 pos 2");
    }

    #[test]
    fn no_comparison_means_no_plant_and_a_failure() {
        let o = Collector::new("t", 0, 1, 2).finish("x".into(), 0, vec![]);
        assert!(!o.passed() && !o.failures.is_empty());
    }
}
