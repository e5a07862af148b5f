//! `tensorfold bench`: prompt processing (pp) and token generation (tg) speed, llama-bench
//! style: a prompt of `--pp` fixed pseudo-random tokens prefilled in chunks of `--chunk` rows
//! (one chunk up to 2,048 tokens by default), then `--tg` tokens decoded one row at a time
//! (end-of-sequence ignored), greedy unless sampling options are given (then each token is
//! chosen where the logits are, with its penalties: the served path's cost). Prints one JSON line per repetition (with the first
//! generated token ids, so runs of other chunkings can be compared) so scripts
//! (tools/bench_cpu.py) can set it beside a peer measured in the same run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use tf_backend::Backend;
use tf_checkpoint::Checkpoint;
use tf_engine::family::{self, LoadOptions};
use tf_engine::generate::{GenRequest, Generator, BLOCK_SIZE};
use tf_engine::{Sampler, SamplingParams};

use super::plan::MAX_STEP_ROWS;
use crate::device::{with_backend, DeviceArgs, OnDevice, WithBackend};

#[derive(Args)]
pub struct BenchArgs {
    /// A GGUF file or an HF checkpoint directory (default: the fetched test model).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Prompt tokens to prefill.
    #[arg(long, default_value_t = 512)]
    pub pp: usize,
    /// Tokens to decode.
    #[arg(long, default_value_t = 128)]
    pub tg: usize,
    /// Repetitions (each prints a line).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// KV pool capacity in positions (default: pp + tg). A serving-sized pool (`tensorfold
    /// plan` prints one) measures decode as `serve` runs it: some kernels size their grids by
    /// the pool.
    #[arg(long)]
    pub kv_positions: Option<usize>,
    /// Rows per prefill step, 1 to 8,192 (default: the prompt, at most 2,048). The model's
    /// activations are sized for it; the tokens do not depend on it.
    #[arg(long)]
    pub chunk: Option<usize>,
    /// Sampling temperature of the decoded tokens (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches this.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// HF's repetition penalty over the prompt's and output's tokens (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty over the output's tokens (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty over the output's tokens (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Seed of the sampled tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub dev: DeviceArgs,
}

impl BenchArgs {
    fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..Default::default()
        }
    }
}

pub fn run(a: BenchArgs) -> Result<()> {
    let dev = a.dev;
    with_backend(&dev, a)
}

impl WithBackend for BenchArgs {
    type Out = ();
    fn run<B: Backend + 'static>(self, dev: &OnDevice<B>) -> Result<()> {
        run_on(self, dev.backend()?)
    }
}

fn run_on<B: Backend + 'static>(a: BenchArgs, backend: B) -> Result<()> {
    // Refused before the model loads (a bad value names its option).
    let sampler = Sampler::new(a.sampling())?;
    let path = crate::model_path::resolve(a.model.clone())?;
    let t0 = Instant::now();
    let ckpt = Checkpoint::open(&path)?;
    let vocab = ckpt.spec.vocab_size as u64;
    let context = (a.pp + a.tg).max(1);
    let pool = a.kv_positions.unwrap_or(context);
    if pool < context {
        anyhow::bail!("--kv-positions {pool} is below --pp + --tg = {context}");
    }
    let rows = match a.chunk {
        Some(c) if !(1..=MAX_STEP_ROWS).contains(&c) => {
            anyhow::bail!("--chunk {c} is outside 1..={MAX_STEP_ROWS}")
        }
        Some(c) => c.min(a.pp.max(1)),
        None => a.pp.clamp(1, 2048),
    };
    let model =
        family::load(&ckpt, backend, LoadOptions { max_rows: rows, max_positions: context })?;
    let mut gen = Generator::new(model, pool.div_ceil(BLOCK_SIZE))?;
    let load_s = t0.elapsed().as_secs_f64();
    let prompt: Vec<u32> = (0..a.pp as u64).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    for rep in 0..a.reps {
        let req = GenRequest {
            prompt: &prompt,
            max_tokens: a.tg,
            sampler: sampler.clone(),
            stop_tokens: &[],
            chunk: rows,
        };
        let started = t0.elapsed();
        let (tokens, st) = gen.generate_tokens(&req, &mut |_| true)?;
        println!(
            "{}",
            serde_json::json!({
                "engine": "tensorfold",
                "model": path.display().to_string(),
                "rep": rep,
                "pp": a.pp,
                "tg": a.tg,
                "pp_tok_s": st.prompt_tok_per_s(),
                "tg_tok_s": st.decode_tok_per_s(),
                "load_s": load_s,
                "chunk": rows,
                "sampling": {
                    "temperature": shortest(a.temperature),
                    "top_p": shortest(a.top_p),
                    "repetition_penalty": shortest(a.repetition_penalty),
                    "presence_penalty": shortest(a.presence_penalty),
                    "frequency_penalty": shortest(a.frequency_penalty),
                    "seed": a.seed,
                },
                "first_tokens": &tokens[..tokens.len().min(8)],
                // Every generated id, hashed (FNV-1a over their little-endian bytes), so runs
                // of other chunkings or switches can be compared whole.
                "tokens_fnv": format!("{:016x}", fnv1a(&tokens)),
                // Rep 0: from opening the checkpoint to its first token (kernel compilation
                // included unless the kernel cache holds them); null for the others.
                "first_token_s": (rep == 0)
                    .then(|| (started + st.time_to_first_token).as_secs_f64()),
            })
        );
    }
    Ok(())
}

/// FNV-1a (64-bit) of the ids' little-endian bytes.
fn fnv1a(ids: &[u32]) -> u64 {
    ids.iter()
        .flat_map(|t| t.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The f64 whose shortest decimal is the f32's (1.3, not 1.2999999523162842).
fn shortest(v: f32) -> f64 {
    v.to_string().parse().unwrap_or(f64::from(v))
}
