//! What a checker compares: per sequence, the input token of every position, the tokens
//! sampled (if any), the logits of the rows that were asked for, and the K and V rows of every
//! layer read back from the paged pool with `Backend::read_kv`.
//!
//! Values are kept as the f32 the backend hands back (bf16 widened exactly for KV and logits),
//! and compared by bit pattern, never by value: `-0.0 != 0.0` and a NaN equals only itself.

use tf_backend::Backend;

use crate::error::Result;
use crate::family::CausalLm;

/// One sequence's state after a run.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqRecord {
    /// (len) input token of each position; the KV covers exactly these positions.
    pub tokens: Vec<u32>,
    /// Tokens chosen from the logits rows, in order (empty under teacher forcing).
    pub sampled: Vec<u32>,
    /// Logits cover positions `logit_start..logit_start + logit_rows`.
    pub logit_start: usize,
    /// (logit_rows, vocab) row-major.
    pub logits: Vec<f32>,
    /// Per layer, (len, kv_heads * head_dim).
    pub k: Vec<Vec<f32>>,
    /// Per layer, (len, kv_heads * head_dim).
    pub v: Vec<Vec<f32>>,
}

/// The states of the sequences of one run, with the row widths they share.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub seqs: Vec<SeqRecord>,
    pub vocab: usize,
    pub kv_dim: usize,
}

/// Row widths and layer count of a model, for records made from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Widths {
    pub vocab: usize,
    pub kv_dim: usize,
    pub layers: usize,
}

impl Widths {
    pub fn of<B: Backend>(model: &dyn CausalLm<B>) -> Self {
        let s = model.spec();
        Widths { vocab: s.vocab_size, kv_dim: s.kv_dim(), layers: s.num_hidden_layers }
    }
}

impl SeqRecord {
    /// Reads back every layer's KV of positions `0..tokens.len()` through `block_table`.
    pub fn capture<B: Backend>(
        model: &dyn CausalLm<B>,
        kv: &B::Kv,
        block_table: &[u32],
        tokens: Vec<u32>,
        logits: (usize, Vec<f32>),
    ) -> Result<Self> {
        let layers = model.spec().num_hidden_layers;
        let (mut k, mut v) = (Vec::with_capacity(layers), Vec::with_capacity(layers));
        for layer in 0..layers {
            let (kl, vl) = model.backend().read_kv(kv, layer, block_table, tokens.len())?;
            k.push(kl);
            v.push(vl);
        }
        Ok(SeqRecord { tokens, sampled: Vec::new(), logit_start: logits.0, logits: logits.1, k, v })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Number of logits rows (0 when `vocab` is 0).
    pub fn logit_rows(&self, vocab: usize) -> usize {
        self.logits.len().checked_div(vocab).unwrap_or(0)
    }

    /// The logits row of absolute position `pos`, if recorded.
    pub fn logits_at(&self, pos: usize, vocab: usize) -> Option<&[f32]> {
        let i = pos.checked_sub(self.logit_start)?;
        self.logits.get(i * vocab..(i + 1) * vocab)
    }

    /// The same record with logits kept only from position `start` on (for comparing a run
    /// that computed only those rows).
    pub fn logits_from(mut self, start: usize, vocab: usize) -> Self {
        let skip = start.saturating_sub(self.logit_start).min(self.logit_rows(vocab));
        self.logits.drain(..skip * vocab);
        self.logit_start += skip;
        self
    }
}

impl Record {
    /// Totals of what comparing against this record covers.
    pub fn rows(&self) -> (usize, usize, usize) {
        let logit_rows = self.seqs.iter().map(|s| s.logit_rows(self.vocab)).sum();
        let kv_rows = self.seqs.iter().map(SeqRecord::len).sum();
        let sampled = self.seqs.iter().map(|s| s.sampled.len()).sum();
        (logit_rows, kv_rows, sampled)
    }
}
