//! One `.safetensors` file: the header parsed and checked, tensors as zero-copy views.
//!
//! Layout (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
//! `u64` N, then N bytes of UTF-8 JSON (possibly padded with spaces), then the byte buffer.
//! The JSON maps each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}`, the
//! offsets relative to the start of the byte buffer; the optional `__metadata__` key maps
//! strings to strings (MLX writes `{"format": "mlx"}`).
//!
//! Invariants: nothing a header claims is trusted before it is checked against the mapped
//! file. The header is parsed in place from the mapping (its claimed length is never
//! allocated); each tensor's range lies inside the byte buffer, matches `dtype x shape`
//! exactly (computed with overflow checks), and no two non-empty tensors overlap. Duplicate
//! keys in the header are refused rather than silently resolved (serde_json would keep the
//! last). Holes between tensors are allowed: they are harmless, if unusual.
//!
//! Alternatives rejected: the `safetensors` crate validates the same things but reports
//! errors without the file name and with less detail about the tensor; reading the header
//! with `std::fs::read` would allocate whatever length the file claims.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{CheckpointError, Result};
use crate::tensor::{DType, TensorData, TensorFormat, TensorView};

/// Headers larger than this are refused (the limit the reference implementation uses).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A mapped `.safetensors` file with its tensors, in header order.
#[derive(Debug)]
pub struct SafetensorsFile {
    pub path: PathBuf,
    /// The `__metadata__` map (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// Views into `map`, in the order the header lists them.
    pub tensors: Vec<TensorView>,
}

impl SafetensorsFile {
    /// Maps `path` and checks its header. Reads no tensor data.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        let file = File::open(path).map_err(|e| CheckpointError::io(path, e))?;
        let len = file.metadata().map_err(|e| CheckpointError::io(path, e))?.len();
        if len < 8 {
            return Err(malformed(
                path,
                format!("file is {len} bytes, shorter than the 8-byte header length"),
            ));
        }
        // SAFETY: the mapping is read-only and every check below runs against its length.
        // Like every mmap-based reader we rely on nothing truncating or rewriting the
        // checkpoint while it is open (that would raise SIGBUS or change bytes under views);
        // checkpoints are immutable files by convention.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| CheckpointError::io(path, e))?;
        parse(path, Arc::new(map))
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorView> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

pub(crate) fn malformed(path: &Path, what: String) -> CheckpointError {
    CheckpointError::Malformed { path: path.to_path_buf(), format: "safetensors", what }
}

/// Parses and checks the header of a mapped file.
fn parse(path: &Path, map: Arc<Mmap>) -> Result<SafetensorsFile> {
    let file_len = map.len();
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(map.get(..8).ok_or_else(|| {
        malformed(path, format!("file is {file_len} bytes, shorter than the 8-byte header length"))
    })?);
    let header_len = u64::from_le_bytes(len_bytes);
    let room = (file_len - 8) as u64;
    if header_len > room {
        return Err(malformed(
            path,
            format!(
                "header length {header_len} runs past the end of the file \
                 ({file_len} bytes, at most {room} bytes of header)"
            ),
        ));
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(malformed(
            path,
            format!("header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit"),
        ));
    }
    // header_len <= file_len - 8, so it fits in usize and the slice is in bounds.
    let data_start = 8 + header_len as usize;
    let header = std::str::from_utf8(&map[8..data_start])
        .map_err(|e| malformed(path, format!("header is not UTF-8: {e}")))?;
    let entries: Entries = serde_json::from_str(header)
        .map_err(|e| malformed(path, format!("header is not a valid JSON object: {e}")))?;
    let data_len = file_len - data_start;

    let mut metadata = BTreeMap::new();
    let mut infos = Vec::with_capacity(entries.0.len());
    for (name, value) in entries.0 {
        if name == "__metadata__" {
            metadata = parse_metadata(path, value)?;
        } else {
            infos.push(parse_info(path, name, value, data_len)?);
        }
    }
    check_overlaps(path, &mut infos)?;
    let tensors = infos
        .into_iter()
        .map(|i| TensorView {
            name: i.name,
            format: TensorFormat::Plain(i.dtype),
            shape: i.shape,
            data: TensorData::Mapped {
                map: map.clone(),
                range: data_start + i.begin..data_start + i.end,
            },
        })
        .collect();
    Ok(SafetensorsFile { path: path.to_path_buf(), metadata, tensors })
}

/// A checked header entry; `begin..end` is relative to the byte buffer.
struct Info {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    begin: usize,
    end: usize,
    /// Position in the header, to restore header order after sorting by offset.
    order: usize,
}

#[derive(Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

fn parse_metadata(path: &Path, value: Value) -> Result<BTreeMap<String, String>> {
    let Value::Object(obj) = value else {
        return Err(malformed(path, format!("`__metadata__` is not an object: {value}")));
    };
    obj.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            other => {
                Err(malformed(path, format!("`__metadata__` key `{k}` is not a string: {other}")))
            }
        })
        .collect()
}

