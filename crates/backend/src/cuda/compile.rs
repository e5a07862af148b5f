//! Kernel sources and their compilation by NVRTC, cached on disk.
//!
//! Each op family is CUDA C++ under `crates/backend/kernels/` (one file, or a few read as one),
//! embedded in the binary; `common.cuh` (bf16 bit helpers, fixed-order warp reductions) is
//! prepended to each, so no source needs an include path at run time. A family compiles as one
//! translation unit or, where it is large, as several (`Unit`: each defines some of the
//! family's entry points), each to a CUBIN for one real architecture (`sm_90a` on Hopper),
//! cached as `<cache>/<unit>-<arch>-<hash>.cubin` where the hash covers the source, the
//! architecture, the options and NVRTC's version: a changed kernel or compiler never loads a
//! stale image. A cache that cannot be written is skipped.
//!
//! Rejected: PTX JIT by the driver at load (slower start, and resource use would not be known
//! until load); one source file for every op (one family per file keeps NVRTC errors local);
//! NVRTC's `--split-compile` for the large units (2 threads: gemm90 10.2 -> 7.5 s, but other
//! machine code: the cubin grew 3.20 -> 3.47 MB, so other kernels than the measured ones).

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::nvrtc::{result as nvrtc, sys};

/// The prelude every family is compiled with.
pub const COMMON: &str = include_str!("../../kernels/common.cuh");

/// One translation unit NVRTC compiles: the whole of an op family's source, or a part of it
/// (some of its entry points, chosen by `part`'s `-D` definition, which the family's files
/// read). Units, not families, are what a cold start compiles in parallel: the attention and
/// gemm90 families are one ~8 s and one ~10 s compile whole (sm_90a, NVRTC 13.0, on one core of
/// the 2-core CPU machine) and at most ~1.9 s and ~5.6 s a part, and a part changes no entry's
/// machine code (nvdisasm of each entry against the whole family's, session 36).
#[derive(Clone, Copy, Debug)]
pub struct Unit {
    /// The unit's name: its cache file's stem, its thread's and its NVRTC program's name.
    pub name: &'static str,
    /// The op family (kernel source) it belongs to: `KernelInfo::family`, the contract's key.
    pub family: &'static str,
    pub source: &'static str,
    /// The `-D` definition choosing the unit's entry points ("" for the whole family).
    pub part: &'static str,
    /// The entry points that definition selects (empty for the whole family).
    pub entries: &'static [&'static str],
}

const fn whole(name: &'static str, source: &'static str) -> Unit {
    Unit { name, family: name, source, part: "", entries: &[] }
}

/// The attention family (one source from four files: the general CTA; the decode CTA and the
/// entry points; the wgmma prefill CTA and its copy-warpgroup form, sm_90a).
const ATTENTION: &str = concat!(
    include_str!("../../kernels/attention.cu"),
    include_str!("../../kernels/attention_dec.cu"),
    include_str!("../../kernels/attention90.cu"),
    include_str!("../../kernels/attention90ws.cu")
);
/// The gemm90 family (one source from three files: the cp.async wgmma kernel and its helpers;
/// the copy-warp kernel fed by tensor copies: its copies and epilogue, then its k loops, entry
/// points and row gather).
const GEMM90: &str = concat!(
    include_str!("../../kernels/gemm90.cu"),
    include_str!("../../kernels/gemm90ws.cu"),
    include_str!("../../kernels/gemm90ws_loop.cu")
);

const fn attention(
    name: &'static str,
    part: &'static str,
    entries: &'static [&'static str],
) -> Unit {
    Unit { name, family: "attention", source: ATTENTION, part, entries }
}
const fn gemm90(name: &'static str, part: &'static str, entries: &'static [&'static str]) -> Unit {
    Unit { name, family: "gemm90", source: GEMM90, part, entries }
}

