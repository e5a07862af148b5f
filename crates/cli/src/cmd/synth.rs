//! `tensorfold synth --like GEOMETRY --seed S --out DIR`: an HF-layout bf16 llama checkpoint
//! with seeded random weights at a published model's geometry, which tensorfold and HF
//! transformers both load. This is how large geometries are tested on machines that have no
//! network: the weights are generated there, only the binary (and a 1.6 MB tokenizer) travel.
//!
//! Written: `config.json` (every `LlamaConfig` key the geometry sets, transformers 4 and 5
//! spellings of the dtype), `generation_config.json`, `model.safetensors` or 5 GB shards with
//! `model.safetensors.index.json`, `tokenizer.json` (a real tokenizer padded with special
//! tokens to the vocabulary, see `synth/tokenizer.rs`) and `tokenizer_config.json` with the
//! chat template. Stale weight files of an earlier run in DIR are removed first, so a
//! directory never mixes two runs' shards.
//!
//! Invariants: the output is a pure function of (geometry, layers, seed, tokenizer source):
//! same arguments, same bytes, whatever the thread count (`synth/weights.rs` says how).
//! Rejected: copying a real model's weights (needs the network and the weights' licences) and
//! all-constant weights (a forward pass of those cannot catch a mixed-up row or head).

mod tokenizer;
mod weights;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Value as Json};

/// Geometries `--like` can copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Like {
    /// SmolLM2-135M-Instruct: hidden 576, 30 layers, 9/3 heads of 64, vocab 49,152, tied.
    #[value(name = "smollm2")]
    Smollm2,
    /// Llama-3.1-8B: hidden 4,096, 32 layers, 32/8 heads of 128, vocab 128,256, llama3 RoPE.
    #[value(name = "llama3-8b")]
    Llama3_8b,
    /// A Nanbeige 33B-class llama: hidden 7,168, 52 layers, 56/8 heads of 128, vocab 166,912.
    #[value(name = "nanbeige-33b")]
    Nanbeige33b,
}

/// The shape of a llama checkpoint, and the config values that go with it.
#[derive(Clone, Debug)]
pub struct Geometry {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub tied: bool,
    pub rope_theta: f64,
    /// `rope_scaling` as the real config.json writes it, or null.
    pub rope_scaling: Json,
    pub rms_norm_eps: f64,
    pub max_positions: usize,
}

impl Like {
    pub fn geometry(self) -> Geometry {
        match self {
            // HuggingFaceTB/SmolLM2-135M-Instruct config.json.
            Like::Smollm2 => Geometry {
                hidden: 576,
                intermediate: 1536,
                layers: 30,
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                vocab: 49152,
                tied: true,
                rope_theta: 100_000.0,
                rope_scaling: Json::Null,
                rms_norm_eps: 1e-5,
                max_positions: 8192,
            },
            // meta-llama/Llama-3.1-8B config.json.
            Like::Llama3_8b => Geometry {
                hidden: 4096,
                intermediate: 14336,
                layers: 32,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                vocab: 128_256,
                tied: false,
                rope_theta: 500_000.0,
                rope_scaling: json!({
                    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
                }),
                rms_norm_eps: 1e-5,
                max_positions: 131_072,
            },
            // The geometry of issue 6 (~62 GiB of bf16 weights). No public config was found:
            // rms_norm_eps 1e-5 is what every published Nanbeige config.json uses
            // (Nanbeige2-8B/16B); rope_theta 1e6 with 32k positions is the common choice of
            // recent long-context llama-style models (Qwen2.5, Yi-1.5).
            Like::Nanbeige33b => Geometry {
                hidden: 7168,
                intermediate: 22016,
                layers: 52,
                heads: 56,
                kv_heads: 8,
                head_dim: 128,
                vocab: 166_912,
                tied: false,
                rope_theta: 1_000_000.0,
                rope_scaling: Json::Null,
                rms_norm_eps: 1e-5,
                max_positions: 32_768,
            },
        }
    }
}

