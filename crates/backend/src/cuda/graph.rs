//! CUDA graphs of forward steps: a step's launches are recorded, not issued, between
//! `step_begin` and `step_end`; at `step_end` the step runs as a replayed graph when an
//! earlier step recorded exactly the same launches, else directly.
//!
//! The key of a graph is the step's whole launch log: every kernel, grid, block, shared memory
//! and argument (device addresses and scalars, bit for bit). A graph is replayed only when the
//! log of the current step equals the log it was captured from, so a replay issues exactly
//! the launches direct issue would: the same bits, by construction, whatever the ops do.
//! Per-step metadata (tokens, positions, block tables, logit rows) lives in one persistent
//! device buffer (`CudaBackend::meta`) at fixed offsets per (rows, logit rows), uploaded by an
//! ordinary stream copy before the step, so consecutive decode steps of the same shape give
//! the same log. A log that changes (a new row count, an attention grid that grows with the
//! positions, a re-allocated scratch buffer, another KV pool) simply misses and runs direct;
//! it is captured the second time it is seen.
//!
//! Capture issues only kernel launches, all resolved (compiled and loaded) while recording,
//! so nothing inside a capture allocates, synchronizes or compiles. Ops that allocate do so
//! while recording, on the host's time, stream-ordered before the step's launches. A failed
//! capture ends the capture, marks the log as not capturable and runs it direct.
//!
//! Bounds: steps of at most [`GRAPH_MAX_ROWS`] rows are recorded (prefill chunks run direct:
//! launch overhead is small beside their work); at most [`MAX_ENTRIES`] logs are remembered,
//! the least recently used evicted first.
//! Rejected: keying by (rows, logit rows) alone, which is right only if every op's launch is a
//! function of those two; comparing the logs makes that an observation, not an assumption,
//! and stays right when an op (attention) sizes its grid by the positions.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaFunction, CudaGraph, LaunchConfig};

use super::{drv, CudaBackend};
use crate::error::Result;

/// Steps with more rows than this run direct.
pub(crate) const GRAPH_MAX_ROWS: usize = 64;
/// Logs (with or without a graph) remembered at once.
const MAX_ENTRIES: usize = 32;

/// One recorded kernel launch.
pub(crate) struct Launch {
    pub name: &'static str,
    pub func: CudaFunction,
    pub cfg: LaunchConfig,
    pub args: Vec<KArg>,
}

impl Launch {
    fn same(&self, o: &Launch) -> bool {
        self.name == o.name
            && self.cfg.grid_dim == o.cfg.grid_dim
            && self.cfg.block_dim == o.cfg.block_dim
            && self.cfg.shared_mem_bytes == o.cfg.shared_mem_bytes
            && self.args.len() == o.args.len()
            && self.args.iter().zip(&o.args).all(|(a, b)| a.same(b))
    }

    fn hash_into(&self, h: &mut DefaultHasher) {
        self.name.hash(h);
        (self.cfg.grid_dim, self.cfg.block_dim, self.cfg.shared_mem_bytes).hash(h);
        for a in &self.args {
            a.bits().hash(h);
        }
    }
}

/// A kernel argument: a device address (`U64`), or a scalar of the kernel's type.
#[derive(Clone, Debug)]
pub(crate) enum KArg {
    U64(u64),
    U32(u32),
    I32(i32),
    F32(f32),
    /// A TMA tensor map, passed by value (a `__grid_constant__` parameter).
    Map(Arc<sys::CUtensorMap>),
}

/// `KArg::$v(x)` from a scalar of the kernel parameter's type.
macro_rules! karg_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for KArg {
            fn from(x: $t) -> KArg {
                KArg::$v(x)
            }
        }
    )*};
}
karg_from!(u64 => U64, u32 => U32, i32 => I32, f32 => F32);

impl KArg {
    /// Kind and bit pattern (a tensor map's: a hash of its words), for the log hash.
    pub(crate) fn bits(&self) -> (u8, u64) {
        match self {
            KArg::U64(v) => (0, *v),
            KArg::U32(v) => (1, *v as u64),
            KArg::I32(v) => (2, *v as u32 as u64),
            KArg::F32(v) => (3, v.to_bits() as u64),
            KArg::Map(m) => {
                let mut h = DefaultHasher::new();
                m.opaque.hash(&mut h);
                (4, h.finish())
            }
        }
    }

