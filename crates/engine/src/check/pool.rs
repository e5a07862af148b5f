//! A checker's own KV pool and the one-sequence teacher-forced run every checker builds on.
//!
//! Each run of a check gets *fresh* blocks, never blocks another run of the same check wrote:
//! the allocator hands out the lowest free id first, so reusing freed blocks would leave the
//! previous run's (identical) values under a run that failed to write a slot, and the check
//! would pass without looking. Candidate runs also get their block tables shuffled, so a value
//! that depended on where a block lives would show.

use tf_backend::{Backend, BatchMeta, SeqMeta};

use super::rng::Rng;
use crate::error::{EngineError, Result};
use crate::family::CausalLm;
use crate::generate::BLOCK_SIZE;
use crate::kv::BlockAllocator;

pub(crate) struct Pool<B: Backend> {
    pub kv: B::Kv,
    blocks: BlockAllocator,
}

impl<B: Backend> Pool<B> {
    /// A pool of `num_blocks` blocks for `model`.
    pub fn new(model: &dyn CausalLm<B>, num_blocks: usize) -> Result<Self> {
        let kv = model.backend().alloc_kv(&model.kv_geometry(BLOCK_SIZE, num_blocks))?;
        Ok(Pool { kv, blocks: BlockAllocator::new(num_blocks as u32) })
    }

    /// Fresh blocks for `len` positions, in allocation order or shuffled by `rng`.
    pub fn table(&mut self, len: usize, rng: Option<&mut Rng>) -> Result<Vec<u32>> {
        let mut t: Vec<u32> =
            self.blocks.alloc(len.div_ceil(BLOCK_SIZE))?.into_iter().map(|b| b.0).collect();
        if let Some(r) = rng {
            r.shuffle(&mut t);
        }
        Ok(t)
    }

    /// Fresh blocks for several sequences at once, shuffled across all of them, so the
    /// sequences' blocks interleave in the pool.
    pub fn tables(&mut self, lens: &[usize], rng: &mut Rng) -> Result<Vec<Vec<u32>>> {
        let mut all =
            self.table(lens.iter().map(|l| l.div_ceil(BLOCK_SIZE) * BLOCK_SIZE).sum(), Some(rng))?;
        let mut out = Vec::with_capacity(lens.len());
        for &l in lens {
            let rest = all.split_off(l.div_ceil(BLOCK_SIZE));
            out.push(std::mem::replace(&mut all, rest));
        }
        Ok(out)
    }
}

/// Blocks for sequences of the given lengths.
pub(crate) fn blocks_for(lens: impl IntoIterator<Item = usize>) -> usize {
    lens.into_iter().map(|l| l.div_ceil(BLOCK_SIZE)).sum()
}

/// Refuses a run the model was not loaded for, naming the checker.
pub(crate) fn need<B: Backend>(
    model: &dyn CausalLm<B>,
    check: &str,
    rows: usize,
    positions: usize,
) -> Result<()> {
    if rows > model.max_rows() || positions > model.max_positions() {
        return Err(EngineError::Refused(format!(
            "{check}: needs {rows} rows per call and {positions} positions; the model was loaded \
             for {} rows and {} positions",
            model.max_rows(),
            model.max_positions()
        )));
    }
    Ok(())
}

/// Rows `tokens` of one sequence at positions `start..`, every row's logits wanted.
pub(crate) fn chunk_meta(tokens: &[u32], start: usize, table: &[u32]) -> BatchMeta {
    let rows = tokens.len();
    BatchMeta {
        tokens: tokens.to_vec(),
        positions: (start..start + rows).map(|p| p as u32).collect(),
        row_seq: vec![0; rows],
        seqs: vec![SeqMeta { block_table: table.to_vec() }],
        logit_rows: (0..rows as u32).collect(),
        block_size: BLOCK_SIZE,
    }
}

/// Teacher-forces `tokens` at positions `start..` of the sequence in `table`, in chunks whose
/// sizes `chunk(done, remaining)` picks (clamped to 1..=remaining); returns every row's logits.
pub(crate) fn teacher<B: Backend>(
    model: &mut dyn CausalLm<B>,
    kv: &mut B::Kv,
    table: &[u32],
    tokens: &[u32],
    start: usize,
    chunk: &mut dyn FnMut(usize, usize) -> usize,
) -> Result<Vec<f32>> {
    let mut logits = Vec::with_capacity(tokens.len() * model.spec().vocab_size);
    let mut done = 0;
    while done < tokens.len() {
        let n = chunk(done, tokens.len() - done).clamp(1, tokens.len() - done);
        let meta = chunk_meta(&tokens[done..done + n], start + done, table);
        logits.extend(model.forward(kv, &meta)?);
        done += n;
    }
    Ok(logits)
}
