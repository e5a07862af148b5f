//! Every refusal has its status and an OpenAI-shaped error body, and no input the client
//! controls produces a 500 (or a panic).

mod common;

use common::*;
use serde_json::{json, Value};

fn msgs() -> Value {
    json!([{"role": "user", "content": "Hi"}])
}

/// Posts a chat request; asserts the status and returns the error object.
async fn refused(app: &axum::Router, body: Value, status: u16) -> Value {
    let r = chat(app, body.clone()).await;
    assert_eq!(r.status.as_u16(), status, "{body} -> {}", String::from_utf8_lossy(&r.body));
    r.error()
}

#[tokio::test]
async fn bad_fields_are_400_naming_the_field() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let app = app(&engine);
    let image = json!({"type": "image_url", "image_url": {"url": "x"}});
    let cases = [
        (json!({"messages": msgs(), "temperature": "hot"}), "temperature"),
        (json!({"messages": msgs(), "temperature": -0.5}), "temperature"),
        (json!({"messages": msgs(), "top_p": 0}), "top_p"),
        (json!({"messages": msgs(), "top_p": 1.5}), "top_p"),
        (json!({"messages": msgs(), "top_k": -2}), "top_k"),
        (json!({"messages": msgs(), "min_p": 2}), "min_p"),
        (json!({"messages": msgs(), "presence_penalty": 3}), "presence_penalty"),
        (json!({"messages": msgs(), "frequency_penalty": -2.5}), "frequency_penalty"),
        (json!({"messages": msgs(), "repetition_penalty": 0}), "repetition_penalty"),
        (json!({"messages": msgs(), "max_tokens": -1}), "max_tokens"),
        (json!({"messages": msgs(), "max_tokens": 0}), "max_tokens"),
        (json!({"messages": msgs(), "max_tokens": 1e12}), "max_tokens"),
        (json!({"messages": msgs(), "max_tokens": 2.5}), "max_tokens"),
        (json!({"messages": msgs(), "max_completion_tokens": "10"}), "max_completion_tokens"),
        (json!({"messages": msgs(), "seed": 1.5}), "seed"),
        (json!({"messages": msgs(), "seed": 1e30}), "seed"),
        (json!({"messages": msgs(), "n": 2}), "n"),
        (json!({"messages": msgs(), "stream": "yes"}), "stream"),
        (json!({"messages": msgs(), "stream_options": true}), "stream_options"),
        (json!({"messages": msgs(), "stop": 5}), "stop"),
        (json!({"messages": msgs(), "stop": [""]}), "stop"),
        (json!({"messages": msgs(), "stop": vec!["x"; 17]}), "stop"),
        (json!({"messages": msgs(), "return_token_ids": 1}), "return_token_ids"),
        (json!({"messages": msgs(), "draft": "no"}), "draft"),
        (json!({"messages": msgs(), "logprobs": true}), "logprobs"),
        (json!({"messages": msgs(), "tool_choice": "required"}), "tool_choice"),
        (json!({"messages": msgs(), "logit_bias": {"x": -100}}), "logit_bias"),
        (json!({"messages": msgs(), "logit_bias": {"-3": 1}}), "logit_bias"),
        (json!({"messages": msgs(), "logit_bias": {"99999999": 1}}), "logit_bias"),
        (json!({"messages": msgs(), "logit_bias": {"50": 101}}), "logit_bias"),
        (json!({"messages": msgs(), "logit_bias": {"50": "high"}}), "logit_bias"),
        (json!({"messages": msgs(), "logit_bias": {"7": 1, "07": 2}}), "logit_bias"),
        (json!({"messages": msgs(), "logit_bias": [1]}), "logit_bias"),
        (
            json!({"messages": msgs(), "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (json!({"messages": msgs(), "model": 7}), "model"),
        (json!({"messages": []}), "messages"),
        (json!({"messages": "Hi"}), "messages"),
        (json!({}), "messages"),
        (json!({"messages": [{"role": "wizard", "content": "Hi"}]}), "messages[0].role"),
        (json!({"messages": [{"content": "Hi"}]}), "messages[0].role"),
        (json!({"messages": [{"role": "user"}]}), "messages[0].content"),
        (json!({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
        (json!({"messages": ["Hi"]}), "messages[0]"),
        (json!({"messages": [{"role": "user", "content": [image]}]}), "messages[0].content"),
    ];
    for (body, param) in cases {
        let e = refused(&app, body.clone(), 400).await;
        assert_eq!(e["param"], param, "{body}: {e}");
        assert_eq!(e["type"], "invalid_request_error");
    }
    assert!(engine.log().requests.is_empty(), "no refused request reached the engine");
}

#[tokio::test]
async fn completion_prompts_are_checked() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let app = app(&engine);
    let vocab = codec().vocab_size() as u64;
    for body in [
        json!({}),
        json!({"prompt": ""}),
        json!({"prompt": []}),
        json!({"prompt": ["a", "b"]}),
        json!({"prompt": [[1], [2]]}),
        json!({"prompt": [1, -2]}),
        json!({"prompt": [vocab]}),
        json!({"prompt": [1.5]}),
        json!({"prompt": {"text": "x"}}),
        json!({"prompt": "x", "echo": true}),
        json!({"prompt": "x", "best_of": 3}),
        json!({"prompt": "x", "logprobs": 2}),
        json!({"prompt": "x", "suffix": "tail"}),
        json!({"prompt": "x", "logit_bias": {"7": "1.5"}}),
    ] {
        let r = post(&app, "/v1/completions", &body).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.error()["type"], "invalid_request_error");
    }
}

#[tokio::test]
async fn malformed_bodies_are_400() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let app = app(&engine);
    let bodies: [&[u8]; 7] = [
        b"{\"messages\": [",
        b"not json",
        b"",
        b"[1, 2]",
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}",
        b"{\"messages\": [], \"temperature\": 1e999}",
        b"\"just a string\"",
    ];
    for body in bodies {
        let r = call(&app, "POST", "/v1/chat/completions", body.to_vec(), &[]).await;
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(body));
        assert_eq!(r.error()["code"], "invalid_json");
    }
}

