//! `concurrent == solo`: sequences whose rows share calls (seeded random mixes of prefill
//! chunks and decode rows, 1 to 16 sequences of different lengths, each call a random subset
//! of the unfinished sequences in random order, each advancing by a random chunk, at most
//! `max_rows` rows per call) give every row's logits and every layer's KV equal bit for bit to
//! each sequence run alone (prefilled whole).
//!
//! The sequences are slices of the token history at random offsets, so they hold different
//! tokens at the same positions: a kernel that mixed up sequences would show. Their blocks
//! are shuffled across the whole pool.

use tf_backend::{Backend, BatchMeta, SeqMeta};

use super::fingerprint::{self, Fnv};
use super::pool::{blocks_for, need, teacher, Pool};
use super::record::{Record, SeqRecord, Widths};
use super::rng::Rng;
use super::{CheckOutcome, Collector, Progress};
use crate::error::{EngineError, Result};
use crate::family::CausalLm;
use crate::generate::BLOCK_SIZE;

/// What `concurrent` runs.
#[derive(Clone, Debug)]
pub struct ConcurrentOpts {
    /// Mixes to run; the first has `max_seqs` sequences, the others a random count.
    pub mixes: usize,
    pub max_seqs: usize,
    /// Longest sequence (also bounded by the history's length).
    pub max_len: usize,
    /// Largest prefill chunk of one sequence in one call.
    pub max_chunk: usize,
    pub seed: u64,
}

impl Default for ConcurrentOpts {
    fn default() -> Self {
        ConcurrentOpts { mixes: 3, max_seqs: 16, max_len: 96, max_chunk: 48, seed: 0 }
    }
}

/// One mix: the sequences' tokens.
struct Mix {
    seqs: Vec<Vec<u32>>,
}

impl Mix {
    fn draw(history: &[u32], k: usize, max_len: usize, rng: &mut Rng) -> Mix {
        let max_len = max_len.min(history.len()).max(1);
        let mut lens: Vec<usize> = Vec::with_capacity(k);
        for _ in 0..k {
            // Different lengths where the range allows.
            let mut l = rng.range(1, max_len);
            for _ in 0..8 {
                if !lens.contains(&l) {
                    break;
                }
                l = rng.range(1, max_len);
            }
            lens.push(l);
        }
        let seqs = lens
            .iter()
            .map(|&l| {
                let off = rng.range(0, history.len() - l);
                history[off..off + l].to_vec()
            })
            .collect();
        Mix { seqs }
    }

    fn lens(&self) -> Vec<usize> {
        self.seqs.iter().map(Vec::len).collect()
    }
}

/// Each sequence alone, prefilled whole (in `max_rows` chunks if longer).
fn solo<B: Backend>(model: &mut dyn CausalLm<B>, pool: &mut Pool<B>, mix: &Mix) -> Result<Record> {
    let w = Widths::of(model);
    let max = model.max_rows();
    let mut seqs = Vec::with_capacity(mix.seqs.len());
    for toks in &mix.seqs {
        let table = pool.table(toks.len(), None)?;
        let logits = teacher(model, &mut pool.kv, &table, toks, 0, &mut |_, _| max)?;
        seqs.push(SeqRecord::capture(model, &pool.kv, &table, toks.clone(), (0, logits))?);
    }
    Ok(Record { seqs, vocab: w.vocab, kv_dim: w.kv_dim })
}

/// The rows of one call: (sequence, first position, rows).
fn schedule(
    rng: &mut Rng,
    lens: &[usize],
    done: &[usize],
    budget: usize,
    max_chunk: usize,
) -> Vec<(usize, usize, usize)> {
    let active: Vec<usize> = (0..lens.len()).filter(|&i| done[i] < lens[i]).collect();
    let mut pick: Vec<usize> = active.iter().copied().filter(|_| rng.coin()).collect();
    if pick.is_empty() {
        pick.push(active[rng.below(active.len())]);
    }
    rng.shuffle(&mut pick);
    let mut budget = budget;
    let mut out = Vec::with_capacity(pick.len());
    for i in pick {
        let rest = lens[i] - done[i];
        // Half the time a decode row, else a prefill chunk.
        let n = if rng.coin() { 1 } else { rng.range(1, rest.min(max_chunk)) };
        let n = n.min(rest).min(budget);
        if n == 0 {
            break;
        }
        out.push((i, done[i], n));
        budget -= n;
    }
    out
}

