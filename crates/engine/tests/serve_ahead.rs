//! The engine thread's decode ahead (`step_ahead`: a lone greedy lane's next step queued
//! before the host reads this one's token) against the same engine without it, on the CPU
//! with the device's part played by tests/ahead_sim: the same tokens and finish reasons for
//! every `max_tokens` from 1 to 6 and 20, a stop token, a cancel mid-run (the lane and its
//! blocks freed), and a request arriving mid-run (the run ends, the two lanes share steps,
//! the lone lane runs ahead again; both replies equal alone). With every lane taken, requests
//! that wait do not end the run, a cancelled waiter is reaped during it, and every decode
//! step runs ahead. Sampled and penalized lanes never run ahead. A control wrapper that
//! feeds the wrong token must be caught.

mod ahead_sim;
mod check_common;
mod serve_common;

use std::time::Duration;

use ahead_sim::{take, Issued, Simulated};
use check_common::{model, tokens, OPTS};
use serve_common::settled;
use tf_engine::serve::{EngineConfig, EngineHandle, Event, Finish, GenerateRequest, Submission};
use tf_engine::SamplingParams;

const BLOCK: usize = 16;

fn config(parallel: usize) -> EngineConfig {
    let context = OPTS.max_positions;
    EngineConfig {
        model_id: "smollm2".into(),
        parallel,
        context,
        max_rows: OPTS.max_rows,
        prefill_chunk: 24,
        queue_limit: 16,
        block_size: BLOCK,
        total_blocks: parallel * context / BLOCK,
        cache_blocks: 0,
    }
}

/// The engine without decode ahead (the CPU model's `decode_ahead` is false).
fn plain() -> EngineHandle {
    EngineHandle::start(model().unwrap(), config(1)).unwrap()
}

/// The engine over the simulated device (two lanes), and its log of ahead steps.
fn ahead(skew: bool, delay_ms: u64) -> (EngineHandle, Issued) {
    ahead_lanes(2, skew, delay_ms)
}

fn ahead_lanes(parallel: usize, skew: bool, delay_ms: u64) -> (EngineHandle, Issued) {
    let (sim, issued) = Simulated::new(model().unwrap(), skew, Duration::from_millis(delay_ms));
    (EngineHandle::start(Box::new(sim), config(parallel)).unwrap(), issued)
}

/// Reads a submission's events until `n` tokens came.
fn tokens_of(sub: &mut Submission, n: usize) -> Vec<u32> {
    let mut toks = Vec::new();
    while toks.len() < n {
        match sub.events.blocking_recv().expect("engine hung up") {
            Event::Started { .. } => {}
            Event::Token { id } => toks.push(id),
            e => panic!("unexpected {e:?}"),
        }
    }
    toks
}

/// Reads a submission's remaining events: its tokens and finish.
fn rest_of(sub: &mut Submission) -> (Vec<u32>, Finish) {
    let mut toks = Vec::new();
    loop {
        match sub.events.blocking_recv().expect("engine hung up") {
            Event::Started { .. } => {}
            Event::Token { id } => toks.push(id),
            Event::Finished { finish, .. } => return (toks, finish),
            Event::Failed { message } => panic!("failed: {message}"),
        }
    }
}

fn request(len: usize, skip: usize, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: tokens(len + skip)[skip..].to_vec(),
        max_tokens,
        sampling: SamplingParams::default(),
        stop_tokens: vec![],
        use_prompt_cache: false,
    }
}

/// The request's tokens and finish; `cancel_after`: cancels once that many tokens came.
fn run(e: &EngineHandle, r: &GenerateRequest, cancel_after: Option<usize>) -> (Vec<u32>, Finish) {
    let mut sub = e.submit(r.clone()).unwrap();
    let mut toks = Vec::new();
    loop {
        match sub.events.blocking_recv().expect("engine hung up") {
            Event::Started { .. } => {}
            Event::Token { id } => {
                toks.push(id);
                if cancel_after == Some(toks.len()) {
                    sub.cancel.cancel();
                }
            }
            Event::Finished { finish, .. } => return (toks, finish),
            Event::Failed { message } => panic!("failed: {message}"),
        }
    }
}

/// The positions the ahead steps fed, checking they were all one sequence's.
fn positions(issued: &Issued) -> Vec<usize> {
    let steps = take(issued);
    assert!(steps.windows(2).all(|w| w[0].0 == w[1].0), "one run fed two sequences: {steps:?}");
    steps.into_iter().map(|(_, p)| p).collect()
}