#[tokio::test]
async fn too_long_prompts_are_400_context_length_exceeded() {
    let engine = FakeEngine::new(Script::Say(ids("ok"))).with_context(20);
    let app = app(&engine);
    let long = "word ".repeat(40);
    let e = refused(&app, json!({"messages": [{"role": "user", "content": long}]}), 400).await;
    assert_eq!(e["code"], "context_length_exceeded");
    let r = post(&app, "/v1/completions", &json!({"prompt": [1, 2, 3], "max_tokens": 18})).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["code"], "context_length_exceeded");
    let r = post(&app, "/v1/completions", &json!({"prompt": [1, 2, 3], "max_tokens": 17})).await;
    assert_eq!(r.status, 200, "exactly the context fits");
}

#[tokio::test]
async fn unknown_model_is_404() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let app = app(&engine);
    let e = refused(&app, json!({"model": "gpt-4o", "messages": msgs()}), 404).await;
    assert_eq!((e["code"].clone(), e["param"].clone()), (json!("model_not_found"), json!("model")));
    let r = call(&app, "GET", "/v1/models/gpt-4o", "", &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.error()["code"], "model_not_found");
}

#[tokio::test]
async fn unknown_paths_are_404_and_wrong_methods_405() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let app = app(&engine);
    let r = call(&app, "GET", "/v1/nothing", "", &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.error()["code"], "not_found");
    for (method, path) in
        [("GET", "/v1/chat/completions"), ("DELETE", "/v1/completions"), ("POST", "/health")]
    {
        let r = call(&app, method, path, "", &[]).await;
        assert_eq!(r.status, 405, "{method} {path}");
        assert_eq!(r.error()["code"], "method_not_allowed");
    }
}

#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let mut config = config();
    config.body_limit = 1024;
    let (app, _) = app_with(&engine, config);
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(2000)}]});
    let r = chat(&app, big).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.error()["code"], "body_too_large");
    assert_eq!(chat(&app, json!({"messages": msgs()})).await.status, 200, "small bodies pass");
}

#[tokio::test]
async fn api_key_guards_v1_only() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let mut config = config();
    config.api_key = Some("s3cret".into());
    let (app, _) = app_with(&engine, config);
    let body = json!({"messages": msgs()}).to_string();
    for headers in
        [vec![], vec![("authorization", "Bearer wrong")], vec![("authorization", "s3cret")]]
    {
        let r = call(&app, "POST", "/v1/chat/completions", body.clone(), &headers).await;
        assert_eq!(r.status, 401, "{headers:?}");
        assert_eq!(r.error()["code"], "invalid_api_key");
        assert_eq!(r.headers["www-authenticate"], "Bearer");
    }
    let r = call(&app, "GET", "/v1/models", "", &[]).await;
    assert_eq!(r.status, 401);
    for auth in ["Bearer s3cret", "bearer s3cret"] {
        let r =
            call(&app, "POST", "/v1/chat/completions", body.clone(), &[("authorization", auth)])
                .await;
        assert_eq!(r.status, 200, "{auth}");
    }
    assert_eq!(call(&app, "GET", "/health", "", &[]).await.status, 200);
    assert_eq!(call(&app, "GET", "/metrics", "", &[]).await.status, 200);
    assert!(engine.log().requests.len() == 2, "only authorized requests reached the engine");
}

