//! safetensors reader (skeleton: filled in by the helper owning it).

use std::path::Path;

use crate::error::{CheckpointError, Result};
use crate::Checkpoint;

pub fn open_hf_dir(path: &Path) -> Result<Checkpoint> {
    Err(CheckpointError::Malformed {
        path: path.to_path_buf(),
        format: "safetensors",
        what: "reader not written yet".to_string(),
    })
}
