//! `windows == steps`: a token history prefilled whole, in chunks of 1 (one-row steps, the
//! shape of decode), 7, 16 and 128 rows, and in seeded ragged chunks, gives every row's logits
//! and every layer's KV equal bit for bit to the whole prefill.
//!
//! Each run writes fresh blocks; candidate runs use shuffled block tables (see `pool`).

use tf_backend::Backend;

use super::fingerprint;
use super::pool::{blocks_for, need, teacher, Pool};
use super::record::{Record, SeqRecord, Widths};
use super::rng::Rng;
use super::{CheckOutcome, Collector, Progress};
use crate::error::{EngineError, Result};
use crate::family::CausalLm;

/// What `windows` runs.
#[derive(Clone, Debug)]
pub struct WindowsOpts {
    /// Fixed chunk sizes compared with the whole prefill; 1 is the one-row steps of decode.
    pub chunks: Vec<usize>,
    /// Also a run in chunks of seeded random sizes (1 to 48 rows).
    pub ragged: bool,
    pub seed: u64,
}

impl Default for WindowsOpts {
    fn default() -> Self {
        WindowsOpts { chunks: vec![1, 7, 16, 128], ragged: true, seed: 0 }
    }
}

/// One teacher-forced run of `tokens` in chunks picked by `chunk`, recorded.
fn run<B: Backend>(
    model: &mut dyn CausalLm<B>,
    pool: &mut Pool<B>,
    tokens: &[u32],
    rng: Option<&mut Rng>,
    chunk: &mut dyn FnMut(usize, usize) -> usize,
) -> Result<Record> {
    let w = Widths::of(model);
    let table = pool.table(tokens.len(), rng)?;
    let logits = teacher(model, &mut pool.kv, &table, tokens, 0, chunk)?;
    let seq = SeqRecord::capture(model, &pool.kv, &table, tokens.to_vec(), (0, logits))?;
    Ok(Record { seqs: vec![seq], vocab: w.vocab, kv_dim: w.kv_dim })
}

/// Checks `windows == steps` on `tokens` (all of them prefilled in one call as the baseline,
/// so the model must be loaded for `tokens.len()` rows).
pub fn windows<B: Backend>(
    model: &mut dyn CausalLm<B>,
    tokens: &[u32],
    opts: &WindowsOpts,
    progress: Progress<'_>,
) -> Result<CheckOutcome> {
    let n = tokens.len();
    if n == 0 || opts.chunks.contains(&0) {
        return Err(EngineError::Refused("windows: needs tokens and chunk sizes above 0".into()));
    }
    need(model, "windows", n, n)?;
    let runs = opts.chunks.len() + 1 + usize::from(opts.ragged);
    let w = Widths::of(model);
    let mut pool = Pool::new(model, blocks_for(std::iter::repeat_n(n, runs)))?;
    let mut tables = Rng::derive(opts.seed, "windows tables");
    let mut sizes = Rng::derive(opts.seed, "windows ragged");
    let mut col = Collector::new("windows", opts.seed, runs - 1, w.layers);

    progress(&format!("windows: whole prefill of {n} rows (baseline)"));
    let base = run(model, &mut pool, tokens, None, &mut |_, rest| rest)?;
    for &c in &opts.chunks {
        let label = if c == 1 {
            "chunks of 1 (one-row steps)".to_string()
        } else {
            format!("chunks of {c}")
        };
        progress(&format!("windows: {label}: {} calls", n.div_ceil(c)));
        let got = run(model, &mut pool, tokens, Some(&mut tables), &mut |_, _| c)?;
        col.compare(label, &base, &got);
    }
    if opts.ragged {
        progress("windows: seeded ragged chunks of 1 to 48 rows");
        let mut calls = 0;
        let got = run(model, &mut pool, tokens, Some(&mut tables), &mut |_, _| {
            calls += 1;
            sizes.range(1, 48)
        })?;
        col.compare(format!("ragged chunks ({calls} calls)"), &base, &got);
    }
    let list: Vec<String> = opts.chunks.iter().map(usize::to_string).collect();
    let what = format!(
        "chunks of {}{} vs one whole prefill of {n} rows",
        list.join(", "),
        if opts.ragged { " and ragged" } else { "" }
    );
    Ok(col.finish(what, fingerprint::record(&base), Vec::new()))
}
