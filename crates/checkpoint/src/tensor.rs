//! Zero-copy tensor views over mapped checkpoint files.
//!
//! A [`TensorView`] is a format, a shape in HF order (outermost first: a linear weight is
//! `[out_features N, in_features K]`) and a byte range of a shared, memory-mapped file. GGUF
//! stores dims innermost first (`ne[0]` = K); its reader reverses them so every consumer sees
//! one convention. Owned data (tables computed at load, test tensors) use the same type.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// Element types of safetensors (and plain GGUF float tensors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    Bool,
    U8,
    I8,
    U16,
    I16,
    F16,
    BF16,
    U32,
    I32,
    F32,
    U64,
    I64,
    F64,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// The safetensors header spelling (`"BF16"`, `"F32"`, ...).
    pub fn from_safetensors(s: &str) -> Option<DType> {
        Some(match s {
            "BOOL" => DType::Bool,
            "U8" => DType::U8,
            "I8" => DType::I8,
            "U16" => DType::U16,
            "I16" => DType::I16,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "U32" => DType::U32,
            "I32" => DType::I32,
            "F32" => DType::F32,
            "U64" => DType::U64,
            "I64" => DType::I64,
            "F64" => DType::F64,
            _ => return None,
        })
    }

    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::Bool => "BOOL",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::U16 => "U16",
            DType::I16 => "I16",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::U32 => "U32",
            DType::I32 => "I32",
            DType::F32 => "F32",
            DType::U64 => "U64",
            DType::I64 => "I64",
            DType::F64 => "F64",
        }
    }
}

/// ggml block-quantized types tensorfold reads. Blocks run along the innermost dim (K).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl GgmlType {
    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                32
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => 256,
        }
    }

    /// Bytes per block (ggml `type_traits[..].type_size`).
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
        }
    }
}

/// How a tensor's bytes encode its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorFormat {
    /// Plain little-endian elements.
    Plain(DType),
    /// ggml blocks along the innermost dim; each row is `K / block_elems` whole blocks.
    Ggml(GgmlType),
}

impl TensorFormat {
    /// Bytes of one row of `k` innermost elements, or `None` if `k` is not a whole number of
    /// blocks or overflows.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        match self {
            TensorFormat::Plain(d) => k.checked_mul(d.size()),
            TensorFormat::Ggml(t) => {
                if !k.is_multiple_of(t.block_elems()) {
                    return None;
                }
                (k / t.block_elems()).checked_mul(t.block_bytes())
            }
        }
    }

    /// Bytes of a whole tensor of `shape` (HF order), checked for overflow.
    pub fn tensor_bytes(self, shape: &[usize]) -> Option<usize> {
        let (&k, outer) = match shape.split_last() {
            Some(x) => x,
            None => return self.row_bytes(1),
        };
        let rows = outer.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        self.row_bytes(k)?.checked_mul(rows)
    }
}

impl fmt::Display for TensorFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorFormat::Plain(d) => f.write_str(d.safetensors_name()),
            TensorFormat::Ggml(t) => f.write_str(t.name()),
        }
    }
}

/// The bytes behind a tensor: a range of a shared mapping, or an owned buffer.
#[derive(Clone)]
pub enum TensorData {
    Mapped { map: Arc<memmap2::Mmap>, range: Range<usize> },
    Owned(Arc<[u8]>),
}

impl TensorData {
    pub fn bytes(&self) -> &[u8] {
        match self {
            TensorData::Mapped { map, range } => &map[range.clone()],
            TensorData::Owned(v) => v,
        }
    }
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorData::Mapped { range, .. } => write!(f, "Mapped({range:?})"),
            TensorData::Owned(v) => write!(f, "Owned({} bytes)", v.len()),
        }
    }
}

/// One tensor of a checkpoint: name, format, shape (HF order) and its bytes.
#[derive(Clone, Debug)]
pub struct TensorView {
    pub name: String,
    pub format: TensorFormat,
    /// Outermost first; the last dim is the contiguous (and, for ggml, blocked) one.
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl TensorView {
    /// An owned tensor; panics only if `bytes` disagrees with `shape`, which is a caller bug.
    pub fn owned(name: &str, format: TensorFormat, shape: Vec<usize>, bytes: Vec<u8>) -> Self {
        assert_eq!(format.tensor_bytes(&shape), Some(bytes.len()), "owned tensor {name}");
        TensorView { name: name.to_string(), format, shape, data: TensorData::Owned(bytes.into()) }
    }

    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// (rows, K) for a matrix, or (1, len) for a vector.
    pub fn rows_cols(&self) -> (usize, usize) {
        match self.shape.as_slice() {
            [] => (1, 1),
            [k] => (1, *k),
            [outer @ .., k] => (outer.iter().product(), *k),
        }
    }
}
