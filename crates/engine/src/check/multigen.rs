//! A tiny multi-sequence generation loop for the `seeded` checker: each call is one
//! `BatchMeta` holding the next rows of every active sequence (a prefill chunk, or the one
//! decode row of the token sampled last), in a seeded random order, at most `max_rows` rows.
//! Tokens are chosen with `Sampler::sample` at the new token's absolute position, exactly as
//! `generate` does for one sequence, and generation runs to `max_tokens` (stop tokens are not
//! special here: a check compares a fixed number of tokens).
//!
//! Rejected: reusing `Generator` (one sequence per call by design) or waiting for the server's
//! scheduler (the checker must exist first, to hold the scheduler to the contract).

use tf_backend::{Backend, BatchMeta, SeqMeta};

use super::record::SeqRecord;
use super::rng::Rng;
use crate::error::{EngineError, Result};
use crate::family::CausalLm;
use crate::generate::BLOCK_SIZE;
use crate::sampler::Sampler;

/// How a sequence's prompt is cut into calls.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Chunking {
    Fixed(usize),
    /// A seeded random size in `1..=max` per call.
    Random(usize),
}

/// One sequence of a multi-sequence generation.
pub(crate) struct GenSeq {
    pub prompt: Vec<u32>,
    pub sampler: Sampler,
    pub max_tokens: usize,
    pub table: Vec<u32>,
    /// The first call this sequence takes part in.
    pub start_call: usize,
    pub chunking: Chunking,
    /// Positions whose KV is stored.
    fed: usize,
    pub out: Vec<u32>,
    /// (out.len(), vocab): the logits each sampled token came from.
    logits: Vec<f32>,
}

impl GenSeq {
    pub fn new(prompt: Vec<u32>, sampler: Sampler, max_tokens: usize, table: Vec<u32>) -> Self {
        GenSeq {
            prompt,
            sampler,
            max_tokens,
            table,
            start_call: 0,
            chunking: Chunking::Fixed(usize::MAX),
            fed: 0,
            out: Vec::new(),
            logits: Vec::new(),
        }
    }

    fn done(&self) -> bool {
        self.out.len() >= self.max_tokens
    }

    /// Positions this sequence will hold KV for.
    pub fn kv_len(&self) -> usize {
        self.prompt.len() + self.max_tokens.saturating_sub(1)
    }

    /// The next rows of this sequence (tokens, first position, wants logits); empty if none.
    fn next_rows(&self, budget: usize, rng: &mut Rng) -> (Vec<u32>, usize, bool) {
        if self.fed < self.prompt.len() {
            let want = match self.chunking {
                Chunking::Fixed(n) => n,
                Chunking::Random(max) => rng.range(1, max),
            };
            let n = want.min(self.prompt.len() - self.fed).min(budget);
            let end = self.fed + n;
            (self.prompt[self.fed..end].to_vec(), self.fed, end == self.prompt.len())
        } else {
            match self.out.last() {
                Some(&t) if budget > 0 => (vec![t], self.fed, true),
                _ => (Vec::new(), self.fed, false),
            }
        }
    }

    /// The final state as a record (KV read back from the pool).
    pub fn record<B: Backend>(&self, model: &dyn CausalLm<B>, kv: &B::Kv) -> Result<SeqRecord> {
        let mut tokens = self.prompt.clone();
        tokens.extend_from_slice(&self.out[..self.out.len().saturating_sub(1)]);
        tokens.truncate(self.fed);
        let start = self.prompt.len().saturating_sub(1);
        let mut r =
            SeqRecord::capture(model, kv, &self.table, tokens, (start, self.logits.clone()))?;
        r.sampled = self.out.clone();
        Ok(r)
    }
}

/// Runs every sequence to `max_tokens`; returns the number of model calls.
pub(crate) fn run<B: Backend>(
    model: &mut dyn CausalLm<B>,
    kv: &mut B::Kv,
    seqs: &mut [GenSeq],
    rng: &mut Rng,
) -> Result<usize> {
    if seqs.iter().any(|s| s.prompt.is_empty() && s.max_tokens > 0) {
        return Err(EngineError::Refused("multi-sequence generation: a prompt is empty".into()));
    }
    let vocab = model.spec().vocab_size;
    let (mut call, mut calls) = (0usize, 0usize);
    while seqs.iter().any(|s| !s.done()) {
        let mut order: Vec<usize> =
            (0..seqs.len()).filter(|&i| !seqs[i].done() && seqs[i].start_call <= call).collect();
        rng.shuffle(&mut order);
        call += 1;
        let mut meta = BatchMeta { block_size: BLOCK_SIZE, ..BatchMeta::default() };
        // (sequence, rows, wants logits)
        let mut parts = Vec::with_capacity(order.len());
        for i in order {
            let (toks, start, wants) = seqs[i].next_rows(model.max_rows() - meta.rows(), rng);
            if toks.is_empty() {
                continue;
            }
            let n = toks.len();
            meta.positions.extend((start..start + n).map(|p| p as u32));
            meta.row_seq.extend(std::iter::repeat_n(meta.seqs.len() as u32, n));
            meta.tokens.extend(toks);
            meta.seqs.push(SeqMeta { block_table: seqs[i].table.clone() });
            if wants {
                meta.logit_rows.push(meta.rows() as u32 - 1);
            }
            parts.push((i, n, wants));
        }
        if meta.rows() == 0 {
            continue;
        }
        let logits = model.forward(kv, &meta)?;
        calls += 1;
        let mut row = 0;
        for (i, n, wants) in parts {
            let s = &mut seqs[i];
            s.fed += n;
            if wants {
                let l = &logits[row * vocab..(row + 1) * vocab];
                row += 1;
                let tok = s.sampler.sample(l, &s.prompt, &s.out, s.fed as u64);
                s.out.push(tok);
                s.logits.extend_from_slice(l);
            }
        }
    }
    Ok(calls)
}
