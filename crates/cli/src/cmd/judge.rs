//! `tensorfold judge`: the teacher-forced fidelity judge of DESIGN.md §2 on one model.
//!
//! Reads a reference made by `tools/reference/hf_logits.py` (JSON, and optionally the full
//! rows `.bin` written with `--full-out`), scores the reference's token history with the
//! engine (`Generator::score`, on the backend `--device` picks) and, with `--f64`, with the
//! same family on the float64 reference backend (always on the CPU), then hands the rows to
//! `tf_engine::judge`. Prints every top-1 difference with both sides' contenders, margins and
//! verdict, and ends stdout with the one-line receipt. Exit 1 when any difference is not a
//! near-tie, or when a row of any side holds NaN or +-Inf (refused, naming side and position,
//! before any comparison).
//!
//! KL is exact over the full vocabulary only with `--reference-logits`; without it the figure
//! is the top-k + rest lower bound, and the receipt says which. `--candidate` judges another
//! reference's full rows in the engine's place (HF eager against HF sdpa: the yardstick of how
//! far two runs of the reference itself are apart), through the same code.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tf_backend::f64ref::F64Backend;
use tf_backend::Backend;
use tf_checkpoint::Checkpoint;
use tf_engine::family::{self, LoadOptions};
use tf_engine::generate::{Generator, BLOCK_SIZE};
use tf_engine::judge::{self, FullRows, JudgeInput, KlMethod, RefFile, Reference};

use crate::cmd::text::Text;
use crate::device::{with_backend, DeviceArgs, OnDevice, WithBackend};

#[derive(Args)]
pub struct JudgeArgs {
    /// Reference JSON from tools/reference/hf_logits.py (format tensorfold-ref-logits/1).
    #[arg(long)]
    pub reference: PathBuf,
    /// The reference's full rows (.bin from hf_logits.py --full-out): KL over the full
    /// vocabulary, exactly. Without it KL is the top-k + rest lower bound.
    #[arg(long)]
    pub reference_logits: Option<PathBuf>,
    /// A GGUF file or an HF checkpoint directory (default: the fetched test model).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Also run the float64 reference backend and judge every difference against it.
    #[arg(long)]
    pub f64: bool,
    /// Judge only the first N positions of the history.
    #[arg(long)]
    pub max_positions: Option<usize>,
    /// Rows per forward step when scoring (a speed knob: chunking changes no value).
    #[arg(long, default_value_t = 256)]
    pub chunk: usize,
    // The engine side runs on --device; the float64 pass (--f64) always runs on the CPU, with
    // --threads.
    #[command(flatten)]
    pub dev: DeviceArgs,
    /// Also write the report (figures and every difference) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Judge another reference's full rows instead of the engine (e.g. HF eager against HF
    /// sdpa: how far two runs of the reference itself are apart). Needs --candidate-logits.
    #[arg(long, requires = "candidate_logits")]
    pub candidate: Option<PathBuf>,
    /// The candidate's full rows (.bin from hf_logits.py --full-out).
    #[arg(long, requires = "candidate")]
    pub candidate_logits: Option<PathBuf>,
    /// Also write the scored rows, raw little-endian f32 `(positions, vocab)`, into this
    /// directory: `engine.f32.bin` (and `float64.f32.bin` with --f64), for offline analysis.
    #[arg(long)]
    pub save_logits: Option<PathBuf>,
}

/// Writes `rows` as raw little-endian f32 to `dir/name`.
fn save_rows(dir: &std::path::Path, name: &str, rows: &[f32]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// A reference JSON and, if given, its full rows.
fn load_reference(json: &Path, bin: Option<&Path>) -> Result<Reference> {
    let bytes = std::fs::read(json).with_context(|| format!("reading {}", json.display()))?;
    let file: RefFile =
        serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", json.display()))?;
    let full = match bin {
        None => None,
        Some(bin) => {
            let desc = file.full_logits.as_ref().with_context(|| {
                format!(
                    "{} records no full_logits; make it with hf_logits.py --full-out",
                    json.display()
                )
            })?;
            Some(FullRows::read(bin, desc)?)
        }
    };
    Reference::new(file, full).with_context(|| format!("checking {}", json.display()))
}

/// The candidate's full rows as f32 `(n, vocab)` (bf16 and f32 exactly; f64 rounded once),
/// after checking it read the same tokens as the reference.
fn candidate_rows(a: &JudgeArgs, reference: &Reference, n: usize) -> Result<Vec<f32>> {
    let (Some(json), Some(bin)) = (&a.candidate, &a.candidate_logits) else {
        bail!("--candidate and --candidate-logits go together");
    };
    let cand = load_reference(json, Some(bin))?;
    if cand.tokens.get(..n) != reference.tokens.get(..n) || cand.vocab != reference.vocab {
        bail!("{}: not the reference's token history or vocabulary", json.display());
    }
    let full = cand.full.as_ref().context("candidate full rows")?;
    Ok((0..n).flat_map(|i| full.row(i)).map(|v| v as f32).collect())
}

/// The engine's scoring of a token history, run on the chosen device.
struct EngineScore<'a> {
    ckpt: &'a Checkpoint,
    tokens: &'a [u32],
    chunk: usize,
}

