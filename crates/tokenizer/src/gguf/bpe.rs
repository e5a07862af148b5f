//! Byte-level BPE from a `gpt2` GGUF vocabulary: vocabulary + merges, and the pre-tokenizer
//! that `tokenizer.ggml.pre` names.
//!
//! Each supported name is laid out the way the original Hugging Face tokenizer.json of that
//! family is (the model was trained on that splitting):
//! - `smollm` (SmolLM/SmolLM2): Digits(individual_digits) then ByteLevel(use_regex) with the
//!   GPT-2 regex. llama.cpp's `smollm` pre-type agrees: it splits `\p{N}` alone before the GPT-2
//!   regex (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM).
//! - `gpt2`: ByteLevel(use_regex) alone.
//! - `llama-bpe` / `llama3` / `llama-v3` (Llama-3): Split(Llama-3 regex, isolated), ByteLevel
//!   without its regex, and BPE `ignore_merges` (a word already in the vocabulary is one token).
//! - `qwen2`: NFC normalizer, Split(Qwen2 regex, isolated), ByteLevel without its regex.
//! - `default` (or no name): llama.cpp's fallback list of regexes applied in turn as isolated
//!   splits; no HF original exists for it.
//!
//! Any other name is refused by name: guessing a split silently changes token ids.
//!
//! Tokens are stored in the byte-level alphabet (`Ġ` for a space); an added token (control,
//! user-defined) is stored as its literal text and kept so, to be matched in raw text. A
//! normal token holding characters outside the alphabet is respelled byte by byte, as the
//! alphabet would write it.

use std::collections::HashMap;

use tf_checkpoint::GgufVocab;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use super::{is_added, type_of};
use crate::error::{Result, TokenizerError};

/// The `tokenizer.ggml.pre` names this module builds.
pub const SUPPORTED_PRE: &[&str] =
    &["smollm", "gpt2", "llama-bpe", "llama3", "llama-v3", "qwen2", "default"];

/// Llama-3's pattern, from its tokenizer.json.
const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pattern (transformers' Qwen2Tokenizer PRETOKENIZE_REGEX): digits one by one.
const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT list, applied in order.
const DEFAULT_RES: &[&str] = &[
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

pub(crate) fn is_llama3(pre: &str) -> bool {
    matches!(pre, "llama-bpe" | "llama3" | "llama-v3")
}

/// The text-splitting stages one pre-tokenizer name stands for.
struct Layout {
    normalizer: Option<NormalizerWrapper>,
    pre_tokenizer: PreTokenizerWrapper,
    ignore_merges: bool,
}

fn layout(pre: Option<&str>) -> Result<Layout> {
    let name = pre.unwrap_or("default");
    let bl_regex = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
    let bl_plain = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false));
    let split = |re: &str| -> Result<PreTokenizerWrapper> {
        let s = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::tk("pre-tokenizer regex", e))?;
        Ok(PreTokenizerWrapper::Split(s))
    };
    let seq = |v: Vec<PreTokenizerWrapper>| PreTokenizerWrapper::Sequence(Sequence::new(v));
    let plain = |pre_tokenizer| Layout { normalizer: None, pre_tokenizer, ignore_merges: false };
    Ok(match name {
        "smollm" => plain(seq(vec![PreTokenizerWrapper::Digits(Digits::new(true)), bl_regex()])),
        "gpt2" => plain(bl_regex()),
        n if is_llama3(n) => Layout {
            normalizer: None,
            pre_tokenizer: seq(vec![split(LLAMA3_RE)?, bl_plain()]),
            ignore_merges: true,
        },
        "qwen2" => Layout {
            normalizer: Some(NormalizerWrapper::NFC(NFC)),
            pre_tokenizer: seq(vec![split(QWEN2_RE)?, bl_plain()]),
            ignore_merges: false,
        },
        "default" => {
            let mut stages = DEFAULT_RES.iter().map(|re| split(re)).collect::<Result<Vec<_>>>()?;
            stages.push(bl_plain());
            plain(seq(stages))
        }
        other => {
            return Err(TokenizerError::UnsupportedPre {
                pre: other.to_string(),
                supported: SUPPORTED_PRE.join(", "),
            })
        }
    })
}

/// GPT-2's byte-to-character table: printable Latin-1 bytes map to themselves, the other 68
/// bytes to U+0100 onwards in byte order.
fn byte_alphabet() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let b = b as u32;
        let code = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        // Every code here is below U+0144 and not a surrogate, so it is a valid char.
        *slot = char::from_u32(code).unwrap_or('\u{fffd}');
    }
    table
}

/// The vocabulary keys: byte-level spelling for model tokens, literal text for added tokens.
fn vocab(v: &GgufVocab) -> Vocab {
    let table = byte_alphabet();
    let alphabet: std::collections::HashSet<char> = table.iter().copied().collect();
    let mut out = Vocab::default();
    for (id, token) in v.tokens.iter().enumerate() {
        let key = if is_added(type_of(v, id)) || token.chars().all(|c| alphabet.contains(&c)) {
            token.clone()
        } else {
            token.bytes().map(|b| table[b as usize]).collect()
        };
        // A repeated token keeps its first id, as a file read front to back would.
        out.entry(key).or_insert(id as u32);
    }
    out
}

fn merges(v: &GgufVocab) -> Result<Vec<(String, String)>> {
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    let mut out = Vec::with_capacity(v.merges.len());
    for (i, m) in v.merges.iter().enumerate() {
        let (a, b) = m.split_once(' ').ok_or_else(|| {
            TokenizerError::vocab("tokenizer.ggml.merges", format!("entry {i} {m:?} has no space"))
        })?;
        // A repeated pair keeps its first (best) rank.
        if seen.insert((a, b), i).is_none() {
            out.push((a.to_string(), b.to_string()));
        }
    }
    Ok(out)
}

pub(crate) fn build(v: &GgufVocab) -> Result<Tokenizer> {
    let layout = layout(v.pre.as_deref())?;
    if v.merges.is_empty() {
        return Err(TokenizerError::vocab("tokenizer.ggml.merges", "is missing or empty"));
    }
    let model = BPE::builder()
        .vocab_and_merges(vocab(v), merges(v)?)
        .ignore_merges(layout.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::vocab("tokenizer.ggml.merges", e.to_string()))?;
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(layout.normalizer)
        .with_pre_tokenizer(Some(layout.pre_tokenizer))
        .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_gpt2s() {
        let t = byte_alphabet();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xad], 'Ń');
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
        assert_eq!(distinct, ByteLevel::alphabet().into_iter().collect());
    }

    #[test]
    fn unknown_pre_is_refused_by_name() {
        let err = layout(Some("tekken")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("\"tekken\"") && err.contains("smollm"), "{err}");
    }
}
