//! `tensorfold serve [PATH]`: the OpenAI-compatible server. Opens and admits the checkpoint,
//! prints the memory plan (by default a share of `--device`'s memory) and refuses a
//! configuration that does not fit, loads the model onto the chosen backend, waits for the
//! backend's kernels (`Backend::ready`; CUDA: a cold start's NVRTC compiles, which began with
//! the backend and ran beside the weight upload) and refuses to serve when one failed to
//! compile, then moves the model to the engine thread and serves HTTP until SIGINT/SIGTERM.
//!
//! Why wait before listening: a server that answers while its kernels still compile keeps its
//! first requests waiting for them (16-22 s on fresh H100 machines before the compile units
//! were split, sessions 32-35; 8.1 s after, session 36), and a kernel that does not compile
//! would fail requests instead of the start.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tf_backend::Backend;
use tf_checkpoint::{admission, Checkpoint};
use tf_engine::family::{self, LoadOptions};
use tf_engine::serve::{EngineConfig, EngineHandle};
use tf_server::ServerConfig;

use crate::cmd::plan::{Sizing, BLOCK_SIZE};
use crate::cmd::text::Text;
use crate::device::{with_backend, DeviceArgs, OnDevice, WithBackend};

#[derive(Args)]
pub struct ServeArgs {
    /// A GGUF file or an HF checkpoint directory (default: the fetched test model).
    pub path: Option<PathBuf>,
    /// Address to bind (loopback by default; 0.0.0.0 exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 requests.
    #[arg(long)]
    pub api_key: Option<String>,
    /// A Jinja chat template file to use instead of the checkpoint's.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// The model id clients see (default: the checkpoint's file or directory name).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Requests waiting for a lane before new ones are refused with 429.
    #[arg(long, default_value_t = 256)]
    pub queue_limit: usize,
    #[command(flatten)]
    pub dev: DeviceArgs,
    #[command(flatten)]
    pub sizing: Sizing,
}

pub fn run(a: ServeArgs) -> Result<()> {
    let dev = a.dev;
    with_backend(&dev, a)
}

impl WithBackend for ServeArgs {
    type Out = ();
    fn run<B: Backend + 'static>(self, dev: &OnDevice<B>) -> Result<()> {
        serve(self, dev)
    }
}

fn serve<B: Backend + 'static>(a: ServeArgs, dev: &OnDevice<B>) -> Result<()> {
    let path = crate::model_path::resolve(a.path.clone())?;
    let ckpt = Checkpoint::open(&path)?;
    admission::admit(&ckpt)?;
    let mem = a.sizing.device_memory(dev.device(), || Ok(dev.memory()?))?;
    let plan = a.sizing.plan(&ckpt, &mem)?;
    let context = a.sizing.context_for(&ckpt)?;
    eprint!(
        "memory plan on {} (context {context}, parallel {}):\n{}\n{}",
        dev.device(),
        a.sizing.parallel,
        plan.describe(),
        a.sizing.default_note(&mem)
    );
    if !plan.fits() {
        bail!("the memory plan does not fit: lower --context, --parallel or --prompt-cache-gib, or raise --mem-limit");
    }
    let mut text = Text::load(&ckpt)?;
    if let Some(f) = &a.chat_template {
        let src = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        text.template = Some(text.codec.chat_template(&src).context("compiling --chat-template")?);
    }
    let model_id = a.model_id.clone().unwrap_or_else(|| {
        path.file_name().map_or("model".into(), |n| n.to_string_lossy().into_owned())
    });
    let rows = a.sizing.max_rows;
    let model =
        family::load(&ckpt, dev.backend()?, LoadOptions { max_rows: rows, max_positions: context })
            .with_context(|| format!("loading {}", path.display()))?;
    let t = Instant::now();
    model.backend().ready().context("the model cannot be served on this device")?;
    let waited = t.elapsed().as_secs_f64();
    if waited >= 0.5 {
        eprintln!(
            "kernels ready after {waited:.1} s more (compiled once per machine, then read from the cache)"
        );
    }
    let engine = EngineHandle::start(
        model,
        EngineConfig {
            model_id: model_id.clone(),
            parallel: a.sizing.parallel,
            context,
            max_rows: rows,
            prefill_chunk: rows,
            queue_limit: a.queue_limit,
            block_size: BLOCK_SIZE,
            total_blocks: plan.total_blocks(),
            cache_blocks: plan.cache_blocks,
        },
    )?;
    let mut cfg =
        ServerConfig::new(model_id, Arc::new(text.codec), text.template, text.stop_tokens);
    cfg.host = a.host;
    cfg.port = a.port;
    cfg.api_key = a.api_key.clone();
    let url = format!("http://{}:{}", a.host, a.port);
    eprintln!("serving {} at {url}/v1 (Ctrl-C to stop)", path.display());
    eprintln!(
        "try: curl {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"What is the capital of France?\"}}]}}'"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(tf_server::serve(cfg, engine))?;
    eprintln!("server stopped");
    Ok(())
}
