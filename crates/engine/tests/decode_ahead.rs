//! `Generator`'s decode-ahead loop (the next step issued before the host reads this one's
//! token; on CUDA `Backend::argmax_ahead`) against its plain loop, on the CPU: a wrapper model
//! plays the device's part (tests/ahead_sim), so the loop's bookkeeping is what is tested:
//! the same tokens and finish reasons for every `max_tokens` from 1 to 9, a stop token and a
//! cancel, no step issued past the last one the plain loop runs, and every step issued
//! before the token it needs is read. A control wrapper that feeds the wrong token must be caught. (The device side, the
//! kernel and its ring, is tests/cuda_ahead.rs in tf-backend, on the GPU.)

mod ahead_sim;
mod check_common;

use std::time::Duration;

use ahead_sim::{Issued, Simulated};
use check_common::{checkpoint, model, tokens};
use tf_backend::cpu::CpuBackend;
use tf_engine::generate::{GenRequest, Generator};
use tf_engine::{Sampler, SamplingParams};

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

/// A generator over the wrapper, and the log of the ahead steps it issues.
fn generator(skew: bool) -> (Generator<CpuBackend>, Issued) {
    let (sim, issued) = Simulated::new(model().unwrap(), skew, Duration::ZERO);
    (Generator::new(Box::new(sim), 16).unwrap(), issued)
}

/// The positions of the steps issued since the last call (cleared).
fn take(issued: &Issued) -> Vec<usize> {
    ahead_sim::take(issued).into_iter().map(|(_, p)| p).collect()
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
