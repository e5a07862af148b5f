//! `tokenizer.ggml.*` and `tokenizer.chat_template` metadata -> [`GgufVocab`] + template.
//!
//! The big arrays (49k tokens, 49k merges) are moved out of the parsed metadata, not copied:
//! `take_vocab` consumes the metadata list. A key with the wrong type is an error naming it;
//! a missing key is `None`/empty, and `tf-tokenizer` decides whether it can do without.
//! Key names: gguf-py 0.19.0 `constants.py` `Keys.Tokenizer`.

use std::path::Path;

use super::value::{GgufValue, GgufValueType};
use crate::error::{CheckpointError, Result};
use crate::vocab::GgufVocab;

const PREFIX: &str = "tokenizer.ggml.";
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

fn bad(path: &Path, key: &str, want: &str, v: &GgufValue) -> CheckpointError {
    CheckpointError::Config {
        path: path.to_path_buf(),
        key: key.to_string(),
        what: format!("expected {want}, found {}", v.type_description()),
    }
}

fn string(path: &Path, key: &str, v: GgufValue) -> Result<String> {
    match v {
        GgufValue::String(s) => Ok(s),
        v => Err(bad(path, key, "a string", &v)),
    }
}

fn strings(path: &Path, key: &str, v: GgufValue) -> Result<Vec<String>> {
    match v {
        GgufValue::Array(GgufValueType::String, items) => {
            // Every element of a string array is a String (the reader builds them by type).
            Ok(items
                .into_iter()
                .filter_map(|x| if let GgufValue::String(s) = x { Some(s) } else { None })
                .collect())
        }
        v => Err(bad(path, key, "an array of strings", &v)),
    }
}

fn ints(path: &Path, key: &str, v: &GgufValue) -> Result<Vec<i32>> {
    let items = match v {
        GgufValue::Array(_, items) => items,
        v => return Err(bad(path, key, "an array of integers", v)),
    };
    items
        .iter()
        .map(|x| x.as_int().and_then(|i| i32::try_from(i).ok()))
        .collect::<Option<_>>()
        .ok_or_else(|| bad(path, key, "an array of i32 integers", v))
}

fn floats(path: &Path, key: &str, v: &GgufValue) -> Result<Vec<f32>> {
    match v {
        GgufValue::Array(GgufValueType::F32, items) => Ok(items
            .iter()
            .filter_map(|x| if let GgufValue::F32(f) = x { Some(*f) } else { None })
            .collect()),
        v => Err(bad(path, key, "an array of f32", v)),
    }
}

fn token_id(path: &Path, key: &str, v: &GgufValue) -> Result<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad(path, key, "a token id (u32)", v))
}

fn flag(path: &Path, key: &str, v: &GgufValue) -> Result<bool> {
    v.as_bool().ok_or_else(|| bad(path, key, "a bool", v))
}

/// Moves the tokenizer metadata out of `metadata`; returns the vocabulary and chat template.
pub fn take_vocab(
    path: &Path,
    metadata: Vec<(String, GgufValue)>,
) -> Result<(GgufVocab, Option<String>)> {
    let mut vocab = GgufVocab::default();
    let mut template = None;
    for (key, v) in metadata {
        if key == CHAT_TEMPLATE_KEY {
            template = Some(string(path, &key, v)?);
            continue;
        }
        let Some(name) = key.strip_prefix(PREFIX) else { continue };
        match name {
            "model" => vocab.model = string(path, &key, v)?,
            "pre" => vocab.pre = Some(string(path, &key, v)?),
            "tokens" => vocab.tokens = strings(path, &key, v)?,
            "merges" => vocab.merges = strings(path, &key, v)?,
            "token_type" => vocab.token_types = ints(path, &key, &v)?,
            "scores" => vocab.scores = floats(path, &key, &v)?,
            "bos_token_id" => vocab.bos = Some(token_id(path, &key, &v)?),
            "eos_token_id" => vocab.eos = Some(token_id(path, &key, &v)?),
            "unknown_token_id" => vocab.unk = Some(token_id(path, &key, &v)?),
            "padding_token_id" => vocab.pad = Some(token_id(path, &key, &v)?),
            "add_bos_token" => vocab.add_bos = Some(flag(path, &key, &v)?),
            "add_eos_token" => vocab.add_eos = Some(flag(path, &key, &v)?),
            "add_space_prefix" => vocab.add_space_prefix = Some(flag(path, &key, &v)?),
            _ => {}
        }
    }
    check_lengths(path, &vocab)?;
    Ok((vocab, template))
}

/// Per-token arrays must match the token list.
fn check_lengths(path: &Path, vocab: &GgufVocab) -> Result<()> {
    let n = vocab.tokens.len();
    for (key, len) in [("token_type", vocab.token_types.len()), ("scores", vocab.scores.len())] {
        if len != 0 && len != n {
            return Err(CheckpointError::Config {
                path: path.to_path_buf(),
                key: format!("{PREFIX}{key}"),
                what: format!("has {len} entries but tokenizer.ggml.tokens has {n}"),
            });
        }
    }
    Ok(())
}
