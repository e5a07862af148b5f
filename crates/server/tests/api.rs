//! The OpenAI surface with a fake engine, in process: prompts reach the engine rendered and
//! tokenized as the checkpoint says, parameters map onto `GenerateRequest`, replies (whole and
//! streamed) carry the engine's tokens as text with stop strings honoured, and the extension
//! fields appear when asked for.

mod common;

use common::*;
use serde_json::{json, Value};

/// SmolLM2-Instruct's template (transformers' rendering of it, as published in the model's
/// tokenizer_config.json) for a system and a user message, with the generation prompt.
const SMOL_PROMPT: &str = concat!(
    "<|im_start|>system\nYou are terse.<|im_end|>\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
);

fn messages() -> Value {
    json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}])
}

#[tokio::test]
async fn chat_renders_the_template_and_returns_the_engine_text() {
    let reply_text = "Hello there! How can I help?";
    let engine = FakeEngine::new(Script::Say(ids(reply_text)));
    let r = chat(&app(&engine), json!({"model": "smollm2-test", "messages": messages()})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], "smollm2-test");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], reply_text);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let req = engine.last_request();
    assert_eq!(codec().decode(&req.prompt, false).unwrap(), SMOL_PROMPT);
    assert_eq!(req.stop_tokens, vec![eos()]);
    let n = ids(reply_text).len() as u64;
    assert_eq!(v["usage"]["prompt_tokens"], req.prompt.len() as u64);
    assert_eq!(v["usage"]["completion_tokens"], n);
    assert_eq!(v["usage"]["total_tokens"], req.prompt.len() as u64 + n);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Chat defaults: the rest of the context, OpenAI's temperature 1.
    assert_eq!(req.max_tokens, 2048 - req.prompt.len());
    assert_eq!(req.sampling.temperature, 1.0);
}

#[tokio::test]
async fn content_parts_and_developer_role_render_like_strings_and_system() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let body = json!({"messages": [
        {"role": "developer", "content": [{"type": "text", "text": "You are terse."}]},
        {"role": "user", "content": "Hi"},
    ]});
    assert_eq!(chat(&app(&engine), body).await.status, 200);
    assert_eq!(codec().decode(&engine.last_request().prompt, false).unwrap(), SMOL_PROMPT);
}

#[tokio::test]
async fn completions_encode_the_prompt_or_take_token_ids() {
    let engine = FakeEngine::new(Script::Say(ids(" world, again")));
    let app = app(&engine);
    let r = post(&app, "/v1/completions", &json!({"prompt": "Hello", "max_tokens": 2})).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    let first_two = codec().decode(&ids(" world, again")[..2], true).unwrap();
    assert_eq!(v["choices"][0]["text"], first_two.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    assert_eq!(engine.last_request().prompt, codec().encode("Hello", true).unwrap());

    let r = post(&app, "/v1/completions", &json!({"prompt": [1, 2, 3]})).await;
    assert_eq!(r.status, 200);
    assert_eq!(engine.last_request().prompt, vec![1, 2, 3]);
    assert_eq!(engine.last_request().max_tokens, 16, "OpenAI's completions default");
    let r = post(&app, "/v1/completions", &json!({"prompt": [[7, 8]]})).await;
    assert_eq!(r.status, 200);
    assert_eq!(engine.last_request().prompt, vec![7, 8]);
}

#[tokio::test]
async fn sampling_fields_reach_the_engine() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let body = json!({
        "messages": messages(), "max_completion_tokens": 5, "max_tokens": 9,
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
        "seed": -1, "n": 1, "draft": false, "user": "ignored", "logprobs": false,
        "logit_bias": {"9": -100, "3": 2.5},
    });
    assert_eq!(chat(&app(&engine), body).await.status, 200);
    let req = engine.last_request();
    let s = &req.sampling;
    assert_eq!(req.max_tokens, 5, "max_completion_tokens wins over max_tokens");
    assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p), (0.7, 0.9, 40, 0.05));
    assert_eq!((s.presence_penalty, s.frequency_penalty, s.repetition_penalty), (0.5, -0.5, 1.1));
    assert_eq!(s.seed, u64::MAX, "-1 as two's complement");
    assert_eq!(s.logit_bias, vec![(3, 2.5), (9, -100.0)], "ascending by id");
    assert!(req.use_prompt_cache);

    let body = json!({"messages": messages(), "top_k": -1, "seed": 42, "ignore_eos": true});
    assert_eq!(chat(&app(&engine), body).await.status, 200);
    let req = engine.last_request();
    assert_eq!((req.sampling.top_k, req.sampling.seed), (0, 42));
    assert!(req.stop_tokens.is_empty(), "ignore_eos clears the stop tokens");
}

#[tokio::test]
async fn requests_without_a_seed_get_different_seeds() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let app = app(&engine);
    let mut seeds = std::collections::HashSet::new();
    for _ in 0..8 {
        assert_eq!(chat(&app, json!({"messages": messages()})).await.status, 200);
        seeds.insert(engine.last_request().sampling.seed);
    }
    assert_eq!(seeds.len(), 8, "a fresh seed per request: {seeds:?}");
}

const STOP_TEXT: &str = "The answer is 42.\n\nUser: and more";