    /// Whether two arguments launch the same kernel argument (equal bits).
    fn same(&self, o: &KArg) -> bool {
        match (self, o) {
            (KArg::Map(a), KArg::Map(b)) => a.opaque == b.opaque,
            _ => self.bits() == o.bits(),
        }
    }
}

fn log_hash(log: &[Launch]) -> u64 {
    let mut h = DefaultHasher::new();
    log.len().hash(&mut h);
    for l in log {
        l.hash_into(&mut h);
    }
    h.finish()
}

fn same_log(a: &[Launch], b: &[Launch]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y))
}

/// An instantiated graph.
struct Graph(CudaGraph);

// SAFETY: a CUDA graph must not be used from two threads at once (the driver does not
// serialize calls on it); every `Graph` lives in `Graphs`, which the backend only reaches
// through its mutex, so calls on it are serialized.
unsafe impl Send for Graph {}

/// A remembered log and its graph, once captured.
struct Entry {
    hash: u64,
    log: Vec<Launch>,
    graph: Option<Graph>,
    /// Capture failed once: never tried again.
    failed: bool,
    last_use: u64,
}

/// Counts, for benchmarks and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Steps run as a replayed graph (including the capturing step).
    pub replayed: u64,
    /// Graphs captured.
    pub captured: u64,
    /// Recorded steps run direct (first sighting, or capture failed).
    pub direct: u64,
    /// Captures that failed (those logs run direct from then on).
    pub failed: u64,
}

/// The recording state and the remembered logs of one backend.
#[derive(Default)]
pub(crate) struct Graphs {
    /// `Some` between `step_begin` and `step_end` of a recorded step.
    recording: Option<Vec<Launch>>,
    entries: Vec<Entry>,
    clock: u64,
    pub stats: GraphStats,
    /// Off: every step runs direct (tests compare both ways).
    pub disabled: bool,
}

impl Graphs {
    pub(crate) fn new(disabled: bool) -> Graphs {
        Graphs { disabled, ..Default::default() }
    }

    /// Where a launch goes while a step is recorded.
    pub(crate) fn recording(&mut self) -> Option<&mut Vec<Launch>> {
        self.recording.as_mut()
    }

    pub(crate) fn begin(&mut self) {
        self.recording = Some(Vec::new());
    }

    pub(crate) fn take(&mut self) -> Option<Vec<Launch>> {
        self.recording.take()
    }

    /// The entry holding `log`, if remembered.
    fn find(&self, hash: u64, log: &[Launch]) -> Option<usize> {
        self.entries.iter().position(|e| e.hash == hash && same_log(&e.log, log))
    }

    /// Remembers `log` (no graph yet), evicting the least recently used entry when full.
    fn insert(&mut self, hash: u64, log: Vec<Launch>) {
        if self.entries.len() >= MAX_ENTRIES {
            if let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_use) {
                self.entries.swap_remove(i);
            }
        }
        let last_use = self.clock;
        self.entries.push(Entry { hash, log, graph: None, failed: false, last_use });
    }
}

