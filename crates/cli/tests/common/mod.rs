//! Helpers shared by the CLI's integration tests.

use std::path::{Path, PathBuf};

/// The test model (scripts/fetch-model.sh puts it in the cache).
pub fn model() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache =
        std::env::var_os("TENSORFOLD_CACHE").map_or_else(|| repo.join(".cache"), PathBuf::from);
    let p = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "test model missing at {}: run scripts/fetch-model.sh", p.display());
    p
}
