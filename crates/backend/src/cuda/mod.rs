//! The CUDA backend: the op set on one NVIDIA GPU (DESIGN.md §4).
//!
//! - `loader`: opens the driver and NVRTC at run time (the build needs no CUDA toolkit), so
//!   a machine without a GPU gets a clear error from [`CudaBackend::new`], never a panic;
//! - `compile`: kernel sources (`crates/backend/kernels/*.cu`, one op family per file),
//!   compiled by NVRTC for the device's architecture and cached on disk;
//! - `kernels`: the registry of entry points and their resource use (the kernel contract);
//! - `tensor`: device buffers; `ops` (row-local ops), `linear` (tensor-core products),
//!   `attention` (paged KV store and attention), `fused` (add+norm, grouped decode products).
//!
//! Exactness: every kernel's arithmetic for a row depends only on that row's inputs and the
//! weight shape (or the row's absolute position), never on the row count. Ops are enqueued in
//! order on one stream; `synchronize` and the `read_*` ops wait for it.
//! Rejected: cuBLAS in the served path (its algorithm choice depends on the row count).

mod ahead;
mod attention;
pub mod compile;
mod fused;
mod fused_norm;
mod fused_rope;
mod gemm;
mod graph;
mod kernels;
mod linear;
pub mod loader;
mod ops;
mod sample;
mod staging;
mod step_events;
mod tensor;
mod wgmma;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError, LaunchConfig};
use tf_checkpoint::TensorView;

pub use graph::GraphStats;
pub(crate) use graph::KArg;
pub use tensor::{CudaBatch, CudaKv, CudaTensor, CudaWeight, KvLayout, WeightKind};

use crate::batch::{BatchMeta, KvGeometry};
use crate::error::{BackendError, Result};
use crate::{
    ActDType, AddNormArgs, AttnArgs, Backend, KernelInfo, LinearPart, NormArgs, QkvRopeArgs,
    RopeArgs, RopeKvArgs, SwigluArgs,
};

/// Construction options.
#[derive(Clone, Debug, Default)]
pub struct CudaConfig {
    /// Where compiled kernels are cached; `None` compiles every run.
    pub kernel_cache: Option<PathBuf>,
    /// Extra directories searched for libnvrtc before the usual places.
    pub nvrtc_dirs: Vec<PathBuf>,
}

impl CudaConfig {
    /// The default kernel cache: `$TENSORFOLD_CACHE/kernels`, else `.cache/kernels` in the
    /// nearest ancestor of the working directory or executable that has a `.cache` (the
    /// repository), else `~/.cache/tensorfold/kernels`.
    pub fn default_kernel_cache() -> Option<PathBuf> {
        if let Some(c) = std::env::var_os("TENSORFOLD_CACHE") {
            return Some(PathBuf::from(c).join("kernels"));
        }
        if let Some(root) = loader::ancestors_with_cache().into_iter().next() {
            return Some(root.join(".cache").join("kernels"));
        }
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tensorfold/kernels"))
    }
}

