//! `TextCodec`: text to token ids and back, for one checkpoint.
//!
//! Built from either source a checkpoint names: an HF `tokenizer.json` (loaded as is by the
//! `tokenizers` crate, with `tokenizer_config.json` read for the special token strings and the
//! add_bos/add_eos flags), or a GGUF vocabulary rebuilt by `crate::gguf`. Both end as one
//! `tokenizers::Tokenizer`, so encoding, decoding and serialization are one code path.
//!
//! Invariants: special tokens written in text are recognised (split out before the model runs,
//! as transformers and llama.cpp both do by default); `add_special_tokens` adds exactly what the
//! checkpoint says (BOS for Llama-style vocabularies, nothing for SmolLM2); ids round-trip through
//! `to_tokenizer_json` unchanged.
//! Rejected: a hand-written BPE. `tokenizers` is the reference implementation the fixtures are
//! made with, and the same crate HF ships; reimplementing it would only add a place to differ.

use std::path::Path;

use serde_json::{json, Value as Json};
use tf_checkpoint::{GgufVocab, TokenizerSource};
use tokenizers::Tokenizer;

use crate::chat::ChatTemplate;
use crate::error::{Result, TokenizerError};

/// A special token: its id and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialToken {
    pub id: u32,
    pub text: String,
}

/// The named special tokens of a checkpoint (the chat template sees their text).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<SpecialToken>,
    pub eos: Option<SpecialToken>,
    pub unk: Option<SpecialToken>,
    pub pad: Option<SpecialToken>,
}

/// Per-id flags, indexed by token id.
const SPECIAL: u8 = 1;
/// A byte-fallback token (`<0xXX>`): the detokenizer never cuts right after one, because the
/// ByteFallback decoder decodes a run of them as one group.
const BYTE: u8 = 2;

#[derive(Debug)]
pub struct TextCodec {
    inner: Tokenizer,
    specials: SpecialTokens,
    add_bos: bool,
    add_eos: bool,
    flags: Vec<u8>,
}

impl TextCodec {
    /// Builds the tokenizer a checkpoint names.
    pub fn from_source(source: &TokenizerSource) -> Result<Self> {
        match source {
            TokenizerSource::Json { tokenizer_json, tokenizer_config } => {
                Self::from_files(tokenizer_json, tokenizer_config.as_deref())
            }
            TokenizerSource::Gguf(vocab) => Self::from_gguf(vocab),
        }
    }

    /// Rebuilds the tokenizer from GGUF `tokenizer.ggml.*` metadata.
    pub fn from_gguf(vocab: &GgufVocab) -> Result<Self> {
        let built = crate::gguf::build(vocab)?;
        let special = |id: Option<u32>| {
            id.map(|id| SpecialToken { id, text: vocab.tokens[id as usize].clone() })
        };
        let specials = SpecialTokens {
            bos: special(vocab.bos),
            eos: special(vocab.eos),
            unk: special(vocab.unk),
            pad: special(vocab.pad),
        };
        Ok(Self::assemble(built.tokenizer, specials, built.add_bos, built.add_eos))
    }

