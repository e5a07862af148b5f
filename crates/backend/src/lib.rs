//! The backend op set: what a model family may ask of a device.
//!
//! A family's forward pass is written against [`Backend`]; `cpu` implements it now and `cuda`
//! will implement the same trait. The op set is designed for a device from the start:
//! - activations and weights live in backend-owned buffers (`Tensor`, `Weight`); the host sees
//!   values only through `read_*`;
//! - ops are issued in order on one queue (the CPU runs them as issued; CUDA will enqueue them
//!   on one stream), and `synchronize` waits for all of them;
//! - one call carries many rows from several sequences: a [`BatchMeta`] lists each row's
//!   token, sequence and absolute position, and each sequence's block table into the paged KV
//!   pool, so a prefill chunk and decode rows of other requests share every op.
//!
//! **The kernel contract** (DESIGN.md §1): every op's result for a row depends only on that
//! row's inputs (and its own sequence's KV), never on how many rows share the call or which.
//! Reduction orders are fixed by the weight shape and absolute positions alone.
//!
//! Activations are bf16 (`ActDType::Bf16`) at the rounding points of HF modeling_llama;
//! logits are returned as f32 holding bf16-rounded values, as HF's `logits.float()` does.

pub mod batch;
pub mod contract;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod f64ref;
pub mod penalty;
pub mod sample;

pub use batch::{BatchMeta, KvGeometry, SeqMeta};
pub use error::{BackendError, Result};
use tf_checkpoint::TensorView;

/// Element type of an activation buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActDType {
    Bf16,
    F32,
}

/// The op set. Shapes are `(rows, cols)`, row-major; "rows" are tokens of the batch.
pub trait Backend: Send {
    /// Activation buffer `(rows, cols)`; may be reused with fewer rows than it was made for.
    type Tensor: Send;
    /// A weight (matrix `(N, K)` or vector) resident on the device.
    type Weight: Send + Sync;
    /// Paged KV pool of every layer.
    type Kv: Send;
    /// Per-step metadata resident on the device.
    type Batch: Send;

    fn name(&self) -> String;

    /// Makes a checkpoint tensor usable by ops. The CPU keeps a view of the mapped file
    /// (quantized blocks are computed in place); a GPU copies it up once.
    fn load_weight(&self, view: &TensorView) -> Result<Self::Weight>;

    /// An activation buffer of up to `max_rows` rows of `cols` columns.
    fn alloc(&self, dtype: ActDType, max_rows: usize, cols: usize) -> Result<Self::Tensor>;

    fn alloc_kv(&self, geom: &KvGeometry) -> Result<Self::Kv>;

    /// Validates and uploads one step's row metadata.
    fn prepare_batch(&self, meta: &BatchMeta) -> Result<Self::Batch>;

    /// `out[r] = table[token[r]]` as bf16, for every row of the batch.
    fn embed(
        &self,
        table: &Self::Weight,
        batch: &Self::Batch,
        out: &mut Self::Tensor,
    ) -> Result<()>;

    /// RMSNorm over groups of `group` columns (group = cols for a hidden state, head_dim for
    /// q/k norms): `bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))`, mean and rsqrt in fp32.
    fn rms_norm(&self, args: NormArgs<'_, Self>) -> Result<()>;

    /// `out = x @ w^T (+ bias)`: fp32 sums in a fixed order per weight shape, bias added in
    /// fp32, one rounding to `out`'s dtype.
    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        out: &mut Self::Tensor,
    ) -> Result<()>;

