//! The CUDA backend: the op set on one NVIDIA GPU (DESIGN.md §4).
//!
//! - `loader`: opens the driver and NVRTC at run time (the build needs no CUDA toolkit), so
//!   a machine without a GPU gets a clear error from [`CudaBackend::new`], never a panic;
//! - `compile`: kernel sources (`crates/backend/kernels/*.cu`, one op family per file),
//!   compiled by NVRTC for the device's architecture and cached on disk;
//! - `kernels`: the registry of entry points and their resource use (the kernel contract);
//! - `tensor`: device buffers; `ops` (row-local ops), `linear` (tensor-core products),
//!   `attention` (paged KV store and attention).
//!
//! Exactness: every kernel's arithmetic for a row depends only on that row's inputs and the
//! weight shape (or the row's absolute position), never on the row count. Ops are enqueued in
//! order on one stream; `synchronize` and the `read_*` ops wait for it.
//! Rejected: cuBLAS in the served path (its algorithm choice depends on the row count).

mod attention;
pub mod compile;
mod kernels;
mod linear;
pub mod loader;
mod ops;
mod tensor;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use tf_checkpoint::TensorView;

pub use tensor::{CudaBatch, CudaKv, CudaTensor, CudaWeight, WeightKind};

use crate::batch::{BatchMeta, KvGeometry};
use crate::error::{BackendError, Result};
use crate::{ActDType, AttnArgs, Backend, KernelInfo, NormArgs, RopeArgs};

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
        let stream = ctx.new_stream().map_err(drv("creating a stream"))?;
        let arch = compile::arch_for(cc);
        let reg = kernels::Registry::new(ctx.clone(), arch.clone(), cfg.kernel_cache);
        Ok(CudaBackend { ctx, stream, reg, arch, device_name, scratch: Mutex::new(None) })
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

    /// Launches entry point `name` with `args` in the kernel's declared order.
    pub(crate) fn launch(&self, name: &str, cfg: LaunchConfig, args: &[KArg]) -> Result<()> {
        let f = self.reg.get(name)?;
        let mut b = self.stream.launch_builder(&f);
        for a in args {
            match a {
                KArg::U64(v) => b.arg(v),
                KArg::U32(v) => b.arg(v),
                KArg::I32(v) => b.arg(v),
                KArg::F32(v) => b.arg(v),
            };
        }
        // SAFETY: each op checks every shape, index and buffer size its kernel follows
        // before calling here, and passes the arguments in the kernel's declared order with
        // the kernel's types (device pointers as u64).
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv(format!("launching {name}")))
    }
}

/// A kernel argument: a device address (`U64`), or a scalar of the kernel's type.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KArg {
    U64(u64),
    U32(u32),
    I32(i32),
    F32(f32),
}

impl From<u64> for KArg {
    fn from(v: u64) -> KArg {
        KArg::U64(v)
    }
}
impl From<u32> for KArg {
    fn from(v: u32) -> KArg {
        KArg::U32(v)
    }
}
impl From<i32> for KArg {
    fn from(v: i32) -> KArg {
        KArg::I32(v)
    }
}
impl From<f32> for KArg {
    fn from(v: f32) -> KArg {
        KArg::F32(v)
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
        Ok(CudaKv { geom: *geom, buf, plane })
    }

    fn prepare_batch(&self, meta: &BatchMeta) -> Result<CudaBatch> {
        meta.validate(None)?;
        let (img, at, max_block, max_pos) = CudaBatch::host_image(meta);
        let mut dev = self.raw::<u32>(img.len(), "batch metadata")?;
        self.stream.memcpy_htod(&img, &mut dev).map_err(drv("uploading batch metadata"))?;
        Ok(CudaBatch { meta: meta.clone(), max_block, max_pos, dev, at })
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
        self.stream.synchronize().map_err(drv("synchronize"))
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
