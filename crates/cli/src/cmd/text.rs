//! Text in and out for the CLI: the checkpoint's tokenizer, its chat template, the tokens that
//! end a reply, and the streaming detokenizer. Shared by `run` and `export`.

use std::path::Path;

use anyhow::{Context, Result};
use tf_checkpoint::Checkpoint;
use tf_tokenizer::{ChatMessage, ChatRequest, ChatTemplate, DecodeStream, TextCodec};

pub struct Text {
    pub codec: TextCodec,
    pub template: Option<ChatTemplate>,
    /// Any of these ends a reply: the spec's eos ids and the tokenizer's eos.
    pub stop_tokens: Vec<u32>,
}

impl Text {
    pub fn load(ckpt: &Checkpoint) -> Result<Self> {
        let codec = TextCodec::from_source(&ckpt.tokenizer).context("building the tokenizer")?;
        let template = match &ckpt.chat_template {
            Some(src) => Some(codec.chat_template(src).context("compiling the chat template")?),
            None => None,
        };
        let mut stop_tokens = ckpt.spec.special.eos.clone();
        stop_tokens.extend(codec.eos_id());
        stop_tokens.sort_unstable();
        stop_tokens.dedup();
        Ok(Text { codec, template, stop_tokens })
    }

    /// Token ids of a prompt: rendered through the chat template (as HF
    /// `apply_chat_template(add_generation_prompt=True)`, encoded without added specials), or
    /// encoded as plain text with the tokenizer's own specials.
    pub fn prompt_ids(&self, prompt: &str, chat: bool, system: Option<&str>) -> Result<Vec<u32>> {
        if !chat {
            return Ok(self.codec.encode(prompt, true)?);
        }
        let template = self.template.as_ref().context(
            "--chat: this checkpoint has no chat template (run without --chat for plain text)",
        )?;
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(ChatMessage::new("system", s));
        }
        messages.push(ChatMessage::new("user", prompt));
        let req = ChatRequest { messages, add_generation_prompt: true, ..Default::default() };
        let rendered = template.render(&req)?;
        Ok(self.codec.encode(&rendered, false)?)
    }

    pub fn detokenizer(&self) -> Detok<'_> {
        Detok { codec: &self.codec, stream: DecodeStream::new(true) }
    }
}

/// Streams text for output tokens; never cuts a UTF-8 sequence.
pub struct Detok<'a> {
    codec: &'a TextCodec,
    stream: DecodeStream,
}

impl Detok<'_> {
    pub fn push(&mut self, id: u32) -> String {
        self.stream.step(self.codec, id).unwrap_or_default()
    }

    pub fn finish(&mut self) -> String {
        self.stream.finish(self.codec).unwrap_or_default()
    }
}

/// Writes `tokenizer.json` and `tokenizer_config.json` (with the chat template) into `dir`.
pub fn export_tokenizer(ckpt: &Checkpoint, dir: &Path) -> Result<()> {
    let codec = TextCodec::from_source(&ckpt.tokenizer)?;
    std::fs::write(dir.join("tokenizer.json"), codec.to_tokenizer_json()?)?;
    let config = codec.to_tokenizer_config(ckpt.chat_template.as_deref());
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&config)?)?;
    Ok(())
}