fn parse_info(path: &Path, name: String, value: Value, data_len: usize) -> Result<Info> {
    let bad = |what: String| malformed(path, format!("tensor `{name}`: {what}"));
    let raw: RawInfo = serde_json::from_value(value)
        .map_err(|e| bad(format!("bad header entry (want dtype, shape, data_offsets): {e}")))?;
    let dtype = DType::from_safetensors(&raw.dtype)
        .ok_or_else(|| bad(format!("unknown or unsupported dtype \"{}\"", raw.dtype)))?;
    let shape = raw
        .shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<Vec<usize>, _>>()
        .map_err(|_| bad(format!("shape {:?} has a dimension too large for usize", raw.shape)))?;
    let want = TensorFormat::Plain(dtype).tensor_bytes(&shape).ok_or_else(|| {
        bad(format!("shape {shape:?} of {} overflows the address space", raw.dtype))
    })?;
    let (begin, end) = raw.data_offsets;
    if begin > end {
        return Err(bad(format!("data_offsets [{begin}, {end}] begin after end")));
    }
    if end > data_len as u64 {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] run past the end of the byte buffer ({data_len} bytes)"
        )));
    }
    // Both are <= data_len, a usize.
    let (begin, end) = (begin as usize, end as usize);
    if end - begin != want {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] hold {} bytes but {} x {shape:?} needs {want}",
            end - begin,
            raw.dtype
        )));
    }
    Ok(Info { name, dtype, shape, begin, end, order: 0 })
}

/// Refuses overlapping byte ranges between non-empty tensors; keeps header order.
fn check_overlaps(path: &Path, infos: &mut [Info]) -> Result<()> {
    for (i, info) in infos.iter_mut().enumerate() {
        info.order = i;
    }
    infos.sort_by_key(|i| (i.begin, i.end));
    let mut prev: Option<&Info> = None;
    for info in infos.iter().filter(|i| i.begin < i.end) {
        if let Some(p) = prev {
            if info.begin < p.end {
                return Err(malformed(
                    path,
                    format!(
                        "tensor `{}` bytes [{}, {}) overlap tensor `{}` bytes [{}, {})",
                        info.name, info.begin, info.end, p.name, p.begin, p.end
                    ),
                ));
            }
        }
        // Ranges so far are disjoint and sorted (any overlap returned above), so the last
        // one ends latest.
        prev = Some(info);
    }
    infos.sort_by_key(|i| i.order);
    Ok(())
}

/// The header's top-level object as ordered pairs, refusing duplicate keys.
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_map(EntriesVisitor)
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Entries;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object mapping tensor names to {dtype, shape, data_offsets}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> std::result::Result<Entries, A::Error> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        while let Some((k, v)) = access.next_entry::<String, Value>()? {
            if !seen.insert(k.clone()) {
                return Err(serde::de::Error::custom(format!("key `{k}` appears twice")));
            }
            out.push((k, v));
        }
        Ok(Entries(out))
    }
}
