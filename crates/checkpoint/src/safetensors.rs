//! HF checkpoint directories: safetensors weights (single file or sharded), `config.json`,
//! the tokenizer files and the chat template.
//!
//! - `file`: one `.safetensors` file, header checked against the mapping, zero-copy views.
//! - `weights`: `model.safetensors` or the shards of `model.safetensors.index.json`.
//! - `hf_dir`: the whole directory as a [`crate::Checkpoint`].
//!
//! Every file is mapped, never read into memory; only JSON side files are read, and those
//! under a size cap so a hostile directory cannot make us allocate without bound.

mod file;
mod hf_dir;
mod weights;

use std::path::Path;

use serde_json::Value;

use crate::error::{CheckpointError, Result};

pub use file::{SafetensorsFile, MAX_HEADER_BYTES};
pub use hf_dir::{
    chat_template, open_hf_dir, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG, TOKENIZER_JSON,
};
pub use weights::{open_sharded, open_single, open_weights, Weights, INDEX_FILE, SINGLE_FILE};

/// JSON side files (config, index, tokenizer_config) larger than this are refused.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// Reads and parses a small JSON file, refusing files over [`MAX_JSON_BYTES`].
pub(crate) fn read_json_file(path: &Path) -> Result<Value> {
    let len = std::fs::metadata(path).map_err(|e| CheckpointError::io(path, e))?.len();
    if len > MAX_JSON_BYTES {
        return Err(CheckpointError::Malformed {
            path: path.to_path_buf(),
            format: "JSON",
            what: format!("{len} bytes is over the {MAX_JSON_BYTES}-byte limit for a side file"),
        });
    }
    let bytes = std::fs::read(path).map_err(|e| CheckpointError::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Malformed {
        path: path.to_path_buf(),
        format: "JSON",
        what: e.to_string(),
    })
}
