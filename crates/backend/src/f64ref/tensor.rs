//! Buffers of the float64 reference: activations, weights and step metadata.
//!
//! An [`F64Tensor`] is `(max_rows, cols)` f64, row-major, plus the rows currently valid (set
//! by the op that last wrote it, as in `cpu`: `embed`/`logits` from the batch, the others from
//! their input). An [`F64Weight`] is the checkpoint tensor decoded exactly to f64 at load,
//! `(n, k)` row-major; the file's bytes are not kept.

use rayon::prelude::*;
use tf_checkpoint::quant::decode_row_f64;
use tf_checkpoint::{DType, TensorFormat, TensorView};

use super::F64Backend;
use crate::batch::BatchMeta;
use crate::error::{BackendError, Result};
use crate::ActDType;

/// `n` zeros, or an out-of-memory error naming `what`.
pub(crate) fn try_zeros(n: usize, what: impl FnOnce() -> String) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| BackendError::OutOfMemory { what: what(), bytes: n.saturating_mul(8) })?;
    v.resize(n, 0.0);
    Ok(v)
}

/// An activation buffer `(rows, cols)` of f64, row-major.
pub struct F64Tensor {
    pub(crate) data: Vec<f64>,
    /// What the fast backend would store; values here are never rounded to it.
    pub(crate) dtype: ActDType,
    pub(crate) rows: usize,
    pub(crate) max_rows: usize,
    pub(crate) cols: usize,
}

impl std::fmt::Debug for F64Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (d, r, m, c) = (self.dtype, self.rows, self.max_rows, self.cols);
        write!(f, "F64Tensor(f64 for {d:?}, {r} of {m} rows x {c})")
    }
}

impl F64Tensor {
    /// A zeroed tensor whose valid rows are all `max_rows`.
    pub fn zeros(dtype: ActDType, max_rows: usize, cols: usize) -> Result<F64Tensor> {
        let n = max_rows.checked_mul(cols).ok_or_else(|| {
            BackendError::shape("alloc", format!("{max_rows} x {cols} overflows"))
        })?;
        let data = try_zeros(n, || format!("f64 activation ({max_rows}, {cols})"))?;
        Ok(F64Tensor { data, dtype, rows: max_rows, max_rows, cols })
    }

    /// A tensor holding `values` (rows x cols).
    pub fn from_f64(rows: usize, cols: usize, values: Vec<f64>) -> Result<F64Tensor> {
        if rows.checked_mul(cols) != Some(values.len()) {
            return Err(BackendError::shape(
                "tensor",
                format!("{} values for ({rows}, {cols})", values.len()),
            ));
        }
        Ok(F64Tensor { data: values, dtype: ActDType::F32, rows, max_rows: rows, cols })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The valid rows' values.
    pub fn values(&self) -> &[f64] {
        &self.data[..self.rows * self.cols]
    }

    /// Checks that `rows` rows fit, for an op writing this tensor.
    pub(crate) fn check_out(&self, op: &'static str, rows: usize, cols: usize) -> Result<()> {
        if self.cols != cols || rows > self.max_rows {
            return Err(BackendError::shape(
                op,
                format!(
                    "output is ({}, {}) but the op writes ({rows}, {cols})",
                    self.max_rows, self.cols
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn check_read(&self, op: &'static str, rows: usize) -> Result<()> {
        if rows > self.rows {
            return Err(BackendError::shape(op, format!("{rows} rows of {} valid", self.rows)));
        }
        Ok(())
    }

    /// Row `r` (`r < max_rows`).
    pub(crate) fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A weight decoded to f64: matrix `(n, k)` or, for a one-dimensional tensor, a vector
/// (`n == 1`).
pub struct F64Weight {
    pub(crate) name: String,
    pub(crate) data: Vec<f64>,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) vector: bool,
}

impl std::fmt::Debug for F64Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "F64Weight({} [{}, {}])", self.name, self.n, self.k)
    }
}

impl F64Weight {
    /// Decodes every row of `view` exactly to f64 (rows in parallel; each row alone).
    pub(crate) fn load(be: &F64Backend, view: &TensorView) -> Result<F64Weight> {
        let supported = match view.format {
            TensorFormat::Plain(d) => matches!(d, DType::F32 | DType::F16 | DType::BF16),
            TensorFormat::Ggml(_) => true,
        };
        if !supported {
            return Err(BackendError::Format {
                op: "load_weight",
                tensor: view.name.clone(),
                format: view.format.to_string(),
            });
        }
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
        let bytes = view.bytes();
        if want != Some(bytes.len()) {
            return Err(bad(format!(
                "shape {:?} in {} needs {want:?} bytes, the tensor has {}",
                view.shape,
                view.format,
                bytes.len()
            )));
        }
        let mut data = try_zeros(n * k, || format!("f64 weight `{}` [{n}, {k}]", view.name))?;
        be.pool.install(|| {
            data.par_chunks_mut(k).zip(bytes.par_chunks(row_bytes)).try_for_each(|(out, b)| {
                decode_row_f64(view.format, b, out).map_err(|e| bad(e.to_string()))
            })
        })?;
        let vector = view.shape.len() <= 1;
        Ok(F64Weight { name: view.name.clone(), data, n, k, vector })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// (rows, elements per row).
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The decoded values, `(n, k)` row-major.
    pub fn values(&self) -> &[f64] {
        &self.data
    }

    /// Row `r` (`r < n`).
    pub(crate) fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.k..(r + 1) * self.k]
    }

    /// The values of a vector weight, checked to have `len` elements.
    pub(crate) fn vector(&self, op: &'static str, len: usize) -> Result<&[f64]> {
        if self.vector && self.k == len {
            Ok(&self.data)
        } else {
            Err(BackendError::shape(
                op,
                format!("`{}` is [{}, {}], expected a vector of {len}", self.name, self.n, self.k),
            ))
        }
    }

    /// Checks that this is a matrix of `k` elements per row.
    pub(crate) fn matrix(&self, op: &'static str, k: usize) -> Result<()> {
        if self.vector || self.k != k {
            return Err(BackendError::shape(
                op,
                format!(
                    "`{}` is [{}, {}], expected a matrix of rows of {k}",
                    self.name, self.n, self.k
                ),
            ));
        }
        Ok(())
    }
}

/// A validated step.
pub struct F64Batch {
    pub(crate) meta: BatchMeta,
}

impl std::fmt::Debug for F64Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "F64Batch({} rows)", self.meta.rows())
    }
}

impl F64Batch {
    pub(crate) fn new(meta: &BatchMeta) -> Result<F64Batch> {
        meta.validate(None)?;
        Ok(F64Batch { meta: meta.clone() })
    }

    pub fn rows(&self) -> usize {
        self.meta.rows()
    }

    pub fn meta(&self) -> &BatchMeta {
        &self.meta
    }
}
