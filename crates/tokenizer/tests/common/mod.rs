//! Shared test helpers: the test model (which must be present: a missing model is a failure
//! telling how to fetch it, never a skip), the fixtures, and a GgufVocab from a fixture.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;
use tf_checkpoint::{Checkpoint, GgufVocab, TokenizerSource};
use tf_tokenizer::TextCodec;

pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// scripts/fetch-model.sh's location logic: $TENSORFOLD_CACHE or <repo>/.cache, then models/.
pub fn locate_model(cache: Option<&Path>) -> Result<PathBuf, String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache = cache.map(Path::to_path_buf).unwrap_or_else(|| {
        match std::env::var_os("TENSORFOLD_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => repo.join(".cache"),
        }
    });
    let path = cache.join("models").join(MODEL_FILE);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "test model {} not found: run scripts/fetch-model.sh (it honours TENSORFOLD_CACHE)",
            path.display()
        ))
    }
}

pub fn model_path() -> PathBuf {
    locate_model(None).unwrap_or_else(|e| panic!("{e}"))
}

/// The real checkpoint, opened once per test binary.
pub fn checkpoint() -> &'static Checkpoint {
    static CKPT: OnceLock<Checkpoint> = OnceLock::new();
    CKPT.get_or_init(|| {
        let path = model_path();
        Checkpoint::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
    })
}

pub fn smollm_vocab() -> &'static GgufVocab {
    match &checkpoint().tokenizer {
        TokenizerSource::Gguf(v) => v,
        other => panic!("the GGUF checkpoint's tokenizer source is {other:?}"),
    }
}

pub fn smollm_codec() -> &'static TextCodec {
    static CODEC: OnceLock<TextCodec> = OnceLock::new();
    CODEC.get_or_init(|| TextCodec::from_gguf(smollm_vocab()).expect("build SmolLM2 tokenizer"))
}

pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

pub fn fixture(name: &str) -> Value {
    let path = fixture_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()).expect("u32 id"))
        .collect()
}

/// The SentencePiece vocabulary of tokenizer_spm.json, as a GGUF reader would fill it.
pub fn spm_vocab(doc: &Value) -> GgufVocab {
    let v = &doc["vocab"];
    let strings = |k: &str| -> Vec<String> {
        v[k].as_array().expect(k).iter().map(|s| s.as_str().expect(k).to_string()).collect()
    };
    let id = |k: &str| v[k].as_u64().map(|n| n as u32);
    GgufVocab {
        model: v["model"].as_str().expect("model").into(),
        pre: None,
        tokens: strings("tokens"),
        token_types: v["token_types"]
            .as_array()
            .expect("types")
            .iter()
            .map(|t| t.as_i64().expect("type") as i32)
            .collect(),
        scores: v["scores"]
            .as_array()
            .expect("scores")
            .iter()
            .map(|s| s.as_f64().expect("score") as f32)
            .collect(),
        merges: Vec::new(),
        bos: id("bos"),
        eos: id("eos"),
        unk: id("unk"),
        pad: None,
        add_bos: v["add_bos"].as_bool(),
        add_eos: v["add_eos"].as_bool(),
        add_space_prefix: v["add_space_prefix"].as_bool(),
    }
}

/// A small deterministic generator (xorshift64*), so property tests need no extra crate.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