#[test]
fn a_lone_greedy_lane_runs_ahead_with_the_plain_tokens() {
    let (reference, (fast, issued)) = (plain(), ahead(false, 0));
    let r = request(37, 0, 20);
    let p0 = r.prompt.len();
    let full = run(&reference, &r, None);
    assert_eq!(full.1, Finish::Length);
    for max in (1..=6).chain([20]) {
        let r = GenerateRequest { max_tokens: max, ..r.clone() };
        let want = run(&reference, &r, None);
        assert_eq!(want.0[..], full.0[..max], "max_tokens {max}: a prefix of the longest");
        assert_eq!(run(&fast, &r, None), want, "max_tokens {max}");
        // The prefill gives output 0 and a plain step output 1 when no more follow; else
        // ahead steps feed outputs 0 ..= max - 2 at their positions, each once, in order.
        let steps: Vec<usize> = if max >= 3 { (p0..p0 + max - 1).collect() } else { vec![] };
        assert_eq!(positions(&issued), steps, "max_tokens {max}: ahead steps");
    }
    // A stop token (the 5th output): the same reply, at most two steps past it.
    let stopped = GenerateRequest { stop_tokens: vec![full.0[4]], ..r.clone() };
    let want = run(&reference, &stopped, None);
    assert_eq!(want, (full.0[..4].to_vec(), Finish::Stop));
    assert_eq!(run(&fast, &stopped, None), want, "stop token");
    assert!(positions(&issued).len() <= 4 + 2, "steps issued past the stop");
    // Sampled and penalized lanes choose on the host's terms: never ahead, same tokens.
    let sampled = SamplingParams { temperature: 0.9, seed: 5, ..Default::default() };
    let penalized = SamplingParams { repetition_penalty: 1.3, ..Default::default() };
    for sampling in [sampled, penalized] {
        let r = GenerateRequest { sampling, ..r.clone() };
        assert_eq!(run(&fast, &r, None), run(&reference, &r, None), "{:?}", r.sampling);
        assert_eq!(positions(&issued), Vec::<usize>::new(), "a sampled lane ran ahead");
    }
    // The control: a run fed the wrong token differs.
    let (skewed, _) = ahead(true, 0);
    assert_ne!(run(&skewed, &r, None), full, "a skewed feed gave the same tokens");
}

#[test]
fn an_arrival_ends_the_run_and_a_cancel_frees_the_lane() {
    let (reference, (fast, issued)) = (plain(), ahead(false, 3));
    let a = request(30, 0, 40);
    let b = request(50, 60, 6);
    let (solo_a, solo_b) = (run(&reference, &a, None), run(&reference, &b, None));
    // A runs ahead alone; B arrives after A's 3rd token (A's 40 take >= 120 ms of delay).
    let mut sub_a = fast.submit(a.clone()).unwrap();
    let mut got_a = tokens_of(&mut sub_a, 3);
    let got_b = run(&fast, &b, None);
    let (rest, finish_a) = rest_of(&mut sub_a);
    got_a.extend(rest);
    assert_eq!(got_b, solo_b, "B beside A's run != B alone");
    assert_eq!((got_a, finish_a), solo_a, "A around B's arrival != A alone");
    // A's ahead steps: from its first decode position to its last, with a gap where it
    // shared plain steps with B (B's 6 tokens end first; A runs ahead again after).
    let fed = positions(&issued);
    let p0 = a.prompt.len();
    assert_eq!((fed.first(), fed.last()), (Some(&p0), Some(&(p0 + 38))), "{fed:?}");
    assert!(fed.len() < 39 && fed.windows(2).all(|w| w[0] < w[1]), "no gap for B: {fed:?}");
    let st = settled(&fast);
    assert_eq!(st.kv_blocks_free, st.kv_blocks_total, "blocks leaked: {st:?}");
    // A cancel after the 3rd token: the lane and its blocks are freed at once, the tokens
    // sent are a prefix of the reply, and the next request equals alone.
    let (toks, finish) = run(&fast, &a, Some(3));
    assert_eq!(finish, Finish::Cancelled);
    assert!(toks.len() < 40 && toks[..] == solo_a.0[..toks.len()], "{toks:?}");
    let st = settled(&fast);
    assert_eq!(st.kv_blocks_free, st.kv_blocks_total, "blocks leaked: {st:?}");
    let _ = take(&issued);
    assert_eq!(run(&fast, &b, None), solo_b, "after a cancel");
}

#[test]
fn with_every_lane_taken_a_waiting_request_does_not_end_the_run() {
    let (reference, (fast, issued)) = (plain(), ahead_lanes(1, false, 3));
    let (a, b, c) = (request(30, 0, 40), request(50, 60, 6), request(20, 120, 6));
    let (solo_a, solo_b) = (run(&reference, &a, None), run(&reference, &b, None));
    // One lane: B and C arrive during A's run and wait for it; C is cancelled while it waits.
    let mut sub_a = fast.submit(a.clone()).unwrap();
    let mut got_a = tokens_of(&mut sub_a, 3);
    let mut sub_b = fast.submit(b.clone()).unwrap();
    let mut sub_c = fast.submit(c).unwrap();
    sub_c.cancel.cancel();
    // The cancelled waiter is reaped (its channel closed, no event) while A still runs: the
    // run ended for it.
    assert!(sub_c.events.blocking_recv().is_none(), "C, cancelled while waiting, got an event");
    let mut early = Vec::new();
    while let Ok(e) = sub_a.events.try_recv() {
        assert!(matches!(e, Event::Token { .. }), "A finished before C was reaped: {e:?}");
        early.push(e);
    }
    let (rest, finish_a) = rest_of(&mut sub_a);
    got_a.extend(early.into_iter().map(|e| match e {
        Event::Token { id } => id,
        _ => unreachable!(),
    }));
    got_a.extend(rest);
    assert_eq!((got_a, finish_a), solo_a, "A with requests waiting != A alone");
    assert_eq!(rest_of(&mut sub_b), solo_b, "B after waiting != B alone");
    // Every decode step of A and of B ran ahead: waiting requests that cannot start did
    // not end A's run, and C's reaping resumed it at once.
    // (B may take A's freed blocks, so the steps are told apart by order.)
    let (pa, pb) = (a.prompt.len(), b.prompt.len());
    let want: Vec<usize> = (pa..pa + 39).chain(pb..pb + 5).collect();
    let fed: Vec<usize> = take(&issued).into_iter().map(|s| s.1).collect();
    assert_eq!(fed, want, "A's then B's ahead steps");
    let st = settled(&fast);
    assert_eq!(st.kv_blocks_free, st.kv_blocks_total, "blocks leaked: {st:?}");
}
