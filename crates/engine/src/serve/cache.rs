//! KV blocks with a prompt cache, as pure data over `BlockId`s (no tensors).
//!
//! A full block of a sequence is named by the hash chain of its tokens: `h_i = H(h_{i-1},
//! tokens of block i)`, so a block is found only under the whole prefix that produced it. A
//! new request walks its prompt's full blocks, reuses every leading block found (reference
//! counts), and prefills the rest. At least one prompt token is always left to compute, so the
//! first output token comes from a real forward row. Unreferenced cached blocks stay reusable
//! until evicted, least recently used first, when free blocks run out or their number passes
//! the cache limit (`--prompt-cache-gib`). Each cached block also keeps its parent hash and
//! tokens, and a hit is verified against them, so a hash collision can never hand out wrong KV.
//!
//! Exactness (`resumed == fresh`): a reused block holds exactly the KV a fresh run would write
//! at those positions, because kernels are row-invariant; the cache changes speed only.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use crate::kv::BlockId;

#[derive(Clone, Debug)]
struct Cached {
    hash: u64,
    parent: u64,
    tokens: Vec<u32>,
}

#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    /// Blocks holding nothing, lowest id first.
    free: BTreeSet<u32>,
    refcount: Vec<u32>,
    cached: Vec<Option<Cached>>,
    by_hash: HashMap<u64, u32>,
    /// Unreferenced cached blocks by last use.
    lru: BTreeMap<u64, u32>,
    last_use: Vec<u64>,
    tick: u64,
    /// Most unreferenced cached blocks kept.
    cache_limit: usize,
    pub hits_blocks: u64,
}

/// The hash of the empty prefix.
const ROOT: u64 = 0x7466_2d63_6163_6865;

fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockManager {
    pub fn new(total: usize, block_size: usize, cache_limit: usize) -> Self {
        BlockManager {
            block_size,
            free: (0..total as u32).collect(),
            refcount: vec![0; total],
            cached: vec![None; total],
            by_hash: HashMap::new(),
            lru: BTreeMap::new(),
            last_use: vec![0; total],
            tick: 0,
            cache_limit,
            hits_blocks: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total(&self) -> usize {
        self.refcount.len()
    }

    /// Blocks a new sequence could get now (free + evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn cached_count(&self) -> usize {
        self.by_hash.len()
    }

    /// Takes the longest cached run of `prompt`'s leading full blocks (leaving at least one
    /// token to compute) and returns those blocks, referenced for the caller.
    pub fn reuse_prefix(&mut self, prompt: &[u32]) -> Vec<BlockId> {
        let bs = self.block_size;
        let reusable = prompt.len().saturating_sub(1) / bs;
        let mut parent = ROOT;
        let mut out = Vec::new();
        for i in 0..reusable {
            let tokens = &prompt[i * bs..(i + 1) * bs];
            let h = chain(parent, tokens);
            let Some(&b) = self.by_hash.get(&h) else { break };
            match &self.cached[b as usize] {
                Some(c) if c.parent == parent && c.tokens == tokens => {}
                _ => break,
            }
            self.acquire(b);
            out.push(BlockId(b));
            parent = h;
        }
        self.hits_blocks += out.len() as u64;
        out
    }

    fn acquire(&mut self, b: u32) {
        if self.refcount[b as usize] == 0 {
            self.lru.remove(&self.last_use[b as usize]);
        }
        self.refcount[b as usize] += 1;
    }

    /// `n` fresh blocks (lowest free ids first, then evicting the least recently used cached
    /// blocks), or `None` with nothing taken if there are not enough.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.available() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let b = match self.free.pop_first() {
                Some(b) => b,
                None => self.evict_oldest()?,
            };
            self.refcount[b as usize] = 1;
            out.push(BlockId(b));
        }
        Some(out)
    }

    fn evict_oldest(&mut self) -> Option<u32> {
        let (_, b) = self.lru.pop_first()?;
        if let Some(c) = self.cached[b as usize].take() {
            self.by_hash.remove(&c.hash);
        }
        Some(b)
    }

    /// Records the full blocks of `tokens` (whose KV is computed) held in `table`, so later
    /// requests can reuse them. Blocks already cached under another id are left alone.
    pub fn register(&mut self, tokens: &[u32], table: &[BlockId]) {
        let bs = self.block_size;
        let mut parent = ROOT;
        for (i, b) in table.iter().enumerate().take(tokens.len() / bs) {
            let t = &tokens[i * bs..(i + 1) * bs];
            let h = chain(parent, t);
            let slot = &mut self.cached[b.0 as usize];
            match slot {
                Some(c) if c.hash == h => {}
                Some(_) => break, // the table diverges from what this block caches
                None => {
                    if let std::collections::hash_map::Entry::Vacant(e) = self.by_hash.entry(h) {
                        *slot = Some(Cached { hash: h, parent, tokens: t.to_vec() });
                        e.insert(b.0);
                    }
                }
            }
            parent = h;
        }
    }

    /// Drops the caller's references; unreferenced blocks return to the free set, or to the
    /// LRU list if cached.
    pub fn release(&mut self, table: &[BlockId]) {
        for b in table {
            let i = b.0 as usize;
            debug_assert!(self.refcount[i] > 0, "block {i} released twice");
            self.refcount[i] = self.refcount[i].saturating_sub(1);
            if self.refcount[i] > 0 {
                continue;
            }
            if self.cached[i].is_some() && self.cache_limit > 0 {
                self.tick += 1;
                self.last_use[i] = self.tick;
                self.lru.insert(self.tick, b.0);
            } else {
                if let Some(c) = self.cached[i].take() {
                    self.by_hash.remove(&c.hash);
                }
                self.free.insert(b.0);
            }
        }
        while self.lru.len() > self.cache_limit {
            if let Some(b) = self.evict_oldest() {
                self.free.insert(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[BlockId]) -> Vec<u32> {
        v.iter().map(|b| b.0).collect()
    }

    #[test]
    fn reuses_full_blocks_of_a_shared_prefix_and_leaves_one_token() {
        let mut m = BlockManager::new(8, 4, 8);
        let a: Vec<u32> = (0..10).collect();
        let ta = m.allocate(3).unwrap();
        m.register(&a, &ta);
        m.release(&ta);
        // Same first 8 tokens, then different.
        let b: Vec<u32> = (0..8).chain([99, 98]).collect();
        assert_eq!(ids(&m.reuse_prefix(&b)), vec![0, 1]);
        // Exactly 8 tokens: only one block may be reused (one token must be computed).
        let c: Vec<u32> = (0..8).collect();
        assert_eq!(ids(&m.reuse_prefix(&c)), vec![0]);
        // A different first block shares nothing, even with equal later blocks.
        let d: Vec<u32> = [7, 7, 7, 7].into_iter().chain(4..10).collect();
        assert!(m.reuse_prefix(&d).is_empty());
    }

    #[test]
    fn lru_eviction_and_limits() {
        let mut m = BlockManager::new(4, 2, 2);
        let t1 = m.allocate(2).unwrap();
        m.register(&[1, 2, 3, 4], &t1);
        m.release(&t1);
        assert_eq!(m.cached_count(), 2);
        assert_eq!(m.free_count(), 2);
        // Needing all 4 blocks evicts the cached ones (oldest first).
        let t2 = m.allocate(4).unwrap();
        assert_eq!(m.cached_count(), 0);
        assert!(m.allocate(1).is_none());
        m.release(&t2);
        assert_eq!(m.free_count(), 4);
        // Cache limit 0: nothing is kept.
        let mut z = BlockManager::new(2, 2, 0);
        let t = z.allocate(1).unwrap();
        z.register(&[5, 6], &t);
        z.release(&t);
        assert_eq!(z.cached_count(), 0);
        assert!(z.reuse_prefix(&[5, 6, 7]).is_empty());
    }

    #[test]
    fn shared_blocks_are_referenced_not_freed() {
        let mut m = BlockManager::new(4, 2, 4);
        let t = m.allocate(2).unwrap();
        m.register(&[1, 2, 3, 4], &t);
        let r = m.reuse_prefix(&[1, 2, 3, 4, 5]);
        assert_eq!(ids(&r), vec![0, 1]);
        m.release(&t);
        // Still referenced by r: not evictable.
        assert_eq!(m.available(), 2);
        m.release(&r);
        assert_eq!(m.available(), 4);
    }
}
