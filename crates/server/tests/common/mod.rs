//! Shared test support: a fake engine that follows `serve::api`'s event order (`Started`,
//! `Token`*, then one `Finished` or `Failed`), the test model's tokenizer and chat template
//! (SmolLM2, from the GGUF that scripts/fetch-model.sh fetches: a missing model fails the test
//! with that hint, never skips it), in-process calls through tower's `oneshot`, and a raw
//! HTTP/1.1 client for a real loopback server.
#![allow(dead_code)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::Value;
use tf_engine::serve::api::{
    CancelToken, EngineStats, Event, Finish, GenerateRequest, ModelInfo, Submission, SubmitError,
    Usage,
};
use tf_server::{AppState, Engine, ServerConfig};
use tf_tokenizer::TextCodec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tower::ServiceExt;

pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// scripts/fetch-model.sh's location logic: $TENSORFOLD_CACHE or <repo>/.cache, then models/.
pub fn model_path() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache = std::env::var_os("TENSORFOLD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".cache"));
    let path = cache.join("models").join(MODEL_FILE);
    assert!(
        path.is_file(),
        "test model {} not found: run scripts/fetch-model.sh (it honours TENSORFOLD_CACHE)",
        path.display()
    );
    path
}

struct Text {
    codec: Arc<TextCodec>,
    template: String,
}

fn text() -> &'static Text {
    static TEXT: OnceLock<Text> = OnceLock::new();
    TEXT.get_or_init(|| {
        let path = model_path();
        let ckpt = tf_checkpoint::Checkpoint::open(&path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        let codec = TextCodec::from_source(&ckpt.tokenizer).expect("SmolLM2 tokenizer");
        let template = ckpt.chat_template.clone().expect("SmolLM2 GGUF has a chat template");
        Text { codec: Arc::new(codec), template }
    })
}

pub fn codec() -> Arc<TextCodec> {
    text().codec.clone()
}

pub fn eos() -> u32 {
    codec().eos_id().expect("SmolLM2 has an EOS token")
}

/// Token ids of `text` (no added specials), for scripting what the fake engine says.
pub fn ids(text: &str) -> Vec<u32> {
    codec().encode(text, false).expect("encode")
}

/// The SmolLM2 config every test starts from: its template and EOS, defaults otherwise.
pub fn config() -> ServerConfig {
    let codec = codec();
    let template = codec.chat_template(&text().template).expect("compile template");
    ServerConfig::new("smollm2-test", codec, Some(template), vec![eos()])
}

/// What the fake engine does with one request.
#[derive(Clone)]
pub enum Script {
    /// Emit these tokens in order (stopping early at a stop token or `max_tokens`); when they
    /// run out, finish as if EOS came.
    Say(Vec<u32>),
    /// Emit this many tokens (`Say` after them), then report a failure.
    FailAfter(usize),
}

/// Everything the fake engine saw.
#[derive(Default)]
pub struct Log {
    pub requests: Vec<GenerateRequest>,
    /// Submission ids whose cancellation (token or dropped receiver) the engine noticed.
    pub cancelled: HashSet<u64>,
    pub finished: HashSet<u64>,
}

/// A fake engine: one thread per request, one token per `delay`.
#[derive(Clone)]
pub struct FakeEngine(Arc<Inner>);

struct Inner {
    info: ModelInfo,
    script: Mutex<Script>,
    delay: Duration,
    /// Requests at once before `QueueFull`.
    queue_limit: usize,
    cached_tokens: usize,
    log: Mutex<Log>,
    stopping: AtomicBool,
    next_id: AtomicU64,
    live: AtomicUsize,
}

impl FakeEngine {
    pub fn new(script: Script) -> Self {
        Self::with(script, Duration::ZERO, 1000, 0)
    }

