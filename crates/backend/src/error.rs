//! Backend errors: they name the op and the shapes involved.

pub type Result<T, E = BackendError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Inputs of an op disagree (a caller bug, reported instead of read out of bounds).
    #[error("{op}: {what}")]
    Shape { op: &'static str, what: String },
    /// A weight format this backend does not compute.
    #[error("{op}: weight `{tensor}` has format {format}, which this backend does not support")]
    Format { op: &'static str, tensor: String, format: String },
    /// Out of device or host memory for a named allocation.
    #[error("out of memory allocating {what}: {bytes} bytes")]
    OutOfMemory { what: String, bytes: usize },
    #[error("{0}")]
    Device(String),
}

impl BackendError {
    pub fn shape(op: &'static str, what: impl Into<String>) -> Self {
        BackendError::Shape { op, what: what.into() }
    }
}
