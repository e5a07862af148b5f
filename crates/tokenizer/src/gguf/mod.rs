//! Rebuilds a `tokenizers::Tokenizer` from the `tokenizer.ggml.*` arrays of a GGUF file.
//!
//! A GGUF carries no tokenizer.json, only the vocabulary (tokens, token types, scores or merges,
//! special ids) and llama.cpp's name for the pre-tokenizer. `bpe` turns a `gpt2` vocabulary into
//! byte-level BPE with the pre-tokenizer its name stands for; `spm` turns a `llama` vocabulary
//! into SentencePiece-style BPE with byte fallback. This module does what both share: checking
//! the arrays, registering control/unknown tokens (types 3 and 2) as special added tokens and
//! user-defined ones (type 4) as plain added tokens so they are matched whole inside text, and
//! the post-processor that adds BOS/EOS.
//!
//! Invariant: token ids are the GGUF's ids. Every added token's content is also a key of the
//! model vocabulary at its own id, so `tokenizers` reuses that id instead of appending a new one.
//!
//! Where the target behaviour comes from, in order: the original Hugging Face tokenizer.json of
//! the model family (fidelity to the model as trained), then llama.cpp (what the GGUF names mean).
//! Rejected: transformers' GGUF converter as the model, since it drops SmolLM2's digit splitting,
//! Llama-3's ignore_merges and Qwen2's NFC (tools/fixtures/tokenizer_bpe.py records where).

mod bpe;
mod spm;

use tf_checkpoint::GgufVocab;
use tokenizers::processors::byte_level::ByteLevel as ByteLevelProcessor;
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{AddedToken, PostProcessorWrapper, Tokenizer};

use crate::error::{Result, TokenizerError};

pub use bpe::SUPPORTED_PRE;

/// llama.cpp's token types (`llama_token_type`), as stored in `tokenizer.ggml.token_type`.
pub(crate) mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
}

/// What the builders hand back besides the tokenizer.
pub(crate) struct Built {
    pub tokenizer: Tokenizer,
    pub add_bos: bool,
    pub add_eos: bool,
}

/// Builds the tokenizer a GGUF vocabulary describes.
pub(crate) fn build(v: &GgufVocab) -> Result<Built> {
    check(v)?;
    let (mut tokenizer, byte_level) = match v.model.as_str() {
        "gpt2" => (bpe::build(v)?, true),
        "llama" => (spm::build(v)?, false),
        other => return Err(TokenizerError::UnsupportedModel { model: other.to_string() }),
    };
    add_special_tokens(&mut tokenizer, v);
    // llama.cpp's defaults when the flag is absent: SentencePiece vocabularies and Llama-3's
    // byte-level one add BOS; other byte-level ones do not.
    let llama3 = matches!(v.pre.as_deref(), Some(p) if bpe::is_llama3(p));
    let add_bos = v.add_bos.unwrap_or(!byte_level || llama3);
    let add_eos = v.add_eos.unwrap_or(false);
    let processor = post_processor(v, add_bos, add_eos, byte_level)?;
    tokenizer.with_post_processor(processor);
    Ok(Built { tokenizer, add_bos, add_eos })
}

fn check(v: &GgufVocab) -> Result<()> {
    let n = v.tokens.len();
    if n == 0 {
        return Err(TokenizerError::vocab("tokenizer.ggml.tokens", "is empty"));
    }
    if u32::try_from(n).is_err() {
        return Err(TokenizerError::vocab("tokenizer.ggml.tokens", format!("{n} tokens")));
    }
    if !v.token_types.is_empty() && v.token_types.len() != n {
        let what = format!("has {} entries for {n} tokens", v.token_types.len());
        return Err(TokenizerError::vocab("tokenizer.ggml.token_type", what));
    }
    let ids = [
        ("tokenizer.ggml.bos_token_id", v.bos),
        ("tokenizer.ggml.eos_token_id", v.eos),
        ("tokenizer.ggml.unknown_token_id", v.unk),
        ("tokenizer.ggml.padding_token_id", v.pad),
    ];
    for (key, id) in ids {
        if let Some(id) = id.filter(|&id| id as usize >= n) {
            return Err(TokenizerError::vocab(key, format!("id {id} is outside the {n} tokens")));
        }
    }
    Ok(())
}

