//! The engine: model families written against the backend op set, paged KV blocks,
//! sampling, and the generation loop.
//!
//! - `family`: one file per model family, registered in one table keyed by the HF
//!   `architectures` string; a family knows geometry and rounding points, not kernels.
//! - `kv`: the block allocator over `BlockId`s (pure data, no tensors).
//! - `sampler` + `philox`: token choice from logits; a draw is keyed by (seed, position) so it
//!   does not depend on the batch, restarts or drafting (the `seeded == seeded` invariant).
//! - `generate`: prefill in chunks and decode, one sequence at a time for now; every step goes
//!   through the same `forward(batch)` a multi-sequence scheduler will call.

mod ahead;
pub mod check;
pub mod error;
pub mod family;
pub mod generate;
pub mod judge;
pub mod kv;
pub mod philox;
pub mod rope;
pub mod sampler;
pub mod serve;

pub use error::{EngineError, Result};
pub use kv::{BlockAllocator, BlockId, SeqId};
pub use sampler::{Sampler, SamplingParams};
