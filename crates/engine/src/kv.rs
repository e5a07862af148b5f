//! Paged KV bookkeeping: which blocks of the pool are free, as pure data.
//!
//! A sequence's KV lives in fixed-size blocks named by `BlockId`; position p of a sequence is in
//! its block table's entry `p / block_size`. The allocator hands out the lowest free id first,
//! so a run's block layout is reproducible (it never changes any value, only where it lives).

use std::collections::BTreeSet;

use crate::error::{EngineError, Result};

/// A block of the KV pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(pub u32);

/// A sequence known to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u64);

#[derive(Debug)]
pub struct BlockAllocator {
    free: BTreeSet<u32>,
    total: u32,
}

impl BlockAllocator {
    pub fn new(total: u32) -> Self {
        BlockAllocator { free: (0..total).collect(), total }
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// `n` blocks, lowest ids first, or a refusal naming the shortfall (nothing is taken).
    pub fn alloc(&mut self, n: usize) -> Result<Vec<BlockId>> {
        if n > self.free.len() {
            return Err(EngineError::Refused(format!(
                "KV cache full: need {n} more blocks, {} of {} free",
                self.free.len(),
                self.total
            )));
        }
        Ok((0..n).filter_map(|_| self.free.pop_first()).map(BlockId).collect())
    }

    /// Returns blocks to the pool; a block freed twice or out of range is a caller bug and is
    /// reported, not silently accepted.
    pub fn free(&mut self, blocks: &[BlockId]) -> Result<()> {
        for b in blocks {
            if b.0 >= self.total || !self.free.insert(b.0) {
                return Err(EngineError::Refused(format!("block {} freed twice or unknown", b.0)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_lowest_first_and_refuses_overdraw() {
        let mut a = BlockAllocator::new(4);
        assert_eq!(a.alloc(2).unwrap(), vec![BlockId(0), BlockId(1)]);
        assert!(a.alloc(3).is_err());
        assert_eq!(a.free_count(), 2);
        a.free(&[BlockId(0)]).unwrap();
        assert_eq!(a.alloc(1).unwrap(), vec![BlockId(0)]);
        assert!(a.free(&[BlockId(3), BlockId(3)]).is_err());
        assert!(a.free(&[BlockId(9)]).is_err());
    }
}
