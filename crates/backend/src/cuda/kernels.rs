//! The kernel registry: every entry point, its family (source file) and launch shape; each
//! compile unit's module (`compile::Unit`: a family, or the part of one that defines the
//! entry) loaded on first use (its CUBIN compiled ahead, below), and the contract's view of
//! them (`Backend::kernels`: compile result, registers, shared memory, limits).
//!
//! Every unit's CUBIN is compiled (or read from the disk cache) by background threads from
//! the moment the registry exists, a core each, taking the units in `compile::UNITS` order
//! (`compile::Cubins`), so a cold start compiles in parallel while the weights upload instead
//! of one unit at a time at first use. A launch that needs a unit before its thread is done waits for that thread's
//! result, never compiles it twice; backends of one process share the set
//! (`Cubins::shared`). `TENSORFOLD_PRECOMPILE=0` compiles at first use only. A process does
//! not exit while one of these compiles runs (an exit handler waits, `compile::IN_FLIGHT`):
//! exit would run NVRTC's destructors under it, so a short command on a cold cache ends a
//! few seconds later, once, and leaves the cache warm.
//! H200, session 12, `bench --pp 128` on two fresh machines: load to first token 28.9 s with
//! first-use compilation, 11.3 s with the threads; 1.9-2.0 s once compiled. (NVIDIA's own
//! cache under ~/.nv, written on a machine's first run, makes later compiles fast even with
//! the kernel cache removed, so only a fresh machine shows the cold cost.)
//!
//! Launch threads are fixed per entry point (the linear kernel's is the most it is launched
//! with: 32 per K slice, at most 16 slices), never derived from a call's row count.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::attention::{
    attention_dec_smem, attention_smem, attention_wg_smem, attention_ws_smem, MAX_SPLIT, WG_ENTRY,
    WG_THREADS, WS_ENTRY, WS_THREADS,
};
use super::compile::{self, Unit, UNITS};
use super::wgmma;
use crate::error::{BackendError, Result};
use crate::KernelInfo;

/// One entry point.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub name: &'static str,
    pub family: &'static str,
    /// Threads per block it is launched with (the most, where a launch varies by shape).
    pub threads: u32,
    /// Dynamic shared memory of its largest launch.
    pub dyn_smem: u32,
}

const fn e(name: &'static str, family: &'static str, threads: u32) -> Entry {
    Entry { name, family, threads, dyn_smem: 0 }
}

/// Largest K split of `linear_bf16` (warps per block) and its token tiles per block.
pub(crate) const LINEAR_MAX_SLICES: u32 = 16;
/// Token tiles (of 8) per block of `linear_bf16`.
pub(crate) const LINEAR_NT: u32 = 4;
/// Calls of at most this many rows (one token tile) take the `_d8` decode variants
/// (`linear_bf16_d8`, `..._swiglu_d8`: one token tile per CTA, two register buffers of 4
/// super-steps a warp); the same bits as the general entries.
pub(crate) const LINEAR_DECODE_ROWS: usize = 8;
/// Most warps per block of the grouped decode products (`linear_bf16_group`,
/// `linear_bf16_swiglu`, the `__launch_bounds__(256)` of linear.cu); their slice jobs (at most
/// `LINEAR_MAX_SLICES`, so the same shared memory as `linear_bf16`) loop over the warps.
pub(crate) const LINEAR_GROUP_WARPS: u32 = 8;

/// Launch shape of one `linear_bf16_tiled*` configuration (a `TL_ENTRY` in gemm.cu).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TiledShape {
    pub name: &'static str,
    /// Features (weight rows) per CTA.
    pub features: usize,
    /// Tokens per CTA.
    pub tokens: usize,
    pub threads: u32,
    /// Dynamic shared memory: the stages of (features + tokens) rows x TK bf16, plus the
    /// running totals (one f32 per accumulator of each thread) when they live there.
    pub smem: u32,
}

/// The shape of `TL_ENTRY(name, mt, nt, wm, wn, tk, stages, tot_smem, _)` (gemm.cu's `TlCfg`).
#[allow(clippy::too_many_arguments)]
const fn tiled_shape(
    name: &'static str,
    mt: u32,
    nt: u32,
    wm: u32,
    wn: u32,
    tk: u32,
    stages: u32,
    tot_smem: bool,
) -> TiledShape {
    let (tm, tn, threads) = (wm * mt * 16, wn * nt * 8, 32 * wm * wn);
    let tot = if tot_smem { mt * nt * 4 * threads * 4 } else { 0 };
    TiledShape {
        name,
        features: tm as usize,
        tokens: tn as usize,
        threads,
        smem: stages * (tm + tn) * tk * 2 + tot,
    }
}

