//! `tensorfold check exact`: runs the exactness checkers of DESIGN.md §1 (`windows`,
//! `concurrent`, `resumed`, `seeded`, from `tf_engine::check`) on a model and prints one line
//! per checker: PASS/FAIL, what was compared, the planted control and whether it was caught,
//! and the state fingerprint (so two machines or builds compare by one line). Exit 1 on any
//! failure, with every differing row listed (up to a limit per comparison).
//!
//! The token history is the model's tokenization of `check::history::PASSAGE`, extended with
//! seeded pseudo-random ids to `--tokens`. Progress goes to stderr, results to stdout.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use tf_backend::Backend;
use tf_checkpoint::Checkpoint;
use tf_engine::check::fault::{Fault, Faulty};
use tf_engine::check::{self, history, CheckOutcome};
use tf_engine::family::{self, CausalLm, LoadOptions};

use crate::cmd::text::Text;
use crate::device::{with_backend, DeviceArgs, OnDevice, WithBackend};

#[derive(Args)]
pub struct CheckArgs {
    #[command(subcommand)]
    pub what: CheckCmd,
}

#[derive(Subcommand)]
pub enum CheckCmd {
    /// Exactness: windows == steps, concurrent == solo, resumed == fresh, seeded == seeded,
    /// each compared bit for bit with a planted control.
    Exact(ExactArgs),
}

#[derive(Args)]
pub struct ExactArgs {
    /// A GGUF file or an HF checkpoint directory (default: the fetched test model).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Checkers to run, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Checker>,
    /// Length of the teacher-forced token history (at least 64); `windows` prefills all of it
    /// in one call as its baseline.
    #[arg(long, default_value_t = 320)]
    pub tokens: usize,
    /// Seed of every random choice (mixes, chunk sizes, block tables, planted rows) and of the
    /// sampler in `seeded`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub dev: DeviceArgs,
    /// Run on a deliberately row-dependent model, to see the checks fail (self-test).
    #[arg(long, value_enum, hide = true)]
    pub fault: Option<FaultArg>,
}

/// A planted fault (`tf_engine::check::fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FaultArg {
    /// Low bits of a logit per row flipped by a mask depending on the call's row count.
    RowDependentLogits,
    /// The first row's token replaced in calls of more than 8 rows (reaches the KV).
    RowDependentToken,
}

/// One checker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Checker {
    Windows,
    Concurrent,
    Resumed,
    Seeded,
}

/// Differing rows listed per comparison of a failed check.
const SHOW_DIFFS: usize = 12;

/// Loads the model on a fresh backend of `dev` (wrapped in `fault`, if any).
fn load<B: Backend + 'static>(
    dev: &OnDevice<B>,
    path: &Path,
    opts: LoadOptions,
    fault: Option<FaultArg>,
) -> tf_engine::Result<Box<dyn CausalLm<B>>> {
    let ckpt = Checkpoint::open(path)?;
    let inner = family::load(&ckpt, dev.backend()?, opts)?;
    Ok(match fault {
        None => inner,
        Some(FaultArg::RowDependentLogits) => {
            Box::new(Faulty { inner, fault: Fault::RowDependentLogits })
        }
        Some(FaultArg::RowDependentToken) => {
            Box::new(Faulty { inner, fault: Fault::RowDependentToken })
        }
    })
}

fn print_failure(o: &CheckOutcome) {
    for c in o.comparisons.iter().filter(|c| !c.diffs.is_empty()) {
        println!("    {}: {}", c.label, c.summary());
        for d in c.by_position().into_iter().take(SHOW_DIFFS) {
            println!("      {d}");
        }
        if c.diffs.len() > SHOW_DIFFS {
            println!("      ... {} more", c.diffs.len() - SHOW_DIFFS);
        }
    }
    if !o.plant.caught() {
        let rows: Vec<String> =
            o.plant.reported.iter().take(SHOW_DIFFS).map(|r| r.to_string()).collect();
        println!("    planted control {} reported: [{}]", o.plant, rows.join("; "));
    }
}

pub fn run(a: CheckArgs) -> Result<()> {
    let CheckCmd::Exact(a) = a.what;
    let dev = a.dev;
    with_backend(&dev, a)
}

impl WithBackend for ExactArgs {
    type Out = ();
    fn run<B: Backend + 'static>(self, dev: &OnDevice<B>) -> Result<()> {
        exact(self, dev)
    }
}

fn exact<B: Backend + 'static>(a: ExactArgs, dev: &OnDevice<B>) -> Result<()> {
    if a.tokens < 64 {
        bail!("--tokens {}: the checks need at least 64 tokens of history", a.tokens);
    }
    let path = crate::model_path::resolve(a.model.clone())?;
    let ckpt = Checkpoint::open(&path)?;
    let text = Text::load(&ckpt)?;
    let ids = text.codec.encode(history::PASSAGE, false)?;
    let tokens = history::history(&ids, a.tokens, ckpt.spec.vocab_size, a.seed);
    drop(ckpt);
    let opts = LoadOptions { max_rows: a.tokens.max(128), max_positions: a.tokens + 64 };
    let mut model =
        load(dev, &path, opts, a.fault).with_context(|| format!("loading {}", path.display()))?;
    let only = if a.only.is_empty() {
        vec![Checker::Windows, Checker::Concurrent, Checker::Resumed, Checker::Seeded]
    } else {
        a.only.clone()
    };
    println!(
        "check exact: {} | {} | {} tokens of history (the passage is {} tokens) | seed {}{}",
        path.display(),
        model.backend().name(),
        tokens.len(),
        ids.len(),
        a.seed,
        a.fault.map_or(String::new(), |f| format!(" | PLANTED FAULT {f:?}"))
    );
    let t0 = Instant::now();
    let mut progress = |s: &str| eprintln!("  [{:6.1}s] {s}", t0.elapsed().as_secs_f64());
    let mut failed = Vec::new();
    for c in &only {
        let m = model.as_mut();
        let out = match c {
            Checker::Windows => {
                let o = check::WindowsOpts { seed: a.seed, ..Default::default() };
                check::windows(m, &tokens, &o, &mut progress)
            }
            Checker::Concurrent => {
                let o = check::ConcurrentOpts { seed: a.seed, ..Default::default() };
                check::concurrent(m, &tokens, &o, &mut progress)
            }
            Checker::Resumed => {
                let o = check::ResumedOpts { seed: a.seed, ..Default::default() };
                check::resumed(m, &tokens, &o, &mut progress)
            }
            Checker::Seeded => {
                let o = check::SeededOpts { seed: a.seed, ..Default::default() };
                let mut restart = || load(dev, &path, opts, a.fault);
                check::seeded(m, &mut restart, &tokens, &o, &mut progress)
            }
        }
        .with_context(|| format!("running the {c:?} check"))?;
        println!("{out}");
        if !out.passed() {
            print_failure(&out);
            failed.push(out.name);
        }
    }
    eprintln!("  [{:6.1}s] done", t0.elapsed().as_secs_f64());
    if !failed.is_empty() {
        bail!("{} of {} checks failed: {}", failed.len(), only.len(), failed.join(", "));
    }
    Ok(())
}