/// Every compile unit, in the order the background threads take them: the llama3-8b served
/// path on sm_90a first (its largest unit first), then the other head dims' attention, the
/// mma.sync prefill GEMM (the prefill path below sm_90a), and the A/B-only wgmma entries.
pub const UNITS: &[Unit] = &[
    gemm90("gemm90_ws", "TF_GEMM90_PART=1", &["linear_bf16_ws", "linear_bf16_ws3", "gather_rows"]),
    attention("attention_hd128", "TF_ATTN_PART=128", &["attention_hd128", "attention_dec_hd128"]),
    attention("attention_ws", "TF_ATTN_PART=2", &["attention_ws_hd128"]),
    // One unit from four files (the products; the grouped decode products; the fused norm
    // prologue's entries; q/k/v with the rope and KV-write epilogue).
    whole(
        "linear",
        concat!(
            include_str!("../../kernels/linear.cu"),
            include_str!("../../kernels/linear_group.cu"),
            include_str!("../../kernels/linear_norm.cu"),
            include_str!("../../kernels/linear_rope.cu")
        ),
    ),
    attention("attention_combine", "TF_ATTN_PART=1", &["attention_combine"]),
    whole("sample", include_str!("../../kernels/sample.cu")),
    whole("norm", include_str!("../../kernels/norm.cu")),
    whole("rope", include_str!("../../kernels/rope.cu")),
    whole("elementwise", include_str!("../../kernels/elementwise.cu")),
    whole("kv", include_str!("../../kernels/kv.cu")),
    whole("embed", include_str!("../../kernels/embed.cu")),
    attention("attention_hd64", "TF_ATTN_PART=64", &["attention_hd64", "attention_dec_hd64"]),
    whole("gemm", include_str!("../../kernels/gemm.cu")),
    attention("attention_hd96", "TF_ATTN_PART=96", &["attention_hd96", "attention_dec_hd96"]),
    attention("attention_hd256", "TF_ATTN_PART=256", &["attention_hd256"]),
    attention("attention_wg", "TF_ATTN_PART=3", &["attention_wg_hd128"]),
    gemm90("gemm90_wg", "TF_GEMM90_PART=2", &["linear_bf16_wg", "linear_bf16_wg_m192"]),
];

/// The indices in `UNITS` of the units that define entry point `entry` of `family` (one, for
/// every registered entry: `cuda::kernels`' test).
pub fn units_of<'a>(family: &'a str, entry: &'a str) -> impl Iterator<Item = usize> + 'a {
    UNITS.iter().enumerate().filter_map(move |(i, u)| {
        let defines = u.entries.is_empty() || u.entries.contains(&entry);
        (u.family == family && defines).then_some(i)
    })
}

/// The index in `UNITS` of the unit that defines entry point `entry` of `family`.
pub fn unit_of(family: &str, entry: &str) -> Option<usize> {
    units_of(family, entry).next()
}

impl Unit {
    /// The translation unit's text: the prelude, then the family's files.
    pub fn text(&self) -> String {
        format!("{COMMON}\n#line 1 \"{}.cu\"\n{}", self.family, self.source)
    }

    /// The unit in messages: `attention.cu [attention_hd128]`, or `norm.cu` for a whole family.
    pub fn label(&self) -> String {
        if self.part.is_empty() {
            format!("{}.cu", self.family)
        } else {
            format!("{}.cu [{}]", self.family, self.name)
        }
    }
}

/// NVRTC options for `arch` (e.g. `sm_90a`) and `unit` (whose text is `text`): its part's
/// definition, plus those of the `-D` definitions listed in `TENSORFOLD_KERNEL_DEFINES`
/// (space-separated `NAME=VALUE`, e.g. `TF_D8_U=6 TF_PREWAIT=0`) whose NAME the text
/// mentions: the kernels' tuning knobs (`#ifndef` defaults in the sources), for A/B runs of
/// one binary. They are part of the
/// options, so of the cache key. No knob changes a kernel's arithmetic.
pub fn options(arch: &str, unit: &Unit, text: &str) -> Vec<String> {
    let mut o =
        vec![format!("--gpu-architecture={arch}"), "--std=c++17".into(), "-lineinfo".into()];
    if !unit.part.is_empty() {
        o.push(format!("-D{}", unit.part));
    }
    if let Ok(defs) = std::env::var("TENSORFOLD_KERNEL_DEFINES") {
        o.extend(defines_for(&defs, text));
    }
    o
}

/// The value `TENSORFOLD_KERNEL_DEFINES` gives knob `name` ("" for a bare `NAME`), for the
/// few knobs whose launches the host must match (`TF_SPLIT_LOOP`, `TF_SPLIT`).
pub fn kernel_define(name: &str) -> Option<String> {
    define_in(&std::env::var("TENSORFOLD_KERNEL_DEFINES").ok()?, name)
}

fn define_in(defs: &str, name: &str) -> Option<String> {
    knobs(defs).find(|(n, _)| *n == name).map(|(_, v)| v.unwrap_or("").to_string())
}

/// The entries of `defs` (space-separated `NAME` or `NAME=VALUE`) as (name, value); entries
/// without a name (`=3`) are dropped.
fn knobs(defs: &str) -> impl Iterator<Item = (&str, Option<&str>)> {
    defs.split_whitespace().filter_map(|d| {
        let (name, value) = d.split_once('=').map_or((d, None), |(n, v)| (n, Some(v)));
        (!name.is_empty()).then_some((name, value))
    })
}

