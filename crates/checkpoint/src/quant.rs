//! Scalar reference decoding of ggml blocks and plain float rows to f32: the arithmetic the
//! fast kernels in `tf-backend` must reproduce, and the weights of the float64 reference.
//!
//! Each `*_block` function is ggml's `dequantize_row_*` (ggml-org/ggml `src/ggml-quants.c`)
//! for one block, with the same fp32 operations in the same order: `d*q + m` for Q4_1/Q5_1 is
//! an fp32 multiply then an add, K-quants form `d*sc` and `dmin*m` first, Q6_K computes
//! `(d*sc)*q`. Layouts byte by byte: /work/shared/notes/quant-formats.md §3.3. Every product
//! here is exact in fp32 (an f16 times small integers); only the final `+ m` / `- dmin*m` can
//! round, and it rounds as ggml's does, so results are bit-identical to ggml and gguf-py
//! (checked value for value by `tests/gguf_fixtures.rs`). ggml may contract `d*q + m` into an
//! fma; with an exact product that gives the same bits.
//!
//! f16 fields convert exactly (`half`), so NaN/Inf scales propagate as in ggml.
//!
//! Alternatives rejected: SIMD or lookup tables here. This is the reference; speed belongs in
//! the backend, which is tested against these functions.

use crate::tensor::{DType, GgmlType, TensorFormat, TensorView};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{format}: {bytes} bytes is not a whole number of {unit}-byte blocks")]
    PartialBlock { format: TensorFormat, bytes: usize, unit: usize },
    #[error("{format}: {bytes} bytes decode to {values} values but the output holds {out}")]
    OutputLen { format: TensorFormat, bytes: usize, values: usize, out: usize },
    #[error("{format}: decoding to floats is implemented for F32, F16, BF16 and ggml blocks only")]
    Unsupported { format: TensorFormat },
    #[error("tensor `{tensor}`: row {row} is out of range ({rows} rows of {cols})")]
    RowOutOfRange { tensor: String, row: usize, rows: usize, cols: usize },
    #[error("tensor `{tensor}`: {what}")]
    BadTensor { tensor: String, what: String },
}

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Q4_0: `d`@0 f16, `qs[16]`@2; `w = (q - 8) * d`; low nibbles are elements 0..16.
fn q4_0_block(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// Q4_1: `d`@0, `m`@2 (f16), `qs[16]`@4; `w = q*d + m`.
fn q4_1_block(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// Q5_0: `d`@0, `qh`@2 (u32 LE, bit j = 5th bit of element j), `qs[16]`@6; `w = (q-16)*d`.
fn q5_0_block(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32_at(b, 2);
    let qs = &b[6..22];
    for j in 0..16 {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((qs[j] & 0x0F) as u32 | xh0) as i32 - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) as u32 | xh1) as i32 - 16) as f32 * d;
    }
}

/// Q5_1: `d`@0, `m`@2, `qh`@4, `qs[16]`@8; `w = q*d + m`.
fn q5_1_block(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32_at(b, 4);
    let qs = &b[8..24];
    for j in 0..16 {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((qs[j] & 0x0F) as u32 | xh0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) as u32 | xh1) as f32 * d + m;
    }
}

/// Q8_0: `d`@0 f16, `qs[32]` i8 @2; `w = q*d`.
fn q8_0_block(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[2..34]) {
        *yj = (q as i8) as f32 * d;
    }
}

/// ggml `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from 12 bytes.
#[inline]
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// The (scale, min) pairs of Q4_K/Q5_K sub-blocks `2c` and `2c+1`, as ggml forms them.
#[inline]
fn k4_pair(d: f32, dmin: f32, scales: &[u8], c: usize) -> [(f32, f32); 2] {
    let (sc0, m0) = scale_min_k4(2 * c, scales);
    let (sc1, m1) = scale_min_k4(2 * c + 1, scales);
    [(d * sc0 as f32, dmin * m0 as f32), (d * sc1 as f32, dmin * m1 as f32)]
}

