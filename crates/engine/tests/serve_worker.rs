//! The engine thread on the real test model: requests run beside others equal the same
//! requests alone (`concurrent == solo`), and a request resumed from the prompt cache equals
//! it computed fresh (`resumed == fresh`), greedy and seeded.

use std::path::{Path, PathBuf};

use tf_backend::cpu::CpuBackend;
use tf_checkpoint::Checkpoint;
use tf_engine::family::{self, LoadOptions};
use tf_engine::serve::{EngineConfig, EngineHandle, Event, Finish, GenerateRequest, Usage};
use tf_engine::SamplingParams;

fn model_path() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache =
        std::env::var_os("TENSORFOLD_CACHE").map_or_else(|| repo.join(".cache"), PathBuf::from);
    let p = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "test model missing at {}: run scripts/fetch-model.sh", p.display());
    p
}

fn engine(parallel: usize, cache_blocks: usize) -> EngineHandle {
    let ckpt = Checkpoint::open(&model_path()).unwrap();
    let context = 512;
    let model = family::load(
        &ckpt,
        CpuBackend::new().unwrap(),
        LoadOptions { max_rows: 64, max_positions: context },
    )
    .unwrap();
    let cfg = EngineConfig {
        model_id: "smollm2".into(),
        parallel,
        context,
        max_rows: 64,
        prefill_chunk: 24,
        queue_limit: 64,
        block_size: 16,
        total_blocks: parallel * context / 16 + cache_blocks,
        cache_blocks,
    };
    EngineHandle::start(model, cfg).unwrap()
}

fn request(i: u32, len: usize, sampled: bool) -> GenerateRequest {
    let prompt: Vec<u32> =
        (0..len as u32).map(|k| (k * 7919 + i * 104_729 + 13) % 49_000 + 100).collect();
    let sampling = if sampled {
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: 1000 + u64::from(i),
            ..Default::default()
        }
    } else {
        SamplingParams::default()
    };
    GenerateRequest {
        prompt,
        max_tokens: 12,
        sampling,
        stop_tokens: vec![],
        use_prompt_cache: true,
    }
}

/// Collects a finished request: (tokens, usage).
fn collect(mut sub: tf_engine::serve::Submission) -> (Vec<u32>, Usage) {
    let mut toks = Vec::new();
    loop {
        match sub.events.blocking_recv().expect("engine hung up") {
            Event::Started { .. } => {}
            Event::Token { id } => toks.push(id),
            Event::Finished { finish, usage } => {
                assert_eq!(finish, Finish::Length);
                return (toks, usage);
            }
            Event::Failed { message } => panic!("failed: {message}"),
        }
    }
}

#[test]
fn concurrent_equals_solo_and_resumed_equals_fresh() {
    let reqs: Vec<GenerateRequest> =
        (0..6).map(|i| request(i, 20 + 17 * i as usize, i % 2 == 1)).collect();
    // Alone: one lane, no cache, one request at a time.
    let solo_engine = engine(1, 0);
    let solo: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.use_prompt_cache = false;
            collect(solo_engine.submit(r).unwrap()).0
        })
        .collect();
    // Together: four lanes, all submitted at once (prefill chunks and decode rows mix).
    let many = engine(4, 64);
    let subs: Vec<_> = reqs.iter().map(|r| many.submit(r.clone()).unwrap()).collect();
    let together: Vec<Vec<u32>> = subs.into_iter().map(|s| collect(s).0).collect();
    assert_eq!(together, solo, "concurrent != solo");
    // Resumed: the same prompts again are served from the prompt cache.
    let (again, usage) = collect(many.submit(reqs[5].clone()).unwrap());
    assert!(usage.cached_tokens >= 16 * ((reqs[5].prompt.len() - 1) / 16) - 16, "{usage:?}");
    assert!(usage.cached_tokens > 0);
    assert_eq!(again, solo[5], "resumed != fresh");
    // A planted difference: a different seed must change the sampled reply.
    let mut other = reqs[5].clone();
    other.sampling.seed += 1;
    assert_ne!(collect(many.submit(other).unwrap()).0, solo[5], "seed had no effect");
}

#[test]
fn too_long_and_invalid_requests_are_refused() {
    let e = engine(1, 0);
    let mut r = request(0, 500, false);
    r.max_tokens = 100;
    assert!(matches!(e.submit(r), Err(tf_engine::serve::SubmitError::TooLong { .. })));
    let mut r = request(0, 10, false);
    r.prompt[0] = 1_000_000;
    assert!(matches!(e.submit(r), Err(tf_engine::serve::SubmitError::Invalid(_))));
    let mut r = request(0, 10, false);
    r.sampling.top_p = 0.0;
    assert!(matches!(e.submit(r), Err(tf_engine::serve::SubmitError::Invalid(_))));
}
