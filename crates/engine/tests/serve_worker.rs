//! The engine thread on the real test model: requests run beside others equal the same
//! requests alone (`concurrent == solo`), and a request resumed from the prompt cache equals
//! it computed fresh (`resumed == fresh`), greedy and seeded; penalized requests, whose
//! tokens the backend chooses (`Backend::sample` with the lane's penalties), equal the host
//! sampler on the logits (`Generator::generate`), alone and beside others.

use std::path::{Path, PathBuf};

use tf_backend::cpu::CpuBackend;
use tf_checkpoint::Checkpoint;
use tf_engine::family::{self, LoadOptions};
use tf_engine::generate::{GenRequest, Generator};
use tf_engine::serve::{EngineConfig, EngineHandle, Event, Finish, GenerateRequest, Usage};
use tf_engine::{Sampler, SamplingParams};

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

#[test]
fn penalized_requests_equal_the_host_sampler_alone_and_together() {
    let pens = [
        SamplingParams { repetition_penalty: 1.3, ..Default::default() },
        SamplingParams { temperature: 0.8, presence_penalty: 1.5, seed: 7, ..Default::default() },
        SamplingParams {
            temperature: 1.1,
            frequency_penalty: 0.9,
            top_k: 40,
            seed: 8,
            ..Default::default()
        },
        SamplingParams { frequency_penalty: 2.0, presence_penalty: -0.5, ..Default::default() },
    ];
    let reqs: Vec<GenerateRequest> = pens
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = request(i as u32, 30 + 11 * i, true);
            r.sampling = p.clone();
            r.max_tokens = 16;
            r
        })
        .collect();
    // The host path: the logits of each step read back, penalized and sampled by `Sampler`.
    let ckpt = Checkpoint::open(&model_path()).unwrap();
    let opts = LoadOptions { max_rows: 64, max_positions: 512 };
    let model = family::load(&ckpt, CpuBackend::new().unwrap(), opts).unwrap();
    let mut gen = Generator::new(model, 512 / 16).unwrap();
    let mut host_tokens = |r: &GenerateRequest| {
        let g = GenRequest {
            prompt: &r.prompt,
            max_tokens: r.max_tokens,
            sampler: Sampler::new(r.sampling.clone()).unwrap(),
            stop_tokens: &[],
            chunk: 24,
        };
        gen.generate(&g, &mut |_, _| true).unwrap().0
    };
    let host: Vec<Vec<u32>> = reqs.iter().map(&mut host_tokens).collect();
    let solo_engine = engine(1, 0);
    let solo: Vec<Vec<u32>> =
        reqs.iter().map(|r| collect(solo_engine.submit(r.clone()).unwrap()).0).collect();
    assert_eq!(solo, host, "the engine's penalized tokens != the host sampler's");
    // Beside unpenalized requests (one step's rows mix penalized and plain rows).
    let many = engine(4, 64);
    let plain = [request(9, 25, true), request(10, 40, false)];
    let subs: Vec<_> = reqs.iter().chain(&plain).map(|r| many.submit(r.clone()).unwrap()).collect();
    let together: Vec<Vec<u32>> = subs.into_iter().map(|s| collect(s).0).collect();
    assert_eq!(together[..reqs.len()], solo[..], "penalized: concurrent != solo");
    // Resumed from the prompt cache: the lane's ids are the whole prompt's all the same.
    let (again, usage) = collect(many.submit(reqs[3].clone()).unwrap());
    assert!(usage.cached_tokens > 0, "{usage:?}");
    assert_eq!(again, solo[3], "penalized: resumed != fresh");
    // logit_bias: the plain greedy reply's first token banned, another boosted; the worker
    // equals the host sampler and the ban holds.
    let mut plain_req = request(11, 33, false);
    plain_req.max_tokens = 6;
    let plain_toks = collect(solo_engine.submit(plain_req.clone()).unwrap()).0;
    let mut biased = plain_req.clone();
    let (first, boost) = (plain_toks[0], plain_toks[0] ^ 1);
    let mut bias = vec![(first, -100.0), (boost, 2.5)];
    bias.sort_by_key(|e| e.0);
    biased.sampling.logit_bias = bias;
    let got = collect(solo_engine.submit(biased.clone()).unwrap()).0;
    assert_ne!(got[0], first, "a -100 bias left the token first");
    assert_eq!(got, host_tokens(&biased), "biased: engine != host");
    // A planted difference: without its penalty the first request's reply changes.
    let mut bare = reqs[0].clone();
    bare.sampling.repetition_penalty = 1.0;
    assert_ne!(collect(solo_engine.submit(bare).unwrap()).0, solo[0], "penalty had no effect");
}
