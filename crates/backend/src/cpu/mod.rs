//! The CPU backend: the op set on host memory, with runtime-selected SIMD and a thread pool.
//!
//! - `simd`: the 16-lane abstraction (AVX-512, AVX2, NEON, scalar) every kernel is written
//!   over, so all levels give identical bits;
//! - `linear`: products over every weight format, decoded in registers (`formats`), a fused
//!   kernel for decode rows and a panel GEMM for prefill (`kernels`);
//! - `elementwise` (norm, rope, swiglu, add, embed), `attention` over the paged pool (`kv`);
//! - `pool`: persistent threads; work is split by output columns or rows/heads, never along a
//!   reduction, so no result depends on the thread count or the batch's row count.
//!
//! Ops run synchronously on the calling thread (helped by the pool), so `synchronize` has
//! nothing to wait for. Thread count: `available_parallelism`, or `CpuConfig::threads`.

mod act;
mod attention;
mod elementwise;
#[cfg(feature = "fault-row-dependent")]
mod fault;
mod kv;
pub(crate) mod linear;
mod pool;
pub mod simd;
mod tensor;
mod weight;

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

pub use kv::CpuKv;
pub use simd::SimdLevel;
pub use tensor::{CpuBatch, CpuTensor};
pub use weight::{CpuWeight, WeightFormat};

use crate::batch::{BatchMeta, KvGeometry};
use crate::error::{BackendError, Result};
use crate::penalty::{self, Penalties};
use crate::{sample, ActDType, AttnArgs, Backend, NormArgs, RopeArgs};
use act::{Dst, Src};
// The `linear` op's driver, chosen at this module boundary: the real one, or in the
// `fault-row-dependent` build (never a default) a split-K one whose schedule depends on the
// row count, which the exactness checkers must catch (`fault.rs`).
#[cfg(feature = "fault-row-dependent")]
use fault::linear as linear_op;
#[cfg(not(feature = "fault-row-dependent"))]
use linear::linear as linear_op;
use tf_checkpoint::TensorView;

/// Construction options; `Default` picks everything automatically.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuConfig {
    /// Threads including the caller's; default `available_parallelism`.
    pub threads: Option<usize>,
    /// Force a SIMD level (tests compare levels); default the best the CPU supports.
    pub level: Option<SimdLevel>,
}

/// The CPU implementation of [`Backend`].
pub struct CpuBackend {
    pub(crate) pool: pool::Pool,
    pub(crate) level: SimdLevel,
    /// Widened inputs of `linear`/`logits`, reused across calls.
    pub(crate) xbuf: Mutex<Vec<f32>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuBackend({}, {} threads)", self.level, self.pool.threads())
    }
}

impl CpuBackend {
    /// The best SIMD level and one thread per available core.
    pub fn new() -> Result<CpuBackend> {
        Self::with_config(CpuConfig::default())
    }

    pub fn with_config(cfg: CpuConfig) -> Result<CpuBackend> {
        let level = match cfg.level {
            Some(l) if !l.supported() => {
                return Err(BackendError::Device(format!(
                    "SIMD level {l} is not supported by this CPU"
                )))
            }
            Some(l) => l,
            None => SimdLevel::detect(),
        };
        let threads = cfg
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let pool = pool::Pool::new(threads)
            .map_err(|e| BackendError::Device(format!("spawning {threads} CPU threads: {e}")))?;
        Ok(CpuBackend { pool, level, xbuf: Mutex::new(Vec::new()) })
    }

