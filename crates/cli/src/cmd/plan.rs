//! `tensorfold plan`: the memory plan for serving a checkpoint, printed before anything loads.
//! `serve` uses the same sizing and refuses to start when the plan does not fit. The default
//! budget is a stated share of the chosen device's memory (`crate::device::DeviceMemory`):
//! RAM for `--device cpu`, the GPU's memory for `--device cuda`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use tf_checkpoint::{admission, Checkpoint};
use tf_engine::serve::plan::{self, MemoryPlan, PlanRequest};

use crate::device::{self, Device, DeviceMemory};

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = 16;

/// Sizing flags shared by `plan` and `serve`.
#[derive(Args, Clone, Debug)]
pub struct Sizing {
    /// Longest prompt + completion per request, tokens (default: the model's, at most 8192).
    #[arg(long)]
    pub context: Option<usize>,
    /// Requests decoded at once (lanes).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Memory for reusable prompt KV (GiB); 0 turns the prompt cache off.
    #[arg(long, default_value_t = 1.0)]
    pub prompt_cache_gib: f64,
    /// The whole memory budget in GiB (default: 75% of the RAM with --device cpu, 90% of the
    /// GPU's memory with --device cuda).
    #[arg(long)]
    pub mem_limit: Option<f64>,
    /// Rows per engine step (prefill chunks and decode rows together).
    #[arg(long, default_value_t = 256)]
    pub max_rows: usize,
}

/// Most rows one engine step may take (`--max-rows`; bench's `--chunk`).
pub const MAX_STEP_ROWS: usize = 8192;

#[derive(Args)]
pub struct PlanArgs {
    /// A GGUF file or an HF checkpoint directory (default: the test model).
    pub path: Option<PathBuf>,
    #[command(flatten)]
    pub sizing: Sizing,
    /// The device the plan is for (its memory sets the default --mem-limit): cpu, cuda (the
    /// first GPU) or cuda:N (GPU ordinal N).
    #[arg(long, value_name = "cpu|cuda[:N]", default_value = "cpu", value_parser = device::parse_device)]
    pub device: Device,
}

fn gib(x: f64, what: &str) -> Result<usize> {
    if !(0.0..=1e6).contains(&x) {
        bail!("{what} = {x} GiB is not a valid size");
    }
    Ok((x * (1u64 << 30) as f64) as usize)
}

impl Sizing {
    /// The context actually used for `ckpt`.
    pub fn context_for(&self, ckpt: &Checkpoint) -> Result<usize> {
        let max = ckpt.spec.max_position_embeddings;
        let c = self.context.unwrap_or(max.min(8192));
        if c == 0 || c > max {
            bail!("--context {c} is outside 1..={max} (the model's max_position_embeddings)");
        }
        Ok(c)
    }

    /// The memory the default budget is a share of: read (by `read`) only when `--mem-limit`
    /// is not given, so that an explicit limit plans for a device this machine lacks.
    pub fn device_memory(
        &self,
        device: Device,
        read: impl FnOnce() -> Result<DeviceMemory>,
    ) -> Result<DeviceMemory> {
        match self.mem_limit {
            Some(_) => Ok(DeviceMemory { device, total: None }),
            None => read(),
        }
    }

    /// Where the default budget came from, as a line, when `--mem-limit` is not given.
    pub fn default_note(&self, mem: &DeviceMemory) -> String {
        match self.mem_limit {
            Some(_) => String::new(),
            None => format!("{}\n", mem.describe_default()),
        }
    }

    /// The plan for `ckpt` within `--mem-limit`, or by default within the share of `mem`.
    pub fn plan(&self, ckpt: &Checkpoint, mem: &DeviceMemory) -> Result<MemoryPlan> {
        if self.parallel == 0 || self.parallel > 1024 {
            bail!("--parallel {} is outside 1..=1024", self.parallel);
        }
        if !(1..=MAX_STEP_ROWS).contains(&self.max_rows) {
            bail!("--max-rows {} is outside 1..={MAX_STEP_ROWS}", self.max_rows);
        }
        let mem_limit = match self.mem_limit {
            Some(g) => gib(g, "--mem-limit")?,
            None => mem.default_limit(),
        };
        let req = PlanRequest {
            weight_bytes: ckpt.weight_bytes(),
            context: self.context_for(ckpt)?,
            parallel: self.parallel,
            prompt_cache_bytes: gib(self.prompt_cache_gib, "--prompt-cache-gib")?,
            max_rows: self.max_rows,
            block_size: BLOCK_SIZE,
            mem_limit,
        };
        Ok(plan::plan(&ckpt.spec, &req))
    }
}

pub fn run(a: PlanArgs) -> Result<()> {
    let path = crate::model_path::resolve(a.path)?;
    let ckpt = Checkpoint::open(&path)?;
    admission::admit(&ckpt)?;
    let mem = a.sizing.device_memory(a.device, || device::memory(a.device))?;
    let p = a.sizing.plan(&ckpt, &mem)?;
    let context = a.sizing.context_for(&ckpt)?;
    crate::cmd::print_out(&format!(
        "plan for {} on {} (context {context}, parallel {})\n{}\n{}",
        path.display(),
        a.device,
        a.sizing.parallel,
        p.describe(),
        a.sizing.default_note(&mem)
    ));
    if !p.fits() {
        bail!("the plan needs {} bytes but the limit is {} bytes: lower --context, --parallel or --prompt-cache-gib, or raise --mem-limit", p.total, p.mem_limit);
    }
    Ok(())
}
