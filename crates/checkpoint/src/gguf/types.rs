//! The ggml tensor type table: id, name, block geometry, and which ones tensorfold decodes.
//!
//! Every type ggml defines is listed with its block size, even those tensorfold cannot decode,
//! so the reader can still bound-check their byte ranges and name them in a refusal. Ids and
//! sizes: gguf-py 0.19.0 `GGMLQuantizationType` / `GGML_QUANT_SIZES` (constants.py), which
//! mirror ggml's `type_traits`; Q8_1 uses ggml's real 36-byte block (gguf-py's 40 is stale,
//! see notes/quant-formats.md §3.2; Q8_1 is never stored in files anyway).

use crate::tensor::{DType, GgmlType, TensorFormat};

/// What the reader knows about one ggml type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlTypeInfo {
    pub id: u32,
    pub name: &'static str,
    pub block_elems: usize,
    pub block_bytes: usize,
    /// `Some` for the types tensorfold decodes; `None` lists the tensor but refuses to load it.
    pub format: Option<TensorFormat>,
}

const fn plain(id: u32, name: &'static str, d: DType, bytes: usize) -> GgmlTypeInfo {
    GgmlTypeInfo {
        id,
        name,
        block_elems: 1,
        block_bytes: bytes,
        format: Some(TensorFormat::Plain(d)),
    }
}

const fn quant(
    id: u32,
    name: &'static str,
    t: GgmlType,
    elems: usize,
    bytes: usize,
) -> GgmlTypeInfo {
    GgmlTypeInfo {
        id,
        name,
        block_elems: elems,
        block_bytes: bytes,
        format: Some(TensorFormat::Ggml(t)),
    }
}

const fn other(id: u32, name: &'static str, elems: usize, bytes: usize) -> GgmlTypeInfo {
    GgmlTypeInfo { id, name, block_elems: elems, block_bytes: bytes, format: None }
}

const QK_K: usize = 256;

/// Every ggml type id gguf-py 0.19.0 knows.
pub const GGML_TYPES: &[GgmlTypeInfo] = &[
    plain(0, "F32", DType::F32, 4),
    plain(1, "F16", DType::F16, 2),
    quant(2, "Q4_0", GgmlType::Q4_0, 32, 18),
    quant(3, "Q4_1", GgmlType::Q4_1, 32, 20),
    quant(6, "Q5_0", GgmlType::Q5_0, 32, 22),
    quant(7, "Q5_1", GgmlType::Q5_1, 32, 24),
    quant(8, "Q8_0", GgmlType::Q8_0, 32, 34),
    other(9, "Q8_1", 32, 36),
    other(10, "Q2_K", QK_K, 84),
    other(11, "Q3_K", QK_K, 110),
    quant(12, "Q4_K", GgmlType::Q4_K, QK_K, 144),
    quant(13, "Q5_K", GgmlType::Q5_K, QK_K, 176),
    quant(14, "Q6_K", GgmlType::Q6_K, QK_K, 210),
    other(15, "Q8_K", QK_K, 292),
    other(16, "IQ2_XXS", QK_K, 66),
    other(17, "IQ2_XS", QK_K, 74),
    other(18, "IQ3_XXS", QK_K, 98),
    other(19, "IQ1_S", QK_K, 50),
    other(20, "IQ4_NL", 32, 18),
    other(21, "IQ3_S", QK_K, 110),
    other(22, "IQ2_S", QK_K, 82),
    other(23, "IQ4_XS", QK_K, 136),
    other(24, "I8", 1, 1),
    other(25, "I16", 1, 2),
    other(26, "I32", 1, 4),
    other(27, "I64", 1, 8),
    other(28, "F64", 1, 8),
    other(29, "IQ1_M", QK_K, 56),
    plain(30, "BF16", DType::BF16, 2),
    other(34, "TQ1_0", QK_K, 54),
    other(35, "TQ2_0", QK_K, 66),
    other(39, "MXFP4", 32, 17),
    other(40, "NVFP4", 64, 36),
    other(41, "Q1_0", 128, 18),
];

/// The table entry for `id`, or `None` for an id no ggml version defines (as far as we know).
pub fn ggml_type(id: u32) -> Option<&'static GgmlTypeInfo> {
    GGML_TYPES.iter().find(|t| t.id == id)
}

/// The names of the types tensorfold decodes, for error messages.
pub fn supported_names() -> String {
    let names: Vec<&str> =
        GGML_TYPES.iter().filter(|t| t.format.is_some()).map(|t| t.name).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_entries_agree_with_tensor_formats() {
        for t in GGML_TYPES.iter() {
            match t.format {
                Some(TensorFormat::Ggml(g)) => {
                    assert_eq!(
                        (g.block_elems(), g.block_bytes(), g.name()),
                        (t.block_elems, t.block_bytes, t.name)
                    );
                }
                Some(TensorFormat::Plain(d)) => {
                    assert_eq!(
                        (1, d.size(), d.safetensors_name()),
                        (t.block_elems, t.block_bytes, t.name)
                    );
                }
                None => {}
            }
        }
        let mut ids: Vec<u32> = GGML_TYPES.iter().map(|t| t.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), GGML_TYPES.len(), "ids are listed once, in order");
    }
}
