//! The weights of an HF directory: `model.safetensors`, or shards named by
//! `model.safetensors.index.json`, gathered into one name -> tensor map.
//!
//! Index format (written by transformers' `save_pretrained` and by mlx-lm):
//! `{"metadata": {...}, "weight_map": {"<tensor>": "<shard file name>", ...}}`.
//!
//! Invariants: every shard the index names is a plain file name inside the directory (no
//! separators, no `..`), exists, and holds every tensor the index assigns to it; a tensor name
//! appears in exactly one shard. A shard may hold tensors the index does not list: they are
//! kept, as transformers loads whole shards. When both a single file and an index exist the
//! single file wins, as in transformers' `from_pretrained`.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use super::file::SafetensorsFile;
use super::read_json_file;
use crate::error::{CheckpointError, Result};
use crate::tensor::TensorView;

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// All tensors of a checkpoint's safetensors files.
#[derive(Debug)]
pub struct Weights {
    /// The files the tensors come from, in the order they were opened.
    pub files: Vec<PathBuf>,
    /// `__metadata__` of every file merged; on a conflicting key the first file wins.
    pub metadata: BTreeMap<String, String>,
    /// Keyed by tensor name.
    pub tensors: BTreeMap<String, TensorView>,
}

/// Opens `dir/model.safetensors`, or else the shards of `dir/model.safetensors.index.json`.
pub fn open_weights(dir: &Path) -> Result<Weights> {
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return open_single(&single);
    }
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        return open_sharded(&index);
    }
    Err(CheckpointError::Malformed {
        path: dir.to_path_buf(),
        format: "HF checkpoint directory",
        what: format!("neither {SINGLE_FILE} nor {INDEX_FILE} is present"),
    })
}

/// One unsharded file.
pub fn open_single(path: &Path) -> Result<Weights> {
    let file = SafetensorsFile::open(path)?;
    let mut weights =
        Weights { files: Vec::new(), metadata: BTreeMap::new(), tensors: BTreeMap::new() };
    // Within one file names are unique (the header parser refuses duplicate keys).
    weights.tensors.extend(file.tensors.into_iter().map(|t| (t.name.clone(), t)));
    weights.metadata = file.metadata;
    weights.files.push(file.path);
    Ok(weights)
}

fn index_error(path: &Path, what: String) -> CheckpointError {
    CheckpointError::Malformed { path: path.to_path_buf(), format: "safetensors index", what }
}

/// The shards named by an index file, which must sit in the same directory as the shards.
pub fn open_sharded(index_path: &Path) -> Result<Weights> {
    let weight_map = read_weight_map(index_path)?;
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let mut shard_names: Vec<&str> = weight_map.values().map(String::as_str).collect();
    shard_names.sort_unstable();
    shard_names.dedup();

    let mut weights =
        Weights { files: Vec::new(), metadata: BTreeMap::new(), tensors: BTreeMap::new() };
    // Tensor name -> index into `shard_names` of the shard holding it.
    let mut home: BTreeMap<String, usize> = BTreeMap::new();
    for (si, shard) in shard_names.iter().enumerate() {
        let path = dir.join(shard);
        if !path.is_file() {
            return Err(index_error(
                index_path,
                format!(
                    "shard `{shard}` is named by the weight_map but {} does not exist",
                    path.display()
                ),
            ));
        }
        let file = SafetensorsFile::open(&path)?;
        for t in file.tensors {
            if let Some(&other) = home.get(&t.name) {
                return Err(index_error(
                    index_path,
                    format!(
                        "tensor `{}` appears in two shards, `{}` and `{shard}`",
                        t.name, shard_names[other]
                    ),
                ));
            }
            home.insert(t.name.clone(), si);
            weights.tensors.insert(t.name.clone(), t);
        }
        for (k, v) in file.metadata {
            weights.metadata.entry(k).or_insert(v);
        }
        weights.files.push(file.path);
    }
    for (name, shard) in &weight_map {
        match home.get(name) {
            Some(&si) if shard_names[si] == shard.as_str() => {}
            Some(&si) => {
                return Err(index_error(
                    index_path,
                    format!(
                        "tensor `{name}` is listed under shard `{shard}` but lives in `{}`",
                        shard_names[si]
                    ),
                ))
            }
            None => {
                return Err(index_error(
                    index_path,
                    format!(
                        "tensor `{name}` is listed under shard `{shard}` but is absent from it"
                    ),
                ))
            }
        }
    }
    Ok(weights)
}

/// The index's `weight_map`, each shard name checked to be a plain file name.
fn read_weight_map(index_path: &Path) -> Result<BTreeMap<String, String>> {
    let index = read_json_file(index_path)?;
    let Some(Value::Object(map)) = index.get("weight_map") else {
        return Err(index_error(index_path, "`weight_map` is missing or not an object".into()));
    };
    if map.is_empty() {
        return Err(index_error(index_path, "`weight_map` is empty".into()));
    }
    let mut out = BTreeMap::new();
    for (name, shard) in map {
        let Value::String(shard) = shard else {
            return Err(index_error(
                index_path,
                format!("`weight_map` entry for tensor `{name}` is not a string: {shard}"),
            ));
        };
        let mut parts = Path::new(shard).components();
        let plain = matches!(parts.next(), Some(Component::Normal(_))) && parts.next().is_none();
        if !plain {
            return Err(index_error(
                index_path,
                format!(
                    "`weight_map` entry for tensor `{name}` names `{shard}`, \
                     which is not a plain file name in the checkpoint directory"
                ),
            ));
        }
        out.insert(name.clone(), shard.clone());
    }
    Ok(out)
}
