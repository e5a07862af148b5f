//! `Generator`'s decode-ahead loop (the next step issued before the host reads this one's
//! token; on CUDA `Backend::argmax_ahead`) against its plain loop, on the CPU: a wrapper model
//! plays the device's part (`ahead_step` runs `forward_greedy` and keeps the token for
//! `ahead_token`), so the loop's bookkeeping is what is tested: the same tokens and finish
//! reasons for every `max_tokens` from 1 to 9, a stop token and a cancel, no step issued
//! past the last one the plain loop runs, and every step issued before the token it needs is
//! read. A control wrapper that feeds the wrong token must be caught. (The device side, the
//! kernel and its ring, is tests/cuda_ahead.rs in tf-backend, on the GPU.)

mod check_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use check_common::{checkpoint, model, tokens};
use tf_backend::cpu::CpuBackend;
use tf_backend::{Backend, BatchMeta, KvGeometry};
use tf_checkpoint::ModelSpec;
use tf_engine::family::CausalLm;
use tf_engine::generate::{GenRequest, Generator};
use tf_engine::{Sampler, SamplingParams};

/// The CPU model with decode ahead played on the host.
struct Simulated {
    inner: Box<dyn CausalLm<CpuBackend>>,
    /// Feeds each ahead step the token it chose plus one (the control).
    skew: bool,
    /// The next step's (token, position) and the first step's metadata (its block table).
    next: Option<(u32, usize, BatchMeta)>,
    /// Chosen tokens by position, until `ahead_token` takes them.
    chosen: BTreeMap<usize, u32>,
    /// Positions of the steps issued, in order (shared with the test).
    issued: Arc<Mutex<Vec<usize>>>,
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
        self.issued.lock().unwrap().push(p);
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
        Ok(())
    }
}

/// Tokens and finish reason of one generation (`stop`: stop tokens; `cancel_at`: on_token
/// returns false at that output index).
fn run(
    g: &mut Generator<CpuBackend>,
    prompt: &[u32],
    max_tokens: usize,
    stop: &[u32],
    cancel_at: Option<usize>,
) -> (Vec<u32>, String) {
    let req = GenRequest {
        prompt,
        max_tokens,
        sampler: Sampler::new(SamplingParams::default()).unwrap(),
        stop_tokens: stop,
        chunk: 16,
    };
    let mut seen = 0usize;
    let (out, st) = g
        .generate_tokens(&req, &mut |_| {
            seen += 1;
            cancel_at != Some(seen - 1)
        })
        .unwrap();
    assert_eq!(st.output_tokens, out.len());
    (out, format!("{:?}", st.finish))
}

/// A generator over the wrapper, and the positions of the ahead steps it issues.
fn generator(skew: bool) -> (Generator<CpuBackend>, Arc<Mutex<Vec<usize>>>) {
    let issued = Arc::new(Mutex::new(Vec::new()));
    let sim = Simulated {
        inner: model().unwrap(),
        skew,
        next: None,
        chosen: BTreeMap::new(),
        issued: issued.clone(),
    };
    (Generator::new(Box::new(sim), 16).unwrap(), issued)
}

/// The issued step positions since the last call (cleared).
fn take(issued: &Arc<Mutex<Vec<usize>>>) -> Vec<usize> {
    std::mem::take(&mut *issued.lock().unwrap())
}

#[test]
fn decode_ahead_loop_equals_the_plain_loop() {
    let _ = checkpoint();
    let prompt = tokens(21);
    let (mut ahead, ahead_issued) = generator(false);
    let (mut plain, plain_issued) = generator(false);
    plain.ahead = false;
    let (full, _) = run(&mut plain, &prompt, 9, &[], None);
    assert_eq!(take(&plain_issued), Vec::<usize>::new(), "the plain loop issued ahead steps");
    let p0 = prompt.len();
    for max in 1..=9 {
        let want = run(&mut plain, &prompt, max, &[], None);
        let got = run(&mut ahead, &prompt, max, &[], None);
        assert_eq!(got, want, "max_tokens {max}");
        assert_eq!(&want.0[..], &full[..max], "max_tokens {max}: a prefix of the longest run");
        // Steps feed outputs 0 ..= max - 2, at their positions, each once, in order.
        let steps: Vec<usize> = (0..max.saturating_sub(1)).map(|j| p0 + j).collect();
        assert_eq!(take(&ahead_issued), steps, "max_tokens {max}: steps issued");
    }
    // A stop token (the 4th output) and a cancel at the 3rd: at most two steps past it.
    let stop = [full[3]];
    let want = run(&mut plain, &prompt, 9, &stop, None);
    let got = run(&mut ahead, &prompt, 9, &stop, None);
    assert_eq!(got, want, "stop token");
    assert_eq!(want.1, "Stop");
    assert!(take(&ahead_issued).len() <= 3 + 2, "steps issued past the stop");
    let want = run(&mut plain, &prompt, 9, &[], Some(2));
    let got = run(&mut ahead, &prompt, 9, &[], Some(2));
    assert_eq!(got, want, "cancel");
    assert_eq!(want.1, "Cancelled");
    assert!(take(&ahead_issued).len() <= 2 + 2, "steps issued past the cancel");
    // The control: a loop fed the wrong token differs.
    let (mut skewed, _) = generator(true);
    let bad = run(&mut skewed, &prompt, 9, &[], None);
    assert_ne!(bad.0, full, "a skewed feed gave the same tokens: the comparison cannot fail");
}