    /// Loads an HF `tokenizer.json`, with `tokenizer_config.json` when there is one.
    pub fn from_files(tokenizer_json: &Path, tokenizer_config: Option<&Path>) -> Result<Self> {
        let file_err = |path: &Path, what: String| TokenizerError::File { path: path.into(), what };
        let mut inner = Tokenizer::from_file(tokenizer_json)
            .map_err(|e| file_err(tokenizer_json, format!("cannot load tokenizer.json: {e}")))?;
        let config = match tokenizer_config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| file_err(path, format!("cannot read: {e}")))?;
                serde_json::from_str::<Json>(&text)
                    .map_err(|e| file_err(path, format!("not JSON: {e}")))?
            }
            None => Json::Null,
        };
        let special = |key: &str| {
            let text = match config.get(key) {
                Some(Json::String(s)) => Some(s.clone()),
                Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).map(String::from),
                _ => None,
            }?;
            let id = inner.token_to_id(&text)?;
            Some(SpecialToken { id, text })
        };
        let specials = SpecialTokens {
            bos: special("bos_token"),
            eos: special("eos_token"),
            unk: special("unk_token"),
            pad: special("pad_token"),
        };
        let flag = |key: &str| config.get(key).and_then(Json::as_bool);
        let explicit = flag("add_bos_token").is_some() || flag("add_eos_token").is_some();
        // transformers rebuilds the post-processor from the flags when the config states them
        // (or the file has none); otherwise the file's post-processor is what adds specials.
        if explicit || inner.get_post_processor().is_none() {
            let pair = |t: &Option<SpecialToken>, on: bool| {
                t.as_ref().filter(|_| on).map(|t| (t.text.clone(), t.id))
            };
            let bos = pair(&specials.bos, flag("add_bos_token").unwrap_or(false));
            let eos = pair(&specials.eos, flag("add_eos_token").unwrap_or(false));
            inner.with_post_processor(Some(crate::gguf::template(bos, eos)?));
        }
        let added = inner.encode_fast("", true).map_err(|e| TokenizerError::tk("encode", e))?;
        let added = added.get_ids();
        let add_bos = specials.bos.as_ref().is_some_and(|b| added.first() == Some(&b.id));
        let add_eos = specials.eos.as_ref().is_some_and(|e| added.last() == Some(&e.id));
        Ok(Self::assemble(inner, specials, add_bos, add_eos))
    }

    fn assemble(inner: Tokenizer, specials: SpecialTokens, add_bos: bool, add_eos: bool) -> Self {
        let size = inner.get_vocab_size(true);
        let mut flags = vec![0u8; size];
        for id in 0..size as u32 {
            let Some(token) = inner.id_to_token(id) else { continue };
            let byte = token.len() == 6
                && token.starts_with("<0x")
                && token.ends_with('>')
                && u8::from_str_radix(&token[3..5], 16).is_ok();
            flags[id as usize] |= if byte { BYTE } else { 0 };
        }
        for (id, token) in inner.get_added_tokens_decoder() {
            if token.special {
                if let Some(f) = flags.get_mut(id as usize) {
                    *f |= SPECIAL;
                }
            }
        }
        TextCodec { inner, specials, add_bos, add_eos, flags }
    }

    /// Token ids of `text`; with `add_special_tokens`, BOS/EOS as the checkpoint adds them.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::tk("encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; `skip_special` drops special tokens. Ids outside the vocabulary are
    /// skipped (as `tokenizers` does); invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(|e| TokenizerError::tk("decode", e))
    }

    /// The vocabulary string of one token (byte-level spelling for GPT-2-style vocabularies).
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.specials
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.specials.bos.as_ref().map(|t| t.id)
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.specials.eos.as_ref().map(|t| t.id)
    }

    /// Whether `encode(.., true)` puts BOS first / EOS last.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    pub fn adds_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether `id` is a special token (dropped by `decode(.., true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.flags.get(id as usize).is_some_and(|f| f & SPECIAL != 0)
    }

    /// Whether the detokenizer must wait for the next token before cutting after `id`.
    pub(crate) fn holds_after(&self, id: u32) -> bool {
        self.flags.get(id as usize).is_some_and(|f| f & BYTE != 0)
    }

    /// The tokenizer as an HF `tokenizer.json` document.
    pub fn to_tokenizer_json(&self) -> Result<String> {
        self.inner.to_string(true).map_err(|e| TokenizerError::tk("serialize tokenizer.json", e))
    }

    /// A `tokenizer_config.json` document to go beside `to_tokenizer_json()`.
    pub fn to_tokenizer_config(&self, chat_template: Option<&str>) -> Json {
        let text = |t: &Option<SpecialToken>| t.as_ref().map(|t| t.text.clone());
        let mut config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": text(&self.specials.bos),
            "eos_token": text(&self.specials.eos),
            "unk_token": text(&self.specials.unk),
            "pad_token": text(&self.specials.pad),
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "clean_up_tokenization_spaces": false,
        });
        if let (Some(t), Some(map)) = (chat_template, config.as_object_mut()) {
            map.insert("chat_template".into(), Json::String(t.to_string()));
        }
        config
    }

    /// A chat template that sees this tokenizer's special token strings.
    pub fn chat_template(&self, source: &str) -> Result<ChatTemplate> {
        Ok(ChatTemplate::new(source)?.with_special_tokens(&self.specials))
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }
}