impl CudaBackend {
    /// Issues one launch on the stream now: `cuLaunchKernelEx`, with programmatic stream
    /// serialization when the backend uses it: the kernel may then start while the previous
    /// one runs, and its `pdl_wait()` (every entry point calls it first) holds every memory
    /// access until that one has finished.
    pub(crate) fn launch_now(
        &self,
        name: &str,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &[KArg],
    ) -> Result<()> {
        let mut vals = args.to_vec();
        let mut params: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|a| match a {
                KArg::U64(v) => v as *mut u64 as *mut c_void,
                KArg::U32(v) => v as *mut u32 as *mut c_void,
                KArg::I32(v) => v as *mut i32 as *mut c_void,
                KArg::F32(v) => v as *mut f32 as *mut c_void,
                // The driver only reads kernel parameters.
                KArg::Map(m) => Arc::as_ptr(m) as *mut c_void,
            })
            .collect();
        // SAFETY: an all-zero launch attribute is a valid value of this plain C union.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: (self.pdl && self.pdl_step.load(std::sync::atomic::Ordering::Relaxed)) as u32,
        };
        self.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        // SAFETY: each op checks every shape, index and buffer size its kernel follows
        // before its launch is issued or recorded, and passes the arguments in the kernel's
        // declared order with the kernel's types (device pointers as u64); `params` points
        // into `vals`, both alive across the call, and the driver copies them at launch. A
        // recorded launch runs before any buffer it names can be freed: the family drops
        // nothing mid-step.
        unsafe {
            sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), null_mut())
                .result()
        }
        .map_err(drv(format!("launching {name}")))
    }

    fn run_direct(&self, log: &[Launch]) -> Result<()> {
        for l in log {
            self.launch_now(l.name, &l.func, l.cfg, &l.args)?;
        }
        Ok(())
    }

    /// Captures `log` into a graph (nothing runs during the capture).
    fn capture(&self, log: &[Launch]) -> Result<Graph> {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream.begin_capture(mode).map_err(drv("beginning a graph capture"))?;
        let issued = self.run_direct(log);
        let ended = self.stream.end_capture(CUgraphInstantiate_flags(0));
        issued?;
        match ended.map_err(drv("ending a graph capture"))? {
            Some(g) => Ok(Graph(g)),
            None => Err(crate::error::BackendError::Device(
                "cuda: a graph capture of a step gave no graph".into(),
            )),
        }
    }

    /// Opens a step: records its launches if it is small enough and graphs are on.
    pub(crate) fn graph_step_begin(&self, rows: usize, fixed_meta: bool) -> Result<()> {
        self.graph_step_end()?;
        static PDL_PREFILL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let all = *PDL_PREFILL
            .get_or_init(|| std::env::var("TENSORFOLD_PDL_PREFILL").is_ok_and(|v| v == "1"));
        let small = rows <= GRAPH_MAX_ROWS;
        self.pdl_step.store(all || small, std::sync::atomic::Ordering::Relaxed);
        let mut g = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        if !g.disabled && fixed_meta && small {
            g.begin();
        }
        Ok(())
    }

    /// Closes a step: replays its graph, captures one, or issues the log direct.
    pub(crate) fn graph_step_end(&self) -> Result<()> {
        let mut g = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(log) = g.take() else { return Ok(()) };
        if log.is_empty() {
            return Ok(());
        }
        g.clock += 1;
        let (hash, clock) = (log_hash(&log), g.clock);
        let Some(i) = g.find(hash, &log) else {
            g.insert(hash, log);
            g.stats.direct += 1;
            let at = g.entries.len() - 1;
            return self.run_direct(&g.entries[at].log);
        };
        g.entries[i].last_use = clock;
        if g.entries[i].graph.is_none() && !g.entries[i].failed {
            match self.capture(&log) {
                Ok(graph) => {
                    g.entries[i].graph = Some(graph);
                    g.stats.captured += 1;
                }
                Err(e) => {
                    eprintln!("tensorfold: CUDA graph capture failed, running direct: {e}");
                    g.entries[i].failed = true;
                    g.stats.failed += 1;
                }
            }
        }
        match &g.entries[i].graph {
            Some(graph) => {
                graph.0.launch().map_err(drv("launching a step graph"))?;
                g.stats.replayed += 1;
                Ok(())
            }
            None => {
                g.stats.direct += 1;
                self.run_direct(&log)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(word: u64) -> KArg {
        let mut m = sys::CUtensorMap { opaque: [0; 16] };
        m.opaque[15] = word;
        KArg::Map(Arc::new(m))
    }

    #[test]
    fn tensor_maps_are_the_same_argument_only_with_the_same_words() {
        // A graph is replayed only for a log of the same arguments: a map differing in its
        // last word (a weight's address or shape) must not match.
        assert!(map(7).same(&map(7)));
        assert!(!map(7).same(&map(8)));
        assert_ne!(map(7).bits(), map(8).bits());
        assert!(!map(0).same(&KArg::U64(0)));
        assert!(KArg::U32(3).same(&KArg::U32(3)) && !KArg::U32(3).same(&KArg::U64(3)));
    }
}
