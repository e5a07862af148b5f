//! tensorfold's OpenAI-compatible HTTP server: HTTP in, engine requests out, engine events
//! back as JSON or server-sent events. It knows no tensors (DESIGN.md §3): it tokenizes,
//! validates, submits a `GenerateRequest` through the [`Engine`] trait and detokenizes.
//!
//! - `validate` (+ `fields`): a raw body becomes a validated `Plan`, or one `ApiError`;
//! - `errors`: the one error enum, rendered as OpenAI's error JSON with its status;
//! - `stream` (+ `stop`): engine events to text deltas with stop-string holdback, and SSE;
//! - `openai`: response wire types; `routes`: handlers, auth, the router; `metrics`: `/metrics`.
//! - `handle`: [`Engine`] for the real engine thread, `tf_engine::serve::EngineHandle`.
//!
//! Invariants: bad input is a 4xx, never a 500 or a panic; a client that disconnects drops its
//! `Submission`, which cancels the request at the engine's next step; on SIGINT/SIGTERM the
//! server stops accepting, tells the engine to stop taking requests, and lets running ones end.
//! Rejected: calling the engine in-process through a lock (the engine owns its thread and
//! talks over channels); a generic `Router<E>` (the engine is one boxed `dyn Engine`, so the
//! router and handlers are not monomorphized per engine type).

mod errors;
mod fields;
mod handle;
mod metrics;
pub mod openai;
mod routes;
pub mod stop;
pub mod stream;
pub mod validate;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tf_engine::serve::api::{EngineStats, GenerateRequest, ModelInfo, Submission, SubmitError};
use tf_engine::SamplingParams;
use tf_tokenizer::{ChatTemplate, TextCodec};

pub use errors::ApiError;
pub use routes::router;

/// What the server needs from the engine. `tf_engine::serve::worker::EngineHandle`
/// implements it; tests use a fake that follows the event order of `serve::api`.
pub trait Engine: Send + Sync + 'static {
    /// Queues a request; its events arrive on the returned submission.
    fn submit(&self, req: GenerateRequest) -> Result<Submission, SubmitError>;
    fn stats(&self) -> EngineStats;
    fn info(&self) -> &ModelInfo;
    /// Stops taking requests; running ones finish or are cancelled.
    fn shutdown(&self);
}

/// Default request body limit: 4 MiB (a long prompt as text is well under that).
pub const DEFAULT_BODY_LIMIT: usize = 4 << 20;

/// Everything the server is started with, built by the CLI from its flags and the checkpoint.
#[derive(Debug)]
pub struct ServerConfig {
    /// Address to bind; 127.0.0.1 unless asked otherwise.
    pub host: IpAddr,
    pub port: u16,
    /// `--api-key`: when set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The id clients name in `model` and `/v1/models` lists.
    pub model_id: String,
    pub codec: Arc<TextCodec>,
    /// The checkpoint's chat template (or `--chat-template FILE`); without one, chat
    /// requests are refused with a 400 saying so.
    pub chat_template: Option<ChatTemplate>,
    /// Tokens that end a reply (the checkpoint's EOS ids).
    pub stop_tokens: Vec<u32>,
    /// Largest request body, bytes (413 above it).
    pub body_limit: usize,
    /// Sampling for fields a request leaves out. OpenAI's defaults: temperature 1, all else
    /// off. The seed here is unused: a request without one gets a fresh random seed.
    pub defaults: SamplingParams,
}

impl ServerConfig {
    /// A config with the defaults: 127.0.0.1:8080, no key, 4 MiB bodies, temperature 1.
    pub fn new(
        model_id: impl Into<String>,
        codec: Arc<TextCodec>,
        chat_template: Option<ChatTemplate>,
        stop_tokens: Vec<u32>,
    ) -> Self {
        ServerConfig {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8080,
            api_key: None,
            model_id: model_id.into(),
            codec,
            chat_template,
            stop_tokens,
            body_limit: DEFAULT_BODY_LIMIT,
            defaults: SamplingParams { temperature: 1.0, ..SamplingParams::default() },
        }
    }
}

/// Shared state of the handlers: the config, the engine, counters.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

struct Shared {
    config: ServerConfig,
    engine: Box<dyn Engine>,
    http: metrics::HttpCounters,
    stopping: AtomicBool,
}

impl AppState {
    pub fn new(config: ServerConfig, engine: impl Engine) -> Self {
        AppState(Arc::new(Shared {
            config,
            engine: Box::new(engine),
            http: metrics::HttpCounters::default(),
            stopping: AtomicBool::new(false),
        }))
    }

    pub fn config(&self) -> &ServerConfig {
        &self.0.config
    }

    pub fn engine(&self) -> &dyn Engine {
        self.0.engine.as_ref()
    }

    /// Refuse new requests (503) and tell the engine to stop taking them.
    pub fn begin_shutdown(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
        self.0.engine.shutdown();
    }

    pub fn is_stopping(&self) -> bool {
        self.0.stopping.load(Ordering::SeqCst)
    }

    /// Validates a request body against the served model.
    pub fn plan(
        &self,
        endpoint: validate::Endpoint,
        body: &[u8],
    ) -> Result<validate::Plan, ApiError> {
        let c = &self.0.config;
        let info = self.0.engine.info();
        let ctx = validate::ValidateCtx {
            model_id: &c.model_id,
            codec: &c.codec,
            template: c.chat_template.as_ref(),
            stop_tokens: &c.stop_tokens,
            context: info.context,
            vocab_size: info.vocab_size,
            defaults: &c.defaults,
        };
        validate::plan(endpoint, body, &ctx)
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// A bound server, not yet serving (tests bind port 0 and read the address).
pub struct Server {
    listener: tokio::net::TcpListener,
    state: AppState,
}

impl Server {
    pub async fn bind(config: ServerConfig, engine: impl Engine) -> Result<Self, ServerError> {
        let addr = SocketAddr::new(config.host, config.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        Ok(Server { listener, state: AppState::new(config, engine) })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        self.listener.local_addr().map_err(ServerError::Serve)
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then stops accepting, shuts the engine's intake and
    /// returns once every open connection has finished its response.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let state = self.state.clone();
        let signal = async move {
            shutdown.await;
            state.begin_shutdown();
        };
        axum::serve(self.listener, router(self.state))
            .with_graceful_shutdown(signal)
            .await
            .map_err(ServerError::Serve)
    }
}

/// Binds `config.host:config.port` and serves until SIGINT or SIGTERM.
pub async fn serve(config: ServerConfig, engine: impl Engine) -> Result<(), ServerError> {
    Server::bind(config, engine).await?.run(os_signal()).await
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM. A handler that cannot be installed
/// never fires (the other still can).
pub async fn os_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = interrupt => {}
        () = terminate() => {}
    }
}

#[cfg(unix)]
async fn terminate() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending::<()>().await,
    }
}

#[cfg(not(unix))]
async fn terminate() {
    std::future::pending::<()>().await
}
