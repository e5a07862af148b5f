//! Decode ahead played on the host, for the tests of its loops on the CPU
//! (`Generator::decode_ahead`: tests/decode_ahead.rs; the engine thread's `step_ahead`:
//! tests/serve_ahead.rs). `Simulated` wraps the CPU model: `ahead_step` runs
//! `forward_greedy` and keeps the token for `ahead_token` and for the next step's input, as
//! the device's `argmax_ahead` does, so what those tests check is the loops' bookkeeping.
//! (The device side, the kernel and its ring, is tests/cuda_ahead.rs in tf-backend.)
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tf_backend::cpu::CpuBackend;
use tf_backend::{Backend, BatchMeta, KvGeometry};
use tf_checkpoint::ModelSpec;
use tf_engine::family::CausalLm;

/// The steps a `Simulated` issued, in order: (the first block of the sequence's table, the
/// position fed).
pub type Issued = Arc<Mutex<Vec<(u32, usize)>>>;

/// The CPU model with decode ahead played on the host.
pub struct Simulated {
    inner: Box<dyn CausalLm<CpuBackend>>,
    /// Feeds each ahead step the token it chose plus one (the control).
    skew: bool,
    /// Host time each ahead step takes on top of its forward pass (a slower device).
    delay: Duration,
    /// The next step's (token, position) and the first step's metadata (its block table).
    next: Option<(u32, usize, BatchMeta)>,
    /// Chosen tokens by position, until `ahead_token` takes them.
    chosen: BTreeMap<usize, u32>,
    issued: Issued,
}

impl Simulated {
    /// Wraps `inner`; returns the wrapper and its log of issued steps.
    pub fn new(
        inner: Box<dyn CausalLm<CpuBackend>>,
        skew: bool,
        delay: Duration,
    ) -> (Self, Issued) {
        let issued = Issued::default();
        let sim = Simulated {
            inner,
            skew,
            delay,
            next: None,
            chosen: BTreeMap::new(),
            issued: issued.clone(),
        };
        (sim, issued)
    }
}

/// The issued steps since the last call (cleared).
pub fn take(issued: &Issued) -> Vec<(u32, usize)> {
    std::mem::take(&mut *issued.lock().unwrap())
}

impl CausalLm<CpuBackend> for Simulated {
    fn spec(&self) -> &ModelSpec {
        self.inner.spec()
    }
    fn backend(&self) -> &CpuBackend {
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
    fn forward(
        &mut self,
        kv: &mut <CpuBackend as Backend>::Kv,
        meta: &BatchMeta,
    ) -> tf_engine::Result<Vec<f32>> {
        self.inner.forward(kv, meta)
    }
    fn decode_ahead(&self) -> bool {
        true
    }
    fn ahead_step(
        &mut self,
        kv: &mut <CpuBackend as Backend>::Kv,
        first: Option<&BatchMeta>,
    ) -> tf_engine::Result<()> {
        let mut meta = match first {
            Some(m) => m.clone(),
            None => {
                let (t, p, mut m) = self.next.take().expect("a step after none was issued");
                m.tokens = vec![t];
                m.positions = vec![p as u32];
                m
            }
        };
        assert_eq!(meta.rows(), 1, "decode ahead steps are one row");
        let p = meta.positions[0] as usize;
        self.issued.lock().unwrap().push((meta.seqs[0].block_table[0], p));
        std::thread::sleep(self.delay);
        let t = self.inner.forward_greedy(kv, &meta)?[0];
        self.chosen.insert(p + 1, t);
        let fed = if self.skew { (t + 1) % self.spec().vocab_size as u32 } else { t };
        meta.tokens = vec![fed];
        self.next = Some((fed, p + 1, meta));
        Ok(())
    }
    fn ahead_token(&mut self, position: usize) -> tf_engine::Result<u32> {
        Ok(self.chosen.remove(&position).expect("a token read before its step was issued"))
    }
    fn ahead_end(&mut self) -> tf_engine::Result<()> {
        self.next = None;
        self.chosen.clear();
        Ok(())
    }
}
