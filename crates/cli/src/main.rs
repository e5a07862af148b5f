//! The `tensorfold` command line: one subcommand per file under `cmd/`.
//!
//! `anyhow` lives here only; library crates return typed errors, which this binary prints
//! with their context and turns into exit code 1 (2 for usage errors, from clap).

mod cmd;
mod device;
mod model_path;

use clap::{Parser, Subcommand};

/// tensorfold: exact LLM inference at full speed.
///
/// Serves Hugging Face checkpoints as published (bf16 safetensors, GGUF) with the same tokens
/// whether a request runs alone or batched, cached or fresh.
#[derive(Parser)]
#[command(name = "tensorfold", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API (chat and text completions, streaming) on a model.
    Serve(cmd::serve::ServeArgs),
    /// Generate a reply to one prompt and print it as it streams, then the speed line.
    Run(cmd::run::RunArgs),
    /// Print a checkpoint's spec and whether it is admitted, without loading weights.
    Info(cmd::info::InfoArgs),
    /// Print the memory plan (weights, KV, prompt cache) for serving, without loading weights.
    Plan(cmd::plan::PlanArgs),
    /// Write a GGUF checkpoint as an HF-layout bf16 checkpoint directory.
    Export(cmd::export::ExportArgs),
    /// Measure prompt and decode speed (llama-bench style), one JSON line per repetition.
    Bench(cmd::bench::BenchArgs),
    /// Greedy generations of a prompt set as JSON, with each step's top-2 logits.
    Golden(cmd::golden::GoldenArgs),
    /// Teacher-forced fidelity judge against an HF reference: KL, top-1, near-tie verdicts.
    Judge(cmd::judge::JudgeArgs),
    /// Exactness checks (`check exact`): bit-for-bit comparisons with planted controls.
    Check(cmd::check::CheckArgs),
    /// The kernel contract: every op at each served geometry against float64 bounds, row
    /// invariance over 1..2,048-row calls, compile and limit gates, with planted controls.
    Contract(cmd::contract::ContractArgs),
    /// Write a seeded random-weight bf16 HF checkpoint at a known model's geometry.
    Synth(cmd::synth::SynthArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Serve(a) => cmd::serve::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Golden(a) => cmd::golden::run(a),
        Command::Judge(a) => cmd::judge::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Contract(a) => cmd::contract::run(a),
        Command::Synth(a) => cmd::synth::run(a),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
