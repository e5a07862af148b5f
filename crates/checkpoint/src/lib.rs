//! The bottom layer of tensorfold: everything that reads a checkpoint from disk.
//!
//! - `safetensors` and `gguf` map files and expose their tensors as zero-copy [`TensorView`]s;
//!   every length and offset a header claims is checked against the file before it is used.
//! - `spec` turns an HF `config.json` or GGUF metadata into one [`ModelSpec`]; `admission`
//!   refuses by name any feature no family implements.
//! - `quant` is the scalar reference decoding of every block format (the arithmetic the fast
//!   kernels in `tf-backend` must reproduce).
//! - `vocab` holds what the files say about the tokenizer (a `tokenizer.json` path or the
//!   GGUF `tokenizer.ggml.*` vocabulary); `tf-tokenizer` builds the tokenizer from it.
//!
//! Nothing here knows about devices, kernels or batching.

pub mod admission;
pub mod checkpoint;
pub mod error;
pub mod gguf;
pub mod quant;
pub mod safetensors;
pub mod spec;
pub mod tensor;
pub mod vocab;
pub mod write;

pub use checkpoint::Checkpoint;
pub use error::{CheckpointError, Result};
pub use spec::ModelSpec;
pub use tensor::{DType, GgmlType, TensorData, TensorFormat, TensorView};
pub use vocab::{GgufVocab, TokenizerSource};
