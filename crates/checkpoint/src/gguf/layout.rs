//! Where each tensor's bytes lie: alignment, the data section, and per-tensor byte ranges,
//! every one checked against the file before a view is made of it.
//!
//! Rules (ggml `gguf.cpp`, gguf-py `gguf_reader.py`): the data section starts at the end of
//! the header rounded up to `general.alignment` (a u32 power of two, default 32); each tensor
//! offset is relative to it and a multiple of the alignment; a tensor holds
//! `numel / block_elems * block_bytes` bytes, `ne[0]` being a whole number of blocks.
//! Ranges must lie inside the file and must not overlap. ggml also insists that tensors be
//! packed in order; that is not required here (it does not affect reading), only disjointness.

use std::path::Path;

use super::reader::{malformed, RawTensorInfo};
use super::types::ggml_type;
use super::value::GgufValue;
use super::GgufTensorInfo;
use crate::error::Result;

pub const DEFAULT_ALIGNMENT: usize = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// `general.alignment` if present (a u32, non-zero power of two), else 32.
pub fn alignment(path: &Path, metadata: &[(String, GgufValue)]) -> Result<usize> {
    let Some((_, v)) = metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v {
        GgufValue::U32(a) if a.is_power_of_two() => Ok(*a as usize),
        GgufValue::U32(a) => Err(malformed(
            path,
            format!("metadata key `{ALIGNMENT_KEY}`: {a} is not a power of two"),
        )),
        v => Err(malformed(
            path,
            format!("metadata key `{ALIGNMENT_KEY}`: expected u32, found {}", v.type_description()),
        )),
    }
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub fn align_up(x: usize, align: usize) -> Option<usize> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// Resolves one tensor info: HF-order shape, type, and its absolute byte range.
fn resolve(
    path: &Path,
    raw: RawTensorInfo,
    data_start: usize,
    align: usize,
    file_len: usize,
) -> Result<GgufTensorInfo> {
    let name = raw.name;
    let bad = |what: String| malformed(path, format!("tensor `{name}`: {what}"));
    let ne: Vec<usize> = raw
        .ne
        .iter()
        .map(|&d| usize::try_from(d).ok().filter(|&d| d <= i64::MAX as usize))
        .collect::<Option<_>>()
        .ok_or_else(|| bad(format!("dims {:?} do not fit in usize", raw.ne)))?;
    let numel = ne.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| {
        bad(format!("shape {:?} (ggml order) has more elements than usize holds", raw.ne))
    })?;
    let info = ggml_type(raw.type_id);
    let len = match info {
        None => None,
        Some(t) => {
            let row = ne.first().copied().unwrap_or(1);
            if row % t.block_elems != 0 {
                return Err(bad(format!(
                    "row of {row} elements is not a whole number of {} blocks of {}",
                    t.name, t.block_elems
                )));
            }
            let bytes = (numel / t.block_elems).checked_mul(t.block_bytes).ok_or_else(|| {
                bad(format!("size of shape {:?} in {} overflows usize", raw.ne, t.name))
            })?;
            Some(bytes)
        }
    };
    let rel = usize::try_from(raw.offset).ok().filter(|o| o % align == 0).ok_or_else(|| {
        bad(format!("data offset {} is not a multiple of the alignment {align}", raw.offset))
    })?;
    let start = data_start
        .checked_add(rel)
        .filter(|&s| s <= file_len)
        .ok_or_else(|| bad(format!("data offset {rel} (absolute {data_start} + {rel}) is past the end of the file ({file_len} bytes)")))?;
    if let Some(len) = len {
        if start.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(bad(format!(
                "data [{start}, {start} + {len}) runs past the end of the file ({file_len} bytes)"
            )));
        }
    }
    let mut shape = ne;
    shape.reverse();
    Ok(GgufTensorInfo {
        name,
        type_id: raw.type_id,
        type_name: info
            .map_or_else(|| format!("unknown type {}", raw.type_id), |t| t.name.to_string()),
        format: info.and_then(|t| t.format),
        shape,
        offset: start,
        len,
    })
}

/// Resolves every tensor, then checks that no two data ranges overlap.
pub fn resolve_all(
    path: &Path,
    raws: Vec<RawTensorInfo>,
    data_start: usize,
    align: usize,
    file_len: usize,
) -> Result<Vec<GgufTensorInfo>> {
    let tensors: Vec<GgufTensorInfo> = raws
        .into_iter()
        .map(|r| resolve(path, r, data_start, align, file_len))
        .collect::<Result<_>>()?;
    let mut ranges: Vec<(usize, usize, &str)> = tensors
        .iter()
        .filter_map(|t| t.len.filter(|&l| l > 0).map(|l| (t.offset, t.offset + l, t.name.as_str())))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let ((s0, e0, a), (s1, e1, b)) = (w[0], w[1]);
        if e0 > s1 {
            return Err(malformed(
                path,
                format!("tensors `{a}` [{s0}, {e0}) and `{b}` [{s1}, {e1}) overlap"),
            ));
        }
    }
    Ok(tensors)
}
