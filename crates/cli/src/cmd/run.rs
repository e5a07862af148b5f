//! `tensorfold run`: one prompt, streamed reply, then one line of figures.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tf_backend::Backend;
use tf_checkpoint::Checkpoint;
use tf_engine::family::{self, LoadOptions};
use tf_engine::generate::{GenRequest, Generator, BLOCK_SIZE};
use tf_engine::{Sampler, SamplingParams};

use crate::cmd::text::Text;
use crate::device::{with_backend, DeviceArgs, OnDevice, WithBackend};

#[derive(Args)]
pub struct RunArgs {
    /// A GGUF file or an HF checkpoint directory (default: the fetched test model).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// The prompt text.
    #[arg(short, long)]
    pub prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling mass (1 is off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep the k most likely tokens (0 is off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Drop tokens below min_p times the top probability (0 is off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// HF repetition penalty (1 is off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Seed of the sampler: the same seed gives the same tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Context length to reserve (default: the model's, at most 8192).
    #[arg(long)]
    pub context: Option<usize>,
    #[command(flatten)]
    pub dev: DeviceArgs,
    /// Print the token ids of prompt and reply as JSON after the reply.
    #[arg(long)]
    pub print_ids: bool,
}

pub fn run(a: RunArgs) -> Result<()> {
    let dev = a.dev;
    with_backend(&dev, a)
}

impl WithBackend for RunArgs {
    type Out = ();
    fn run<B: Backend + 'static>(self, dev: &OnDevice<B>) -> Result<()> {
        run_on(self, dev.backend()?)
    }
}

fn run_on<B: Backend + 'static>(a: RunArgs, backend: B) -> Result<()> {
    let path = crate::model_path::resolve(a.model.clone())?;
    let ckpt = Checkpoint::open(&path)?;
    let text = Text::load(&ckpt)?;
    let prompt_ids = text.prompt_ids(&a.prompt, a.chat, a.system.as_deref())?;
    let context = a.context.unwrap_or(ckpt.spec.max_position_embeddings.min(8192));
    let rows = 512;
    let model =
        family::load(&ckpt, backend, LoadOptions { max_rows: rows, max_positions: context })
            .with_context(|| format!("loading {}", path.display()))?;
    let mut gen = Generator::new(model, context.div_ceil(BLOCK_SIZE))?;
    let params = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
        ..Default::default()
    };
    let req = GenRequest {
        prompt: &prompt_ids,
        max_tokens: a.max_tokens,
        sampler: Sampler::new(params)?,
        stop_tokens: &text.stop_tokens,
        chunk: rows,
    };
    let mut detok = text.detokenizer();
    let mut stdout = std::io::stdout();
    let stops = text.stop_tokens.clone();
    let (out, stats) = gen.generate_tokens(&req, &mut |tok| {
        if stops.contains(&tok) {
            return false;
        }
        let piece = detok.push(tok);
        let _ = stdout.write_all(piece.as_bytes());
        let _ = stdout.flush();
        true
    })?;
    let rest = detok.finish();
    print!("{rest}");
    println!();
    if a.print_ids {
        println!("{}", serde_json::json!({"prompt_ids": prompt_ids, "output_ids": out}));
    }
    eprintln!(
        "prompt {} tokens, {:.1} tok/s | decode {} tokens, {:.1} tok/s | ttft {:.1} ms | finish {:?}",
        stats.prompt_tokens,
        stats.prompt_tok_per_s(),
        stats.output_tokens,
        stats.decode_tok_per_s(),
        stats.time_to_first_token.as_secs_f64() * 1e3,
        stats.finish
    );
    Ok(())
}
