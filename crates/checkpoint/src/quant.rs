//! Scalar reference decoding of ggml blocks (skeleton: filled in by the helper owning it).
//!
//! API the backend relies on:
//! `pub fn dequantize_row(ty: GgmlType, blocks: &[u8], out: &mut [f32])` decodes whole blocks
//! exactly as ggml's `dequantize_row_*` (every value exact in f32).