    /// Rotates `x` (rows, heads * head_dim) in place at each row's absolute position, with
    /// bf16 cos/sin from `table` (positions, head_dim/2 cos then head_dim/2 sin, bf16):
    /// `bf16(bf16(x*cos) + bf16(rot(x)*sin))`.
    fn rope(&self, args: RopeArgs<'_, Self>) -> Result<()>;

    /// Writes each row's k and v (rows, kv_heads * head_dim) into its slot of `layer`.
    fn kv_store(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        k: &Self::Tensor,
        v: &Self::Tensor,
        batch: &Self::Batch,
    ) -> Result<()>;

    /// Causal attention of each row's q over its sequence's KV at positions `0..=pos`,
    /// visited block by block in position order; fp32 scores and softmax; bf16 out.
    fn attention(&self, args: AttnArgs<'_, Self>) -> Result<()>;

    /// `out = bf16(bf16(silu(gate)) * up)`.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor, out: &mut Self::Tensor) -> Result<()>;

    /// Residual: `acc = bf16(acc + x)`.
    fn add(&self, acc: &mut Self::Tensor, x: &Self::Tensor) -> Result<()>;

    /// Fused residual and norm: `acc = bf16(acc + x)`, then `out = rms_norm(acc)` (groups of
    /// `group` columns). Bit for bit [`Backend::add`] then [`Backend::rms_norm`] (the default);
    /// a GPU does both in one launch.
    fn add_rms_norm(&self, a: AddNormArgs<'_, Self>) -> Result<()> {
        self.add(a.acc, a.x)?;
        let (weight, eps, group) = (a.weight, a.eps, a.group);
        self.rms_norm(NormArgs { x: a.acc, weight, eps, group, out: a.out })
    }

    /// Several products of the same `x`: `parts[j].out = x @ parts[j].w^T (+ bias)`. Bit for
    /// bit one [`Backend::linear`] per part (the default); a GPU may launch them together
    /// (q, k, v), each weight keeping its own K split.
    fn linear_group(&self, x: &Self::Tensor, parts: &mut [LinearPart<'_, Self>]) -> Result<()> {
        for p in parts.iter_mut() {
            self.linear(x, p.w, p.bias, p.out)?;
        }
        Ok(())
    }

    /// The gated MLP's first half: `gate = x @ gate_w^T`, `up = x @ up_w^T` (both written) and
    /// `out = bf16(bf16(silu(gate)) * up)`. Bit for bit two [`Backend::linear`] calls and
    /// [`Backend::swiglu`] (the default); a GPU may compute matching gate and up features in
    /// one launch with the SwiGLU epilogue.
    fn linear_swiglu(&self, a: SwigluArgs<'_, Self>) -> Result<()> {
        self.linear(a.x, a.gate_w, None, a.gate)?;
        self.linear(a.x, a.up_w, None, a.up)?;
        self.swiglu(a.gate, a.up, a.out)
    }

    /// [`Backend::add_rms_norm`], then [`Backend::linear_group`] of its output `n.out`. Bit for
    /// bit those two ops (the default); a GPU may compute the norm in the products' prologue.
    fn add_norm_linear_group(
        &self,
        n: AddNormArgs<'_, Self>,
        parts: &mut [LinearPart<'_, Self>],
    ) -> Result<()> {
        let AddNormArgs { acc, x, weight, eps, group, out } = n;
        self.add_rms_norm(AddNormArgs { acc, x, weight, eps, group, out: &mut *out })?;
        self.linear_group(out, parts)
    }

    /// [`Backend::add_rms_norm`], then [`Backend::linear_swiglu`] of its output `n.out` with
    /// `gate_w`, `up_w` into `gate`, `up` and `out`. Bit for bit those two ops (the default); a
    /// GPU may compute the norm in the products' prologue.
    fn add_norm_linear_swiglu(
        &self,
        n: AddNormArgs<'_, Self>,
        gate_w: &Self::Weight,
        up_w: &Self::Weight,
        gate: &mut Self::Tensor,
        up: &mut Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<()> {
        let AddNormArgs { acc, x, weight, eps, group, out: normed } = n;
        self.add_rms_norm(AddNormArgs { acc, x, weight, eps, group, out: &mut *normed })?;
        self.linear_swiglu(SwigluArgs { x: normed, gate_w, up_w, gate, up, out })
    }

    /// The attention block's rope and KV write: [`Backend::rope`] of `q` and of `k` (in
    /// place), then [`Backend::kv_store`] of the rotated `k` and `v` into `layer`. Bit for bit
    /// those three ops (the default); a GPU does them in one launch.
    fn rope_kv_store(&self, a: RopeKvArgs<'_, Self>) -> Result<()> {
        let (head_dim, style, table, batch) = (a.head_dim, a.style, a.table, a.batch);
        self.rope(RopeArgs { x: a.q, heads: a.heads, head_dim, style, table, batch })?;
        self.rope(RopeArgs { x: a.k, heads: a.kv_heads, head_dim, style, table, batch })?;
        self.kv_store(a.kv, a.layer, a.k, a.v, batch)
    }

    /// The attention block's front: q, k, v of `a.input` ([`Backend::linear_group`], after
    /// [`Backend::add_rms_norm`] for [`QkvInput::AddNorm`]), then [`Backend::rope_kv_store`] of
    /// them. Bit for bit those ops (the default, [`qkv_rope_kv_store_unfused`]); a GPU may rope
    /// and write the KV rows in the products' epilogue.
    fn qkv_rope_kv_store(&self, a: QkvRopeArgs<'_, Self>) -> Result<()> {
        qkv_rope_kv_store_unfused(self, a)
    }

    /// Logits of the batch's `logit_rows`: `out[i] = x[logit_rows[i]] @ w^T` rounded to bf16,
    /// held in an f32 tensor of `(logit_rows.len(), vocab)`.
    fn logits(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        batch: &Self::Batch,
        out: &mut Self::Tensor,
    ) -> Result<()>;

    /// Copies the first `rows` rows of a tensor to the host as f32 (bf16 widened exactly).
    fn read_f32(&self, t: &Self::Tensor, rows: usize) -> Result<Vec<f32>>;

    /// Copies the KV rows of one sequence (positions `0..len`) of `layer` to the host:
    /// (k, v), each `(len, kv_heads * head_dim)` as f32. For fingerprints and tests.
    fn read_kv(
        &self,
        kv: &Self::Kv,
        layer: usize,
        block_table: &[u32],
        len: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)>;

    /// Waits for every issued op.
    fn synchronize(&self) -> Result<()>;

    /// Opens one forward step over `batch`: every op issued until [`Backend::step_end`] is
    /// one step. A backend may hold the step's launches back and run them as a replayed
    /// CUDA graph (same kernels, same arguments, so the same bits). The CPU runs ops as they
    /// are issued and does nothing here.
    fn step_begin(&self, _batch: &Self::Batch) -> Result<()> {
        Ok(())
    }

    /// Closes the step opened by [`Backend::step_begin`]: every op of it is issued (or its
    /// graph launched) before this returns. Harmless without an open step.
    fn step_end(&self) -> Result<()> {
        Ok(())
    }

    /// The greedy token of each of the first `rows` rows of a logits tensor: the highest
    /// value, ties to the lowest id, NaN never wins, 0 for a row with nothing above -inf
    /// (the engine's `sampler::argmax`). A GPU computes it there and copies back 4 bytes a
    /// row; the default reads the rows back and scans them on the host.
    fn argmax(&self, t: &Self::Tensor, rows: usize) -> Result<Vec<u32>> {
        let v = self.read_f32(t, rows)?;
        let cols = v.len().checked_div(rows).unwrap_or(0);
        if cols == 0 {
            return Ok(vec![0; rows]);
        }
        Ok(v.chunks_exact(cols).map(argmax_row).collect())
    }

    /// Whether [`Backend::argmax_ahead`] is available (greedy decode with the next step
    /// issued before this one's token is read).
    fn decode_ahead(&self) -> bool {
        false
    }

    /// Decode ahead, inside a step of one row and one logits row (before `step_end`): the
    /// greedy token of `logits`' row ([`Backend::argmax`]'s rule) becomes, on the device, the
    /// input of the next step, whose metadata (`batch`'s, its position advanced by one) is
    /// returned, so the host can issue that step before it reads this token with
    /// [`Backend::ahead_token`]. Only where [`Backend::decode_ahead`] says so.
    fn argmax_ahead(&self, _logits: &Self::Tensor, _batch: &Self::Batch) -> Result<Self::Batch> {
        Err(BackendError::Device(format!("{}: no decode ahead", self.name())))
    }

    /// The token [`Backend::argmax_ahead`] chose for sequence position `position` (the step
    /// at `position - 1`), waiting for it.
    fn ahead_token(&self, _position: usize) -> Result<u32> {
        Err(BackendError::Device(format!("{}: no decode ahead", self.name())))
    }

    /// The sampled token of each of the first `rows` rows of a logits tensor under its
    /// [`sample::Draw`] (`draws.len() == rows`), after its [`penalty::Penalties`] (none when
    /// `penalties` is empty, else one a row): the definitions of [`penalty::Penalties::apply`]
    /// and [`sample::sample_row`] (temperature 0 is [`Backend::argmax`]'s rule). A GPU computes
    /// it there and copies back 4 bytes a row; the default reads the rows back and runs the
    /// host definition.
    fn sample(
        &self,
        t: &Self::Tensor,
        rows: usize,
        draws: &[sample::Draw],
        penalties: &[penalty::Penalties<'_>],
    ) -> Result<Vec<u32>> {
        sample::check_draws(rows, draws)?;
        penalty::check(rows, penalties)?;
        let mut v = self.read_f32(t, rows)?;
        let cols = v.len().checked_div(rows).unwrap_or(0);
        if cols == 0 {
            return Ok(vec![0; rows]);
        }
        let tokens = v.chunks_exact_mut(cols).enumerate().zip(draws).map(|((i, r), d)| {
            penalties.get(i).inspect(|p| p.apply(r));
            sample::sample_row(r, d)
        });
        Ok(tokens.collect())
    }

    /// Blocks until the kernels this backend compiles at run time are compiled (CUDA: a cold
    /// start's NVRTC compiles, begun with the backend); `Err` names each that failed. Loads
    /// nothing and checks no launch limit: an entry point a device cannot launch fails only
    /// where it is launched. A backend with no run-time compiled kernels (the CPU) is ready.
    fn ready(&self) -> Result<()> {
        Ok(())
    }

    /// The compiled kernels behind the ops, with their resource use against the device's
    /// limits: gates 1 (compiles) and 4 (limits) of the kernel contract. A backend with no
    /// separately compiled kernels (the CPU) reports none.
    fn kernels(&self) -> Result<Vec<KernelInfo>> {
        Ok(Vec::new())
    }
}

/// Highest value of `row`, ties to the lowest index, NaN never wins; 0 when no value is above
/// -inf. The host half of [`Backend::argmax`] (the same rule as the engine's sampler).
pub fn argmax_row(row: &[f32]) -> u32 {
    let (mut best, mut best_v) = (0usize, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// One compiled kernel as the kernel contract sees it.
#[derive(Clone, Debug)]
pub struct KernelInfo {
    /// Entry point name, e.g. `rms_norm_bf16`.
    pub name: String,
    /// Op family (the source file), e.g. `norm`.
    pub family: String,
    /// `Err(log)` when compilation or loading failed.
    pub compiled: std::result::Result<(), String>,
    pub registers: u32,
    pub shared_bytes: u32,
    /// Threads per block the backend launches it with, and the most the compiled kernel allows.
    pub launch_threads: u32,
    pub max_threads: u32,
    /// `Err(why)` when registers, shared memory or launch bounds exceed the device's limits.
    pub limits: std::result::Result<(), String>,
}

/// The products' input of [`Backend::qkv_rope_kv_store`].
pub enum QkvInput<'a, B: Backend + ?Sized> {
    /// Rows already normed.
    Normed(&'a B::Tensor),
    /// The residual add and norm that make them ([`Backend::add_norm_linear_group`]).
    AddNorm(AddNormArgs<'a, B>),
}

impl<B: Backend + ?Sized> QkvInput<'_, B> {
    /// The products of these rows: [`Backend::linear_group`], after the norm for `AddNorm`
    /// ([`Backend::add_norm_linear_group`]).
    pub fn products(self, be: &B, parts: &mut [LinearPart<'_, B>]) -> Result<()> {
        match self {
            QkvInput::Normed(x) => be.linear_group(x, parts),
            QkvInput::AddNorm(n) => be.add_norm_linear_group(n, parts),
        }
    }
}

/// Arguments of [`Backend::qkv_rope_kv_store`]: the products, then [`RopeKvArgs`]' fields
/// (q, k and v are the parts' outputs).
pub struct QkvRopeArgs<'a, B: Backend + ?Sized> {
    pub input: QkvInput<'a, B>,
    /// q, k, v in that order.
    pub parts: [LinearPart<'a, B>; 3],
    pub kv: &'a mut B::Kv,
    pub layer: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub style: tf_checkpoint::spec::RopeStyle,
    pub table: &'a B::Weight,
    pub batch: &'a B::Batch,
}

/// [`Backend::qkv_rope_kv_store`] as the ops it stands for (the definition of its bits).
pub fn qkv_rope_kv_store_unfused<B: Backend + ?Sized>(be: &B, a: QkvRopeArgs<'_, B>) -> Result<()> {
    let QkvRopeArgs { input, mut parts, kv, layer, heads, kv_heads, head_dim, style, table, batch } =
        a;
    input.products(be, &mut parts)?;
    let [q, k, v] = parts;
    let (q, k, v) = (q.out, k.out, &*v.out);
    be.rope_kv_store(RopeKvArgs {
        q,
        k,
        v,
        kv,
        layer,
        heads,
        kv_heads,
        head_dim,
        style,
        table,
        batch,
    })
}

/// Arguments of [`Backend::rms_norm`].
pub struct NormArgs<'a, B: Backend + ?Sized> {
    pub x: &'a B::Tensor,
    pub weight: &'a B::Weight,
    pub eps: f32,
    /// Columns normalized together: the row width, or head_dim for per-head q/k norms.
    pub group: usize,
    pub out: &'a mut B::Tensor,
}

/// Arguments of [`Backend::add_rms_norm`].
pub struct AddNormArgs<'a, B: Backend + ?Sized> {
    /// The residual stream, updated in place.
    pub acc: &'a mut B::Tensor,
    pub x: &'a B::Tensor,
    pub weight: &'a B::Weight,
    pub eps: f32,
    pub group: usize,
    pub out: &'a mut B::Tensor,
}

/// One product of [`Backend::linear_group`].
pub struct LinearPart<'a, B: Backend + ?Sized> {
    pub w: &'a B::Weight,
    pub bias: Option<&'a B::Weight>,
    pub out: &'a mut B::Tensor,
}

/// Arguments of [`Backend::linear_swiglu`].
pub struct SwigluArgs<'a, B: Backend + ?Sized> {
    pub x: &'a B::Tensor,
    pub gate_w: &'a B::Weight,
    pub up_w: &'a B::Weight,
    /// `(rows, n)` bf16: the products, written too.
    pub gate: &'a mut B::Tensor,
    pub up: &'a mut B::Tensor,
    /// `(rows, n)`: the SwiGLU activation.
    pub out: &'a mut B::Tensor,
}

/// Arguments of [`Backend::rope_kv_store`].
pub struct RopeKvArgs<'a, B: Backend + ?Sized> {
    /// (rows, heads * head_dim), rotated in place.
    pub q: &'a mut B::Tensor,
    /// (rows, kv_heads * head_dim), rotated in place, then stored.
    pub k: &'a mut B::Tensor,
    /// (rows, kv_heads * head_dim), stored.
    pub v: &'a B::Tensor,
    pub kv: &'a mut B::Kv,
    pub layer: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub style: tf_checkpoint::spec::RopeStyle,
    /// As [`RopeArgs::table`].
    pub table: &'a B::Weight,
    pub batch: &'a B::Batch,
}

/// Arguments of [`Backend::rope`].
pub struct RopeArgs<'a, B: Backend + ?Sized> {
    pub x: &'a mut B::Tensor,
    pub heads: usize,
    pub head_dim: usize,
    pub style: tf_checkpoint::spec::RopeStyle,
    /// bf16 `(max_positions, head_dim)`: cos of the head_dim/2 frequencies, then their sin.
    pub table: &'a B::Weight,
    pub batch: &'a B::Batch,
}

/// Arguments of [`Backend::attention`].
pub struct AttnArgs<'a, B: Backend + ?Sized> {
    /// (rows, heads * head_dim), already rotated.
    pub q: &'a B::Tensor,
    pub kv: &'a B::Kv,
    pub layer: usize,
    pub batch: &'a B::Batch,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Softmax scale, usually 1/sqrt(head_dim).
    pub scale: f32,
    /// (rows, heads * head_dim) bf16.
    pub out: &'a mut B::Tensor,
}