/// The `-D` options of `defs` whose NAME `unit` mentions.
fn defines_for(defs: &str, unit: &str) -> Vec<String> {
    knobs(defs)
        .filter(|(name, _)| unit.contains(name))
        .map(|(name, value)| match value {
            Some(v) => format!("-D{name}={v}"),
            None => format!("-D{name}"),
        })
        .collect()
}

/// The architecture name NVRTC compiles for on a device of compute capability `cc`:
/// `sm_90a` on Hopper (its arch-specific instructions), `sm_XY` elsewhere.
pub fn arch_for(cc: (i32, i32)) -> String {
    match cc {
        (9, 0) => "sm_90a".into(),
        (maj, min) => format!("sm_{maj}{min}"),
    }
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut maj, mut min) = (0, 0);
    // SAFETY: two out-pointers to live integers; the library was opened by `loader::nvrtc`.
    unsafe { sys::nvrtcVersion(&mut maj, &mut min) }
        .result()
        .map_err(|e| format!("nvrtcVersion: {e}"))?;
    Ok((maj, min))
}

/// Compiles `unit` for `arch` to a CUBIN. `Err` holds NVRTC's log.
/// NVRTC must have been opened (`loader::nvrtc`).
pub fn compile(unit: &Unit, arch: &str) -> Result<Vec<u8>, String> {
    compile_with(unit, arch, "")
}

/// [`compile`] with knobs `defs` (as `TENSORFOLD_KERNEL_DEFINES` gives them) on top of the
/// environment's: lets a test compile the knobs' variants.
/// NVRTC runs on a thread of its own with `NVRTC_STACK` bytes of stack: its front end recurses
/// deeply on the larger units (the attention family overflowed a 2 MiB thread stack).
pub fn compile_with(unit: &Unit, arch: &str, defs: &str) -> Result<Vec<u8>, String> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name(format!("nvrtc-{}", unit.name))
            .stack_size(NVRTC_STACK)
            .spawn_scoped(s, || compile_here(unit, arch, defs))
            .map_err(|e| format!("{}: no thread for NVRTC: {e}", unit.label()))?
            .join()
            .map_err(|_| format!("{}: the NVRTC thread panicked", unit.label()))?
    })
}

/// The stack of an NVRTC compile thread (reserved, not committed, until used).
const NVRTC_STACK: usize = 256 << 20;

fn compile_here(unit: &Unit, arch: &str, defs: &str) -> Result<Vec<u8>, String> {
    let label = unit.label();
    let text = unit.text();
    let mut opts = options(arch, unit, &text);
    opts.extend(defines_for(defs, &text));
    let src = CString::new(text.as_str()).map_err(|_| format!("{label} holds a NUL byte"))?;
    let name = CString::new(format!("{}.cu", unit.name)).map_err(|e| e.to_string())?;
    let prog = nvrtc::create_program(&src, Some(&name))
        .map_err(|e| format!("{label}: nvrtcCreateProgram: {e}"))?;
    // SAFETY: `prog` was just created from `src`/`name`, which outlive it; it is destroyed
    // once below and not used after.
    unsafe {
        let out = match nvrtc::compile_program(prog, &opts) {
            Ok(()) => cubin(prog).map_err(|e| format!("{label}: nvrtcGetCUBIN: {e}")),
            Err(e) => Err(format!("{label} for {arch}: {e}\n{}", log(prog))),
        };
        let _ = nvrtc::destroy_program(prog);
        out
    }
}

/// # Safety
/// `prog` is a live, compiled program.
unsafe fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, nvrtc::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: forwarded from the caller; `size` is a live out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result()?;
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds the `size` bytes NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast::<c_char>()) }.result()?;
    Ok(buf)
}

