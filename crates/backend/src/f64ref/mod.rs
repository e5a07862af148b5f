//! The float64 reference backend: the same op set as `cpu`, every value an f64, nothing
//! rounded until the host reads it (DESIGN.md §2 "Float64 reference": the same model, bf16 or
//! quantized weights cast up exactly, one rounding at the end). When the engine and HF
//! disagree, running the *same family code* on this backend settles which side is off.
//!
//! Invariants:
//! - values: a [`F64Tensor`] holds f64 whatever [`ActDType`] is asked (the dtype only says
//!   what the fast backend would round to, and is kept for `Debug`); weights of every
//!   supported format (F32/F16/BF16, ggml blocks) are decoded exactly to f64 once, at load;
//! - arithmetic: each op is its textbook formula in f64 with no intermediate rounding to a
//!   narrower type: `rms_norm = w * (x / sqrt(mean(x^2) + eps))`, `linear = sum_k x*w (+ b)`,
//!   RoPE from f64 angles, softmax attention in f64 over an f64 paged KV pool,
//!   `swiglu = silu(g) * u`, `add`, `logits`; `read_f32` rounds once, [`F64Backend::read_f64`]
//!   not at all;
//! - order: every dot product runs over k sequentially from 0 (rows and columns are tiled,
//!   never the reduction), threads split output columns (linear/logits) or (row, head) items
//!   (attention); so a row's result is independent of the batch and of the thread count, as
//!   the kernel contract requires of every backend;
//! - RoPE: the backend takes the model's [`RopeSpec`] at construction and computes
//!   `inv_freq` in f64 (HF's fp32 formula, llama3/linear scaling included, done in f64) and
//!   `cos`/`sin` of `position * inv_freq` in f64. The bf16 table in [`RopeArgs`] is the fast
//!   path's; it is only checked (width, positions covered), never read for values.
//! - scalars the trait passes as f32: `eps` is widened (HF adds it in fp32 too); the attention
//!   `scale`, when it is `1/sqrt(head_dim)` rounded to f32, is replaced by that value in f64
//!   (HF's `head_dim ** -0.5` is a Python double); any other scale is widened.
//!
//! Memory: weights are kept decoded (8 bytes per parameter: ~1.1 GB for a 135M model, ~8 GB
//! for 1B). Rejected: decoding quantized rows on the fly in every product, which saves memory
//! but repeats the decode per call and is slower; the reference serves small test models.
//! Rejected: reading cos/sin from the bf16 table (that would bake bf16 rounding into the
//! reference), and a table of f64 cos/sin (a few sin/cos per row per call cost nothing).

mod attention;
mod linear;
mod ops;
mod rope;
mod tensor;

pub use attention::F64Kv;
pub use rope::inv_freq_f64;
pub use tensor::{F64Batch, F64Tensor, F64Weight};

use crate::batch::{BatchMeta, KvGeometry};
use crate::error::{BackendError, Result};
use crate::{ActDType, AttnArgs, Backend, NormArgs, RopeArgs};
use tf_checkpoint::spec::RopeSpec;
use tf_checkpoint::TensorView;

/// The float64 implementation of [`Backend`].
pub struct F64Backend {
    pool: rayon::ThreadPool,
    /// f64 inverse frequencies of the model's RoPE (dim/2 of them).
    inv_freq: Vec<f64>,
}

impl std::fmt::Debug for F64Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "F64Backend({} threads)", self.pool.current_num_threads())
    }
}

impl F64Backend {
    /// A backend for a model with this RoPE, one thread per available core.
    pub fn new(rope: &RopeSpec) -> Result<F64Backend> {
        Self::with_threads(rope, None)
    }

    /// As [`F64Backend::new`] with `threads` worker threads (`None`: available cores).
    pub fn with_threads(rope: &RopeSpec, threads: Option<usize>) -> Result<F64Backend> {
        let inv_freq = inv_freq_f64(rope)?;
        let mut b = rayon::ThreadPoolBuilder::new();
        if let Some(t) = threads {
            b = b.num_threads(t.max(1));
        }
        let pool = b
            .thread_name(|i| format!("f64ref-{i}"))
            .build()
            .map_err(|e| BackendError::Device(format!("f64ref: spawning threads: {e}")))?;
        Ok(F64Backend { pool, inv_freq })
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The f64 inverse frequencies RoPE uses.
    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    /// Copies the first `rows` rows of a tensor to the host without rounding.
    pub fn read_f64(&self, t: &F64Tensor, rows: usize) -> Result<Vec<f64>> {
        t.check_read("read_f64", rows)?;
        Ok(t.data[..rows * t.cols].to_vec())
    }

    /// Copies the KV rows of one sequence of `layer` to the host without rounding.
    pub fn read_kv_f64(
        &self,
        kv: &F64Kv,
        layer: usize,
        block_table: &[u32],
        len: usize,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        kv.read(layer, block_table, len)
    }
}

impl Backend for F64Backend {
    type Tensor = F64Tensor;
    type Weight = F64Weight;
    type Kv = F64Kv;
    type Batch = F64Batch;

