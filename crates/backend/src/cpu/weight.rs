//! Weights of the CPU backend: a checked, zero-copy view of the checkpoint's bytes.
//!
//! Matrices stay in their file format (plain bf16/f16/f32 or a ggml block format) and are
//! decoded in registers by the kernels; no dequantized copy of a matrix is ever made.
//! Vectors (norm weights, biases: one-dimensional tensors) are also decoded once to f32 at
//! load, since every op that reads them wants f32 and they are small. `load` checks the byte
//! length against the shape so no kernel can read past a tensor.

use tf_checkpoint::{DType, GgmlType, TensorFormat, TensorView};

use crate::error::{BackendError, Result};

use super::linear::formats;
use super::simd::SimdLevel;

/// The formats the CPU kernels compute, one per `formats::Format` implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum WeightFormat {
    Bf16,
    F16,
    F32,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl WeightFormat {
    fn of(f: TensorFormat) -> Option<WeightFormat> {
        Some(match f {
            TensorFormat::Plain(DType::BF16) => WeightFormat::Bf16,
            TensorFormat::Plain(DType::F16) => WeightFormat::F16,
            TensorFormat::Plain(DType::F32) => WeightFormat::F32,
            TensorFormat::Plain(_) => return None,
            TensorFormat::Ggml(t) => match t {
                GgmlType::Q4_0 => WeightFormat::Q4_0,
                GgmlType::Q4_1 => WeightFormat::Q4_1,
                GgmlType::Q5_0 => WeightFormat::Q5_0,
                GgmlType::Q5_1 => WeightFormat::Q5_1,
                GgmlType::Q8_0 => WeightFormat::Q8_0,
                GgmlType::Q4_K => WeightFormat::Q4_K,
                GgmlType::Q5_K => WeightFormat::Q5_K,
                GgmlType::Q6_K => WeightFormat::Q6_K,
            },
        })
    }
}

/// A weight resident in host memory: matrix `(n, k)` (rows of `k` innermost elements) or a
/// vector (`n == 1`).
pub struct CpuWeight {
    pub(crate) view: TensorView,
    pub(crate) format: WeightFormat,
    /// Rows (output features of a matrix, 1 for a vector).
    pub(crate) n: usize,
    /// Elements per row (input features).
    pub(crate) k: usize,
    pub(crate) row_bytes: usize,
    /// f32 values of a one-dimensional tensor.
    pub(crate) vector: Option<Vec<f32>>,
}

impl std::fmt::Debug for CpuWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuWeight({} {:?} [{}, {}])", self.view.name, self.format, self.n, self.k)
    }
}

impl CpuWeight {
    pub(crate) fn load(view: &TensorView) -> Result<CpuWeight> {
        let format = WeightFormat::of(view.format).ok_or_else(|| BackendError::Format {
            op: "load_weight",
            tensor: view.name.clone(),
            format: view.format.to_string(),
        })?;
        let bad =
            |what: String| BackendError::shape("load_weight", format!("`{}`: {what}", view.name));
        let (n, k) = view.rows_cols();
        if k == 0 || n == 0 {
            return Err(bad(format!("empty shape {:?}", view.shape)));
        }
        let row_bytes = view.format.row_bytes(k).ok_or_else(|| {
            bad(format!("{k} elements per row is not whole {} blocks", view.format))
        })?;
        let want = view.format.tensor_bytes(&view.shape);
        if want != Some(view.bytes().len()) {
            return Err(bad(format!(
                "shape {:?} in {} needs {want:?} bytes, the tensor has {}",
                view.shape,
                view.format,
                view.bytes().len()
            )));
        }
        let mut w = CpuWeight { view: view.clone(), format, n, k, row_bytes, vector: None };
        if view.shape.len() <= 1 {
            let mut v = vec![0f32; k.div_ceil(16) * 16];
            w.decode_row(SimdLevel::Scalar, 0, &mut v);
            v.truncate(k);
            w.vector = Some(v);
        }
        Ok(w)
    }

    pub fn name(&self) -> &str {
        &self.view.name
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// (rows, elements per row).
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The bytes of row `r` (`r < n`).
    pub(crate) fn row(&self, r: usize) -> &[u8] {
        &self.view.bytes()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// f32 values of a vector weight, checked to have `len` elements.
    pub(crate) fn vector(&self, op: &'static str, len: usize) -> Result<&[f32]> {
        match &self.vector {
            Some(v) if v.len() == len => Ok(v),
            _ => Err(BackendError::shape(
                op,
                format!(
                    "`{}` is [{}, {}], expected a vector of {len}",
                    self.view.name, self.n, self.k
                ),
            )),
        }
    }

    /// Decodes row `r` exactly to f32 into `out[..k]`; `out` holds `round_up(k, 16)` values
    /// (the tail is zero-filled).
    pub(crate) fn decode_row(&self, level: SimdLevel, r: usize, out: &mut [f32]) {
        formats::decode_row(level, self.format, self.row(r), self.k, out);
    }
}