/// The CUDA implementation of [`Backend`].
pub struct CudaBackend {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) reg: kernels::Registry,
    arch: String,
    device_name: String,
    /// Attention split partials, grown on demand (ops run in stream order, so reuse is safe).
    pub(crate) scratch: Mutex<Option<CudaSlice<f32>>>,
    /// Step metadata at a fixed address, shared by the batches while no other holds it.
    pub(crate) meta: Mutex<Option<Arc<CudaSlice<u32>>>>,
    /// The gathered input rows of `linear_bf16_ws` calls that need them (`wgmma.rs`), grown
    /// on demand.
    pub(crate) gathered: Mutex<Option<CudaSlice<u16>>>,
    /// Greedy tokens of `argmax`, grown on demand.
    pub(crate) tokens: Mutex<Option<CudaSlice<u32>>>,
    /// `sample`'s per-row parameters and weights (`sample.rs`), grown on demand.
    pub(crate) sample_buf: Mutex<Option<CudaSlice<u64>>>,
    /// Step recording and the graphs of recorded steps (`graph.rs`).
    pub(crate) graphs: Mutex<graph::Graphs>,
    /// Launch with programmatic stream serialization (sm_90+, `TENSORFOLD_PDL=0` turns it
    /// off): a kernel may start while the previous one finishes (`graph.rs` `launch_now`).
    pub(crate) pdl: bool,
    /// Whether the current step's launches take PDL (`graph.rs` `graph_step_begin`): steps of
    /// at most `GRAPH_MAX_ROWS` rows do; prefill chunks run plain stream order, since their
    /// kernels of thousands of CTAs would let the next kernel's CTAs hold SMs while they wait
    /// (`TENSORFOLD_PDL_PREFILL=1`: every step takes it, for A/B).
    pub(crate) pdl_step: std::sync::atomic::AtomicBool,
    /// Streaming multiprocessors (sizes the bounded attention split grid).
    pub(crate) sms: usize,
    /// What the last launch wrote to the KV pool if it was `kv_store` or `rope_kv_store`
    /// (`KvWrite`); every launch clears it first. Attention's decode CTAs copy the rows older
    /// than the call's before waiting for the previous kernel only when that kernel wrote this
    /// call's rows of this layer and nothing else (`TF_DEC_EARLY`, attention_dec.cu). A copy
    /// on the stream in between (a new batch's metadata) is no kernel: the next launch starts
    /// after it completes, so an entry it leaves allows only copies of finished rows.
    pub(crate) kv_written: Mutex<Option<KvWrite>>,
    /// Kernel launches issued so far (`launches`).
    launches: std::sync::atomic::AtomicU64,
    /// The fused norm products' count of CTAs that have read the residual (`linear_norm.cu`:
    /// the last one writes it back and resets the count to zero for the next launch).
    pub(crate) norm_counter: CudaSlice<u32>,
    /// CTAs an SM holds, by (entry point, threads, dynamic shared memory): the driver's
    /// occupancy answers for this GPU, asked once each (`persistent_ctas`).
    pub(crate) resident: Mutex<Vec<(Occupancy, u32)>>,
    /// Pinned buffers the weight upload copies through (`staging.rs`), made on first use.
    pub(crate) staging: Mutex<Option<staging::Staging>>,
    /// `TENSORFOLD_STEP_EVENTS=1`: events around each step (`step_events.rs`), else None.
    pub(crate) step_events: Mutex<Option<step_events::StepEvents>>,
    /// The decode-ahead token ring (`ahead.rs`), made on first use.
    pub(crate) ahead_ring: Mutex<Option<ahead::HostRing>>,
}

/// An occupancy question: (entry point, threads a block, dynamic shared memory bytes).
pub(crate) type Occupancy = (&'static str, u32, u32);

/// A KV store launch's pool, positions buffer and layer region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvWrite {
    pub pool: u64,
    pub positions: u64,
    pub region: (u32, u32),
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({}, {})", self.device_name, self.arch)
    }
}

/// A driver error as a backend error naming what was being done.
pub(crate) fn drv(what: impl std::fmt::Display) -> impl FnOnce(DriverError) -> BackendError {
    move |e| BackendError::Device(format!("cuda: {what}: {e}"))
}

