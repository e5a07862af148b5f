//! Verdicts, the printed lines and the SUMMARY count of the contract.
//!
//! Lines are printed as each unit is judged (gates 2 and 3 and both controls), then gates 1
//! and 4 from `Backend::kernels()` (queried last, so lazily compiled kernels are listed),
//! then the SUMMARY. A unit passes when its gates 1-4 all pass; a unit whose setup or op
//! failed fails every gate and misses both controls (they could not be planted), so an
//! error can never turn into a green SUMMARY.

use std::collections::BTreeMap;
use std::time::Instant;

use super::data::{Rng, Scratch};
use super::geometry::{Geometry, Unit};
use super::{attention, ops, rows, ContractConfig, ContractError};
use crate::{Backend, KernelInfo};

/// One gate's (or control's) outcome; for a control `ok` means red as planted.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub ok: bool,
    pub detail: String,
}

impl Verdict {
    pub fn pass(detail: String) -> Verdict {
        Verdict { ok: true, detail }
    }
    pub fn fail(detail: String) -> Verdict {
        Verdict { ok: false, detail }
    }
}

/// Gates 2 and 3 and the two controls of one unit.
#[derive(Clone, Debug)]
pub struct Judged {
    pub bound: Verdict,
    pub rows: Verdict,
    pub ctl_bound: Verdict,
    pub ctl_row: Verdict,
}

impl Judged {
    pub fn error(e: &ContractError) -> Judged {
        let v = Verdict::fail(format!("could not run: {e}"));
        Judged { bound: v.clone(), rows: v.clone(), ctl_bound: v.clone(), ctl_row: v }
    }
}

/// A judged unit.
#[derive(Clone, Debug)]
pub struct UnitResult {
    /// The op's name as printed (`kv_store` and `attention` are two units of one family).
    pub op: &'static str,
    pub geometry: &'static str,
    pub label: String,
    /// `KernelInfo::family` values behind the op.
    pub sources: &'static [&'static str],
    pub judged: Judged,
}

/// The counts of the SUMMARY line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    pub kernels: usize,
    pub pass: usize,
    pub fail: usize,
    pub controls: usize,
    pub red: usize,
    pub missed: usize,
}

impl Summary {
    /// Every unit passed gates 1-4 and every control came out red.
    pub fn ok(&self) -> bool {
        self.fail == 0 && self.missed == 0 && self.kernels > 0
    }

    pub fn line(&self) -> String {
        format!(
            "SUMMARY {} kernels: {} pass gates 1-4, {} fail; {} controls: {} red as planted, {} missed",
            self.kernels, self.pass, self.fail, self.controls, self.red, self.missed
        )
    }
}

fn label(unit: &Unit) -> String {
    match unit {
        Unit::Norm { what, cols, group } => format!("{what} [{cols} / {group}]"),
        Unit::Linear { what, n, k, bias } => {
            format!("{what} [{n} x {k}]{}", if *bias { " +bias" } else { "" })
        }
        Unit::Rope { what, heads, style } => format!("{what} {heads} heads {style:?}"),
        Unit::AddNorm => "add + rms_norm hidden".into(),
        Unit::LinearGroup { bias } => format!("q,k,v{}", if *bias { " +bias" } else { "" }),
        Unit::LinearSwiglu => "gate,up + swiglu".into(),
        Unit::RopeKv { style } => format!("rope q,k + kv_store {style:?}"),
        Unit::AddNormGroup => "add + rms_norm + q,k,v".into(),
        Unit::QkvRope { norm: true, style } => {
            format!("add + rms_norm + q,k,v + rope {style:?} + kv")
        }
        Unit::QkvRope { norm: false, style } => format!("q,k,v + rope {style:?} + kv_store"),
        Unit::AddNormSwiglu => "add + rms_norm + gate,up + swiglu".into(),
        _ => String::new(),
    }
}

fn line(r: &UnitResult, gate: &str, v: &Verdict, control: bool) -> String {
    let word = match (control, v.ok) {
        (false, true) => "PASS",
        (false, false) => "FAIL",
        (true, true) => "RED",
        (true, false) => "MISSED",
    };
    format!("{:<9} {:<9} {:<26} {gate:<18} {word:<6} {}", r.op, r.geometry, r.label, v.detail)
}

