//! The tokenizer of a synthetic checkpoint: a real tokenizer (by default SmolLM2's, rebuilt
//! from the fetched test model's GGUF vocabulary by tf-tokenizer) padded with special tokens
//! `<|synth_pad_ID|>` up to the geometry's vocabulary, so `tokenizer.json` has exactly as many
//! ids as the embedding has rows, and the source's chat template.
//!
//! Sources (`--tokenizer-from`): a GGUF file; an HF directory holding `tokenizer.json` (and
//! `tokenizer_config.json` for the special tokens and chat template), such as any `synth` or
//! `export` output; or a `tokenizer.json` file (its `tokenizer_config.json` read from beside it).
//! A source that was itself padded by synth has its pads dropped first, so a 1.6 MB
//! `tokenizer.json` + `tokenizer_config.json` from a `--like smollm2` run serves every geometry
//! on a machine without the test model.
//!
//! Invariants: the written `tokenizer.json` loads back (checked here through tf-tokenizer)
//! with exactly `vocab` ids; a source larger than the vocabulary is refused. The JSON is
//! written compact (no indentation), about half the size of the pretty form.
//! Rejected: embedding the tokenizer in the binary (the build would then need the test model,
//! or the repository a 1.6 MB blob), and padding the BPE vocabulary with plain tokens (they
//! would decode as literal text; added special tokens are what real checkpoints use for
//! reserved ids, e.g. Llama 3's `<|reserved_special_token_N|>`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value as Json};
use tf_checkpoint::Checkpoint;
use tf_tokenizer::TextCodec;

/// The prefix of padding tokens; the id follows, then `|>`.
pub const PAD_PREFIX: &str = "<|synth_pad_";

/// The ids config.json names, and the source's size.
pub struct SynthTokenizer {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
    /// Ids of the source before padding.
    pub source_vocab: usize,
}

/// Writes `tokenizer.json` and `tokenizer_config.json` into `out`: the tokenizer of `source`
/// padded to `vocab` ids, checked by loading it back.
pub fn write(source: &Path, vocab: usize, out: &Path) -> Result<SynthTokenizer> {
    let (codec, template, raw) = load_source(source)?;
    // A carried tokenizer.json is taken as written (its post-processor included), so a synth
    // fed its own earlier output writes the same bytes; a GGUF vocabulary is serialized anew.
    let text = match raw {
        Some(text) => text,
        None => codec.to_tokenizer_json()?,
    };
    let base: Json = serde_json::from_str(&text).context("re-reading the serialized tokenizer")?;
    let (padded, source_vocab) = pad_tokenizer(base, vocab)
        .with_context(|| format!("padding the tokenizer of {}", source.display()))?;
    let tokenizer_json = serde_json::to_string(&padded)?;
    let tokenizer_config = codec.to_tokenizer_config(template.as_deref());
    write_checked(&tokenizer_json, &tokenizer_config, vocab, out)?;
    Ok(SynthTokenizer {
        bos: codec.bos_id(),
        eos: codec.eos_id(),
        pad: codec.special_tokens().pad.as_ref().map(|t| t.id),
        source_vocab,
    })
}

/// The source's tokenizer, chat template, and its tokenizer.json text when it has one.
fn load_source(path: &Path) -> Result<(TextCodec, Option<String>, Option<String>)> {
    let (json, dir): (PathBuf, PathBuf) = if path.is_dir() {
        (path.join("tokenizer.json"), path.to_path_buf())
    } else if path.extension().is_some_and(|e| e == "json") {
        (path.to_path_buf(), path.parent().unwrap_or(Path::new(".")).to_path_buf())
    } else {
        let ckpt = Checkpoint::open(path)
            .with_context(|| format!("reading the tokenizer of {}", path.display()))?;
        let codec = TextCodec::from_source(&ckpt.tokenizer)
            .with_context(|| format!("building the tokenizer of {}", path.display()))?;
        return Ok((codec, ckpt.chat_template, None));
    };
    if !json.is_file() {
        bail!("--tokenizer-from {}: {} not found", path.display(), json.display());
    }
    let config = Some(dir.join("tokenizer_config.json")).filter(|p| p.is_file());
    let codec = TextCodec::from_files(&json, config.as_deref())
        .with_context(|| format!("loading {}", json.display()))?;
    let template = tf_checkpoint::safetensors::chat_template(&dir)
        .with_context(|| format!("reading the chat template in {}", dir.display()))?;
    let raw =
        std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    Ok((codec, template, Some(raw)))
}

