//! Finding the CUDA driver and NVRTC at run time, with clean errors instead of panics.
//!
//! cudarc (feature `dynamic-loading`) opens `libcuda`/`libnvrtc` by name on first use and
//! panics when none loads. So before cudarc touches either, this module opens the library
//! itself: first by the names cudarc tries (the loader's search path), then by full path in
//! the places NVIDIA installs put it (the CUDA toolkit, the driver's directories, pip wheels,
//! `scripts/nvrtc-wheels.sh`'s cache, or a directory named by `TENSORFOLD_NVRTC_LIB`). A
//! library opened by full path stays loaded for the process, so cudarc's later open by name
//! finds it by its soname (glibc matches already-loaded objects by soname). For NVRTC the
//! `libnvrtc-builtins` beside it is opened the same way, since NVRTC opens it by name.
//!
//! Rejected: `catch_unwind` around cudarc's first load (the panic message still reaches
//! stderr through the panic hook, and a panic is not an error a caller can render).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

/// Libraries opened here, kept loaded for the life of the process.
static DRIVER: OnceLock<Result<Library, String>> = OnceLock::new();
static NVRTC: OnceLock<Result<Vec<Library>, String>> = OnceLock::new();

/// Opens the CUDA driver library; `Err` says none was found.
pub fn driver() -> Result<(), String> {
    let r = DRIVER.get_or_init(|| {
        let names = cudarc::get_lib_name_candidates("cuda");
        let dirs = [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/local/nvidia/lib64",
            "/usr/local/nvidia/lib",
            "/usr/lib/wsl/lib",
            "/usr/local/cuda/compat",
        ];
        let paths = dirs.iter().map(|d| Path::new(d).join("libcuda.so.1"));
        open_first(names.into_iter().map(PathBuf::from).chain(paths)).ok_or_else(|| {
            "--device cuda: no CUDA driver found (libcuda.so.1 could not be loaded); this machine \
             has no NVIDIA GPU or driver"
                .to_string()
        })
    });
    r.as_ref().map(|_| ()).map_err(Clone::clone)
}

/// Opens NVRTC (and its builtins library); `extra` directories are searched first.
/// `Err` lists where it looked.
pub fn nvrtc(extra: &[PathBuf]) -> Result<(), String> {
    let r = NVRTC.get_or_init(|| {
        let dirs = nvrtc_dirs(extra);
        for dir in &dirs {
            let Some(lib) = newest(dir, "libnvrtc.so.") else { continue };
            let Some(main) = open_first([lib]) else { continue };
            let mut libs = vec![main];
            if let Some(b) = newest(dir, "libnvrtc-builtins.so.").and_then(|b| open_first([b])) {
                libs.push(b);
            }
            return Ok(libs);
        }
        // The loader's own search path (LD_LIBRARY_PATH, ldconfig) last.
        if let Some(lib) =
            open_first(cudarc::get_lib_name_candidates("nvrtc").into_iter().map(PathBuf::from))
        {
            return Ok(vec![lib]);
        }
        let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        Err(format!(
            "NVRTC (libnvrtc.so) not found: looked in {} and the loader's search path; set \
             TENSORFOLD_NVRTC_LIB to the directory holding libnvrtc.so.13, or run \
             scripts/nvrtc-wheels.sh",
            looked.join(", ")
        ))
    });
    r.as_ref().map(|_| ()).map_err(Clone::clone)
}

/// Directories that may hold NVRTC, most specific first.
fn nvrtc_dirs(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = extra.to_vec();
    if let Some(d) = std::env::var_os("TENSORFOLD_NVRTC_LIB") {
        let p = PathBuf::from(d);
        // A file path names the library itself; take its directory.
        dirs.push(if p.is_file() { p.parent().map(Path::to_path_buf).unwrap_or(p) } else { p });
    }
    for d in ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"] {
        dirs.push(PathBuf::from(d));
    }
    // pip wheels: nvidia/cu13/lib (CUDA 13 wheels) or nvidia/cuda_nvrtc/lib (CUDA 12 wheels),
    // under any python's site-packages we can see, and the repository cache.
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(c) = std::env::var_os("TENSORFOLD_CACHE") {
        roots.push(PathBuf::from(c).join("nvrtc"));
    }
    for base in ancestors_with_cache() {
        roots.push(base.join(".cache").join("nvrtc"));
    }
    for pat in
        ["/usr/lib", "/usr/local/lib", "/opt/torch/.venv/lib", "/opt/conda/lib", "/opt/venv/lib"]
    {
        if let Ok(rd) = std::fs::read_dir(pat) {
            for e in rd.flatten() {
                let n = e.file_name();
                if n.to_string_lossy().starts_with("python3") {
                    roots.push(e.path().join("site-packages"));
                    roots.push(e.path().join("dist-packages"));
                }
            }
        }
    }
    for r in roots {
        dirs.push(r.join("nvidia").join("cu13").join("lib"));
        dirs.push(r.join("nvidia").join("cuda_nvrtc").join("lib"));
    }
    dirs
}

/// The working directory's and the executable's ancestors that hold a `.cache` directory.
pub(crate) fn ancestors_with_cache() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut starts = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf))
    {
        starts.push(dir);
    }
    for s in starts {
        for a in s.ancestors() {
            if a.join(".cache").is_dir() && !out.iter().any(|o: &PathBuf| o == a) {
                out.push(a.to_path_buf());
            }
        }
    }
    out
}

/// The file in `dir` whose name starts with `prefix` and is longest (most version digits,
/// e.g. `libnvrtc.so.13` over nothing; `.alt` variants are skipped).
fn newest(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut best: Option<PathBuf> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let longer =
            best.as_ref().is_none_or(|b| name.len() > b.file_name().map_or(0, |n| n.len()));
        if name.starts_with(prefix) && !name.contains(".alt") && longer {
            best = Some(e.path());
        }
    }
    best
}

fn open_first(paths: impl IntoIterator<Item = PathBuf>) -> Option<Library> {
    paths.into_iter().find_map(|p| {
        // SAFETY: opening a shared library runs its initializers; these are NVIDIA's driver
        // and NVRTC libraries, which cudarc would open next anyway.
        unsafe { Library::new(&p) }.ok()
    })
}
