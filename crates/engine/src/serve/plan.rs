//! The memory plan: one budget split into weights, KV for `context x parallel`, the prompt
//! cache and activations, computed from the spec and the checkpoint's sizes before any weight
//! is read. `tensorfold plan` prints it; `serve` refuses a configuration that does not fit,
//! with the numbers, instead of running out of memory later.

use tf_checkpoint::ModelSpec;

const GIB: f64 = (1u64 << 30) as f64;

/// Inputs of a plan.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    pub weight_bytes: usize,
    pub context: usize,
    pub parallel: usize,
    pub prompt_cache_bytes: usize,
    /// Rows of one step (activation buffers are sized for it).
    pub max_rows: usize,
    pub block_size: usize,
    /// The whole budget.
    pub mem_limit: usize,
}

/// Where the budget goes.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    pub weight_bytes: usize,
    pub kv_bytes_per_token: usize,
    /// Blocks reserved for `parallel` sequences of `context` tokens.
    pub lane_blocks: usize,
    /// Extra blocks the prompt cache may keep.
    pub cache_blocks: usize,
    pub kv_bytes: usize,
    pub cache_bytes: usize,
    pub activation_bytes: usize,
    pub total: usize,
    pub mem_limit: usize,
}

impl MemoryPlan {
    pub fn fits(&self) -> bool {
        self.total <= self.mem_limit
    }

    pub fn total_blocks(&self) -> usize {
        self.lane_blocks + self.cache_blocks
    }

    /// A human-readable table, one line per item.
    pub fn describe(&self) -> String {
        let g = |b: usize| format!("{:8.3} GiB", b as f64 / GIB);
        format!(
            "weights          {}\nKV (lanes)       {}  ({} blocks, {} bytes/token)\nprompt cache     {}  ({} blocks)\nactivations      {}\ntotal            {}\nlimit            {}  ({})",
            g(self.weight_bytes),
            g(self.kv_bytes),
            self.lane_blocks,
            self.kv_bytes_per_token,
            g(self.cache_bytes),
            self.cache_blocks,
            g(self.activation_bytes),
            g(self.total),
            g(self.mem_limit),
            if self.fits() { "fits" } else { "DOES NOT FIT" }
        )
    }
}

/// KV bytes of one token over all layers (bf16 K and V).
pub fn kv_bytes_per_token(spec: &ModelSpec) -> usize {
    2 * spec.num_hidden_layers * spec.kv_dim() * 2
}

pub fn plan(spec: &ModelSpec, r: &PlanRequest) -> MemoryPlan {
    let per_token = kv_bytes_per_token(spec);
    let block_bytes = per_token * r.block_size;
    let lane_blocks = r.parallel * r.context.div_ceil(r.block_size);
    let cache_blocks = r.prompt_cache_bytes / block_bytes.max(1);
    let kv_bytes = lane_blocks * block_bytes;
    let cache_bytes = cache_blocks * block_bytes;
    // Per row: hidden-size buffers, q/k/v/attn, three intermediate buffers (bf16) and f32
    // logits.
    let per_row = 2 * (3 * spec.hidden_size + 2 * spec.q_dim() + 2 * spec.kv_dim())
        + 2 * 3 * spec.intermediate_size
        + 4 * spec.vocab_size;
    let activation_bytes = r.max_rows * per_row;
    let total = r.weight_bytes + kv_bytes + cache_bytes + activation_bytes;
    MemoryPlan {
        weight_bytes: r.weight_bytes,
        kv_bytes_per_token: per_token,
        lane_blocks,
        cache_blocks,
        kv_bytes,
        cache_bytes,
        activation_bytes,
        total,
        mem_limit: r.mem_limit,
    }
}

/// Physical memory of this machine from `/proc/meminfo`, if readable.
pub fn host_memory_bytes() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The default budget: 75% of host memory (CPU backend), or 8 GiB if unknown.
pub fn default_mem_limit() -> usize {
    host_memory_bytes().map_or(8 << 30, |m| m / 4 * 3)
}