impl WithBackend for EngineScore<'_> {
    type Out = Vec<f32>;
    fn run<B: Backend + 'static>(self, dev: &OnDevice<B>) -> Result<Vec<f32>> {
        score(self.ckpt, dev.backend()?, self.tokens, self.chunk)
    }
}

/// Teacher-forced logits of `tokens` on `backend`, `(tokens, vocab)`.
fn score<B: Backend + 'static>(
    ckpt: &Checkpoint,
    backend: B,
    tokens: &[u32],
    chunk: usize,
) -> Result<Vec<f32>> {
    let label = backend.name();
    let t0 = Instant::now();
    let opts = LoadOptions { max_rows: chunk.max(1), max_positions: tokens.len() };
    let model = family::load(ckpt, backend, opts)?;
    let mut gen = Generator::new(model, tokens.len().div_ceil(BLOCK_SIZE))?;
    let t1 = Instant::now();
    let rows = gen.score(tokens, chunk)?;
    eprintln!(
        "judge: {label}: load {:.1}s, {} positions scored in {:.1}s",
        (t1 - t0).as_secs_f64(),
        tokens.len(),
        t1.elapsed().as_secs_f64()
    );
    Ok(rows)
}

pub fn run(a: JudgeArgs) -> Result<()> {
    let reference = load_reference(&a.reference, a.reference_logits.as_deref())?;
    let n = a.max_positions.unwrap_or(usize::MAX).min(reference.tokens.len());
    if n == 0 {
        bail!("--max-positions 0: nothing to judge");
    }
    let path = crate::model_path::resolve(a.model.clone())?;
    let ckpt = Checkpoint::open(&path)?;
    if ckpt.spec.vocab_size != reference.vocab {
        bail!(
            "{}: vocabulary of {}, but the reference {} has {}",
            path.display(),
            ckpt.spec.vocab_size,
            a.reference.display(),
            reference.vocab
        );
    }
    let tokens = &reference.tokens[..n];
    let method = if reference.full.is_some() { KlMethod::Full } else { KlMethod::TopkRest };
    let judged = match &a.candidate {
        Some(c) => format!("candidate {}", c.display()),
        None => format!("model {}", path.display()),
    };
    println!(
        "judge: {judged} vs reference {} ({} {}, {}), {n} positions, KL {}",
        a.reference.display(),
        reference.model,
        reference.dtype,
        versions(&reference),
        method.describe()
    );
    let engine = match &a.candidate {
        Some(_) => candidate_rows(&a, &reference, n)?,
        None => with_backend(&a.dev, EngineScore { ckpt: &ckpt, tokens, chunk: a.chunk })?,
    };
    let float64 = match a.f64 {
        true => {
            let f64ref = F64Backend::with_threads(&ckpt.spec.rope, a.dev.threads)?;
            Some(score(&ckpt, f64ref, tokens, a.chunk)?)
        }
        false => None,
    };
    if let Some(dir) = &a.save_logits {
        save_rows(dir, "engine.f32.bin", &engine)?;
        if let Some(f) = &float64 {
            save_rows(dir, "float64.f32.bin", f)?;
        }
    }
    let input = JudgeInput {
        reference: &reference,
        engine: &engine,
        float64: float64.as_deref(),
        positions: n,
    };
    let report = judge::judge(&input)?;
    print_report(&ckpt, &report);
    if let Some(p) = &a.json {
        let s = serde_json::to_string_pretty(&report)? + "\n";
        std::fs::write(p, s).with_context(|| format!("writing {}", p.display()))?;
    }
    if !report.passed() {
        bail!(
            "{} of {} top-1 differences are not near-ties",
            report.failures(),
            report.differences.len()
        );
    }
    Ok(())
}

/// Every difference (tokens named by the checkpoint's tokenizer when it loads), the top-k
/// figures, and the receipt as the last line.
fn print_report(ckpt: &Checkpoint, report: &judge::Report) {
    let text = Text::load(ckpt).ok();
    let name = |id: u32| match text.as_ref().and_then(|t| t.codec.decode(&[id], false).ok()) {
        Some(s) => format!("{id} {s:?}"),
        None => id.to_string(),
    };
    let mut out = String::new();
    for d in &report.differences {
        out.push_str(&d.describe(&name));
    }
    let t = &report.topk;
    out.push_str(&format!(
        "top-k + lse figures (k = {}): mean lower bound {:.6}, mean upper bound {:.4}, mean \
         mass outside the top-k {:.4}\n",
        t.k, t.mean_lower, t.mean_upper, t.mean_rest_mass
    ));
    out.push_str(&report.receipt());
    out.push('\n');
    crate::cmd::print_out(&out);
}

fn versions(r: &Reference) -> String {
    let v: Vec<String> =
        r.versions.iter().map(|(k, v)| format!("{k} {}", v.as_deref().unwrap_or("-"))).collect();
    v.join(", ")
}
