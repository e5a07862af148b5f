//! A real server on a loopback port: the SSE wire format, a client that disconnects cancels
//! its request (streamed or not), the body limit on the wire, and graceful shutdown lets a
//! running stream finish while new connections are refused.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

fn slow_engine() -> FakeEngine {
    // Long enough that only a cancellation ends it within the test's patience.
    FakeEngine::with(Script::Say(ids(&"tick ".repeat(2000))), Duration::from_millis(5), 100, 0)
}

#[tokio::test]
async fn sse_chunks_are_data_lines_ending_with_done() {
    let engine = FakeEngine::new(Script::Say(ids("Hello there")));
    let live = live(&engine, config()).await;
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true}).to_string();
    let mut s =
        connect_and_send(live.addr, &http_post("/v1/chat/completions", body.as_bytes())).await;
    let (status, text) = read_response(&mut s).await;
    assert_eq!(status, 200);
    assert!(text.starts_with("data: {"), "{text:?}");
    assert!(text.ends_with("\n\ndata: [DONE]\n\n"), "{text:?}");
    assert_eq!(stream_text(&parse_sse(&text)), "Hello there");
}

#[tokio::test]
async fn a_client_leaving_a_stream_cancels_its_request() {
    let engine = slow_engine();
    let live = live(&engine, config()).await;
    let body = json!({"prompt": "Hi", "stream": true, "max_tokens": 2000}).to_string();
    let mut s = connect_and_send(live.addr, &http_post("/v1/completions", body.as_bytes())).await;
    let mut buf = Vec::new();
    assert!(read_until(&mut s, &mut buf, b"tick", Duration::from_secs(5)).await, "no token came");
    drop(s);
    assert!(
        engine.wait_cancelled(1, Duration::from_secs(5)).await,
        "the engine never saw the cancel"
    );
    assert!(!engine.log().finished.contains(&1));
}

#[tokio::test]
async fn a_client_leaving_a_whole_reply_cancels_its_request() {
    let engine = slow_engine();
    let live = live(&engine, config()).await;
    let body = json!({"prompt": "Hi", "max_tokens": 2000}).to_string();
    let s = connect_and_send(live.addr, &http_post("/v1/completions", body.as_bytes())).await;
    // Let the request reach the engine, then hang up without reading.
    for _ in 0..500 {
        if !engine.log().requests.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(engine.log().requests.len(), 1, "the request never reached the engine");
    drop(s);
    assert!(
        engine.wait_cancelled(1, Duration::from_secs(5)).await,
        "the engine never saw the cancel"
    );
}

#[tokio::test]
async fn the_body_limit_holds_on_the_wire() {
    let engine = FakeEngine::new(Script::Say(ids("ok")));
    let mut config = config();
    config.body_limit = 4096;
    let live = live(&engine, config).await;
    let body = json!({"prompt": "x".repeat(10_000)}).to_string();
    let mut s = connect_and_send(live.addr, &http_post("/v1/completions", body.as_bytes())).await;
    let (status, text) = read_response(&mut s).await;
    assert_eq!(status, 413, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "body_too_large");
}

#[tokio::test]
async fn graceful_shutdown_finishes_running_streams_and_refuses_new_ones() {
    let reply = "one two three four five six seven eight";
    let engine = FakeEngine::with(Script::Say(ids(reply)), Duration::from_millis(30), 100, 0);
    let mut live = live(&engine, config()).await;
    let body = json!({"prompt": "Hi", "stream": true, "max_tokens": 100}).to_string();
    let mut s = connect_and_send(live.addr, &http_post("/v1/completions", body.as_bytes())).await;
    let mut buf = Vec::new();
    assert!(read_until(&mut s, &mut buf, b"data: ", Duration::from_secs(5)).await);
    live.stop.take().unwrap().send(()).unwrap();
    // The running stream still ends properly.
    let (status, text) = {
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut rest).await.unwrap();
        buf.extend(rest);
        let whole = String::from_utf8(buf).unwrap();
        let (head, body) = whole.split_once("\r\n\r\n").unwrap();
        (head.to_string(), body.to_string())
    };
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(text.contains("data: [DONE]"), "the stream was cut: {text}");
    assert!(engine.is_stopping(), "the engine was told to stop taking requests");
    let ended = tokio::time::timeout(Duration::from_secs(5), live.done).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "the server did not stop cleanly: {ended:?}");
    assert!(tokio::net::TcpStream::connect(live.addr).await.is_err(), "still accepting");
}
