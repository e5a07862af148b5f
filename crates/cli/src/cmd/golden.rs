//! `tensorfold golden`: greedy generations of a prompt set, as JSON, with each step's top-2
//! contenders. The engine side of `tools/reference/compare_greedy.py` (against HF
//! transformers) and the source of committed goldens.
//!
//! Output: `{model, max_new_tokens, prompts: [{name, messages, prompt_ids, tokens, text, stop,
//! sha256, steps: [{top: [[id, logit], [id, logit]]}]}]}`; `tokens` ends with the stop token
//! when one was produced, as `hf_greedy.py` records it; `name` is the prompt's (null if it has
//! none); `sha256` is the hex SHA-256 of `tokens` as consecutive little-endian u32 (one line
//! that identifies a generation; the committed goldens under `tests/fixtures/golden/` and
//! their declared-differences list key on it).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tf_backend::Backend;
use tf_checkpoint::Checkpoint;
use tf_engine::family::{self, LoadOptions};
use tf_engine::generate::{FinishReason, GenRequest, Generator, BLOCK_SIZE};
use tf_engine::{Sampler, SamplingParams};
use tf_tokenizer::{ChatMessage, ChatRequest};

use crate::cmd::text::Text;
use crate::device::{with_backend, DeviceArgs, OnDevice, WithBackend};

#[derive(Args)]
pub struct GoldenArgs {
    /// A GGUF file or an HF checkpoint directory (default: the fetched test model).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// JSON `{prompts: [{messages: [{role, content}]}]}`.
    #[arg(long)]
    pub prompts: PathBuf,
    /// Tokens to generate per prompt (fewer if a stop token comes first).
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Where to write the JSON (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub dev: DeviceArgs,
}

#[derive(serde::Deserialize)]
struct PromptSet {
    prompts: Vec<PromptEntry>,
}

#[derive(serde::Deserialize)]
struct PromptEntry {
    #[serde(default)]
    name: Option<String>,
    messages: Vec<ChatMessage>,
}

/// Top two (id, logit) of a row, ties to the lower id.
fn top2(logits: &[f32]) -> [(u32, f32); 2] {
    let mut best = [(0u32, f32::NEG_INFINITY), (0u32, f32::NEG_INFINITY)];
    for (i, &v) in logits.iter().enumerate() {
        if v > best[0].1 {
            best[1] = best[0];
            best[0] = (i as u32, v);
        } else if v > best[1].1 {
            best[1] = (i as u32, v);
        }
    }
    best
}

/// Hex SHA-256 of token ids as consecutive little-endian u32.
fn tokens_sha256(tokens: &[u32]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

pub fn run(a: GoldenArgs) -> Result<()> {
    let dev = a.dev;
    with_backend(&dev, a)
}

impl WithBackend for GoldenArgs {
    type Out = ();
    fn run<B: Backend + 'static>(self, dev: &OnDevice<B>) -> Result<()> {
        run_on(self, dev.backend()?)
    }
}

fn run_on<B: Backend + 'static>(a: GoldenArgs, backend: B) -> Result<()> {
    let path = crate::model_path::resolve(a.model.clone())?;
    let set: PromptSet = serde_json::from_slice(
        &std::fs::read(&a.prompts).with_context(|| format!("reading {}", a.prompts.display()))?,
    )
    .with_context(|| format!("parsing {}", a.prompts.display()))?;
    let ckpt = Checkpoint::open(&path)?;
    let text = Text::load(&ckpt)?;
    let template = text.template.as_ref().context("the checkpoint has no chat template")?;
    let context = 4096.min(ckpt.spec.max_position_embeddings);
    let model =
        family::load(&ckpt, backend, LoadOptions { max_rows: 256, max_positions: context })?;
    let mut gen = Generator::new(model, context.div_ceil(BLOCK_SIZE))?;
    let mut out = Vec::new();
    for p in &set.prompts {
        let req = ChatRequest {
            messages: p.messages.clone(),
            add_generation_prompt: true,
            ..Default::default()
        };
        let prompt_ids = text.codec.encode(&template.render(&req)?, false)?;
        let mut tokens = Vec::new();
        let mut steps = Vec::new();
        let greq = GenRequest {
            prompt: &prompt_ids,
            max_tokens: a.max_tokens,
            sampler: Sampler::new(SamplingParams::default())?,
            stop_tokens: &text.stop_tokens,
            chunk: 256,
        };
        let (_, stats) = gen.generate(&greq, &mut |tok, logits| {
            let t = top2(logits);
            steps.push(serde_json::json!({"top": [[t[0].0, t[0].1], [t[1].0, t[1].1]]}));
            tokens.push(tok);
            true
        })?;
        let reply = text.codec.decode(&tokens, true)?;
        out.push(serde_json::json!({
            "name": p.name,
            "messages": p.messages,
            "prompt_ids": prompt_ids,
            "tokens": tokens,
            "text": reply,
            "stop": if stats.finish == FinishReason::Stop { "eos" } else { "length" },
            "sha256": tokens_sha256(&tokens),
            "steps": steps,
        }));
    }
    let doc = serde_json::json!({
        "model": path.display().to_string(),
        "engine": "tensorfold",
        "max_new_tokens": a.max_tokens,
        "prompts": out,
    });
    let s = serde_json::to_string_pretty(&doc)? + "\n";
    match &a.out {
        Some(p) => std::fs::write(p, s).with_context(|| format!("writing {}", p.display()))?,
        None => crate::cmd::print_out(&s),
    }
    Ok(())
}