/// # Safety
/// `prog` is a live program.
unsafe fn log(prog: sys::nvrtcProgram) -> String {
    // SAFETY: forwarded from the caller.
    match unsafe { nvrtc::get_program_log(prog) } {
        Ok(chars) => {
            let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => format!("(no log: {e})"),
    }
}

/// FNV-1a, 64 bits: a stable cache key (std's hasher is not stable across Rust releases).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain([0xffu8].iter()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The cache file of `unit` compiled for `arch` by NVRTC `version`.
pub fn cache_path(dir: &Path, unit: &Unit, arch: &str, version: (i32, i32)) -> PathBuf {
    let text = unit.text();
    let opts = options(arch, unit, &text).join(" ");
    let ver = format!("{}.{}", version.0, version.1);
    let h = fnv1a(&[text.as_bytes(), arch.as_bytes(), opts.as_bytes(), ver.as_bytes()]);
    dir.join(format!("{}-{arch}-{h:016x}.cubin", unit.name))
}

/// The CUBIN of `unit` for `arch`, from the cache when present, else compiled (and cached).
pub fn cubin_cached(dir: Option<&Path>, unit: &Unit, arch: &str) -> Result<Vec<u8>, String> {
    let version = nvrtc_version()?;
    let path = dir.map(|d| cache_path(d, unit, arch, version));
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if !bytes.is_empty() {
            return Ok(bytes);
        }
    }
    let bytes = compile(unit, arch)?;
    if let Some(p) = path {
        // Write to a temporary name, then rename: a concurrent reader never sees half a file.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let ok = p.parent().is_some_and(|d| std::fs::create_dir_all(d).is_ok())
            && std::fs::write(&tmp, &bytes).is_ok();
        if ok {
            let _ = std::fs::rename(&tmp, &p);
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(bytes)
}

/// Every unit's CUBIN for one architecture, each produced once by whichever asks first: a
/// launch, or (with `background`) the detached threads started at creation, a core each (at
/// most a unit each), which take the units in `UNITS` order (the served path's first), so a
/// cold start compiles in parallel instead of one unit at a time at first use, and on a
/// machine with fewer cores than units the served path's units are not slowed by the rest. A
/// caller asking for a unit a thread is compiling waits for that result; one asking for a
/// unit no thread has taken yet compiles it itself, and the threads skip it. NVRTC compiles
/// distinct programs concurrently; an exit waits for the threads (`IN_FLIGHT`).
#[derive(Clone)]
pub struct Cubins {
    arch: String,
    cache: Option<PathBuf>,
    slots: Arc<Vec<Slot>>,
}

/// One unit's CUBIN or its compile log, once produced, and whether someone took it on.
struct Slot {
    cubin: OnceLock<Result<Vec<u8>, String>>,
    taken: AtomicBool,
}

impl Cubins {
    pub fn new(arch: &str, cache: Option<PathBuf>, background: bool) -> Cubins {
        let slots = UNITS.iter().map(|_| Slot { cubin: OnceLock::new(), taken: false.into() });
        let set = Cubins { arch: arch.to_string(), cache, slots: Arc::new(slots.collect()) };
        if background {
            warm_nvrtc(arch);
            wait_background_at_exit();
            let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
            let next = Arc::new(AtomicUsize::new(0));
            for t in 0..cores.clamp(1, UNITS.len()) {
                let (set, next) = (set.clone(), next.clone());
                background_started();
                let spawned =
                    std::thread::Builder::new().name(format!("nvrtc-{t}")).spawn(move || {
                        let _done = BackgroundDone;
                        set.compile_queue(&next);
                    });
                if spawned.is_err() {
                    // The other threads (or, with none, the launches) compile its share.
                    drop(BackgroundDone);
                }
            }
        }
        set
    }

    /// A background thread's work: the next unit no one has taken, until none is left.
    fn compile_queue(&self, next: &AtomicUsize) {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= UNITS.len() {
                return;
            }
            if !self.slots[i].taken.swap(true, Ordering::AcqRel) {
                drop(self.get(i));
            }
        }
    }

    /// The process's set for `(arch, cache)`, started (with background threads unless
    /// `TENSORFOLD_PRECOMPILE=0`) by the first backend that asks: a second backend of the same
    /// GPU kind (serve opens one for the memory plan, then the engine's) shares its results
    /// and threads instead of compiling every unit again.
    pub fn shared(arch: &str, cache: Option<PathBuf>) -> Cubins {
        static SETS: Mutex<Vec<Cubins>> = Mutex::new(Vec::new());
        let mut sets = SETS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = sets.iter().find(|c| c.arch == arch && c.cache == cache) {
            return set.clone();
        }
        let background = std::env::var("TENSORFOLD_PRECOMPILE").map_or(true, |v| v != "0");
        let set = Cubins::new(arch, cache, background);
        sets.push(set.clone());
        set
    }

    /// Whether `other` is this same set (one compile a unit between them).
    pub fn shares_with(&self, other: &Cubins) -> bool {
        Arc::ptr_eq(&self.slots, &other.slots)
    }

    /// Waits for every unit's CUBIN (compiling those no thread has taken); `Err` names each
    /// unit that failed with the first line of its log.
    pub fn wait_all(&self) -> Result<(), String> {
        let failed: Vec<String> = (0..UNITS.len())
            .filter_map(|i| self.get(i).err().map(|log| (i, log)))
            .map(|(i, log)| format!("  {}: {}", UNITS[i].label(), log.lines().next().unwrap_or("")))
            .collect();
        if failed.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{} of {} kernel units failed to compile for {}:\n{}",
            failed.len(),
            UNITS.len(),
            self.arch,
            failed.join("\n")
        ))
    }

    /// The CUBIN of `UNITS[i]` (from the disk cache when present, else compiled).
    pub fn get(&self, i: usize) -> Result<Vec<u8>, String> {
        let (unit, slot) = (&UNITS[i], &self.slots[i]);
        let made = slot.cubin.get_or_init(|| {
            slot.taken.store(true, Ordering::Release);
            cubin_cached(self.cache.as_deref(), unit, &self.arch)
        });
        made.clone()
    }
}

