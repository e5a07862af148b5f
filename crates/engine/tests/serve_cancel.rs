//! Cancellation on the engine thread, on the real test model: a request dropped mid-prompt or
//! mid-decode frees its lane and blocks at the next step, a request beside it is unchanged
//! token for token, and the stats a server exposes (`/metrics`, `/health`) show a lane as
//! running from its `Started` event on (regression: they were published only after the
//! lane's first step, so a long first prefill chunk looked like an idle engine).

mod serve_common;

use std::path::{Path, PathBuf};

use serve_common::settled;
use tf_backend::cpu::CpuBackend;
use tf_checkpoint::Checkpoint;
use tf_engine::family::{self, LoadOptions};
use tf_engine::serve::{
    EngineConfig, EngineHandle, EngineStats, Event, Finish, GenerateRequest, Submission,
};
use tf_engine::SamplingParams;

const CONTEXT: usize = 512;
const CHUNK: usize = 24;

fn model_path() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache =
        std::env::var_os("TENSORFOLD_CACHE").map_or_else(|| repo.join(".cache"), PathBuf::from);
    let p = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "test model missing at {}: run scripts/fetch-model.sh", p.display());
    p
}

fn engine(parallel: usize) -> EngineHandle {
    let ckpt = Checkpoint::open(&model_path()).unwrap();
    let model = family::load(
        &ckpt,
        CpuBackend::new().unwrap(),
        LoadOptions { max_rows: 64, max_positions: CONTEXT },
    )
    .unwrap();
    let cache_blocks = 64;
    let cfg = EngineConfig {
        model_id: "smollm2".into(),
        parallel,
        context: CONTEXT,
        max_rows: 64,
        prefill_chunk: CHUNK,
        queue_limit: 64,
        block_size: 16,
        total_blocks: parallel * CONTEXT / 16 + cache_blocks,
        cache_blocks,
    };
    EngineHandle::start(model, cfg).unwrap()
}

fn request(i: u32, len: usize, max_tokens: usize) -> GenerateRequest {
    let prompt: Vec<u32> =
        (0..len as u32).map(|k| (k * 7919 + i * 104_729 + 13) % 49_000 + 100).collect();
    GenerateRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        stop_tokens: vec![],
        use_prompt_cache: true,
    }
}

/// The request's next event.
fn next(sub: &mut Submission) -> Event {
    sub.events.blocking_recv().expect("engine hung up")
}

fn wait_started(sub: &mut Submission) {
    match next(sub) {
        Event::Started { .. } => {}
        e => panic!("expected Started, got {e:?}"),
    }
}

/// All of a request's tokens, to its `Length` finish.
fn collect(mut sub: Submission) -> Vec<u32> {
    let mut toks = Vec::new();
    loop {
        match next(&mut sub) {
            Event::Started { .. } => {}
            Event::Token { id } => toks.push(id),
            Event::Finished { finish, .. } => {
                assert_eq!(finish, Finish::Length);
                return toks;
            }
            Event::Failed { message } => panic!("failed: {message}"),
        }
    }
}

/// Every block is free or held (unreferenced) by the prompt cache.
fn assert_no_leak(st: &EngineStats) {
    assert_eq!(
        st.kv_blocks_free + st.prompt_cache_blocks,
        st.kv_blocks_total,
        "blocks leaked: {st:?}"
    );
}

#[test]
fn running_from_started_and_freed_after_a_mid_prompt_cancel() {
    let e = engine(2);
    let prompt_len = 400;
    let mut sub = e.submit(request(1, prompt_len, 8)).unwrap();
    wait_started(&mut sub);
    let st = e.stats();
    assert_eq!(st.requests_running, 1, "a lane that sent Started must show as running: {st:?}");
    assert!(st.kv_blocks_free < st.kv_blocks_total, "its blocks must show as taken: {st:?}");
    drop(sub); // the client leaves during its first prefill chunk
    let st = settled(&e);
    assert_no_leak(&st);
    assert_eq!(st.completion_tokens_total, 0);
    let whole = prompt_len.div_ceil(CHUNK) as u64;
    assert!(
        st.steps_total < whole,
        "{} steps ran; the whole prefill needs {whole}",
        st.steps_total
    );
    // The lane is usable again, and the cancelled prefill's cached blocks resume correctly.
    let again = collect(e.submit(request(1, prompt_len, 8)).unwrap());
    let fresh = collect(engine(1).submit(request(1, prompt_len, 8)).unwrap());
    assert_eq!(again, fresh);
    assert_no_leak(&settled(&e));
}

#[test]
fn a_stream_dropped_mid_decode_leaves_the_one_beside_it_unchanged() {
    let alone = collect(engine(1).submit(request(2, 40, 24)).unwrap());
    let e = engine(2);
    let mut other = e.submit(request(3, 30, 300)).unwrap();
    wait_started(&mut other);
    for _ in 0..3 {
        assert!(matches!(next(&mut other), Event::Token { .. }));
    }
    let mut probe = e.submit(request(2, 40, 24)).unwrap();
    let mut toks = Vec::new();
    loop {
        match next(&mut probe) {
            Event::Started { .. } => {}
            Event::Token { id } => {
                toks.push(id);
                if toks.len() == 5 {
                    other.cancel.cancel(); // mid-decode of both
                }
            }
            Event::Finished { finish, .. } => {
                assert_eq!(finish, Finish::Length);
                break;
            }
            Event::Failed { message } => panic!("failed: {message}"),
        }
    }
    assert_eq!(toks, alone, "the probe changed when the stream beside it was dropped");
    loop {
        match next(&mut other) {
            Event::Token { .. } => {}
            Event::Finished { finish, usage } => {
                assert_eq!(finish, Finish::Cancelled);
                assert!(usage.completion_tokens < 300);
                break;
            }
            e => panic!("unexpected {e:?}"),
        }
    }
    let st = settled(&e);
    assert_no_leak(&st);
    // Both lanes serve again, at once.
    let a = e.submit(request(2, 40, 24)).unwrap();
    let b = e.submit(request(4, 20, 8)).unwrap();
    assert_eq!(collect(a), alone);
    assert_eq!(collect(b).len(), 8);
    assert_no_leak(&settled(&e));
}