/// Judges one unit (two for attention) and prints its lines.
pub fn run_unit<B: Backend>(
    be: &B,
    g: &Geometry,
    unit: &Unit,
    cfg: &ContractConfig,
    out: &mut dyn FnMut(&str),
) -> Vec<UnitResult> {
    let label = label(unit);
    let family = unit.family();
    let mut rng = Rng::derive(cfg.seed, &format!("{}/{}/{label}", g.name, family.name()));
    let t0 = Instant::now();
    let judged: Vec<(&'static str, &'static [&'static str], Judged)> =
        match Scratch::new(&cfg.scratch) {
            Err(e) => vec![(family.name(), family.kernel_sources(), Judged::error(&e))],
            Ok(s) => match unit {
                Unit::Attention => {
                    let [kv, at] = attention::run(be, g, &s, &mut rng);
                    vec![("kv_store", &["kv"], kv), ("attention", &["attention"], at)]
                }
                _ => {
                    let j = match ops::build(be, g, unit, &s, &mut rng) {
                        Ok(mut case) => rows::drive(be, case.as_mut(), &mut rng),
                        Err(e) => Judged::error(&e),
                    };
                    vec![(family.name(), family.kernel_sources(), j)]
                }
            },
        };
    let secs = t0.elapsed().as_secs_f64();
    let mut results = Vec::new();
    for (op, sources, judged) in judged {
        let r = UnitResult { op, geometry: g.name, label: label.clone(), sources, judged };
        let j = &r.judged;
        out(&line(&r, "gate 2 f64 bound", &j.bound, false));
        let rows = Verdict { detail: format!("{} [{secs:.1} s]", j.rows.detail), ..j.rows.clone() };
        out(&line(&r, "gate 3 row-invar", &rows, false));
        out(&line(&r, "control 1%-off ref", &j.ctl_bound, true));
        out(&line(&r, "control row flip", &j.ctl_row, true));
        results.push(r);
    }
    results
}

/// Gates 1 and 4 of one kernel source family.
struct SourceGates {
    compiled: Verdict,
    limits: Verdict,
}

fn source_gates(entries: &[&KernelInfo]) -> SourceGates {
    let names: Vec<&str> = entries.iter().map(|k| k.name.as_str()).collect();
    let first_line = |s: &str| s.lines().next().unwrap_or("").to_string();
    let compiled = match entries.iter().find(|k| k.compiled.is_err()) {
        None => Verdict::pass(format!("{} kernels compiled: {}", names.len(), names.join(", "))),
        Some(k) => Verdict::fail(format!(
            "{} did not compile: {}",
            k.name,
            first_line(k.compiled.as_ref().err().map_or("", |s| s))
        )),
    };
    let limits = match entries.iter().find(|k| k.limits.is_err()) {
        None => {
            let regs = entries.iter().map(|k| k.registers).max().unwrap_or(0);
            let smem = entries.iter().map(|k| k.shared_bytes).max().unwrap_or(0);
            let launch = entries.iter().map(|k| k.launch_threads).max().unwrap_or(0);
            Verdict::pass(format!(
                "within the device's: registers <= {regs}, shared <= {smem} B, launch <= {launch} threads"
            ))
        }
        Some(k) => Verdict::fail(format!(
            "{}: {}",
            k.name,
            k.limits.as_ref().err().map_or("", |s| s.as_str())
        )),
    };
    SourceGates { compiled, limits }
}

/// Prints gates 1 and 4, then counts the SUMMARY.
pub fn finish(
    results: &[UnitResult],
    kernels: crate::Result<Vec<KernelInfo>>,
    out: &mut dyn FnMut(&str),
) -> Summary {
    let kernels = match kernels {
        Ok(k) => k,
        Err(e) => {
            out(&format!("gates 1 and 4    FAIL   Backend::kernels() failed: {e}"));
            return count(results, |_| false, 0);
        }
    };
    if kernels.is_empty() {
        out("gate 1 compiles  PASS   vacuous: the backend reports no separately compiled kernels (Backend::kernels() is empty)");
        out("gate 4 limits    PASS   vacuous: no compiled kernels, so no registers, shared memory or launch bounds to check");
        return count(results, |_| true, 0);
    }
    let mut by_source: BTreeMap<String, Vec<&KernelInfo>> = BTreeMap::new();
    for k in &kernels {
        by_source.entry(k.family.trim_end_matches(".cu").to_string()).or_default().push(k);
    }
    let mut gates: BTreeMap<&str, SourceGates> = BTreeMap::new();
    let mut unclaimed = 0;
    for (src, entries) in &by_source {
        let sg = source_gates(entries);
        let claimed = results.iter().any(|r| r.sources.contains(&src.as_str()));
        let word = |v: &Verdict| if v.ok { "PASS" } else { "FAIL" };
        out(&format!(
            "kernels   {src:<36} gate 1 compiles   {:<6} {}",
            word(&sg.compiled),
            sg.compiled.detail
        ));
        out(&format!(
            "kernels   {src:<36} gate 4 limits     {:<6} {}",
            word(&sg.limits),
            sg.limits.detail
        ));
        if !claimed {
            unclaimed += 1;
            out(&format!(
                "kernels   {src:<36} unclaimed         FAIL   no op of the contract drives these kernels (gates 2, 3 cannot be judged): add the source to contract::geometry::Family::kernel_sources"
            ));
        }
        gates.insert(src.as_str(), sg);
    }
    let unit_ok = |r: &UnitResult| {
        r.sources.iter().all(|s| gates.get(s).is_some_and(|g| g.compiled.ok && g.limits.ok))
    };
    for r in results.iter().filter(|r| !r.sources.iter().all(|s| gates.contains_key(s))) {
        out(&line(
            r,
            "gates 1, 4",
            &Verdict::fail(format!(
                "no kernels() entry of source {:?}: cannot see what serves this op",
                r.sources
            )),
            false,
        ));
    }
    count(results, unit_ok, unclaimed)
}

fn count(
    results: &[UnitResult],
    gates_1_4: impl Fn(&UnitResult) -> bool,
    extra_fail: usize,
) -> Summary {
    let pass =
        results.iter().filter(|r| gates_1_4(r) && r.judged.bound.ok && r.judged.rows.ok).count();
    let red = results
        .iter()
        .map(|r| usize::from(r.judged.ctl_bound.ok) + usize::from(r.judged.ctl_row.ok))
        .sum();
    let kernels = results.len() + extra_fail;
    let controls = 2 * results.len();
    Summary { kernels, pass, fail: kernels - pass, controls, red, missed: controls - red }
}