/// The prefill kernel: 128 x 128 CTAs of 4 warps, two CTAs an SM.
pub(crate) const LINEAR_TILED: TiledShape =
    tiled_shape("linear_bf16_tiled", 4, 8, 2, 2, 32, 2, true);
/// The same arithmetic in 128 x 128 CTAs of 8 warps, one CTA an SM: for small grids.
pub(crate) const LINEAR_TILED_R: TiledShape =
    tiled_shape("linear_bf16_tiled_r", 4, 4, 2, 4, 64, 3, false);
const fn tiled_entry(t: TiledShape) -> Entry {
    Entry { name: t.name, family: "gemm", threads: t.threads, dyn_smem: t.smem }
}
/// Shared memory the CUDA runtime grants without an opt-in.
const DEFAULT_SMEM: u32 = 48 * 1024;

pub(crate) const ENTRIES: &[Entry] = &[
    e("embed", "embed", 256),
    e("rms_norm", "norm", 1024),
    e("add_rms_norm", "norm", 1024),
    e("rope", "rope", 256),
    e("rope_kv_store", "rope", 256),
    e("swiglu", "elementwise", 256),
    e("add", "elementwise", 256),
    e("kv_store", "kv", 256),
    Entry {
        name: "attention_hd64",
        family: "attention",
        threads: 128,
        dyn_smem: attention_smem(64),
    },
    Entry {
        name: "attention_hd96",
        family: "attention",
        threads: 128,
        dyn_smem: attention_smem(96),
    },
    Entry {
        name: "attention_hd128",
        family: "attention",
        threads: 128,
        dyn_smem: attention_smem(128),
    },
    Entry {
        name: "attention_hd256",
        family: "attention",
        threads: 128,
        dyn_smem: attention_smem(256),
    },
    Entry {
        name: "attention_dec_hd64",
        family: "attention",
        threads: 128,
        dyn_smem: attention_dec_smem(64, MAX_SPLIT),
    },
    Entry {
        name: "attention_dec_hd96",
        family: "attention",
        threads: 128,
        dyn_smem: attention_dec_smem(96, MAX_SPLIT),
    },
    Entry {
        name: "attention_dec_hd128",
        family: "attention",
        threads: 128,
        dyn_smem: attention_dec_smem(128, MAX_SPLIT),
    },
    Entry {
        name: WG_ENTRY,
        family: "attention",
        threads: WG_THREADS,
        dyn_smem: attention_wg_smem(),
    },
    Entry {
        name: WS_ENTRY,
        family: "attention",
        threads: WS_THREADS,
        dyn_smem: attention_ws_smem(),
    },
    e("attention_combine", "attention", 128),
    e("argmax_f32", "sample", 1024),
    e("argmax_ahead", "sample", 1024),
    e("sample_rows", "sample", 1024),
    e("penalize_rows", "sample", 1024),
    Entry {
        name: "linear_bf16",
        family: "linear",
        threads: 32 * LINEAR_MAX_SLICES,
        dyn_smem: LINEAR_MAX_SLICES * LINEAR_NT * 32 * 4 * 4,
    },
    Entry {
        name: "linear_bf16_d8",
        family: "linear",
        threads: 32 * LINEAR_MAX_SLICES,
        dyn_smem: LINEAR_MAX_SLICES * 32 * 4 * 4,
    },
    Entry {
        name: "linear_bf16_group",
        family: "linear",
        threads: 32 * LINEAR_GROUP_WARPS,
        dyn_smem: LINEAR_MAX_SLICES * LINEAR_NT * 32 * 4 * 4,
    },
    Entry {
        name: "linear_bf16_group_d8",
        family: "linear",
        threads: 32 * LINEAR_GROUP_WARPS,
        dyn_smem: LINEAR_MAX_SLICES * 32 * 4 * 4,
    },
    Entry {
        name: "linear_bf16_swiglu",
        family: "linear",
        threads: 32 * LINEAR_GROUP_WARPS,
        dyn_smem: LINEAR_MAX_SLICES * LINEAR_NT * 32 * 4 * 4,
    },
    Entry {
        name: "linear_bf16_swiglu_d8",
        family: "linear",
        threads: 32 * LINEAR_GROUP_WARPS,
        dyn_smem: LINEAR_MAX_SLICES * 32 * 4 * 4,
    },
    Entry {
        name: "linear_bf16_group_norm",
        family: "linear",
        threads: 32 * LINEAR_GROUP_WARPS,
        dyn_smem: super::fused_norm::NORM_SMEM_MAX,
    },
    Entry {
        name: "linear_bf16_swiglu_norm",
        family: "linear",
        threads: 32 * LINEAR_GROUP_WARPS,
        dyn_smem: super::fused_norm::NORM_SMEM_MAX,
    },
    Entry {
        name: "linear_bf16_qkv_rope",
        family: "linear",
        threads: 32 * LINEAR_GROUP_WARPS,
        dyn_smem: LINEAR_MAX_SLICES * 32 * 4 * 4,
    },
    Entry {
        name: "linear_bf16_qkv_rope_nt",
        family: "linear",
        threads: 32 * LINEAR_GROUP_WARPS,
        dyn_smem: LINEAR_MAX_SLICES * LINEAR_NT * 32 * 4 * 4,
    },
    Entry {
        name: "linear_bf16_qkv_rope_norm",
        family: "linear",
        threads: 32 * LINEAR_GROUP_WARPS,
        dyn_smem: super::fused_norm::NORM_SMEM_MAX,
    },
    tiled_entry(LINEAR_TILED),
    tiled_entry(LINEAR_TILED_R),
    super::wgmma::wg_entry(super::wgmma::WG_SHAPES[0]),
    super::wgmma::wg_entry(super::wgmma::WG_SHAPES[1]),
    super::wgmma::wg_entry(super::wgmma::LINEAR_WS),
    super::wgmma::WS3,
    super::wgmma::GATHER,
];