/// The sequences of `mix` sharing seeded random calls; returns the record and the call count.
fn mixed<B: Backend>(
    model: &mut dyn CausalLm<B>,
    pool: &mut Pool<B>,
    mix: &Mix,
    max_chunk: usize,
    rng: &mut Rng,
) -> Result<(Record, usize)> {
    let w = Widths::of(model);
    let lens = mix.lens();
    let tables = pool.tables(&lens, rng)?;
    let mut done = vec![0usize; lens.len()];
    let mut logits: Vec<Vec<f32>> = lens.iter().map(|&l| Vec::with_capacity(l * w.vocab)).collect();
    let mut calls = 0;
    while done.iter().zip(&lens).any(|(d, l)| d < l) {
        let plan = schedule(rng, &lens, &done, model.max_rows(), max_chunk);
        let mut meta = BatchMeta { block_size: BLOCK_SIZE, ..BatchMeta::default() };
        for (si, &(i, start, n)) in plan.iter().enumerate() {
            meta.tokens.extend_from_slice(&mix.seqs[i][start..start + n]);
            meta.positions.extend((start..start + n).map(|p| p as u32));
            meta.row_seq.extend(std::iter::repeat_n(si as u32, n));
            meta.seqs.push(SeqMeta { block_table: tables[i].clone() });
        }
        meta.logit_rows = (0..meta.rows() as u32).collect();
        let out = model.forward(&mut pool.kv, &meta)?;
        calls += 1;
        let mut row = 0;
        for &(i, _, n) in &plan {
            logits[i].extend_from_slice(&out[row * w.vocab..(row + n) * w.vocab]);
            row += n;
            done[i] += n;
        }
    }
    let mut seqs = Vec::with_capacity(lens.len());
    for ((toks, table), l) in mix.seqs.iter().zip(&tables).zip(logits) {
        seqs.push(SeqRecord::capture(model, &pool.kv, table, toks.clone(), (0, l))?);
    }
    Ok((Record { seqs, vocab: w.vocab, kv_dim: w.kv_dim }, calls))
}

/// Checks `concurrent == solo` on sequences cut from `history`.
pub fn concurrent<B: Backend>(
    model: &mut dyn CausalLm<B>,
    history: &[u32],
    opts: &ConcurrentOpts,
    progress: Progress<'_>,
) -> Result<CheckOutcome> {
    if history.is_empty() || opts.mixes == 0 || opts.max_seqs == 0 || opts.max_chunk == 0 {
        return Err(EngineError::Refused(
            "concurrent: needs a history, at least one mix, one sequence and a chunk above 0"
                .into(),
        ));
    }
    let max_len = opts.max_len.min(history.len()).max(1);
    need(model, "concurrent", 1, max_len)?;
    let w = Widths::of(model);
    let mut rng = Rng::derive(opts.seed, "concurrent");
    let mut col = Collector::new("concurrent", opts.seed, opts.mixes, w.layers);
    let mut fp = Fnv::new();
    let mut shapes = Vec::new();
    for m in 0..opts.mixes {
        let k = if m == 0 { opts.max_seqs } else { rng.range(1, opts.max_seqs) };
        let mix = Mix::draw(history, k, max_len, &mut rng);
        let lens = mix.lens();
        let total: usize = lens.iter().sum();
        let mut pool = Pool::new(model, 2 * blocks_for(lens.iter().copied()))?;
        progress(&format!("concurrent: mix {m}: {k} sequences, {total} rows, each alone"));
        let base = solo(model, &mut pool, &mix)?;
        progress(&format!("concurrent: mix {m}: the same rows in shared calls"));
        let (got, calls) = mixed(model, &mut pool, &mix, opts.max_chunk, &mut rng)?;
        let (lo, hi) = (lens.iter().min().unwrap_or(&0), lens.iter().max().unwrap_or(&0));
        let label = format!("mix {m} ({k} seqs of {lo}..{hi} tokens in {calls} calls)");
        shapes.push(format!("{k} seqs/{calls} calls"));
        col.compare(label, &base, &got);
        fp.u64(fingerprint::record(&base));
    }
    let what = format!(
        "{} mixes ({}) of shared calls vs each sequence alone",
        opts.mixes,
        shapes.join(", ")
    );
    Ok(col.finish(what, fp.finish(), Vec::new()))
}
