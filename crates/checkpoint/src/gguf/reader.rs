//! The GGUF header parser: magic, version, metadata key/values and tensor infos, read from
//! the mapped bytes through a bounds-checked cursor.
//!
//! Invariants: no read past the end of the buffer (every read goes through `Cursor::take`);
//! no allocation sized by a count from the file until that count is checked against the
//! bytes that remain (`count * min_encoded_size <= remaining`); nested arrays at most
//! `MAX_ARRAY_DEPTH` deep, so a hostile file cannot overflow the stack. Layout checks (the
//! tensor data ranges) live in `layout.rs`; this file only decodes the header.
//!
//! Versions: v2 and v3 share one layout (u64 counts and lengths; v3 only added big-endian
//! files, which are refused here). v1 used u32 counts and is refused by name.
//! Source: ggml `docs/gguf.md`, gguf-py 0.19.0 `gguf_reader.py`.

use std::collections::HashSet;
use std::path::Path;

use super::value::{GgufValue, GgufValueType};
use crate::error::{CheckpointError, Result};

/// `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are refused (gguf-py writes any depth; real files use 1).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most array elements reserved up front (32 bytes each); longer arrays grow as they are read.
const MAX_PREALLOC: usize = 1 << 16;
/// Smallest metadata entry: key length (u64) + value type (u32) + a one-byte value.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
/// Smallest tensor info: name length (u64) + n_dims (u32) + type (u32) + offset (u64).
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;

/// A tensor info as stored: dims innermost first, offset relative to the data section.
#[derive(Clone, Debug)]
pub struct RawTensorInfo {
    pub name: String,
    pub ne: Vec<u64>,
    pub type_id: u32,
    pub offset: u64,
}

#[derive(Clone, Debug)]
pub struct RawHeader {
    pub version: u32,
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<RawTensorInfo>,
    /// Byte offset just past the last tensor info.
    pub header_end: usize,
}

pub fn malformed(path: &Path, what: String) -> CheckpointError {
    CheckpointError::Malformed { path: path.to_path_buf(), format: "GGUF", what }
}

/// A read position in the file's bytes; every read is checked against the end.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn err(&self, what: String) -> CheckpointError {
        malformed(self.path, what)
    }

    /// The next `n` bytes, or a "truncated" error naming `ctx` (what was being read).
    fn take(&mut self, n: u64, ctx: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let len = self.buf.len();
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() => {
                let s = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
            }
            _ => Err(self.err(format!(
                "truncated: {} needs {n} bytes at offset {} but the file ends at {len}",
                ctx(),
                self.pos
            ))),
        }
    }

    fn array<const N: usize>(&mut self, ctx: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, ctx)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, ctx: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(ctx)?))
    }

    fn u64(&mut self, ctx: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(ctx)?))
    }

    fn string(&mut self, ctx: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("length of {}", ctx()))?;
        let bytes = self.take(len, &|| format!("string of {len} bytes in {}", ctx()))?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| self.err(format!("{}: string is not UTF-8 ({e})", ctx())))
    }

    fn value(
        &mut self,
        ty: GgufValueType,
        ctx: &dyn Fn() -> String,
        depth: usize,
    ) -> Result<GgufValue> {
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>(ctx)?[0]),
            GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.array(ctx)?)),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(ctx)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(ctx)?)),
            GgufValueType::U32 => GgufValue::U32(self.u32(ctx)?),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(ctx)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(ctx)?)),
            GgufValueType::Bool => match self.array::<1>(ctx)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.err(format!("{}: bool byte is {b}, not 0 or 1", ctx()))),
            },
            GgufValueType::String => GgufValue::String(self.string(ctx)?),
            GgufValueType::Array => self.array_value(ctx, depth)?,
            GgufValueType::U64 => GgufValue::U64(self.u64(ctx)?),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(ctx)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(ctx)?)),
        })
    }

    fn array_value(&mut self, ctx: &dyn Fn() -> String, depth: usize) -> Result<GgufValue> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(format!("{}: arrays nested deeper than {MAX_ARRAY_DEPTH}", ctx())));
        }
        let type_id = self.u32(&|| format!("array element type of {}", ctx()))?;
        let elem = GgufValueType::from_id(type_id)
            .ok_or_else(|| self.err(format!("{}: unknown array element type {type_id}", ctx())))?;
        let count = self.u64(&|| format!("array length of {}", ctx()))?;
        // Bound the count by the bytes left before allocating anything for it.
        let fits = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(elem.min_encoded_size()))
            .is_some_and(|need| need <= self.remaining());
        if !fits {
            return Err(self.err(format!(
                "{}: array of {count} {elem} elements cannot fit in the {} bytes left in the file",
                ctx(),
                self.remaining()
            )));
        }
        // `count` is now at most the file size; each element is also read with checks. The
        // preallocation is capped besides, so a hostile count costs memory only as its
        // elements are actually read.
        let mut values = Vec::with_capacity((count as usize).min(MAX_PREALLOC));
        for i in 0..count {
            values.push(self.value(elem, &|| format!("{} element {i}", ctx()), depth + 1)?);
        }
        Ok(GgufValue::Array(elem, values))
    }
}