/// Whether the backend ever launches `en` on `arch`: the `gemm90` family and the wgmma
/// attention entries only on sm_90a; elsewhere they compile to empty entry points that are never
/// launched, so their launch shared memory (more than sm_89 has) is neither requested nor
/// checked there.
fn launched_on(en: &Entry, arch: &str) -> bool {
    let wgmma_only = en.family == wgmma::FAMILY || en.name == WG_ENTRY || en.name == WS_ENTRY;
    !wgmma_only || wgmma::runs_on(arch)
}

/// Compiled modules of one device, loaded on first use.
pub(crate) struct Registry {
    ctx: Arc<CudaContext>,
    arch: String,
    cubins: compile::Cubins,
    modules: Vec<OnceLock<std::result::Result<Arc<CudaModule>, String>>>,
    functions: Vec<OnceLock<std::result::Result<CudaFunction, String>>>,
}

impl Registry {
    pub(crate) fn new(ctx: Arc<CudaContext>, arch: String, cache: Option<PathBuf>) -> Registry {
        let cubins = compile::Cubins::shared(&arch, cache);
        Registry {
            ctx,
            arch,
            cubins,
            modules: UNITS.iter().map(|_| OnceLock::new()).collect(),
            functions: ENTRIES.iter().map(|_| OnceLock::new()).collect(),
        }
    }

    /// The module of the compile unit that defines `en`.
    fn module(&self, en: &Entry) -> std::result::Result<Arc<CudaModule>, String> {
        let i = compile::unit_of(en.family, en.name)
            .ok_or_else(|| format!("no compile unit of kernel family `{}`", en.family))?;
        self.modules[i].get_or_init(|| self.load(i, &UNITS[i])).clone()
    }