    pub fn level(&self) -> SimdLevel {
        self.level
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// (parallel jobs posted, worker entries into them): how often helper threads arrive in
    /// time to share an op (diagnostics for benchmarks).
    pub fn pool_stats(&self) -> (u64, u64) {
        self.pool.stats()
    }

    /// Calls `f` on disjoint ranges covering `0..items` (`chunk` items each), on the pool's
    /// threads when `parallel`, else on the caller's.
    pub(crate) fn for_ranges(
        &self,
        items: usize,
        chunk: usize,
        parallel: bool,
        f: &(dyn Fn(Range<usize>) + Sync),
    ) {
        if items == 0 {
            return;
        }
        if !parallel || self.pool.threads() == 1 {
            f(0..items);
            return;
        }
        let chunk = chunk.max(1);
        let next = AtomicUsize::new(0);
        self.pool.run(&|_tid| loop {
            let i = next.fetch_add(1, Ordering::Relaxed) * chunk;
            if i >= items {
                break;
            }
            f(i..(i + chunk).min(items));
        });
    }
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Kv = CpuKv;
    type Batch = CpuBatch;

    fn name(&self) -> String {
        format!("cpu ({}, {} threads)", self.level, self.pool.threads())
    }

    fn load_weight(&self, view: &TensorView) -> Result<CpuWeight> {
        CpuWeight::load(view)
    }

    fn alloc(&self, dtype: ActDType, max_rows: usize, cols: usize) -> Result<CpuTensor> {
        CpuTensor::zeros(dtype, max_rows, cols)
    }

    fn alloc_kv(&self, geom: &KvGeometry) -> Result<CpuKv> {
        CpuKv::new(geom)
    }

    fn prepare_batch(&self, meta: &BatchMeta) -> Result<CpuBatch> {
        CpuBatch::new(meta)
    }

    fn embed(&self, table: &CpuWeight, batch: &CpuBatch, out: &mut CpuTensor) -> Result<()> {
        elementwise::embed(self, table, &batch.meta.tokens, out)
    }

    fn rms_norm(&self, a: NormArgs<'_, Self>) -> Result<()> {
        elementwise::rms_norm(self, a.x, a.weight, a.eps, a.group, a.out)
    }

    fn linear(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        out: &mut CpuTensor,
    ) -> Result<()> {
        linear_op(self, x, w, bias, out)
    }

    fn rope(&self, a: RopeArgs<'_, Self>) -> Result<()> {
        if a.x.rows != a.batch.rows() {
            return Err(BackendError::shape(
                "rope",
                format!("{} rows but the batch has {}", a.x.rows, a.batch.rows()),
            ));
        }
        let pos = &a.batch.meta.positions;
        elementwise::rope(self, a.x, a.heads, a.head_dim, a.style, a.table, pos)
    }

    fn kv_store(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        batch: &CpuBatch,
    ) -> Result<()> {
        kv.store(layer, k, v, batch)
    }

    fn attention(&self, a: AttnArgs<'_, Self>) -> Result<()> {
        let sh = attention::AttnShape {
            layer: a.layer,
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            scale: a.scale,
        };
        attention::attention(self, a.q, a.kv, a.batch, sh, a.out)
    }

    fn swiglu(&self, gate: &CpuTensor, up: &CpuTensor, out: &mut CpuTensor) -> Result<()> {
        out.check_out("swiglu", gate.rows, gate.cols)?;
        let shape = (gate.rows, gate.cols);
        let op = elementwise::Binary::Swiglu;
        let rows = elementwise::binary(self, op, "swiglu", Src::of(gate), shape, up, Dst::of(out))?;
        out.rows = rows;
        Ok(())
    }

    fn add(&self, acc: &mut CpuTensor, x: &CpuTensor) -> Result<()> {
        let shape = (acc.rows, acc.cols);
        let src = Src::of(acc);
        elementwise::binary(self, elementwise::Binary::Add, "add", src, shape, x, Dst::of(acc))?;
        Ok(())
    }

    fn logits(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        batch: &CpuBatch,
        out: &mut CpuTensor,
    ) -> Result<()> {
        if x.rows != batch.rows() {
            return Err(BackendError::shape(
                "logits",
                format!("{} rows but the batch has {}", x.rows, batch.rows()),
            ));
        }
        linear::logits(self, x, &batch.meta.logit_rows, w, out)
    }

    fn read_f32(&self, t: &CpuTensor, rows: usize) -> Result<Vec<f32>> {
        if rows > t.rows {
            return Err(BackendError::shape(
                "read_f32",
                format!("{rows} rows of {} valid", t.rows),
            ));
        }
        Ok(t.to_f32(rows))
    }

    /// The host definitions (`Penalties::apply`, `sample::sample_row`), rows shared among the
    /// pool's threads: each token is a pure function of its own row, penalties and draw, so
    /// no thread count changes one.
    fn sample(
        &self,
        t: &CpuTensor,
        rows: usize,
        draws: &[sample::Draw],
        penalties: &[Penalties<'_>],
    ) -> Result<Vec<u32>> {
        sample::check_draws(rows, draws)?;
        penalty::check(rows, penalties)?;
        let v = self.read_f32(t, rows)?;
        let cols = v.len().checked_div(rows).unwrap_or(0);
        if cols == 0 {
            return Ok(vec![0; rows]);
        }
        let tokens: Vec<AtomicU32> = (0..rows).map(|_| AtomicU32::new(0)).collect();
        let sampled = draws.iter().filter(|d| !d.quantize().greedy).count();
        let penalized = penalties.iter().filter(|p| !p.is_off()).count();
        self.for_ranges(rows, 1, sampled + penalized >= 2, &|r| {
            for i in r {
                let row = &v[i * cols..(i + 1) * cols];
                let tok = match penalties.get(i).filter(|p| !p.is_off()) {
                    Some(p) => {
                        let mut own = row.to_vec();
                        p.apply(&mut own);
                        sample::sample_row(&own, &draws[i])
                    }
                    None => sample::sample_row(row, &draws[i]),
                };
                tokens[i].store(tok, Ordering::Relaxed);
            }
        });
        Ok(tokens.into_iter().map(AtomicU32::into_inner).collect())
    }

    fn read_kv(
        &self,
        kv: &CpuKv,
        layer: usize,
        block_table: &[u32],
        len: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        kv.read(layer, block_table, len)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
