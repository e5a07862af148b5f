//! Where a checkpoint's tokenizer comes from, as plain data. `tf-tokenizer` turns it into a
//! working tokenizer; this crate only reads it out of the files.

use std::path::PathBuf;

/// Where a checkpoint's tokenizer comes from.
#[derive(Clone, Debug)]
pub enum TokenizerSource {
    /// An HF `tokenizer.json` (+ optional `tokenizer_config.json` beside it).
    Json { tokenizer_json: PathBuf, tokenizer_config: Option<PathBuf> },
    /// A vocabulary embedded in GGUF metadata (`tokenizer.ggml.*`).
    Gguf(GgufVocab),
}

/// The `tokenizer.ggml.*` metadata of a GGUF file, read by the GGUF reader and turned into a
/// `tokenizers::Tokenizer` by this module.
#[derive(Clone, Debug, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name llama.cpp uses (`smollm`, `llama-bpe`, ...).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.scores` (SentencePiece).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.merges` (BPE), each `"left right"`.
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}