/// Background compiles in flight, and the condition variable their ends signal. The process
/// must not exit while one runs: exit runs NVRTC's library destructors, which a compile on
/// another thread may still be using. An exit handler (registered with the first background
/// compile) waits for them, at most `EXIT_WAIT`.
static IN_FLIGHT: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());
const EXIT_WAIT: Duration = Duration::from_secs(120);

fn background_started() {
    *IN_FLIGHT.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
}

/// Ends one background compile when dropped (also when the compile panics).
struct BackgroundDone;

impl Drop for BackgroundDone {
    fn drop(&mut self) {
        let mut n = IN_FLIGHT.0.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        IN_FLIGHT.1.notify_all();
    }
}

/// Waits until no background compile runs, at most `limit`; whether none does.
pub fn wait_background(limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut n = IN_FLIGHT.0.lock().unwrap_or_else(|e| e.into_inner());
    while *n > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        n = IN_FLIGHT.1.wait_timeout(n, left).unwrap_or_else(|e| e.into_inner()).0;
    }
    true
}

extern "C" fn wait_background_on_exit() {
    wait_background(EXIT_WAIT);
}

extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// Compiles an empty kernel once, on this thread, before the exit handler is registered:
/// NVRTC registers its library destructors as it first runs, and exit() runs handlers in the
/// reverse order of registration, so the handler that waits for the background compiles must
/// come after them (session 34: a process leaving during a cold compile died in an
/// `nvrtc-*` thread, SIGSEGV, when it did not). A failure here only loses that order.
fn warm_nvrtc(arch: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(src) = CString::new("extern \"C\" __global__ void tf_warm() {}") else { return };
        let Ok(prog) = nvrtc::create_program(&src, None) else { return };
        let opts = [format!("--gpu-architecture={arch}")];
        // SAFETY: `prog` was just created from `src`, which outlives it; it is destroyed once
        // and not used after.
        unsafe {
            let _ = nvrtc::compile_program(prog, &opts);
            let _ = nvrtc::destroy_program(prog);
        }
    });
}

/// Registers `wait_background_on_exit` once. exit() runs handlers in the reverse order of
/// registration, so this one runs before the dynamic loader's destructors of the libraries
/// (registered at start-up).
fn wait_background_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: atexit takes a plain `extern "C" fn()` that lives for the whole program; the
    // handler only locks a static mutex and waits on a static condition variable.
    ONCE.call_once(|| unsafe {
        atexit(wait_background_on_exit);
    });
}

#[cfg(test)]
mod tests {
    use super::{define_in, defines_for};

    #[test]
    fn defines_reach_only_the_families_that_mention_them() {
        let unit = "#ifndef TF_D8_U\n#define TF_D8_U 4\n#endif\n#if TF_PREWAIT\n#endif";
        assert_eq!(
            defines_for("TF_D8_U=6 TF_NT_U=1 TF_PREWAIT =3", unit),
            ["-DTF_D8_U=6", "-DTF_PREWAIT"]
        );
        assert!(defines_for("TF_D8_U=6", "// no knobs here").is_empty());
        assert!(defines_for("", unit).is_empty());
    }

    #[test]
    fn the_host_reads_a_knob_as_nvrtc_gets_it() {
        let defs = "TF_D8_U=6 TF_SPLIT_LOOP=1 TF_X";
        assert_eq!(define_in(defs, "TF_SPLIT_LOOP").as_deref(), Some("1"));
        assert_eq!(define_in(defs, "TF_X").as_deref(), Some(""));
        assert_eq!(define_in(defs, "TF_SPLIT"), None);
        assert_eq!(define_in("", "TF_SPLIT_LOOP"), None);
    }
}
