//! SentencePiece-style BPE from a `llama` GGUF vocabulary (tokens + scores + types).
//!
//! A SentencePiece BPE model encodes by repeatedly merging the adjacent pair whose union is the
//! highest-scoring piece (ties: leftmost); characters missing from the vocabulary become their
//! UTF-8 bytes as `<0xXX>` tokens (byte fallback). That is `tokenizers`' BPE with the merge list
//! ordered by the score of the merged piece, which is how it is built here: every split of every
//! normal or user-defined token into two vocabulary tokens is a merge, ranked by the token's
//! score (higher first), then by token id, then by split position.
//!
//! Spaces: the text's spaces become `▁`, and with `add_space_prefix` a `▁` is put in front of
//! every text fragment (the text cut at special and user-defined tokens). That is llama.cpp's
//! behaviour (a space before each raw-text fragment that starts the text or follows a special
//! token) and Llama-2's original tokenizer.json (normalizer Prepend("▁") + Replace(" ", "▁"),
//! which runs on each segment between added tokens). Rejected: the Metaspace pre-tokenizer with
//! prepend_scheme "first" (what transformers' GGUF converter builds), which adds no `▁` before
//! text that already starts with a space and so disagrees with SentencePiece on " a".
//! Decoding undoes it: `▁` to space, byte tokens to bytes, and one leading space stripped.

use std::cmp::Ordering;

use tf_checkpoint::GgufVocab;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{NormalizerWrapper, Tokenizer};

use super::{token_type, type_of};
use crate::error::{Result, TokenizerError};

const SPACE: &str = "\u{2581}";

/// Merge candidates: (score of the merged token, its id, split byte offset).
fn merges(v: &GgufVocab, vocab: &Vocab) -> Vec<(String, String)> {
    let mut cands: Vec<(f32, u32, usize)> = Vec::new();
    for (id, token) in v.tokens.iter().enumerate() {
        let ty = type_of(v, id);
        if ty != token_type::NORMAL && ty != token_type::USER_DEFINED {
            continue;
        }
        // Only the token that owns this spelling can be a merge result.
        if vocab.get(token) != Some(&(id as u32)) {
            continue;
        }
        for (at, _) in token.char_indices().skip(1) {
            let (l, r) = token.split_at(at);
            if vocab.contains_key(l) && vocab.contains_key(r) {
                cands.push((v.scores[id], id as u32, at));
            }
        }
    }
    cands.sort_by(|a, b| match b.0.total_cmp(&a.0) {
        Ordering::Equal => (a.1, a.2).cmp(&(b.1, b.2)),
        other => other,
    });
    cands
        .into_iter()
        .map(|(_, id, at)| {
            let (l, r) = v.tokens[id as usize].split_at(at);
            (l.to_string(), r.to_string())
        })
        .collect()
}

fn normalizer(add_space_prefix: bool) -> Result<NormalizerWrapper> {
    let replace = Replace::new(" ", SPACE).map_err(|e| TokenizerError::tk("normalizer", e))?;
    if !add_space_prefix {
        return Ok(NormalizerWrapper::Replace(replace));
    }
    Ok(NormalizerWrapper::Sequence(NormalizerSequence::new(vec![
        NormalizerWrapper::Prepend(Prepend::new(SPACE.to_string())),
        NormalizerWrapper::Replace(replace),
    ])))
}

fn decoder(add_space_prefix: bool) -> Result<DecoderWrapper> {
    let replace = Replace::new(SPACE, " ").map_err(|e| TokenizerError::tk("decoder", e))?;
    let mut steps = vec![
        DecoderWrapper::Replace(replace),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        steps.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    Ok(DecoderWrapper::Sequence(DecoderSequence::new(steps)))
}

pub(crate) fn build(v: &GgufVocab) -> Result<Tokenizer> {
    if v.scores.len() != v.tokens.len() {
        let what = format!("has {} entries for {} tokens", v.scores.len(), v.tokens.len());
        return Err(TokenizerError::vocab("tokenizer.ggml.scores", what));
    }
    let mut vocab = Vocab::default();
    for (id, token) in v.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let merges = merges(v, &vocab);
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true);
    if let Some(unk) = v.unk {
        builder = builder.unk_token(v.tokens[unk as usize].clone()).fuse_unk(true);
    }
    let model = builder
        .build()
        .map_err(|e| TokenizerError::vocab("tokenizer.ggml.tokens", e.to_string()))?;
    // llama.cpp's default: a SentencePiece vocabulary without the flag adds the prefix space.
    let add_space_prefix = v.add_space_prefix.unwrap_or(true);
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(normalizer(add_space_prefix)?))
        .with_decoder(Some(decoder(add_space_prefix)?));
    Ok(tokenizer)
}
