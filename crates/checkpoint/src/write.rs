//! Writing safetensors files (for `export` and `synth`): the header is JSON with each tensor's
//! dtype, shape and `data_offsets`, padded with spaces to a multiple of 8 bytes, followed by
//! the tensors back to back in header order (the format's documented layout,
//! huggingface/safetensors README).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use crate::error::{CheckpointError, Result};
use crate::tensor::DType;

/// One tensor to write; `bytes` are little-endian elements of `dtype`.
pub struct OutTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// Writes `tensors` (sorted by name, as HF writers do) to `path`.
pub fn write_safetensors(
    path: &Path,
    tensors: &mut [OutTensor],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), serde_json::to_value(metadata).unwrap_or_default());
    }
    let mut offset = 0usize;
    for t in tensors.iter() {
        let want = t.shape.iter().product::<usize>() * t.dtype.size();
        if want != t.bytes.len() {
            return Err(CheckpointError::Tensor {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                what: format!("shape {:?} needs {want} bytes, got {}", t.shape, t.bytes.len()),
            });
        }
        header.insert(
            t.name.clone(),
            serde_json::json!({
                "dtype": t.dtype.safetensors_name(),
                "shape": t.shape,
                "data_offsets": [offset, offset + t.bytes.len()],
            }),
        );
        offset += t.bytes.len();
    }
    let mut json = serde_json::Value::Object(header).to_string().into_bytes();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let io = |e| CheckpointError::io(path, e);
    let tmp = path.with_extension("safetensors.part");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    f.write_all(&(json.len() as u64).to_le_bytes()).map_err(io)?;
    f.write_all(&json).map_err(io)?;
    for t in tensors.iter() {
        f.write_all(&t.bytes).map_err(io)?;
    }
    f.flush().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)
}