#[tokio::test]
async fn a_full_queue_is_429_with_retry_after() {
    let slow = std::time::Duration::from_millis(50);
    let engine = FakeEngine::with(Script::Say(ids("one two three four five six")), slow, 1, 0);
    let app = app(&engine);
    // The first request holds the only slot for ~300 ms; the second comes meanwhile.
    let first = chat(&app, json!({"messages": msgs(), "stream": true}));
    let (a, b) = tokio::join!(first, async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        chat(&app, json!({"messages": msgs()})).await
    });
    assert_eq!(a.status, 200);
    assert_eq!(b.status, 429);
    assert_eq!(b.error()["code"], "queue_full");
    assert_eq!(b.headers["retry-after"], "1");
}

#[tokio::test]
async fn shutting_down_is_503() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let (app, state) = app_with(&engine, config());
    state.begin_shutdown();
    assert!(engine.is_stopping(), "the engine was told");
    let e = refused(&app, json!({"messages": msgs()}), 503).await;
    assert_eq!(e["code"], "shutting_down");
    assert_eq!(call(&app, "GET", "/health", "", &[]).await.status, 503);
    // The engine's own refusal maps the same way.
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let app2 = app_with(&engine, config()).0;
    tf_server::Engine::shutdown(&engine);
    refused(&app2, json!({"messages": msgs()}), 503).await;
}

#[tokio::test]
async fn chat_without_a_template_or_refused_by_it_is_400() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let mut config = config();
    config.chat_template = None;
    let (app, _) = app_with(&engine, config);
    let e = refused(&app, json!({"messages": msgs()}), 400).await;
    assert!(e["message"].as_str().unwrap().contains("--chat-template"), "{e}");

    let mut config = common::config();
    let template =
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}x";
    config.chat_template = Some(codec().chat_template(template).unwrap());
    let (app, _) = app_with(&engine, config);
    let e = refused(&app, json!({"messages": msgs()}), 400).await;
    assert!(e["message"].as_str().unwrap().contains("system first"), "{e}");
}

#[tokio::test]
async fn an_engine_failure_is_500_or_an_error_event() {
    let engine = FakeEngine::new(Script::FailAfter(3));
    let app = app(&engine);
    let r = chat(&app, json!({"messages": msgs()})).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.error()["type"], "server_error");
    let chunks = chat(&app, json!({"messages": msgs(), "stream": true})).await.sse();
    let last = chunks.last().unwrap();
    assert_eq!(last["error"]["type"], "server_error", "{last}");
}

/// Every field of a valid request replaced by every kind of wrong value: never a 500.
#[tokio::test]
async fn no_field_value_causes_a_server_error() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let app = app(&engine);
    let base = json!({
        "model": "smollm2-test", "messages": msgs(), "max_tokens": 4, "temperature": 0.5,
        "top_p": 0.9, "top_k": 5, "min_p": 0.1, "presence_penalty": 0, "frequency_penalty": 0,
        "repetition_penalty": 1, "seed": 1, "stop": ["x"], "n": 1, "stream": false,
        "stream_options": {"include_usage": true}, "return_token_ids": true, "draft": false,
        "max_completion_tokens": 4, "tools": [], "chat_template_kwargs": {},
        "add_generation_prompt": true, "ignore_eos": false, "logit_bias": {},
    });
    let wrong = [
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(1e300),
        json!(-1e300),
        json!(1.5),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(""),
        json!("x"),
        json!([]),
        json!([null]),
        json!({}),
        json!({"a": 1}),
        json!([{"role": 1}]),
    ];
    let keys: Vec<String> = base.as_object().unwrap().keys().cloned().collect();
    for key in &keys {
        for value in &wrong {
            let mut body = base.clone();
            body[key.as_str()] = value.clone();
            let r = chat(&app, body).await;
            let s = r.status.as_u16();
            assert!(s == 200 || (400..500).contains(&s), "{key} = {value}: {s}");
            if s != 200 {
                r.error();
            }
        }
    }
}