/// Drops earlier synth pads from `tok` (a parsed `tokenizer.json`), then appends special
/// tokens `<|synth_pad_ID|>` for every id from the source's size to `vocab`. Returns the
/// document and the source's size.
pub fn pad_tokenizer(mut tok: Json, vocab: usize) -> Result<(Json, usize)> {
    let model_ids = tok
        .pointer("/model/vocab")
        .and_then(Json::as_object)
        .context("tokenizer.json has no model.vocab object")?
        .values()
        .filter_map(Json::as_u64)
        .max()
        .map_or(0, |m| m + 1);
    let added = tok
        .get_mut("added_tokens")
        .and_then(Json::as_array_mut)
        .context("tokenizer.json has no added_tokens list")?;
    added.retain(|t| !t["content"].as_str().is_some_and(|c| c.starts_with(PAD_PREFIX)));
    let added_ids = added.iter().filter_map(|t| t["id"].as_u64()).max().map_or(0, |m| m + 1);
    let size = model_ids.max(added_ids) as usize;
    if size > vocab {
        bail!("the tokenizer has {size} ids, more than the model's vocabulary of {vocab}");
    }
    added.extend((size..vocab).map(|id| {
        json!({"id": id, "content": format!("{PAD_PREFIX}{id}|>"), "single_word": false,
               "lstrip": false, "rstrip": false, "normalized": false, "special": true})
    }));
    Ok((tok, size))
}

/// Writes the two files, then loads them back through tf-tokenizer and checks the size.
fn write_checked(json: &str, config: &Json, vocab: usize, out: &Path) -> Result<()> {
    let (tj, tc) = (out.join("tokenizer.json"), out.join("tokenizer_config.json"));
    std::fs::write(&tj, json).with_context(|| format!("writing {}", tj.display()))?;
    let config = serde_json::to_string_pretty(config)? + "\n";
    std::fs::write(&tc, config).with_context(|| format!("writing {}", tc.display()))?;
    let codec = TextCodec::from_files(&tj, Some(&tc)).context("loading the padded tokenizer")?;
    if codec.vocab_size() != vocab {
        bail!(
            "the padded tokenizer has {} ids, not {vocab} (are the source's ids contiguous?)",
            codec.vocab_size()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Json {
        json!({
            "added_tokens": [{"id": 3, "content": "<s>", "special": true}],
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}},
        })
    }

    #[test]
    fn pads_from_the_source_size_to_the_vocabulary() {
        let (t, size) = pad_tokenizer(tiny(), 7).unwrap();
        assert_eq!(size, 4);
        let added = t["added_tokens"].as_array().unwrap();
        let ids: Vec<u64> = added.iter().map(|a| a["id"].as_u64().unwrap()).collect();
        assert_eq!(ids, vec![3, 4, 5, 6]);
        assert_eq!(added[3]["content"], "<|synth_pad_6|>");
        assert_eq!(added[3]["special"], true);
    }

    #[test]
    fn repadding_drops_the_old_pads_first() {
        let (t, _) = pad_tokenizer(tiny(), 9).unwrap();
        let (t, size) = pad_tokenizer(t, 6).unwrap();
        assert_eq!(size, 4);
        assert_eq!(t["added_tokens"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_larger_source_is_refused() {
        let e = pad_tokenizer(tiny(), 3).unwrap_err().to_string();
        assert!(e.contains("4 ids") && e.contains("vocabulary of 3"), "{e}");
    }
}