    pub fn with(script: Script, delay: Duration, queue_limit: usize, cached_tokens: usize) -> Self {
        FakeEngine(Arc::new(Inner {
            info: ModelInfo {
                id: "fake".into(),
                context: 2048,
                vocab_size: codec().vocab_size(),
                parallel: 4,
            },
            script: Mutex::new(script),
            delay,
            queue_limit,
            cached_tokens,
            log: Mutex::new(Log::default()),
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            live: AtomicUsize::new(0),
        }))
    }

    pub fn with_context(self, context: usize) -> Self {
        let mut inner = Arc::try_unwrap(self.0).ok().expect("configure before sharing");
        inner.info.context = context;
        FakeEngine(Arc::new(inner))
    }

    pub fn set_script(&self, script: Script) {
        *self.0.script.lock().unwrap() = script;
    }

    pub fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.0.log.lock().unwrap()
    }

    pub fn last_request(&self) -> GenerateRequest {
        self.log().requests.last().cloned().expect("a request reached the engine")
    }

    pub fn is_stopping(&self) -> bool {
        self.0.stopping.load(Ordering::SeqCst)
    }

    /// Waits until request `id`'s cancellation is seen (true) or `within` passes (false).
    pub async fn wait_cancelled(&self, id: u64, within: Duration) -> bool {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if self.log().cancelled.contains(&id) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }
}

impl Engine for FakeEngine {
    fn submit(&self, req: GenerateRequest) -> Result<Submission, SubmitError> {
        let inner = &self.0;
        if inner.stopping.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        let needed = req.prompt.len() + req.max_tokens;
        if needed > inner.info.context {
            return Err(SubmitError::TooLong {
                prompt: req.prompt.len(),
                max_tokens: req.max_tokens,
                needed,
                context: inner.info.context,
            });
        }
        let live = inner.live.load(Ordering::SeqCst);
        if live >= inner.queue_limit {
            return Err(SubmitError::QueueFull { waiting: live, limit: inner.queue_limit });
        }
        inner.live.fetch_add(1, Ordering::SeqCst);
        let id = inner.next_id.fetch_add(1, Ordering::SeqCst);
        inner.log.lock().unwrap().requests.push(req.clone());
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancelToken::default();
        let script = inner.script.lock().unwrap().clone();
        let (engine, token) = (self.clone(), cancel.clone());
        std::thread::spawn(move || {
            engine.generate(id, &req, script, &tx, &token);
            engine.0.live.fetch_sub(1, Ordering::SeqCst);
        });
        Ok(Submission { id, events: rx, cancel })
    }

    fn stats(&self) -> EngineStats {
        let log = self.log();
        EngineStats {
            requests_total: log.requests.len() as u64,
            requests_running: self.0.live.load(Ordering::SeqCst),
            prompt_tokens_total: log.requests.iter().map(|r| r.prompt.len() as u64).sum(),
            ..Default::default()
        }
    }

    fn info(&self) -> &ModelInfo {
        &self.0.info
    }

    fn shutdown(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
    }
}

impl FakeEngine {
    fn generate(
        &self,
        id: u64,
        req: &GenerateRequest,
        script: Script,
        tx: &mpsc::UnboundedSender<Event>,
        cancel: &CancelToken,
    ) {
        let cached = self.0.cached_tokens.min(req.prompt.len());
        let (tokens, fail_after) = match script {
            Script::Say(t) => (t, None),
            Script::FailAfter(n) => (vec![ids("x")[0]; n], Some(n)),
        };
        let usage = |n: usize| Usage {
            prompt_tokens: req.prompt.len(),
            cached_tokens: cached,
            completion_tokens: n,
        };
        let finish = |finish: Finish, n: usize| {
            let _ = tx.send(Event::Finished { finish, usage: usage(n) });
            self.log().finished.insert(id);
        };
        let _ = tx.send(Event::Started { cached_tokens: cached });
        for (n, &tok) in tokens.iter().enumerate() {
            std::thread::sleep(self.0.delay);
            if cancel.is_cancelled() || tx.is_closed() {
                self.log().cancelled.insert(id);
                return;
            }
            if n == req.max_tokens {
                return finish(Finish::Length, n);
            }
            if req.stop_tokens.contains(&tok) {
                return finish(Finish::Stop, n);
            }
            let _ = tx.send(Event::Token { id: tok });
        }
        if fail_after.is_some() {
            let _ = tx.send(Event::Failed { message: "the fake engine failed".into() });
            return;
        }
        if tokens.len() >= req.max_tokens {
            finish(Finish::Length, req.max_tokens)
        } else {
            finish(Finish::Stop, tokens.len())
        }
    }
}

