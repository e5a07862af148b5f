//! The server over the real engine thread (`EngineHandle`) on the test model: a reply through
//! HTTP, whole or streamed, is the text of the tokens the engine gives for the same
//! `GenerateRequest` submitted directly (greedy and seeded); stop strings cut the real text
//! where `str::find` says; a client that leaves a stream frees its lane.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tf_backend::cpu::CpuBackend;
use tf_checkpoint::Checkpoint;
use tf_engine::family::{self, LoadOptions};
use tf_engine::serve::{EngineConfig, EngineHandle, Event, Finish, GenerateRequest};
use tf_engine::SamplingParams;
use tf_server::AppState;
use tf_tokenizer::{ChatMessage, ChatRequest};

const CONTEXT: usize = 512;

fn engine() -> EngineHandle {
    let ckpt = Checkpoint::open(&model_path()).unwrap();
    let model = family::load(
        &ckpt,
        CpuBackend::new().unwrap(),
        LoadOptions { max_rows: 32, max_positions: CONTEXT },
    )
    .unwrap();
    let cfg = EngineConfig {
        model_id: "smollm2-test".into(),
        parallel: 2,
        context: CONTEXT,
        max_rows: 32,
        prefill_chunk: 32,
        queue_limit: 8,
        block_size: 16,
        total_blocks: 2 * CONTEXT / 16 + 16,
        cache_blocks: 16,
    };
    EngineHandle::start(model, cfg).unwrap()
}

const QUESTION: &str = "Name three colours of the rainbow.";

/// The prompt as transformers' `apply_chat_template(add_generation_prompt=True)` builds it,
/// through the tokenizer crate (not the server's validation).
fn prompt_ids() -> Vec<u32> {
    let codec = codec();
    let cfg = config();
    let template = cfg.chat_template.as_ref().unwrap();
    let req = ChatRequest {
        messages: vec![ChatMessage::new("user", QUESTION)],
        add_generation_prompt: true,
        ..Default::default()
    };
    codec.encode(&template.render(&req).unwrap(), false).unwrap()
}

/// The engine's own answer to a request, without the server: (text, tokens, finish).
async fn direct(
    engine: &EngineHandle,
    sampling: SamplingParams,
    max_tokens: usize,
) -> (String, usize, Finish) {
    let req = GenerateRequest {
        prompt: prompt_ids(),
        max_tokens,
        sampling,
        stop_tokens: vec![eos()],
        use_prompt_cache: false,
    };
    let mut sub = engine.submit(req).unwrap();
    let mut tokens = Vec::new();
    while let Some(ev) = sub.events.recv().await {
        match ev {
            Event::Token { id } => tokens.push(id),
            Event::Finished { finish, .. } => {
                let text = codec().decode(&tokens, true).unwrap();
                return (text, tokens.len(), finish);
            }
            Event::Failed { message } => panic!("engine failed: {message}"),
            Event::Started { .. } => {}
        }
    }
    panic!("the engine dropped the request");
}

fn body(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 24});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_replies_equal_the_engine_run_directly() {
    let engine = engine();
    let app = tf_server::router(AppState::new(config(), engine.clone()));
    let greedy = SamplingParams::default();
    let seeded = SamplingParams { temperature: 0.8, top_p: 0.95, seed: 7, ..Default::default() };
    let cases = [
        (greedy.clone(), json!({"temperature": 0})),
        (seeded, json!({"temperature": 0.8, "top_p": 0.95, "seed": 7})),
    ];
    for (sampling, fields) in cases {
        let (want, n, finish) = direct(&engine, sampling, 24).await;
        assert!(!want.is_empty());
        let v = chat(&app, body(fields.clone())).await.json();
        assert_eq!(v["choices"][0]["message"]["content"], want.as_str(), "{fields}");
        assert_eq!(v["usage"]["completion_tokens"], n as u64);
        let reason = if finish == Finish::Length { "length" } else { "stop" };
        assert_eq!(v["choices"][0]["finish_reason"], reason);
        let mut streamed = body(fields.clone());
        streamed["stream"] = json!(true);
        let chunks = chat(&app, streamed).await.sse();
        assert_eq!(stream_text(&chunks), want, "stream, {fields}");
    }
    // A stop string taken from the middle of the real reply cuts it at its first occurrence.
    let (want, _, _) = direct(&engine, greedy, 24).await;
    let words: Vec<&str> = want.split_whitespace().collect();
    assert!(words.len() >= 3, "reply too short to pick a stop string: {want:?}");
    let stop = words[2];
    let cut = &want[..want.find(stop).unwrap()];
    for stream in [false, true] {
        let r = chat(&app, body(json!({"temperature": 0, "stop": stop, "stream": stream}))).await;
        let text = if stream {
            stream_text(&r.sse())
        } else {
            r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string()
        };
        assert_eq!(text, cut, "stop {stop:?}, stream {stream}");
    }
    engine.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_a_stream_frees_the_lane() {
    let engine = engine();
    let mut cfg = config();
    cfg.port = 0;
    let server = tf_server::Server::bind(cfg, engine.clone()).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let req =
        body(json!({"stream": true, "ignore_eos": true, "max_tokens": 400, "temperature": 0}));
    let mut s =
        connect_and_send(addr, &http_post("/v1/chat/completions", req.to_string().as_bytes()))
            .await;
    let mut buf = Vec::new();
    // The role chunk, then at least one content chunk.
    assert!(read_until(&mut s, &mut buf, b"\"content\":\"", Duration::from_secs(30)).await);
    let before = engine.stats();
    drop(s);
    let mut freed = false;
    for _ in 0..200 {
        let st = engine.stats();
        if st.requests_running == 0 && st.requests_waiting == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = engine.stats();
    assert!(freed, "the lane is still running 2 s after the client left: {after:?}");
    assert!(
        after.completion_tokens_total < 400,
        "the request ran to max_tokens instead of being cancelled (before: {before:?})"
    );
    stop.send(()).unwrap();
    assert!(matches!(tokio::time::timeout(Duration::from_secs(10), done).await, Ok(Ok(Ok(())))));
}
