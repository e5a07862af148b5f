//! Shared by the `check_*` tests: the real test model (a missing model is a failure telling
//! how to fetch it, never a skip), its token history, and model loading.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tf_backend::cpu::CpuBackend;
use tf_checkpoint::Checkpoint;
use tf_engine::check::history;
use tf_engine::family::{self, CausalLm, LoadOptions};

pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Rows and positions the tests load the model for.
pub const OPTS: LoadOptions = LoadOptions { max_rows: 128, max_positions: 256 };

/// scripts/fetch-model.sh's location logic: $TENSORFOLD_CACHE or <repo>/.cache, then models/.
pub fn model_path() -> PathBuf {
    let cache = std::env::var_os("TENSORFOLD_CACHE")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache"), PathBuf::from);
    let p = cache.join("models").join(MODEL_FILE);
    assert!(
        p.is_file(),
        "test model {} not found: run scripts/fetch-model.sh (it honours TENSORFOLD_CACHE)",
        p.display()
    );
    p
}

pub fn checkpoint() -> &'static Checkpoint {
    static CKPT: OnceLock<Checkpoint> = OnceLock::new();
    CKPT.get_or_init(|| {
        let p = model_path();
        Checkpoint::open(&p).unwrap_or_else(|e| panic!("opening {}: {e}", p.display()))
    })
}

/// A freshly loaded model on the CPU backend.
pub fn model() -> tf_engine::Result<Box<dyn CausalLm<CpuBackend>>> {
    family::load(checkpoint(), CpuBackend::new()?, OPTS)
}

/// `n` tokens: the model's tokenization of the passage, extended if needed.
pub fn tokens(n: usize) -> Vec<u32> {
    let codec = tf_tokenizer::TextCodec::from_source(&checkpoint().tokenizer).expect("tokenizer");
    let ids = codec.encode(history::PASSAGE, false).expect("encode the passage");
    assert!(ids.len() >= 300, "the passage is {} tokens", ids.len());
    history::history(&ids, n, checkpoint().spec.vocab_size, 0)
}

/// Prints progress with the test's name.
pub fn progress(name: &'static str) -> impl FnMut(&str) {
    move |s| eprintln!("[{name}] {s}")
}
