//! GGUF reader: a memory-mapped file, its metadata and tensor infos, and a [`Checkpoint`]
//! with HF tensor names, a [`ModelSpec`](crate::ModelSpec) and the embedded vocabulary.
//!
//! Opening reads only the header (the map's first pages); tensor data is never touched until
//! a consumer reads a [`TensorView`]. Every count, length and offset the header claims is
//! checked against the file before it is used (`reader.rs`, `layout.rs`), so a malformed file
//! gives a `Malformed` error naming the file, the key or tensor, and the problem, never a panic
//! or an out-of-bounds read.
//!
//! Tensors: F32/F16/BF16 become `TensorFormat::Plain`, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K
//! become `TensorFormat::Ggml`; shapes are reversed into HF order (`ne[0]`, the contiguous and
//! blocked dim, is last). Tensors of any other ggml type stay listed in [`GgufFile::tensors`]
//! but have no view; [`open_checkpoint`] names them in `spec.unsupported` so admission refuses
//! the checkpoint, and [`GgufFile::tensor_view`] refuses them by tensor and type.
//!
//! Layout: `value.rs` (metadata values), `reader.rs` (header bytes), `layout.rs` (data ranges),
//! `types.rs` (ggml type table), `names.rs` (GGUF -> HF names), `spec.rs` (ModelSpec),
//! `vocab.rs` (tokenizer metadata).

mod layout;
mod names;
mod reader;
mod spec;
mod types;
mod value;
mod vocab;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::checkpoint::CheckpointFormat;
use crate::error::{CheckpointError, Result};
use crate::tensor::{TensorData, TensorFormat, TensorView};
use crate::vocab::TokenizerSource;
use crate::Checkpoint;

pub use layout::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT};
pub use names::{gguf_name, hf_name, ROPE_FREQS};
pub use reader::{MAX_ARRAY_DEPTH, MAX_DIMS};
pub use spec::{hf_architecture, model_spec};
pub use types::{ggml_type, GgmlTypeInfo, GGML_TYPES};
pub use value::{GgufValue, GgufValueType};
pub use vocab::CHAT_TEMPLATE_KEY;

/// One tensor as the header describes it, resolved against the file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    /// The GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// The ggml type id as stored.
    pub type_id: u32,
    /// `Q4_1`, `F32`, ... or `unknown type 99`.
    pub type_name: String,
    /// `None` for types tensorfold does not decode.
    pub format: Option<TensorFormat>,
    /// HF order: outermost first, `ne[0]` last.
    pub shape: Vec<usize>,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    /// Bytes of data; `None` only for a type id outside the ggml table (size unknown).
    pub len: Option<usize>,
}

/// A mapped GGUF file: header decoded and checked, data untouched.
#[derive(Debug)]
pub struct GgufFile {
    pub path: PathBuf,
    /// 2 or 3.
    pub version: u32,
    /// In file order; keys are unique.
    pub metadata: Vec<(String, GgufValue)>,
    /// In file order; names are unique, data ranges in bounds and disjoint.
    pub tensors: Vec<GgufTensorInfo>,
    pub alignment: usize,
    /// Start of the data section (end of header rounded up to `alignment`).
    pub data_offset: usize,
    map: Arc<memmap2::Mmap>,
}

impl GgufFile {
    /// Maps `path` and decodes its header. Reads no tensor data.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = std::fs::File::open(path).map_err(|e| CheckpointError::io(path, e))?;
        // SAFETY: the mapping is read-only and the file is treated as immutable while mapped;
        // modifying a checkpoint file while it is being served is outside the contract (as for
        // every mmap-based loader). All reads of the map go through bounds-checked slices.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| CheckpointError::io(path, e))?;
        let header = reader::parse_header(&map, path)?;
        let alignment = layout::alignment(path, &header.metadata)?;
        let data_offset = layout::align_up(header.header_end, alignment).ok_or_else(|| {
            reader::malformed(
                path,
                format!("data section offset overflows (header ends at {})", header.header_end),
            )
        })?;
        let tensors = layout::resolve_all(path, header.tensors, data_offset, alignment, map.len())?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            version: header.version,
            metadata: header.metadata,
            tensors,
            alignment,
            data_offset,
            map: Arc::new(map),
        })
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.architecture`, if it is a string.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(|v| v.as_str())
    }

    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The file's size in bytes.
    pub fn file_len(&self) -> usize {
        self.map.len()
    }

    /// A zero-copy view of `info` named `name`; refuses a type tensorfold does not decode.
    pub fn view_as(&self, info: &GgufTensorInfo, name: &str) -> Result<TensorView> {
        let (Some(format), Some(len)) = (info.format, info.len) else {
            return Err(CheckpointError::Tensor {
                path: self.path.clone(),
                tensor: info.name.clone(),
                what: format!(
                    "ggml type {} is not supported (supported: {})",
                    info.type_name,
                    types::supported_names()
                ),
            });
        };
        // `layout` checked offset + len <= file length and the size against the shape.
        Ok(TensorView {
            name: name.to_string(),
            format,
            shape: info.shape.clone(),
            data: TensorData::Mapped {
                map: Arc::clone(&self.map),
                range: info.offset..info.offset + len,
            },
        })
    }

    /// A zero-copy view of the tensor named `name` (GGUF name), under its GGUF name.
    pub fn tensor_view(&self, name: &str) -> Result<TensorView> {
        let info = self.tensor_info(name).ok_or_else(|| CheckpointError::Tensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            what: "missing from the GGUF file".to_string(),
        })?;
        self.view_as(info, name)
    }
}

/// Opens a GGUF file as a [`Checkpoint`]: HF tensor names, spec, vocabulary, chat template.
pub fn open_checkpoint(path: &Path) -> Result<Checkpoint> {
    let mut file = GgufFile::open(path)?;
    let mut spec = spec::model_spec(&file)?;
    let mut tensors = BTreeMap::new();
    for info in &file.tensors {
        let hf = names::hf_name(&info.name).unwrap_or_else(|| info.name.clone());
        if info.format.is_none() {
            spec.unsupported.push(format!(
                "tensor `{hf}` (GGUF `{}`) in ggml type {} (supported: {})",
                info.name,
                info.type_name,
                types::supported_names()
            ));
            continue;
        }
        let view = file.view_as(info, &hf)?;
        if tensors.insert(hf.clone(), view).is_some() {
            return Err(reader::malformed(
                path,
                format!(
                    "tensor `{}` maps to HF name `{hf}`, which another tensor already has",
                    info.name
                ),
            ));
        }
    }
    let metadata = std::mem::take(&mut file.metadata);
    let (vocab, chat_template) = vocab::take_vocab(path, metadata)?;
    Ok(Checkpoint {
        path: path.to_path_buf(),
        format: CheckpointFormat::Gguf,
        spec,
        tensors,
        tokenizer: TokenizerSource::Gguf(vocab),
        chat_template,
    })
}
