//! Where the default model lives when no path is given.
//!
//! `scripts/fetch-model.sh` stores the test model under `$TENSORFOLD_CACHE/models`, by default
//! `<repo>/.cache/models`. The binary looks in `$TENSORFOLD_CACHE`, then in `.cache` beside
//! each ancestor of the executable and of the working directory (so `target/release/tensorfold`
//! finds the repository's cache), and says how to fetch the model if none has it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(c) = std::env::var_os("TENSORFOLD_CACHE") {
        dirs.push(PathBuf::from(c));
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    dirs.extend(roots.into_iter().map(|r| r.join(".cache")));
    dirs.into_iter().map(|d| d.join("models").join(DEFAULT_MODEL_FILE)).collect()
}

/// `path` if given, else the default test model if fetched.
pub fn resolve(path: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = path {
        if !p.exists() {
            bail!("{}: no such file or directory", p.display());
        }
        return Ok(p);
    }
    match candidates().into_iter().find(|p| p.is_file()) {
        Some(p) => Ok(p),
        None => bail!(
            "no model given and the default model ({DEFAULT_MODEL_FILE}) is not fetched: \
             run scripts/fetch-model.sh, or pass a GGUF file or HF checkpoint directory"
        ),
    }
}
