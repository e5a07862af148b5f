//! Activation buffers and step metadata of the CPU backend.
//!
//! A [`CpuTensor`] is `(max_rows, cols)` of bf16 (stored as `u16` bit patterns) or f32,
//! row-major, plus the number of rows currently valid. The op that writes a tensor sets that
//! count: `embed` and `logits` from the batch, every other op from its input. Ops read only
//! the valid rows, so a buffer made for a 512-row prefill serves a 1-row decode unchanged.
//! Host access (`from_*`, `to_f32`) is for tests and benchmarks; the engine sees values only
//! through `Backend::read_f32`.

use crate::batch::BatchMeta;
use crate::error::{BackendError, Result};
use crate::ActDType;

use super::simd::math;

/// Element storage of a tensor.
pub(crate) enum Data {
    /// bf16 bit patterns.
    Bf16(Vec<u16>),
    F32(Vec<f32>),
}

/// An activation buffer `(rows, cols)`, row-major.
pub struct CpuTensor {
    pub(crate) data: Data,
    /// Valid rows (set by the op that last wrote the tensor).
    pub(crate) rows: usize,
    pub(crate) max_rows: usize,
    pub(crate) cols: usize,
}

impl std::fmt::Debug for CpuTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CpuTensor({:?}, {} of {} rows x {})",
            self.dtype(),
            self.rows,
            self.max_rows,
            self.cols
        )
    }
}

fn try_zeroed<T: Clone + Default>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| BackendError::OutOfMemory {
        what: what.to_string(),
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    v.resize(n, T::default());
    Ok(v)
}

impl CpuTensor {
    /// A zeroed tensor whose valid rows are all `max_rows`.
    pub fn zeros(dtype: ActDType, max_rows: usize, cols: usize) -> Result<CpuTensor> {
        let n = max_rows.checked_mul(cols).ok_or_else(|| {
            BackendError::shape("alloc", format!("{max_rows} x {cols} overflows"))
        })?;
        let what = format!("activation ({max_rows}, {cols}) {dtype:?}");
        let data = match dtype {
            ActDType::Bf16 => Data::Bf16(try_zeroed(n, &what)?),
            ActDType::F32 => Data::F32(try_zeroed(n, &what)?),
        };
        Ok(CpuTensor { data, rows: max_rows, max_rows, cols })
    }

    /// A bf16 tensor holding `values` (rows x cols) rounded to bf16.
    pub fn from_f32_as_bf16(rows: usize, cols: usize, values: &[f32]) -> Result<CpuTensor> {
        Self::check_len(rows, cols, values.len())?;
        let data = Data::Bf16(values.iter().map(|&v| math::f32_to_bf16(v)).collect());
        Ok(CpuTensor { data, rows, max_rows: rows, cols })
    }

    /// A bf16 tensor from bit patterns.
    pub fn from_bf16_bits(rows: usize, cols: usize, bits: Vec<u16>) -> Result<CpuTensor> {
        Self::check_len(rows, cols, bits.len())?;
        Ok(CpuTensor { data: Data::Bf16(bits), rows, max_rows: rows, cols })
    }

    /// An f32 tensor holding `values`.
    pub fn from_f32(rows: usize, cols: usize, values: Vec<f32>) -> Result<CpuTensor> {
        Self::check_len(rows, cols, values.len())?;
        Ok(CpuTensor { data: Data::F32(values), rows, max_rows: rows, cols })
    }

    fn check_len(rows: usize, cols: usize, len: usize) -> Result<()> {
        if rows.checked_mul(cols) != Some(len) {
            return Err(BackendError::shape(
                "tensor",
                format!("{len} values for ({rows}, {cols})"),
            ));
        }
        Ok(())
    }

    pub fn dtype(&self) -> ActDType {
        match self.data {
            Data::Bf16(_) => ActDType::Bf16,
            Data::F32(_) => ActDType::F32,
        }
    }

    /// Valid rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    /// Sets the valid row count (tests fill a tensor, then use a prefix of it).
    pub fn set_rows(&mut self, rows: usize) -> Result<()> {
        if rows > self.max_rows {
            return Err(BackendError::shape(
                "set_rows",
                format!("{rows} rows in a tensor of {}", self.max_rows),
            ));
        }
        self.rows = rows;
        Ok(())
    }

    /// The first `rows` rows widened to f32.
    pub fn to_f32(&self, rows: usize) -> Vec<f32> {
        let n = rows.min(self.max_rows) * self.cols;
        match &self.data {
            Data::Bf16(v) => v[..n].iter().map(|&h| math::bf16_to_f32(h)).collect(),
            Data::F32(v) => v[..n].to_vec(),
        }
    }

    /// bf16 bit patterns of the valid rows (None for an f32 tensor).
    pub fn bf16_bits(&self) -> Option<&[u16]> {
        match &self.data {
            Data::Bf16(v) => Some(&v[..self.rows * self.cols]),
            Data::F32(_) => None,
        }
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
}

/// A validated step: the metadata plus what the kernels look up per row.
pub struct CpuBatch {
    pub(crate) meta: BatchMeta,
    /// Largest block id any row needs (checked against the pool at use).
    pub(crate) max_block: Option<u32>,
}

impl std::fmt::Debug for CpuBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuBatch({} rows)", self.meta.rows())
    }
}

impl CpuBatch {
    pub(crate) fn new(meta: &BatchMeta) -> Result<CpuBatch> {
        meta.validate(None)?;
        let mut max_block = None;
        for r in 0..meta.rows() {
            let seq = &meta.seqs[meta.row_seq[r] as usize];
            let need = meta.positions[r] as usize / meta.block_size + 1;
            let m = seq.block_table[..need].iter().copied().max();
            max_block = max_block.max(m);
        }
        Ok(CpuBatch { meta: meta.clone(), max_block })
    }

    pub fn rows(&self) -> usize {
        self.meta.rows()
    }

    pub fn meta(&self) -> &BatchMeta {
        &self.meta
    }
}
