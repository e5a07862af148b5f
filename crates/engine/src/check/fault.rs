//! Deliberately broken models, to prove the checkers can fail: a `CausalLm` wrapper whose
//! results depend on how many rows share a call, the very thing the contract forbids.
//! Used by the negative tests and by `tensorfold check exact --fault` (hidden), never by
//! serving code.
//!
//! - `RowDependentLogits`: flips low bits of one logit per returned row, by a mask that depends
//!   on the call's row count (as a kernel whose reduction order followed the batch size would
//!   differ); the KV is untouched, so only logits rows may be reported.
//! - `RowDependentToken`: in calls of more than 8 rows, the first row's token is replaced (a
//!   batch-composition bug that reaches the KV and every later row).

use tf_backend::{Backend, BatchMeta, KvGeometry};
use tf_checkpoint::ModelSpec;

use crate::error::Result;
use crate::family::CausalLm;

/// Which bug a [`Faulty`] model has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    RowDependentLogits,
    RowDependentToken,
}

/// A model with a planted row-count dependence.
pub struct Faulty<B: Backend> {
    pub inner: Box<dyn CausalLm<B>>,
    pub fault: Fault,
}

impl<B: Backend> CausalLm<B> for Faulty<B> {
    fn spec(&self) -> &ModelSpec {
        self.inner.spec()
    }

    fn backend(&self) -> &B {
        self.inner.backend()
    }

    fn max_rows(&self) -> usize {
        self.inner.max_rows()
    }

    fn max_positions(&self) -> usize {
        self.inner.max_positions()
    }

    fn kv_geometry(&self, block_size: usize, num_blocks: usize) -> KvGeometry {
        self.inner.kv_geometry(block_size, num_blocks)
    }

    fn forward(&mut self, kv: &mut B::Kv, meta: &BatchMeta) -> Result<Vec<f32>> {
        let rows = meta.rows();
        let vocab = self.spec().vocab_size.max(1);
        match self.fault {
            Fault::RowDependentLogits => {
                let mut l = self.inner.forward(kv, meta)?;
                let mask = 1 + (rows % 251) as u32;
                for (i, row) in l.chunks_mut(vocab).enumerate() {
                    let x = &mut row[(i * 31) % vocab];
                    *x = f32::from_bits(x.to_bits() ^ mask);
                }
                Ok(l)
            }
            Fault::RowDependentToken if rows > 8 => {
                let mut m = meta.clone();
                m.tokens[0] = (m.tokens[0] + 1) % vocab as u32;
                self.inner.forward(kv, &m)
            }
            Fault::RowDependentToken => self.inner.forward(kv, meta),
        }
    }
}
