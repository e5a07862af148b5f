//! Opening a checkpoint from a path: a GGUF file, or an HF directory (config.json +
//! safetensors, single or sharded). The result names tensors by their HF names whatever the
//! file format, so families read one naming scheme.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{CheckpointError, Result};
use crate::spec::ModelSpec;
use crate::tensor::TensorView;
use crate::vocab::TokenizerSource;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointFormat {
    Gguf,
    Safetensors,
}

#[derive(Debug)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub format: CheckpointFormat,
    pub spec: ModelSpec,
    /// Keyed by HF tensor name (`model.layers.0.self_attn.q_proj.weight`).
    pub tensors: BTreeMap<String, TensorView>,
    pub tokenizer: TokenizerSource,
    /// Jinja chat template from `tokenizer_config.json` / `chat_template.jinja` / GGUF metadata.
    pub chat_template: Option<String>,
}

impl Checkpoint {
    /// Opens a GGUF file or an HF checkpoint directory. Maps files; reads no tensor data.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let meta = std::fs::metadata(path).map_err(|e| CheckpointError::io(path, e))?;
        if meta.is_dir() {
            crate::safetensors::open_hf_dir(path)
        } else {
            crate::gguf::open_checkpoint(path)
        }
    }

    pub fn tensor(&self, name: &str) -> Result<&TensorView> {
        self.tensors.get(name).ok_or_else(|| CheckpointError::Tensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            what: "missing from the checkpoint".to_string(),
        })
    }

    /// Total bytes of all tensors as stored.
    pub fn weight_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.bytes().len()).sum()
    }
}
