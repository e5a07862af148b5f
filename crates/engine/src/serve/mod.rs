//! Serving many requests at once: the engine thread and the pure data structures it drives.
//!
//! - `api`: what the server sends in (`GenerateRequest`) and gets back (`Event`s on a channel);
//! - `cache`: paged KV blocks with the prompt cache (hash chain of token blocks, reference
//!   counts, LRU eviction) as pure data over `BlockId`s;
//! - `scheduler`: continuous batching over `--parallel` lanes; `schedule()` returns a plan of
//!   decode rows and prefill chunks for one step;
//! - `plan`: the memory plan (weights + KV + prompt cache within one budget);
//! - `worker`: the thread that owns the model and the KV pool and runs schedule -> forward ->
//!   sample, step after step.
//!
//! Exactness: a row's logits depend only on its own tokens and KV (the kernel contract), so
//! which requests share a step, and whether a prefix came from the cache, changes no token.

pub mod api;
pub mod cache;
pub mod plan;
pub mod scheduler;
pub mod worker;

pub use api::*;
pub use worker::{EngineConfig, EngineHandle};
