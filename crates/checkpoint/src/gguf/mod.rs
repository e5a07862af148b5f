//! GGUF reader (skeleton: filled in by the helper owning `gguf/`).

use std::path::Path;

use crate::error::{CheckpointError, Result};
use crate::Checkpoint;

pub fn open_checkpoint(path: &Path) -> Result<Checkpoint> {
    Err(CheckpointError::Malformed {
        path: path.to_path_buf(),
        format: "GGUF",
        what: "reader not written yet".to_string(),
    })
}