/// The router over `engine` and `config`.
pub fn app_with(engine: &FakeEngine, config: ServerConfig) -> (Router, AppState) {
    let state = AppState::new(config, engine.clone());
    (tf_server::router(state.clone()), state)
}

pub fn app(engine: &FakeEngine) -> Router {
    app_with(engine, config()).0
}

/// A response as the tests read it.
pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body))
        })
    }

    /// The `error` object of an error reply, checked for OpenAI's shape.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].is_string(), "error without message: {v}");
        assert!(e["type"].is_string(), "error without type: {v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "error shape: {v}");
        e
    }

    /// The `data:` payloads of an SSE body, checked to end with `[DONE]`, JSON-parsed.
    pub fn sse(&self) -> Vec<Value> {
        parse_sse(&String::from_utf8(self.body.clone()).expect("SSE body is UTF-8"))
    }
}

pub fn parse_sse(text: &str) -> Vec<Value> {
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let mut out = Vec::new();
    for (i, event) in events.iter().enumerate() {
        if event.starts_with(':') {
            continue; // keep-alive comment
        }
        let data =
            event.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data line: {event:?}"));
        if data == "[DONE]" {
            assert_eq!(i, events.len() - 1, "[DONE] is not last");
            return out;
        }
        out.push(serde_json::from_str(data).unwrap_or_else(|e| panic!("chunk {data:?}: {e}")));
    }
    panic!("stream did not end with data: [DONE]:\n{text}");
}

/// One request through the router, in process.
pub async fn call(
    app: &Router,
    method: &str,
    path: &str,
    body: impl Into<Body>,
    headers: &[(&str, &str)],
) -> Reply {
    let mut req =
        Request::builder().method(method).uri(path).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = app.clone().oneshot(req.body(body.into()).unwrap()).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = to_bytes(response.into_body(), usize::MAX).await.unwrap().to_vec();
    Reply { status, headers, body }
}

pub async fn post(app: &Router, path: &str, body: &Value) -> Reply {
    call(app, "POST", path, body.to_string(), &[]).await
}

pub async fn chat(app: &Router, body: Value) -> Reply {
    post(app, "/v1/chat/completions", &body).await
}

/// The concatenated text of a stream's chunks (chat `delta.content` or completion `text`).
pub fn stream_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|ch| ch["delta"]["content"].as_str().or(ch["text"].as_str()))
        .collect()
}

/// A real server on an ephemeral loopback port; send on the channel to stop it.
pub struct Live {
    pub addr: SocketAddr,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<Result<(), tf_server::ServerError>>,
}

pub async fn live(engine: &FakeEngine, mut config: ServerConfig) -> Live {
    config.port = 0;
    let server = tf_server::Server::bind(config, engine.clone()).await.expect("bind");
    let addr = server.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Live { addr, stop: Some(stop), done }
}

/// Raw HTTP/1.1: the request bytes for a JSON POST.
pub fn http_post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

pub async fn connect_and_send(addr: SocketAddr, request: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("send");
    s
}

/// Reads until `needle` has arrived (true) or `within` passes (false).
pub async fn read_until(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    needle: &[u8],
    within: Duration,
) -> bool {
    let end = tokio::time::Instant::now() + within;
    loop {
        if buf.windows(needle.len()).any(|w| w == needle) {
            return true;
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(end, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return false,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads a whole `Connection: close` response: (status, body with chunked framing removed).
pub async fn read_response(s: &mut TcpStream) -> (u16, String) {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    (status, if chunked { dechunk(body) } else { body.to_string() })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}
