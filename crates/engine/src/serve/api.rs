//! The engine's service interface: requests in, events out, over channels.
//!
//! The server validates HTTP input into a `GenerateRequest` (token ids, sampling, limits) and
//! submits it; the engine thread answers on the request's own event channel. Dropping the
//! `Submission` (its receiver) cancels the request at the next step, as does `cancel()`: a
//! client that disconnects frees its lane and KV without any other request noticing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::sampler::SamplingParams;

/// One generation, already tokenized and validated by the server.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    /// Most tokens to generate (>= 1).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Any of these ends generation; the stop token is not part of the output.
    pub stop_tokens: Vec<u32>,
    /// Use the prompt cache (a request may opt out; results are equal either way).
    pub use_prompt_cache: bool,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token was produced.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Cancelled by the client (or its channel closed).
    Cancelled,
}

/// Token counts of a finished request (OpenAI `usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prompt cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// What the engine reports for one request, in order: `Started`, `Token`*, then exactly one
/// of `Finished` or `Failed`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The request got a lane; `cached_tokens` of its prompt are reused from the cache.
    Started {
        cached_tokens: usize,
    },
    /// One output token.
    Token {
        id: u32,
    },
    Finished {
        finish: Finish,
        usage: Usage,
    },
    /// The engine could not serve it (e.g. an internal error); nothing more follows.
    Failed {
        message: String,
    },
}

/// Why a submission was refused before it was queued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The waiting queue is full (HTTP 429/503).
    #[error("the server is busy: {waiting} requests are waiting (queue limit {limit})")]
    QueueFull { waiting: usize, limit: usize },
    /// Prompt plus `max_tokens` does not fit the context (HTTP 400).
    #[error("this request needs {needed} tokens ({prompt} prompt + {max_tokens} max_tokens) but the context is {context} tokens")]
    TooLong { prompt: usize, max_tokens: usize, needed: usize, context: usize },
    /// A field the engine cannot honour (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// The engine is stopping (HTTP 503).
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Cancels a request from any thread.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A queued request as the caller holds it.
#[derive(Debug)]
pub struct Submission {
    pub id: u64,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub cancel: CancelToken,
}

/// A snapshot of the engine's counters, for `/metrics` and `/health`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    pub requests_total: u64,
    pub requests_running: usize,
    pub requests_waiting: usize,
    pub prompt_tokens_total: u64,
    pub cached_tokens_total: u64,
    pub completion_tokens_total: u64,
    pub steps_total: u64,
    /// Sum of step wall times, seconds.
    pub step_seconds_total: f64,
    pub kv_blocks_total: usize,
    pub kv_blocks_free: usize,
    pub prompt_cache_blocks: usize,
}

/// Static facts about the served model, for `/v1/models` and validation.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The id clients name in `model` (e.g. the checkpoint's file or directory name).
    pub id: String,
    /// Longest prompt + completion, tokens.
    pub context: usize,
    pub vocab_size: usize,
    pub parallel: usize,
}
