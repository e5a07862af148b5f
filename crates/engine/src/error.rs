//! Engine errors: wrap the layers below and add the engine's own refusals.

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Checkpoint(#[from] tf_checkpoint::CheckpointError),
    #[error(transparent)]
    Backend(#[from] tf_backend::BackendError),
    /// The request cannot be served as asked (too long, out of KV blocks, bad parameter).
    #[error("{0}")]
    Refused(String),
}