    fn load(&self, i: usize, unit: &Unit) -> std::result::Result<Arc<CudaModule>, String> {
        let cubin = self.cubins.get(i)?;
        self.ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| format!("{}: loading the {} CUBIN: {e}", unit.label(), self.arch))
    }

    fn function_at(&self, i: usize) -> std::result::Result<CudaFunction, String> {
        let en = &ENTRIES[i];
        self.functions[i]
            .get_or_init(|| {
                let m = self.module(en)?;
                let f = m
                    .load_function(en.name)
                    .map_err(|e| format!("{}.cu: entry point {}: {e}", en.family, en.name))?;
                // The L1 / shared-memory split (carveout) stays the driver's choice. Session
                // 25 (H200, bench decode; a knob built for it, removed) set it per entry: all at
                // 0 / 50 / 100% 167 / 199-203 / 153-155 tok/s against 208-212; the streaming
                // products at 16 KB 210-215 against 209-213 (neutral), at 0% 168-171; the
                // norm-fused q/k/v at 100 KB 208 against 212. The driver gives the products 32
                // KB (224 KB of L1, which holds their loads in flight: loadbw.py's `co100`).
                if en.dyn_smem > DEFAULT_SMEM && launched_on(en, &self.arch) {
                    let a = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                    f.set_attribute(a, en.dyn_smem as i32).map_err(|e| {
                        format!("{}: {} bytes of dynamic shared memory: {e}", en.name, en.dyn_smem)
                    })?;
                }
                Ok(f)
            })
            .clone()
    }

    /// The function of entry point `name` (compiling its family on first use).
    pub(crate) fn get(&self, name: &str) -> Result<CudaFunction> {
        let i = ENTRIES
            .iter()
            .position(|e| e.name == name)
            .ok_or_else(|| BackendError::Device(format!("no CUDA kernel `{name}`")))?;
        self.function_at(i).map_err(BackendError::Device)
    }

    /// The compile set behind this registry's modules.
    pub(crate) fn cubins(&self) -> &compile::Cubins {
        &self.cubins
    }

    /// Every entry point for the kernel contract (compiles every family).
    pub(crate) fn infos(&self) -> Vec<KernelInfo> {
        let dev = |a| self.ctx.attribute(a).unwrap_or(0).max(0) as u32;
        let max_smem =
            dev(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
        let max_regs = dev(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
        let max_block = dev(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
        ENTRIES
            .iter()
            .enumerate()
            .map(|(i, en)| {
                let mut info = KernelInfo {
                    name: en.name.to_string(),
                    family: en.family.to_string(),
                    compiled: Ok(()),
                    registers: 0,
                    shared_bytes: 0,
                    launch_threads: en.threads,
                    max_threads: 0,
                    limits: Ok(()),
                };
                match self.function_at(i) {
                    Err(log) => {
                        info.compiled = Err(log);
                        info.limits = Err("not compiled".into());
                    }
                    Ok(f) => {
                        let at = |a| f.get_attribute(a).unwrap_or(-1);
                        let regs = at(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS);
                        let smem = at(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
                        let maxt =
                            at(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
                        let local = at(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
                        info.registers = regs.max(0) as u32;
                        let dyn_smem = if launched_on(en, &self.arch) { en.dyn_smem } else { 0 };
                        info.shared_bytes = smem.max(0) as u32 + dyn_smem;
                        info.max_threads = maxt.max(0) as u32;
                        info.limits = limits(&info, (max_smem, max_regs, max_block), local);
                    }
                }
                info
            })
            .collect()
    }
}

/// Gate 4: the launch fits the compiled kernel and the device.
fn limits(k: &KernelInfo, dev: (u32, u32, u32), local: i32) -> std::result::Result<(), String> {
    let (max_smem, max_regs, max_block) = dev;
    let mut why = Vec::new();
    if k.launch_threads > k.max_threads || k.launch_threads > max_block {
        why.push(format!(
            "launched with {} threads, the kernel allows {} and the device {max_block}",
            k.launch_threads, k.max_threads
        ));
    }
    if k.shared_bytes > max_smem {
        why.push(format!(
            "{} bytes of shared memory, the device allows {max_smem}",
            k.shared_bytes
        ));
    }
    if k.registers * k.launch_threads > max_regs {
        why.push(format!(
            "{} registers x {} threads exceeds the device's {max_regs} per block",
            k.registers, k.launch_threads
        ));
    }
    if local < 0 {
        why.push("function attributes could not be read".into());
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::{compile, ENTRIES};

    /// Every entry point is defined by exactly one compile unit of its family, and a unit's
    /// list names only entry points of its family: the registry loads the module `unit_of`
    /// names, so a missing or doubled listing would fail at the entry's first launch.
    #[test]
    fn every_entry_has_one_compile_unit() {
        for en in ENTRIES {
            let units: Vec<_> =
                compile::units_of(en.family, en.name).map(|i| compile::UNITS[i].name).collect();
            assert_eq!(units.len(), 1, "{} ({}): units {units:?}", en.name, en.family);
        }
        for u in compile::UNITS {
            for name in u.entries {
                let en = ENTRIES.iter().find(|e| e.name == *name);
                assert!(en.is_some_and(|e| e.family == u.family), "{}: {name}", u.name);
            }
            // A family is whole or all parts.
            let whole = compile::UNITS.iter().any(|v| v.family == u.family && v.part.is_empty());
            assert!(!whole || u.part.is_empty(), "{}: a part beside its whole family", u.name);
        }
    }
}