    fn name(&self) -> String {
        format!("f64ref ({} threads)", self.threads())
    }

    fn load_weight(&self, view: &TensorView) -> Result<F64Weight> {
        F64Weight::load(self, view)
    }

    fn alloc(&self, dtype: ActDType, max_rows: usize, cols: usize) -> Result<F64Tensor> {
        F64Tensor::zeros(dtype, max_rows, cols)
    }

    fn alloc_kv(&self, geom: &KvGeometry) -> Result<F64Kv> {
        F64Kv::new(geom)
    }

    fn prepare_batch(&self, meta: &BatchMeta) -> Result<F64Batch> {
        F64Batch::new(meta)
    }

    fn embed(&self, table: &F64Weight, batch: &F64Batch, out: &mut F64Tensor) -> Result<()> {
        ops::embed(table, &batch.meta.tokens, out)
    }

    fn rms_norm(&self, a: NormArgs<'_, Self>) -> Result<()> {
        ops::rms_norm(self, a.x, a.weight, f64::from(a.eps), a.group, a.out)
    }

    fn linear(
        &self,
        x: &F64Tensor,
        w: &F64Weight,
        bias: Option<&F64Weight>,
        out: &mut F64Tensor,
    ) -> Result<()> {
        let rows: Vec<usize> = (0..x.rows).collect();
        linear::product(self, "linear", x, &rows, w, bias, out)
    }

    fn rope(&self, a: RopeArgs<'_, Self>) -> Result<()> {
        let shape = ops::RopeShape { heads: a.heads, head_dim: a.head_dim, style: a.style };
        ops::rope(self, a.x, shape, a.table, a.batch)
    }

    fn kv_store(
        &self,
        kv: &mut F64Kv,
        layer: usize,
        k: &F64Tensor,
        v: &F64Tensor,
        batch: &F64Batch,
    ) -> Result<()> {
        kv.store(layer, k, v, batch)
    }

    fn attention(&self, a: AttnArgs<'_, Self>) -> Result<()> {
        let exact = 1.0 / (a.head_dim as f64).sqrt();
        let scale = if a.scale == exact as f32 { exact } else { f64::from(a.scale) };
        let sh = attention::AttnShape {
            layer: a.layer,
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            scale,
        };
        attention::attention(self, a.q, a.kv, a.batch, sh, a.out)
    }

    fn swiglu(&self, gate: &F64Tensor, up: &F64Tensor, out: &mut F64Tensor) -> Result<()> {
        ops::swiglu(self, gate, up, out)
    }

    fn add(&self, acc: &mut F64Tensor, x: &F64Tensor) -> Result<()> {
        ops::add(self, acc, x)
    }

    fn logits(
        &self,
        x: &F64Tensor,
        w: &F64Weight,
        batch: &F64Batch,
        out: &mut F64Tensor,
    ) -> Result<()> {
        if x.rows != batch.rows() {
            return Err(BackendError::shape(
                "logits",
                format!("{} rows but the batch has {}", x.rows, batch.rows()),
            ));
        }
        let rows: Vec<usize> = batch.meta.logit_rows.iter().map(|&r| r as usize).collect();
        linear::product(self, "logits", x, &rows, w, None, out)
    }

    /// The one rounding of the reference: f64 to the nearest f32.
    fn read_f32(&self, t: &F64Tensor, rows: usize) -> Result<Vec<f32>> {
        t.check_read("read_f32", rows)?;
        Ok(t.data[..rows * t.cols].iter().map(|&v| v as f32).collect())
    }

    fn read_kv(
        &self,
        kv: &F64Kv,
        layer: usize,
        block_table: &[u32],
        len: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (k, v) = kv.read(layer, block_table, len)?;
        let narrow = |x: Vec<f64>| x.into_iter().map(|v| v as f32).collect();
        Ok((narrow(k), narrow(v)))
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