/// Checks that `count` items of at least `min_bytes` each fit in what is left of the file.
fn check_count(c: &Cursor<'_>, count: u64, min_bytes: usize, what: &str) -> Result<usize> {
    usize::try_from(count)
        .ok()
        .filter(|n| n.checked_mul(min_bytes).is_some_and(|need| need <= c.remaining()))
        .ok_or_else(|| {
            c.err(format!(
                "header claims {count} {what}, which cannot fit in the {} bytes left in the file \
                 (each takes at least {min_bytes})",
                c.remaining()
            ))
        })
}

fn read_version(c: &mut Cursor<'_>) -> Result<u32> {
    let magic = c.array::<4>(&|| "magic".to_string())?;
    if &magic != b"GGUF" {
        return Err(c.err(format!("bad magic {magic:02x?} (expected \"GGUF\"): not a GGUF file")));
    }
    let version = c.u32(&|| "version".to_string())?;
    match version {
        2 | 3 => Ok(version),
        1 => {
            Err(c.err("GGUF version 1 (u32 counts) is not supported; only versions 2 and 3".into()))
        }
        v if matches!(v.swap_bytes(), 2 | 3) => Err(c.err(format!(
            "big-endian GGUF (version field reads {v:#010x}) is not supported; only little-endian"
        ))),
        v => Err(c.err(format!("GGUF version {v} is not supported; only versions 2 and 3"))),
    }
}

fn read_metadata(c: &mut Cursor<'_>, count: u64) -> Result<Vec<(String, GgufValue)>> {
    let n = check_count(c, count, MIN_KV_BYTES, "metadata entries")?;
    let mut seen = HashSet::with_capacity(n);
    let mut metadata = Vec::with_capacity(n);
    for i in 0..n {
        let key = c.string(&|| format!("key of metadata entry {i}"))?;
        let ctx = || format!("metadata key `{key}`");
        let type_id = c.u32(&|| format!("value type of {}", ctx()))?;
        let ty = GgufValueType::from_id(type_id)
            .ok_or_else(|| c.err(format!("{}: unknown value type {type_id}", ctx())))?;
        let value = c.value(ty, &ctx, 0)?;
        if !seen.insert(key.clone()) {
            return Err(c.err(format!("{}: duplicate metadata key", ctx())));
        }
        metadata.push((key, value));
    }
    Ok(metadata)
}

fn read_tensor_infos(c: &mut Cursor<'_>, count: u64) -> Result<Vec<RawTensorInfo>> {
    let n = check_count(c, count, MIN_TENSOR_INFO_BYTES, "tensors")?;
    let mut seen = HashSet::with_capacity(n);
    let mut tensors = Vec::with_capacity(n);
    for i in 0..n {
        let name = c.string(&|| format!("name of tensor info {i}"))?;
        let ctx = || format!("tensor `{name}`");
        let n_dims = c.u32(&|| format!("n_dims of {}", ctx()))?;
        if n_dims > MAX_DIMS {
            return Err(c.err(format!("{}: n_dims {n_dims} exceeds the maximum {MAX_DIMS}", ctx())));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            ne.push(c.u64(&|| format!("dim {d} of {}", ctx()))?);
        }
        let type_id = c.u32(&|| format!("type of {}", ctx()))?;
        let offset = c.u64(&|| format!("data offset of {}", ctx()))?;
        if !seen.insert(name.clone()) {
            return Err(c.err(format!("{}: duplicate tensor name", ctx())));
        }
        tensors.push(RawTensorInfo { name, ne, type_id, offset });
    }
    Ok(tensors)
}

/// Decodes the header of a GGUF file held in `buf`.
pub fn parse_header(buf: &[u8], path: &Path) -> Result<RawHeader> {
    let mut c = Cursor { buf, pos: 0, path };
    let version = read_version(&mut c)?;
    let tensor_count = c.u64(&|| "tensor count".to_string())?;
    let kv_count = c.u64(&|| "metadata count".to_string())?;
    let metadata = read_metadata(&mut c, kv_count)?;
    let tensors = read_tensor_infos(&mut c, tensor_count)?;
    Ok(RawHeader { version, metadata, tensors, header_end: c.pos })
}