impl CudaBackend {
    /// The GPU of index `ordinal`, default configuration.
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        let cfg =
            CudaConfig { kernel_cache: CudaConfig::default_kernel_cache(), nvrtc_dirs: vec![] };
        Self::with_config(ordinal, cfg)
    }

    pub fn with_config(ordinal: usize, cfg: CudaConfig) -> Result<CudaBackend> {
        loader::driver().map_err(BackendError::Device)?;
        loader::nvrtc(&cfg.nvrtc_dirs)
            .map_err(|e| BackendError::Device(format!("--device cuda: {e}")))?;
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            BackendError::Device(format!("--device cuda: GPU {ordinal} could not be opened: {e}"))
        })?;
        // SAFETY: the backend uses one stream, so cudarc's cross-stream event tracking is not
        // needed; it is turned off before any buffer exists.
        unsafe { ctx.disable_event_tracking() };
        let cc = ctx.compute_capability().map_err(drv("compute capability"))?;
        if cc.0 < 8 {
            return Err(BackendError::Device(format!(
                "--device cuda: GPU {ordinal} has compute capability {}.{}; the kernels need \
                 8.0 or newer (bf16 tensor cores)",
                cc.0, cc.1
            )));
        }
        let device_name = ctx.name().map_err(drv("device name"))?;
        let sm_attr =
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        let sms = ctx.attribute(sm_attr).map_err(drv("SM count"))?.max(1) as usize;
        let stream = ctx.new_stream().map_err(drv("creating a stream"))?;
        let arch = compile::arch_for(cc);
        let reg = kernels::Registry::new(ctx.clone(), arch.clone(), cfg.kernel_cache);
        let norm_counter = stream.alloc_zeros::<u32>(1).map_err(drv("the norm counter"))?;
        Ok(CudaBackend {
            ctx,
            stream,
            reg,
            arch,
            device_name,
            scratch: Mutex::new(None),
            meta: Mutex::new(None),
            gathered: Mutex::new(None),
            tokens: Mutex::new(None),
            sample_buf: Mutex::new(None),
            // `TENSORFOLD_CUDA_GRAPHS=0` runs every step direct (A/B timing, debugging).
            graphs: Mutex::new(graph::Graphs::new(
                std::env::var("TENSORFOLD_CUDA_GRAPHS").is_ok_and(|v| v == "0"),
            )),
            pdl: cc.0 >= 9 && std::env::var("TENSORFOLD_PDL").map_or(true, |v| v != "0"),
            pdl_step: std::sync::atomic::AtomicBool::new(true),
            sms,
            kv_written: Mutex::new(None),
            launches: Default::default(),
            norm_counter,
            resident: Mutex::new(Vec::new()),
            staging: Mutex::new(None),
            step_events: Mutex::new(step_events::enabled().then(Default::default)),
            ahead_ring: Mutex::new(None),
        })
    }

    /// Device memory in bytes.
    pub fn total_memory(&self) -> usize {
        self.ctx.total_mem().unwrap_or(0)
    }

    /// Free device memory in bytes (0 if the driver cannot say).
    pub fn free_memory(&self) -> usize {
        self.ctx.mem_get_info().map(|(free, _)| free).unwrap_or(0)
    }

    /// The NVRTC architecture the kernels are compiled for, e.g. `sm_90a`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// A bf16 tensor holding `bits` (rows x cols), for tests and the contract.
    pub fn upload_bf16(&self, rows: usize, cols: usize, bits: &[u16]) -> Result<CudaTensor> {
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        self.upload(ActDType::Bf16, rows, cols, &bytes)
    }

    /// An f32 tensor holding `values` (rows x cols).
    pub fn upload_f32(&self, rows: usize, cols: usize, values: &[f32]) -> Result<CudaTensor> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload(ActDType::F32, rows, cols, &bytes)
    }

    fn upload(
        &self,
        dtype: ActDType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<CudaTensor> {
        let mut t = self.alloc(dtype, rows, cols)?;
        if bytes.len() != rows * cols * t.elem_bytes() {
            return Err(BackendError::shape(
                "upload",
                format!("{} bytes for ({rows}, {cols})", bytes.len()),
            ));
        }
        if !bytes.is_empty() {
            self.stream.memcpy_htod(bytes, &mut t.buf).map_err(drv("upload"))?;
        }
        Ok(t)
    }

    /// Uploads a step's metadata image: into the backend's persistent buffer (fixed address,
    /// `true`) when no other live batch holds it, else into a buffer of its own (`false`).
    /// The copy is stream-ordered after every earlier launch, so the previous step has read
    /// the old contents before they change.
    fn upload_meta(&self, img: &[u32]) -> Result<(Arc<CudaSlice<u32>>, bool)> {
        let mut slot = self.meta.lock().unwrap_or_else(|e| e.into_inner());
        let free = slot.as_mut().is_none_or(|a| Arc::get_mut(a).is_some());
        if free && slot.as_ref().is_none_or(|a| a.len() < img.len()) {
            let n = img.len().next_power_of_two().max(4096);
            *slot = Some(Arc::new(self.raw::<u32>(n, "batch metadata")?));
        }
        if let Some(buf) = slot.as_mut().and_then(Arc::get_mut) {
            self.stream.memcpy_htod(img, buf).map_err(drv("uploading batch metadata"))?;
        } else {
            let mut own = self.raw::<u32>(img.len(), "batch metadata")?;
            self.stream.memcpy_htod(img, &mut own).map_err(drv("uploading batch metadata"))?;
            return Ok((Arc::new(own), false));
        }
        match slot.as_ref() {
            Some(a) => Ok((a.clone(), true)),
            None => Err(BackendError::Device("cuda: batch metadata buffer missing".into())),
        }
    }

    /// Device bytes for `what`, uninitialized; out-of-memory is reported by name.
    pub(crate) fn raw<T: cudarc::driver::DeviceRepr>(
        &self,
        n: usize,
        what: &str,
    ) -> Result<CudaSlice<T>> {
        // SAFETY: every buffer is written (by an upload or an op) before it is read; ops read
        // only rows their inputs' writers set.
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| {
            if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                BackendError::OutOfMemory {
                    what: what.to_string(),
                    bytes: n * std::mem::size_of::<T>(),
                }
            } else {
                BackendError::Device(format!("cuda: allocating {what}: {e}"))
            }
        })
    }

    /// CTAs of `name` the GPU holds at once at `threads` threads and `smem` bytes: a
    /// persistent launch's grid (the driver's occupancy figure an SM, asked once per shape and
    /// kept in `resident`, times the SMs).
    pub(crate) fn persistent_ctas(
        &self,
        name: &'static str,
        threads: u32,
        smem: u32,
    ) -> Result<u32> {
        let key = (name, threads, smem);
        let mut seen = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        let per_sm = match seen.iter().find(|(k, _)| *k == key) {
            Some(&(_, n)) => n,
            None => {
                let f = self.reg.get(name)?;
                let n = f
                    .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
                    .map_err(|e| BackendError::Device(format!("cuda: occupancy of {name}: {e}")))?
                    .max(1);
                seen.push((key, n));
                n
            }
        };
        Ok(per_sm * self.sms as u32)
    }

    /// Kernel launches issued so far, run or recorded into a graph (tests count a fused op's).
    pub fn launches(&self) -> u64 {
        self.launches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Launches entry point `name` with `args` in the kernel's declared order; while a step
    /// is recorded (`graph`), the launch is logged instead and issued at the step's end.
    pub(crate) fn launch(&self, name: &str, cfg: LaunchConfig, args: &[KArg]) -> Result<()> {
        *self.kv_written.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.launches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let f = self.reg.get(name)?;
        {
            let mut g = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(log) = g.recording() {
                // `reg.get` found `name` among the entries, so the lookup succeeds.
                let name = kernels::ENTRIES.iter().find(|e| e.name == name).map_or("?", |e| e.name);
                log.push(graph::Launch { name, func: f, cfg, args: args.to_vec() });
                return Ok(());
            }
        }
        self.launch_now(name, &f, cfg, args)
    }

    /// Records that the launch just made wrote a call's KV rows (`kv_written`).
    pub(crate) fn wrote_kv(&self, w: KvWrite) {
        *self.kv_written.lock().unwrap_or_else(|e| e.into_inner()) = Some(w);
    }

    /// Graph counts so far (replayed, captured, direct, failed).
    pub fn graph_stats(&self) -> GraphStats {
        self.graphs.lock().unwrap_or_else(|e| e.into_inner()).stats
    }

    /// Turns step graphs off (every step runs its launches direct) or back on.
    pub fn set_graphs(&self, on: bool) -> Result<()> {
        self.graph_step_end()?;
        self.graphs.lock().unwrap_or_else(|e| e.into_inner()).disabled = !on;
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type Kv = CudaKv;
    type Batch = CudaBatch;

    fn name(&self) -> String {
        format!("cuda ({}, {})", self.device_name, self.arch)
    }

    fn load_weight(&self, view: &TensorView) -> Result<CudaWeight> {
        ops::load_weight(self, view)
    }

    fn alloc(&self, dtype: ActDType, max_rows: usize, cols: usize) -> Result<CudaTensor> {
        let n = max_rows.checked_mul(cols).ok_or_else(|| {
            BackendError::shape("alloc", format!("{max_rows} x {cols} overflows"))
        })?;
        let eb = if dtype == ActDType::F32 { 4 } else { 2 };
        let what = format!("activation ({max_rows}, {cols}) {dtype:?}");
        let mut buf = self.raw::<u8>(n * eb, &what)?;
        self.stream.memset_zeros(&mut buf).map_err(drv("zeroing an activation"))?;
        Ok(CudaTensor { buf, dtype, rows: max_rows, max_rows, cols })
    }

    fn alloc_kv(&self, geom: &KvGeometry) -> Result<CudaKv> {
        let (total, plane) = CudaKv::sizes(geom)?;
        let mut buf = self.raw::<u16>(total, &format!("KV pool {geom:?}"))?;
        self.stream.memset_zeros(&mut buf).map_err(drv("zeroing the KV pool"))?;
        Ok(CudaKv { geom: *geom, buf, plane, layout: KvLayout::from_env() })
    }

    fn prepare_batch(&self, meta: &BatchMeta) -> Result<CudaBatch> {
        meta.validate(None)?;
        // A recorded step's launches read the metadata buffer: issue them before it changes.
        self.graph_step_end()?;
        let (img, at, max_block) = CudaBatch::host_image(meta);
        step_events::step_start(self);
        let (dev, fixed) = self.upload_meta(&img)?;
        Ok(CudaBatch { meta: meta.clone(), max_block, dev, at, fixed })
    }

    fn step_begin(&self, batch: &CudaBatch) -> Result<()> {
        self.graph_step_begin(batch.rows(), batch.fixed)
    }

    fn step_end(&self) -> Result<()> {
        self.graph_step_end()
    }

    fn argmax(&self, t: &CudaTensor, rows: usize) -> Result<Vec<u32>> {
        sample::argmax(self, t, rows)
    }

    fn decode_ahead(&self) -> bool {
        ahead::enabled(self)
    }

    fn argmax_ahead(&self, logits: &CudaTensor, batch: &CudaBatch) -> Result<CudaBatch> {
        ahead::argmax_ahead(self, logits, batch)
    }

    fn ahead_token(&self, position: usize) -> Result<u32> {
        ahead::ahead_token(self, position)
    }

    fn sample(
        &self,
        t: &CudaTensor,
        rows: usize,
        draws: &[crate::sample::Draw],
        penalties: &[crate::penalty::Penalties<'_>],
    ) -> Result<Vec<u32>> {
        sample::sample(self, t, rows, draws, penalties)
    }

    fn embed(&self, table: &CudaWeight, batch: &CudaBatch, out: &mut CudaTensor) -> Result<()> {
        ops::embed(self, table, batch, out)
    }

    fn rms_norm(&self, a: NormArgs<'_, Self>) -> Result<()> {
        ops::rms_norm(self, a)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        out: &mut CudaTensor,
    ) -> Result<()> {
        linear::linear(self, x, w, bias, out)
    }

    fn rope(&self, a: RopeArgs<'_, Self>) -> Result<()> {
        ops::rope(self, a)
    }

    fn kv_store(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        batch: &CudaBatch,
    ) -> Result<()> {
        attention::kv_store(self, kv, layer, (k, v), batch)
    }

    fn attention(&self, a: AttnArgs<'_, Self>) -> Result<()> {
        attention::attention(self, a)
    }

    fn swiglu(&self, gate: &CudaTensor, up: &CudaTensor, out: &mut CudaTensor) -> Result<()> {
        ops::swiglu(self, gate, up, out)
    }

    fn add(&self, acc: &mut CudaTensor, x: &CudaTensor) -> Result<()> {
        ops::add(self, acc, x)
    }

    fn add_rms_norm(&self, a: AddNormArgs<'_, Self>) -> Result<()> {
        fused::add_rms_norm(self, a)
    }

    fn linear_group(&self, x: &CudaTensor, parts: &mut [LinearPart<'_, Self>]) -> Result<()> {
        fused::linear_group(self, x, parts)
    }

    fn linear_swiglu(&self, a: SwigluArgs<'_, Self>) -> Result<()> {
        fused::linear_swiglu(self, a)
    }

    fn add_norm_linear_group(
        &self,
        n: AddNormArgs<'_, Self>,
        parts: &mut [LinearPart<'_, Self>],
    ) -> Result<()> {
        fused_norm::add_norm_linear_group(self, n, parts)
    }

    fn add_norm_linear_swiglu(
        &self,
        n: AddNormArgs<'_, Self>,
        gate_w: &CudaWeight,
        up_w: &CudaWeight,
        gate: &mut CudaTensor,
        up: &mut CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        fused_norm::add_norm_linear_swiglu(self, n, [gate_w, up_w], [gate, up, out])
    }

    fn rope_kv_store(&self, a: RopeKvArgs<'_, Self>) -> Result<()> {
        fused::rope_kv_store(self, a)
    }

    fn qkv_rope_kv_store(&self, a: QkvRopeArgs<'_, Self>) -> Result<()> {
        fused_rope::qkv_rope_kv_store(self, a)
    }

    fn logits(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        batch: &CudaBatch,
        out: &mut CudaTensor,
    ) -> Result<()> {
        linear::logits(self, x, w, batch, out)
    }

    fn read_f32(&self, t: &CudaTensor, rows: usize) -> Result<Vec<f32>> {
        ops::read_f32(self, t, rows)
    }

    fn read_kv(
        &self,
        kv: &CudaKv,
        layer: usize,
        block_table: &[u32],
        len: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        attention::read_kv(self, kv, layer, block_table, len)
    }

    fn synchronize(&self) -> Result<()> {
        self.graph_step_end()?;
        self.stream.synchronize().map_err(drv("synchronize"))
    }

    fn ready(&self) -> Result<()> {
        self.reg.cubins().wait_all().map_err(BackendError::Device)
    }

    fn kernels(&self) -> Result<Vec<KernelInfo>> {
        Ok(self.reg.infos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine with no NVIDIA driver (CI, this repository's build machine), asking for
    /// the GPU is a clear error, not a panic. Skipped where a driver is present.
    #[test]
    fn no_driver_is_a_clear_error() {
        if loader::driver().is_ok() {
            eprintln!("a CUDA driver is present: nothing to check here");
            return;
        }
        let err = CudaBackend::new(0).expect_err("no driver, yet the backend opened").to_string();
        assert!(
            err.contains("--device cuda: no CUDA driver found (libcuda.so.1 could not be loaded)"),
            "{err}"
        );
    }
}
