//! Step metadata shared by every backend: which rows belong to which sequence, where, and
//! where each sequence's KV lives. Built on the host by the engine, validated once here.

use crate::error::{BackendError, Result};

/// Geometry of the paged KV pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Tokens per block (fixed for the pool's life).
    pub block_size: usize,
    pub num_blocks: usize,
}

impl KvGeometry {
    /// Bytes of K and V of every layer for one block (bf16).
    pub fn block_bytes(&self) -> usize {
        2 * self.layers * self.block_size * self.kv_heads * self.head_dim * 2
    }

    /// Checks that a step fits this pool: `layer` exists, the batch's block size is the pool's,
    /// and `max_block` (the highest block id any row reaches, if any) lies inside the pool.
    /// Shared by every backend's `kv_store` and `attention`.
    pub fn check_batch(
        &self,
        op: &'static str,
        layer: usize,
        meta: &BatchMeta,
        max_block: Option<u32>,
    ) -> Result<()> {
        if layer >= self.layers {
            return Err(BackendError::shape(op, format!("layer {layer} of {}", self.layers)));
        }
        if meta.block_size != self.block_size {
            return Err(BackendError::shape(
                op,
                format!(
                    "batch block_size {} but the pool's is {}",
                    meta.block_size, self.block_size
                ),
            ));
        }
        if let Some(b) = max_block.filter(|&b| b as usize >= self.num_blocks) {
            return Err(BackendError::shape(
                op,
                format!("block {b} of a pool of {}", self.num_blocks),
            ));
        }
        Ok(())
    }

    /// Checks an attention call's geometry against the pool: `q` is `(rows, heads * head_dim)`
    /// and the query heads group evenly over this pool's kv heads. Shared by every backend.
    pub fn check_attention(
        &self,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        (q_rows, q_cols): (usize, usize),
        rows: usize,
    ) -> Result<()> {
        if kv_heads != self.kv_heads
            || head_dim != self.head_dim
            || kv_heads == 0
            || !heads.is_multiple_of(kv_heads)
            || q_cols != heads * head_dim
            || q_rows != rows
        {
            return Err(BackendError::shape(
                "attention",
                format!(
                    "q ({q_rows}, {q_cols}) as {heads} heads of {head_dim} over {kv_heads} kv heads; the pool has {} kv heads of {}",
                    self.kv_heads, self.head_dim
                ),
            ));
        }
        Ok(())
    }
}

/// One sequence of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqMeta {
    /// Block ids of the pool, in position order: position p lives in block
    /// `block_table[p / block_size]` at slot `p % block_size`.
    pub block_table: Vec<u32>,
}

/// One step: rows of one or more sequences (prefill chunks and decode rows alike).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchMeta {
    /// (rows) input token of each row.
    pub tokens: Vec<u32>,
    /// (rows) absolute position of each row in its sequence.
    pub positions: Vec<u32>,
    /// (rows) index into `seqs`.
    pub row_seq: Vec<u32>,
    pub seqs: Vec<SeqMeta>,
    /// Rows whose logits are wanted, ascending.
    pub logit_rows: Vec<u32>,
    pub block_size: usize,
}

impl BatchMeta {
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// Checks every index the kernels will follow, so no op can read out of bounds.
    pub fn validate(&self, num_blocks: Option<usize>) -> Result<()> {
        let bad = |what: String| Err(BackendError::shape("batch", what));
        let rows = self.tokens.len();
        if self.positions.len() != rows || self.row_seq.len() != rows {
            return bad(format!(
                "{rows} tokens but {} positions and {} row_seq entries",
                self.positions.len(),
                self.row_seq.len()
            ));
        }
        if self.block_size == 0 {
            return bad("block_size is 0".into());
        }
        for r in 0..rows {
            let s = self.row_seq[r] as usize;
            let Some(seq) = self.seqs.get(s) else {
                return bad(format!("row {r} names sequence {s} of {}", self.seqs.len()));
            };
            let need = self.positions[r] as usize / self.block_size + 1;
            if seq.block_table.len() < need {
                return bad(format!(
                    "row {r} at position {} needs {need} blocks, sequence {s} has {}",
                    self.positions[r],
                    seq.block_table.len()
                ));
            }
            if let Some(n) = num_blocks {
                if let Some(b) = seq.block_table[..need].iter().find(|&&b| b as usize >= n) {
                    return bad(format!("sequence {s} names block {b} of a pool of {n}"));
                }
            }
        }
        if self.logit_rows.windows(2).any(|w| w[0] >= w[1])
            || self.logit_rows.iter().any(|&r| r as usize >= rows)
        {
            return bad(format!(
                "logit_rows {:?} not ascending within {rows} rows",
                self.logit_rows
            ));
        }
        Ok(())
    }
}