#[tokio::test]
async fn a_stop_string_ends_the_text_before_it() {
    let engine = FakeEngine::new(Script::Say(ids(STOP_TEXT)));
    let app = app(&engine);
    for (stop, want) in [
        (json!("\n\nUser:"), "The answer is 42."),
        (json!(["nope", "swer"]), "The an"), // inside one token
        (json!(["42", "The"]), ""),
    ] {
        let r = chat(&app, json!({"messages": messages(), "stop": stop})).await;
        let v = r.json();
        assert_eq!(v["choices"][0]["message"]["content"], want, "stop {stop}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    // A stop string that never appears changes nothing.
    let r = chat(&app, json!({"messages": messages(), "stop": "zebra"})).await;
    assert_eq!(r.json()["choices"][0]["message"]["content"], STOP_TEXT);
}

#[tokio::test]
async fn streamed_text_never_shows_a_stop_string_or_anything_after_it() {
    let engine = FakeEngine::new(Script::Say(ids(STOP_TEXT)));
    let app = app(&engine);
    let body = json!({"messages": messages(), "stream": true, "stop": ["\n\nUser:"]});
    let r = chat(&app, body).await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let chunks = r.sse();
    assert_eq!(stream_text(&chunks), "The answer is 42.");
    for c in &chunks {
        let piece = c["choices"][0]["delta"]["content"].as_str().unwrap_or("");
        assert!(!piece.contains('\n'), "a held-back prefix leaked: {c}");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(last["choices"][0]["delta"].as_object().unwrap().is_empty());
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c.get("usage").is_none()));
}

#[tokio::test]
async fn stream_and_whole_reply_agree() {
    let text = "Ünïcödé — 日本語 and emoji 🙂 across byte-level tokens.";
    let engine = FakeEngine::new(Script::Say(ids(text)));
    let app = app(&engine);
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let base = if path == "/v1/completions" {
            json!({"prompt": "x", "max_tokens": 100})
        } else {
            json!({"messages": messages()})
        };
        let mut streamed = base.clone();
        streamed["stream"] = json!(true);
        let whole = post(&app, path, &base).await.json();
        let chunks = post(&app, path, &streamed).await.sse();
        let whole_text = whole["choices"][0]["message"]["content"]
            .as_str()
            .or(whole["choices"][0]["text"].as_str());
        assert_eq!(whole_text, Some(text), "{path}");
        assert_eq!(stream_text(&chunks), text, "{path}");
    }
}

#[tokio::test]
async fn include_usage_adds_a_last_chunk_with_usage_and_cached_tokens() {
    let engine = FakeEngine::with(Script::Say(ids("a b c")), Default::default(), 100, 5);
    let body =
        json!({"messages": messages(), "stream": true, "stream_options": {"include_usage": true}});
    let chunks = chat(&app(&engine), body).await.sse();
    let (last, rest) = chunks.split_last().unwrap();
    assert!(
        rest.iter().all(|c| c["usage"].is_null() && c.get("usage").is_some()),
        "usage: null before the end"
    );
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    let prompt = engine.last_request().prompt.len() as u64;
    assert_eq!(last["usage"]["prompt_tokens"], prompt);
    assert_eq!(last["usage"]["completion_tokens"], ids("a b c").len() as u64);
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 5);
}

#[tokio::test]
async fn return_token_ids_gives_prompt_and_completion_ids() {
    let out = ids("Hello there friend");
    let engine = FakeEngine::new(Script::Say(out.clone()));
    let app = app(&engine);
    let v = chat(&app, json!({"messages": messages(), "return_token_ids": true})).await.json();
    let prompt = engine.last_request().prompt;
    let as_ids = |v: &Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    assert_eq!(as_ids(&v["prompt_token_ids"]), prompt);
    assert_eq!(as_ids(&v["choices"][0]["token_ids"]), out);

    let body = json!({"prompt": "Hi", "stream": true, "return_token_ids": true, "max_tokens": 50});
    let chunks = post(&app, "/v1/completions", &body).await.sse();
    assert_eq!(as_ids(&chunks[0]["prompt_token_ids"]), codec().encode("Hi", true).unwrap());
    assert!(chunks[1..].iter().all(|c| c.get("prompt_token_ids").is_none()));
    let streamed: Vec<u32> =
        chunks.iter().flat_map(|c| as_ids(&c["choices"][0]["token_ids"])).collect();
    assert_eq!(streamed, out);
    // Without the flag, no ids.
    let v = chat(&app, json!({"messages": messages()})).await.json();
    assert!(v.get("prompt_token_ids").is_none() && v["choices"][0].get("token_ids").is_none());
}

#[tokio::test]
async fn models_health_and_metrics() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let app = app(&engine);
    let v = call(&app, "GET", "/v1/models", "", &[]).await.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "smollm2-test");
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["max_model_len"], 2048);
    let r = call(&app, "GET", "/v1/models/smollm2-test", "", &[]).await;
    assert_eq!((r.status.as_u16(), r.json()["id"].clone()), (200, json!("smollm2-test")));
    let r = call(&app, "GET", "/health", "", &[]).await;
    assert_eq!((r.status.as_u16(), r.json()["status"].clone()), (200, json!("ok")));

    assert_eq!(chat(&app, json!({"messages": messages()})).await.status, 200);
    assert_eq!(chat(&app, json!({"messages": []})).await.status, 400);
    let r = call(&app, "GET", "/metrics", "", &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = String::from_utf8(r.body).unwrap();
    let prompt = engine.last_request().prompt.len();
    for want in [
        "tensorfold_requests_total 1".to_string(),
        format!("tensorfold_prompt_tokens_total {prompt}"),
        "tensorfold_requests_waiting 0".into(),
        "tensorfold_http_responses_total{code=\"200\"}".into(),
        "tensorfold_http_responses_total{code=\"400\"} 1".into(),
        "# TYPE tensorfold_step_seconds summary".into(),
        "tensorfold_cached_tokens_total 0".into(),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
}