/// Q4_K: `d`@0, `dmin`@2, `scales[12]`@4, `qs[128]`@16; element `64c + 32t + l` is nibble
/// `t` of `qs[32c + l]`, sub-block `2c + t`: `w = (d*sc)*q - dmin*m`.
fn q4_k_block(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for c in 0..4 {
        let [(d1, m1), (d2, m2)] = k4_pair(d, dmin, scales, c);
        let q = &b[16 + 32 * c..16 + 32 * (c + 1)];
        let y = &mut y[64 * c..64 * (c + 1)];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// Q5_K: as Q4_K with `qh[32]`@16 and `qs[128]`@48; bit `2c + t` of `qh[l]` adds 16.
fn q5_k_block(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    for c in 0..4 {
        let [(d1, m1), (d2, m2)] = k4_pair(d, dmin, scales, c);
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        let ql = &b[48 + 32 * c..48 + 32 * (c + 1)];
        let y = &mut y[64 * c..64 * (c + 1)];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0x0F) + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// Q6_K: `ql[128]`@0, `qh[64]`@128, `scales[16]` i8 @192, `d`@208 f16; per half `n` of 128:
/// 4 quarters of 32 from `ql` low/high nibbles and 2-bit `qh` fields; `w = (d*sc)*(q - 32)`.
fn q6_k_block(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for n in 0..2 {
        let ql = &b[64 * n..64 * (n + 1)];
        let qh = &b[128 + 32 * n..128 + 32 * (n + 1)];
        let sc = &b[192 + 8 * n..192 + 8 * (n + 1)];
        let y = &mut y[128 * n..128 * (n + 1)];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// Checks that `bytes` is whole units of `unit` bytes decoding to exactly `out` values.
fn check_len(
    format: TensorFormat,
    bytes: usize,
    unit: usize,
    per_unit: usize,
    out: usize,
) -> Result<(), QuantError> {
    if !bytes.is_multiple_of(unit) {
        return Err(QuantError::PartialBlock { format, bytes, unit });
    }
    let values = bytes / unit * per_unit;
    if values != out {
        return Err(QuantError::OutputLen { format, bytes, values, out });
    }
    Ok(())
}

/// Decodes whole ggml blocks to f32 exactly as ggml's `dequantize_row_*`.
/// `out` must hold `blocks.len() / block_bytes * block_elems` values.
pub fn dequantize_row(ty: GgmlType, blocks: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let (bb, be) = (ty.block_bytes(), ty.block_elems());
    check_len(TensorFormat::Ggml(ty), blocks.len(), bb, be, out.len())?;
    let block: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::Q4_0 => q4_0_block,
        GgmlType::Q4_1 => q4_1_block,
        GgmlType::Q5_0 => q5_0_block,
        GgmlType::Q5_1 => q5_1_block,
        GgmlType::Q8_0 => q8_0_block,
        GgmlType::Q4_K => q4_k_block,
        GgmlType::Q5_K => q5_k_block,
        GgmlType::Q6_K => q6_k_block,
    };
    for (b, y) in blocks.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        block(b, y);
    }
    Ok(())
}

/// Decodes a row of plain little-endian F32, F16 or BF16 elements to f32 (all exact).
pub fn decode_plain_row(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let format = TensorFormat::Plain(dtype);
    check_len(format, bytes.len(), dtype.size(), 1, out.len())?;
    match dtype {
        DType::F32 => {
            for (y, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *y = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (y, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::BF16 => {
            for (y, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        _ => return Err(QuantError::Unsupported { format }),
    }
    Ok(())
}

/// Decodes a row of any float or ggml format to f32.
pub fn decode_row(format: TensorFormat, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    match format {
        TensorFormat::Plain(d) => decode_plain_row(d, bytes, out),
        TensorFormat::Ggml(t) => dequantize_row(t, bytes, out),
    }
}

/// [`dequantize_row`] widened to f64: ggml's f32 values are exact, so the float64 reference
/// weights are these values cast up (notes/quant-formats.md §3.3 "Exactness").
pub fn dequantize_row_f64(ty: GgmlType, blocks: &[u8], out: &mut [f64]) -> Result<(), QuantError> {
    decode_row_f64(TensorFormat::Ggml(ty), blocks, out)
}

/// [`decode_row`] widened to f64 (exactly).
pub fn decode_row_f64(
    format: TensorFormat,
    bytes: &[u8],
    out: &mut [f64],
) -> Result<(), QuantError> {
    let mut tmp = vec![0f32; out.len()];
    decode_row(format, bytes, &mut tmp)?;
    for (o, t) in out.iter_mut().zip(tmp) {
        *o = t.into();
    }
    Ok(())
}

/// Decodes row `row` of `view` (rows are all dims but the last) into `out` (K values).
pub fn tensor_row(view: &TensorView, row: usize, out: &mut [f32]) -> Result<(), QuantError> {
    let (rows, cols) = view.rows_cols();
    if row >= rows {
        return Err(QuantError::RowOutOfRange { tensor: view.name.clone(), row, rows, cols });
    }
    let bad = |what: String| QuantError::BadTensor { tensor: view.name.clone(), what };
    let rb = view
        .format
        .row_bytes(cols)
        .ok_or_else(|| bad(format!("{cols} columns are not whole {} blocks", view.format)))?;
    let bytes = view.bytes().get(row * rb..(row + 1) * rb).ok_or_else(|| {
        bad(format!("{} bytes hold fewer than {rows} rows of {rb} bytes", view.bytes().len()))
    })?;
    decode_row(view.format, bytes, out)
}

/// Decodes a whole tensor to f32, rows in order.
pub fn tensor_to_f32(view: &TensorView) -> Result<Vec<f32>, QuantError> {
    let (rows, cols) = view.rows_cols();
    let mut out = vec![0f32; rows * cols];
    for (r, chunk) in out.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
        tensor_row(view, r, chunk)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_partial_blocks_and_wrong_output_lengths() {
        let mut out = vec![0f32; 32];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut out),
            Err(QuantError::PartialBlock { unit: 18, .. })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 36], &mut out),
            Err(QuantError::OutputLen { values: 64, out: 32, .. })
        ));
        assert!(matches!(
            decode_plain_row(DType::F32, &[0u8; 6], &mut out),
            Err(QuantError::PartialBlock { .. })
        ));
        assert!(matches!(
            decode_plain_row(DType::I32, &[0u8; 128], &mut out),
            Err(QuantError::Unsupported { .. })
        ));
    }

    #[test]
    fn tensor_row_checks_the_row_index() {
        let v = TensorView::owned("w", TensorFormat::Plain(DType::F32), vec![2, 3], vec![0u8; 24]);
        let mut out = [0f32; 3];
        assert!(tensor_row(&v, 1, &mut out).is_ok());
        assert!(matches!(
            tensor_row(&v, 2, &mut out),
            Err(QuantError::RowOutOfRange { rows: 2, .. })
        ));
    }
}