/// The type of token `id`; a file without types counts every token as normal.
pub(crate) fn type_of(v: &GgufVocab, id: usize) -> i32 {
    v.token_types.get(id).copied().unwrap_or(token_type::NORMAL)
}

/// Whether a token is matched whole in text before the model sees it (types 2, 3, 4), as
/// llama.cpp's special-token partition does.
pub(crate) fn is_added(token_type: i32) -> bool {
    matches!(token_type, token_type::UNKNOWN | token_type::CONTROL | token_type::USER_DEFINED)
}

fn add_special_tokens(tokenizer: &mut Tokenizer, v: &GgufVocab) {
    let mut special = Vec::new();
    let mut plain = Vec::new();
    for (id, token) in v.tokens.iter().enumerate() {
        let ty = type_of(v, id);
        // An empty added token would match everywhere; such an entry stays a vocabulary entry.
        if !is_added(ty) || token.is_empty() {
            continue;
        }
        let special_token = ty != token_type::USER_DEFINED;
        let added = AddedToken::from(token.clone(), special_token).normalized(false);
        if special_token {
            special.push(added);
        } else {
            plain.push(added);
        }
    }
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&plain);
}

fn post_processor(
    v: &GgufVocab,
    add_bos: bool,
    add_eos: bool,
    byte_level: bool,
) -> Result<Option<PostProcessorWrapper>> {
    let token = |id: Option<u32>, key: &'static str| -> Result<(String, u32)> {
        let id = id.ok_or_else(|| TokenizerError::vocab(key, "is required by the add flag"))?;
        Ok((v.tokens[id as usize].clone(), id))
    };
    let bos = if add_bos { Some(token(v.bos, "tokenizer.ggml.bos_token_id")?) } else { None };
    let eos = if add_eos { Some(token(v.eos, "tokenizer.ggml.eos_token_id")?) } else { None };
    if bos.is_none() && eos.is_none() {
        let processor = ByteLevelProcessor::new(false, false, true);
        return Ok(byte_level.then_some(PostProcessorWrapper::ByteLevel(processor)));
    }
    Ok(Some(PostProcessorWrapper::Template(template(bos, eos)?)))
}

/// `bos $A eos` for one sequence and `bos $A eos bos $B eos` for a pair (the layout
/// transformers writes for add_bos_token / add_eos_token). A template names each special token;
/// the name is the token's text (as in HF files) unless the text would not parse as a template
/// piece (a space, a colon, a leading `$`), then a plain `bos` / `eos`.
pub(crate) fn template(
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
) -> Result<TemplateProcessing> {
    let err = |e: String| TokenizerError::tk("post-processor template", e);
    let named = |t: Option<(String, u32)>, fallback: &str| {
        t.map(|(text, id)| {
            let safe = !text.is_empty() && !text.contains([' ', ':']) && !text.starts_with('$');
            let name = if safe { text.clone() } else { fallback.to_string() };
            (name, text, id)
        })
    };
    let (bos, eos) = (named(bos, "bos"), named(eos, "eos"));
    let pieces = |seq: &str, type_id: u32| {
        let mut out: Vec<String> = bos.iter().map(|b| format!("{}:{type_id}", b.0)).collect();
        out.push(format!("{seq}:{type_id}"));
        out.extend(eos.iter().map(|e| format!("{}:{type_id}", e.0)));
        out
    };
    let single = pieces("$A", 0);
    let mut pair = single.clone();
    pair.extend(pieces("$B", 1));
    let mut specials = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for (name, text, id) in bos.iter().chain(eos.iter()) {
        // BOS and EOS may be one token; a template names it once.
        if !names.contains(&name.as_str()) {
            names.push(name);
            let token = SpecialToken::new(name.clone(), vec![*id], vec![text.clone()]);
            specials.push(token.map_err(|e| err(e.to_string()))?);
        }
    }
    TemplateProcessing::builder()
        .try_single(single)
        .map_err(err)?
        .try_pair(pair)
        .map_err(err)?
        .special_tokens(specials)
        .build()
        .map_err(|e| err(e.to_string()))
}
