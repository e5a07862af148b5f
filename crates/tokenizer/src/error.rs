//! The one error type of `tf-tokenizer`. Every message names the file, the GGUF key or the
//! template stage it comes from, so a refusal at load time reads without the source at hand.
//! Errors from the `tokenizers` crate (boxed trait objects) are flattened to their message and
//! tagged with the operation that raised them.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: {what}")]
    File { path: PathBuf, what: String },

    #[error(
        "GGUF tokenizer: tokenizer.ggml.model {model:?} is not supported (supported: gpt2, llama)"
    )]
    UnsupportedModel { model: String },

    #[error(
        "GGUF tokenizer: tokenizer.ggml.pre {pre:?} is not supported for byte-level BPE \
         (supported: {supported})"
    )]
    UnsupportedPre { pre: String, supported: String },

    #[error("GGUF tokenizer: {key}: {what}")]
    Vocab { key: &'static str, what: String },

    #[error("tokenizer: {op}: {what}")]
    Tokenizers { op: &'static str, what: String },

    #[error("chat template ({stage}): {message}")]
    Template { stage: &'static str, message: String },
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

impl TokenizerError {
    pub(crate) fn tk(op: &'static str, e: impl std::fmt::Display) -> Self {
        TokenizerError::Tokenizers { op, what: e.to_string() }
    }

    pub(crate) fn vocab(key: &'static str, what: impl Into<String>) -> Self {
        TokenizerError::Vocab { key, what: what.into() }
    }
}
