//! Typed errors of the checkpoint layer. Every message names the file, the tensor or key, and
//! the problem, so a user can act on it without a debugger.

use std::path::PathBuf;

pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file's bytes contradict its own header (truncation, bad offsets, overflow...).
    #[error("{path}: malformed {format} file: {what}")]
    Malformed { path: PathBuf, format: &'static str, what: String },
    /// A tensor the model needs is missing or has the wrong shape/format.
    #[error("{path}: tensor `{tensor}`: {what}")]
    Tensor { path: PathBuf, tensor: String, what: String },
    /// `config.json` or GGUF metadata is missing a key or holds a bad value.
    #[error("{path}: config key `{key}`: {what}")]
    Config { path: PathBuf, key: String, what: String },
    /// The checkpoint is well formed but uses features no family implements.
    #[error("{path}: not admitted: {}", reasons.join("; "))]
    NotAdmitted { path: PathBuf, reasons: Vec<String> },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
}

impl CheckpointError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
}
