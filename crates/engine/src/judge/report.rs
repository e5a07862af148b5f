//! What the judge found: figures, every top-1 difference with its verdict, and the one-line
//! receipt. Serializable, so `tensorfold judge --json` and tests read the same numbers the
//! text shows.
//!
//! Invariant: `passed()` is true only when every difference's verdict is a near-tie; the
//! figures (mean/max KL, top-1 agreement) are reported, and targets on them are held by the
//! caller (the CLI test), since a bound depends on the checkpoint being judged.

use std::fmt::Write;

use serde::Serialize;

use super::verdict::{Agrees, Contenders, Verdict};

/// How the KL figures were computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KlMethod {
    /// Exactly over the full vocabulary, from the reference's full rows.
    Full,
    /// From the reference's top-k + lse: the top-k + rest coarse-graining, a lower bound.
    TopkRest,
}

impl KlMethod {
    pub fn describe(self) -> &'static str {
        match self {
            KlMethod::Full => "full vocabulary, exact",
            KlMethod::TopkRest => "top-k + rest lumped: a lower bound of the full-vocabulary KL",
        }
    }
}

/// The top-k + lse figures, computed whatever the method (to compare against `Full`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TopkSummary {
    pub k: usize,
    /// Mean over positions of the lumped lower bound.
    pub mean_lower: f64,
    /// Mean over positions of the (loose) upper bound.
    pub mean_upper: f64,
    /// Mean reference probability mass outside the top-k.
    pub mean_rest_mass: f64,
}

/// One position where the two sides' top-1 differ; `a` is the reference's, `b` the engine's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Difference {
    pub position: usize,
    /// The history's next token (the one this row predicts), if inside the history.
    pub next_token: Option<u32>,
    pub a: u32,
    pub b: u32,
    pub reference: Contenders,
    pub engine: Contenders,
    pub float64: Option<Contenders>,
    /// Which contender float64 ranks higher (with the float64 pass).
    pub float64_agrees: Option<Agrees>,
    /// Whether `a` and `b` are within one bf16 step in float64 too (with the float64 pass).
    pub float64_near_tie: Option<bool>,
    pub verdict: Verdict,
}

/// The judge's findings over `positions` rows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub positions: usize,
    pub vocab: usize,
    pub kl_method: KlMethod,
    pub mean_kl: f64,
    pub max_kl: f64,
    pub max_kl_position: usize,
    pub topk: TopkSummary,
    pub top1_agree: usize,
    /// With the float64 pass: both sides' distance from float64.
    pub float64: Option<Float64Figures>,
    pub differences: Vec<Difference>,
}

/// How far each side is from float64 (the same family in f64), over all positions, and
/// which side float64 takes at the differences. KL is KL(float64 || side): exact with full
/// reference rows, else both coarse-grained to the reference's top-k + rest.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Float64Figures {
    pub kl_to_reference: f64,
    pub kl_to_engine: f64,
    /// Positions where float64's top-1 is the reference's (resp. the engine's).
    pub top1_reference: usize,
    pub top1_engine: usize,
    /// At the differences: float64 ranks the reference's contender higher / the engine's /
    /// neither.
    pub sides_with_reference: usize,
    pub sides_with_engine: usize,
    pub ties: usize,
    /// Differences whose two contenders are within one bf16 step in float64 too.
    pub near_ties: usize,
}

impl Report {
    pub fn near_ties(&self) -> usize {
        self.differences.iter().filter(|d| d.verdict.passed()).count()
    }

    pub fn failures(&self) -> usize {
        self.differences.len() - self.near_ties()
    }

    pub fn passed(&self) -> bool {
        self.failures() == 0
    }

    pub fn top1_percent(&self) -> f64 {
        100.0 * self.top1_agree as f64 / self.positions.max(1) as f64
    }

    /// The final one-line receipt.
    pub fn receipt(&self) -> String {
        let kl = match self.kl_method {
            KlMethod::Full => "full vocabulary",
            KlMethod::TopkRest => "top-k+rest lower bound",
        };
        format!(
            "judge: positions {} | mean KL {:.6} ({kl}) | max KL {:.6} (position {}) | top-1 \
             {:.2}% ({}/{}) | differences {} (near-ties {} / failures {}){} | {}",
            self.positions,
            self.mean_kl,
            self.max_kl,
            self.max_kl_position,
            self.top1_percent(),
            self.top1_agree,
            self.positions,
            self.differences.len(),
            self.near_ties(),
            self.failures(),
            self.float64.map(|f| f.receipt(self.positions)).unwrap_or_default(),
            if self.passed() { "PASS" } else { "FAIL" },
        )
    }
}

impl Float64Figures {
    fn receipt(&self, n: usize) -> String {
        let pct = |x: usize| 100.0 * x as f64 / n.max(1) as f64;
        format!(
            " | float64: KL to reference {:.6}, to engine {:.6}; top-1 = reference {:.2}%, = \
             engine {:.2}%; at differences sides with reference {} / engine {} / tie {}, \
             near-tie in float64 {}",
            self.kl_to_reference,
            self.kl_to_engine,
            pct(self.top1_reference),
            pct(self.top1_engine),
            self.sides_with_reference,
            self.sides_with_engine,
            self.ties,
            self.near_ties,
        )
    }
}

impl Difference {
    /// A multi-line description; `name(id)` renders a token (its text, or the id alone).
    pub fn describe(&self, name: &dyn Fn(u32) -> String) -> String {
        let verdict = match self.verdict {
            Verdict::NearTie => "near-tie: passes".to_string(),
            Verdict::ThirdContender { side } => {
                format!("FAILS: third contender ({side}: a contender is not among its top-2)")
            }
            Verdict::Wide { side } => format!("FAILS: wider than one bf16 step on the {side} side"),
        };
        let mut s = format!(
            "position {}{}: reference top-1 {} vs engine top-1 {}: {verdict}\n",
            self.position,
            self.next_token.map(|t| format!(" (next token {})", name(t))).unwrap_or_default(),
            name(self.a),
            name(self.b),
        );
        let sides = [("reference", Some(&self.reference)), ("engine", Some(&self.engine))];
        for (label, c) in sides.into_iter().chain([("float64", self.float64.as_ref())]) {
            if let Some(c) = c {
                let _ = writeln!(s, "  {label:<9} {}", side_line(c, self.a, self.b, name));
            }
        }
        if let Some(agrees) = self.float64_agrees {
            let who = match agrees {
                Agrees::Reference => "float64 agrees with the reference",
                Agrees::Engine => "float64 agrees with the engine",
                Agrees::Tie => "float64 ties the two",
            };
            let tie = match self.float64_near_tie {
                Some(true) => "a near-tie in float64 too",
                _ => "NOT a near-tie in float64",
            };
            let _ = writeln!(s, "  {who}; {tie}");
        }
        s
    }
}

fn side_line(c: &Contenders, a: u32, b: u32, name: &dyn Fn(u32) -> String) -> String {
    let top: Vec<String> = c.top.iter().map(|&(id, l)| format!("{} {l}", name(id))).collect();
    let b_logit = c.b.map_or("not in top-k".to_string(), |v| v.to_string());
    let margin = c.margin_steps().map_or("unknown".to_string(), |m| format!("{m:.2} bf16 steps"));
    format!(
        "top [{}]; a={} {} (rank {}), b={} {} (rank {}); |a-b| {margin}",
        top.join(", "),
        a,
        c.a,
        c.rank_a,
        b,
        b_logit,
        c.rank_b.map_or("> k".to_string(), |r| r.to_string()),
    )
}