/// Write a seeded random-weight bf16 checkpoint at a known model's geometry.
///
/// The tokenizer comes from --tokenizer-from (default: the fetched test model, whose
/// SmolLM2 vocabulary is padded with `<|synth_pad_ID|>` special tokens to the geometry's
/// vocabulary). On a machine without the test model, carry the tokenizer.json and
/// tokenizer_config.json of any `synth --like smollm2` output (1.6 MB) in a directory and pass
/// that directory.
#[derive(Args)]
pub struct SynthArgs {
    /// The geometry to copy.
    #[arg(long, value_enum)]
    pub like: Like,
    /// Seed of the weights: the same seed gives the same bytes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory (created; earlier weight files in it are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// Number of layers instead of the geometry's (for quick tests).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Tokenizer source: a GGUF file, an HF directory with tokenizer.json (and
    /// tokenizer_config.json), or a tokenizer.json file (default: the fetched test model).
    #[arg(long)]
    pub tokenizer_from: Option<PathBuf>,
    /// Threads generating weights (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Spread the shard files round-robin over these directories (repeat the flag) and put
    /// symbolic links to them in --out: for a checkpoint no single filesystem holds, e.g.
    /// `--shard-dir /dev/shm/x --shard-dir /tmp/x` for the 62 GiB nanbeige-33b geometry.
    #[arg(long = "shard-dir")]
    pub shard_dirs: Vec<PathBuf>,
}

pub fn run(a: SynthArgs) -> Result<()> {
    let start = Instant::now();
    let mut g = a.like.geometry();
    if let Some(l) = a.layers {
        if l == 0 {
            bail!("--layers must be at least 1");
        }
        g.layers = l;
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    remove_stale_weights(&a.out)?;
    let source = crate::model_path::resolve(a.tokenizer_from.clone())?;
    let tok = tokenizer::write(&source, g.vocab, &a.out)?;
    eprintln!(
        "synth: tokenizer from {} ({} ids, padded to {})",
        source.display(),
        tok.source_vocab,
        g.vocab
    );
    write_json(&a.out.join("config.json"), &config_json(&g, &tok))?;
    let gen = json!({"bos_token_id": tok.bos, "eos_token_id": tok.eos,
                     "pad_token_id": tok.pad, "do_sample": false});
    write_json(&a.out.join("generation_config.json"), &gen)?;

    let tensors = weights::plan_tensors(&g);
    let shards = weights::plan_shards(&tensors, weights::MAX_SHARD_BYTES);
    if shards.len() > 1 {
        write_json(
            &a.out.join("model.safetensors.index.json"),
            &weights::index_json(&tensors, &shards),
        )?;
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.unwrap_or(0))
        .build()
        .context("starting the writer threads")?;
    for d in &a.shard_dirs {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let dirs = weights::ShardDirs { out: &a.out, spread: &a.shard_dirs };
    let bytes = pool.install(|| weights::write_shards(&dirs, a.seed, &tensors, &shards))?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "wrote {}: {} tensors in {} file(s), {bytes} bytes ({:.2} GiB) in {secs:.1}s ({:.2} GB/s)",
        a.out.display(),
        tensors.len(),
        shards.len(),
        bytes as f64 / (1u64 << 30) as f64,
        bytes as f64 / 1e9 / secs.max(1e-9)
    );
    Ok(())
}

/// `config.json` for `LlamaForCausalLM` at geometry `g`.
fn config_json(g: &Geometry, tok: &tokenizer::SynthTokenizer) -> Json {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": g.hidden,
        "intermediate_size": g.intermediate,
        "num_hidden_layers": g.layers,
        "num_attention_heads": g.heads,
        "num_key_value_heads": g.kv_heads,
        "head_dim": g.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": g.rms_norm_eps,
        "rope_theta": g.rope_theta,
        "rope_scaling": g.rope_scaling,
        "max_position_embeddings": g.max_positions,
        "vocab_size": g.vocab,
        "tie_word_embeddings": g.tied,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "use_cache": true,
        "bos_token_id": tok.bos,
        "eos_token_id": tok.eos,
        "pad_token_id": tok.pad,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    })
}

fn write_json(path: &Path, v: &Json) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// Removes `model.safetensors`, `model-*-of-*.safetensors` (and their `.part` leftovers) and
/// the index from `dir`: readers prefer a single file to an index, so a stale one would win.
/// Symbolic links of an earlier `--shard-dir` run are removed too (not what they point to).
fn remove_stale_weights(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let base = name.strip_suffix(".part").unwrap_or(name);
        let shard = base.starts_with("model-") && base.contains("-of-");
        let stale = base == "model.safetensors"
            || base == "model.safetensors.index.json"
            || (shard && base.ends_with(".safetensors"));
        if stale && entry.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()) {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}
