//! An HF checkpoint directory as a [`Checkpoint`]: `config.json` (+ `generation_config.json`)
//! for the spec, the safetensors weights, `tokenizer.json` (+ `tokenizer_config.json`) for the
//! tokenizer, and the chat template.
//!
//! The chat template is looked up as transformers does: a `chat_template.jinja` file beside
//! the tokenizer overrides the `chat_template` key of `tokenizer_config.json`; that key is a
//! string, or a list of `{name, template}` of which the one named `default` is used (a list
//! with no `default` gives no template, as transformers then needs an explicit name).
//!
//! Nothing here reads tensor data or the tokenizer itself; `tf-tokenizer` builds it from the
//! paths.

use std::path::Path;

use serde_json::Value;

use super::read_json_file;
use super::weights::open_weights;
use super::MAX_JSON_BYTES;
use crate::checkpoint::{Checkpoint, CheckpointFormat};
use crate::error::{CheckpointError, Result};
use crate::vocab::TokenizerSource;

pub const TOKENIZER_JSON: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Opens an HF checkpoint directory. Maps the weights; reads no tensor data.
pub fn open_hf_dir(dir: &Path) -> Result<Checkpoint> {
    let spec = crate::spec::hf::read_spec(dir)?;
    let tokenizer_json = dir.join(TOKENIZER_JSON);
    if !tokenizer_json.is_file() {
        return Err(CheckpointError::Malformed {
            path: dir.to_path_buf(),
            format: "HF checkpoint directory",
            what: format!("{TOKENIZER_JSON} is missing (tensorfold reads the tokenizer from it)"),
        });
    }
    let tokenizer_config = Some(dir.join(TOKENIZER_CONFIG)).filter(|p| p.is_file());
    let chat_template = chat_template(dir)?;
    let weights = open_weights(dir)?;
    Ok(Checkpoint {
        path: dir.to_path_buf(),
        format: CheckpointFormat::Safetensors,
        spec,
        tensors: weights.tensors,
        tokenizer: TokenizerSource::Json { tokenizer_json, tokenizer_config },
        chat_template,
    })
}

/// The directory's chat template: `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template`, else `None`.
pub fn chat_template(dir: &Path) -> Result<Option<String>> {
    let jinja = dir.join(CHAT_TEMPLATE_FILE);
    if jinja.is_file() {
        return read_text(&jinja).map(Some);
    }
    let config_path = dir.join(TOKENIZER_CONFIG);
    if !config_path.is_file() {
        return Ok(None);
    }
    let config = read_json_file(&config_path)?;
    let bad = |what: String| CheckpointError::Config {
        path: config_path.clone(),
        key: "chat_template".to_string(),
        what,
    };
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            for (i, entry) in list.iter().enumerate() {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                let (Some(name), Some(template)) = (name, template) else {
                    return Err(bad(format!(
                        "entry {i} is not {{\"name\": .., \"template\": ..}}"
                    )));
                };
                if name == "default" {
                    return Ok(Some(template.to_string()));
                }
            }
            Ok(None)
        }
        Some(other) => Err(bad(format!("expected a string or a list of templates, found {other}"))),
    }
}

fn read_text(path: &Path) -> Result<String> {
    let len = std::fs::metadata(path).map_err(|e| CheckpointError::io(path, e))?.len();
    if len > MAX_JSON_BYTES {
        return Err(CheckpointError::ChatTemplate(format!(
            "{}: {len} bytes is over the {MAX_JSON_BYTES}-byte limit",
            path.display()
        )));
    }
    std::fs::read_to_string(path).map_err(|e| CheckpointError::io(path, e))
}
