//! The llama family: `LlamaForCausalLM` and the architectures that are llama with options
//! (SmolLM2, Llama 3.x with `llama3` RoPE scaling, Mistral without sliding window, Qwen2 with
//! q/k/v biases, Qwen3 with per-head q/k RMSNorm), written once, top-down as HF
//! `modeling_llama.py` reads.
//!
//! Rounding points follow HF at bf16 (DESIGN.md §2): the residual stream is bf16 with each add
//! rounded; RMSNorm is `bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))`; projections are fp32 sums
//! rounded once; RoPE uses bf16 cos/sin of the fp32 angle; the MLP is
//! `down(bf16(bf16(silu(gate)) * up))`; logits are the lm_head product rounded to bf16.
//! The backend guarantees each row's arithmetic is independent of the batch, so this file
//! never needs to know how rows were grouped.

use tf_backend::{
    ActDType, AddNormArgs, AttnArgs, Backend, BatchMeta, KvGeometry, LinearPart, NormArgs,
    QkvInput, QkvRopeArgs, RopeKvArgs,
};
use tf_checkpoint::{Checkpoint, DType, ModelSpec, TensorFormat, TensorView};

use super::{CausalLm, LoadOptions};
use crate::error::{EngineError, Result};
use crate::rope;

struct Attention<B: Backend> {
    q_proj: B::Weight,
    k_proj: B::Weight,
    v_proj: B::Weight,
    o_proj: B::Weight,
    /// Qwen2 (q, k, v) and llama `attention_bias` (q, k, v, o).
    q_bias: Option<B::Weight>,
    k_bias: Option<B::Weight>,
    v_bias: Option<B::Weight>,
    o_bias: Option<B::Weight>,
    /// Qwen3: RMSNorm over each head (head_dim).
    q_norm: Option<B::Weight>,
    k_norm: Option<B::Weight>,
}

struct Mlp<B: Backend> {
    gate_proj: B::Weight,
    up_proj: B::Weight,
    down_proj: B::Weight,
}

struct Layer<B: Backend> {
    input_layernorm: B::Weight,
    self_attn: Attention<B>,
    post_attention_layernorm: B::Weight,
    mlp: Mlp<B>,
}

/// Activation buffers, allocated once for `max_rows`.
struct Scratch<B: Backend> {
    hidden: B::Tensor,   // (rows, hidden) residual stream
    normed: B::Tensor,   // (rows, hidden)
    q: B::Tensor,        // (rows, heads * head_dim)
    q_normed: B::Tensor, // (rows, heads * head_dim), Qwen3 only
    k: B::Tensor,        // (rows, kv_heads * head_dim)
    k_normed: B::Tensor, // (rows, kv_heads * head_dim), Qwen3 only
    v: B::Tensor,        // (rows, kv_heads * head_dim)
    attn: B::Tensor,     // (rows, heads * head_dim)
    proj: B::Tensor,     // (rows, hidden) o_proj and down_proj outputs
    gate: B::Tensor,     // (rows, intermediate)
    up: B::Tensor,       // (rows, intermediate)
    act: B::Tensor,      // (rows, intermediate)
    logits: B::Tensor,   // (rows, vocab) f32
}

pub struct Llama<B: Backend> {
    spec: ModelSpec,
    backend: B,
    embed_tokens: B::Weight,
    layers: Vec<Layer<B>>,
    norm: B::Weight,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<B::Weight>,
    rope_table: B::Weight, // (max_positions, head_dim) bf16
    scratch: Scratch<B>,
    max_rows: usize,
    max_positions: usize,
    /// Decode ahead: the metadata of the next step, advanced on the device by the last.
    ahead: Option<B::Batch>,
}

impl<B: Backend> Llama<B> {
    pub fn load(ckpt: &Checkpoint, backend: B, opts: LoadOptions) -> Result<Self> {
        let spec = ckpt.spec.clone();
        let w = |name: &str| -> Result<B::Weight> { Ok(backend.load_weight(ckpt.tensor(name)?)?) };
        let opt = |name: &str, on: bool| -> Result<Option<B::Weight>> {
            if on {
                w(name).map(Some)
            } else {
                Ok(None)
            }
        };
        let mut layers = Vec::with_capacity(spec.num_hidden_layers);
        for i in 0..spec.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let b = spec.attention_bias;
            layers.push(Layer {
                input_layernorm: w(&format!("{p}.input_layernorm.weight"))?,
                self_attn: Attention {
                    q_proj: w(&format!("{a}.q_proj.weight"))?,
                    k_proj: w(&format!("{a}.k_proj.weight"))?,
                    v_proj: w(&format!("{a}.v_proj.weight"))?,
                    o_proj: w(&format!("{a}.o_proj.weight"))?,
                    q_bias: opt(&format!("{a}.q_proj.bias"), b)?,
                    k_bias: opt(&format!("{a}.k_proj.bias"), b)?,
                    v_bias: opt(&format!("{a}.v_proj.bias"), b)?,
                    o_bias: opt(&format!("{a}.o_proj.bias"), spec.o_proj_bias)?,
                    q_norm: opt(&format!("{a}.q_norm.weight"), spec.qk_norm)?,
                    k_norm: opt(&format!("{a}.k_norm.weight"), spec.qk_norm)?,
                },
                post_attention_layernorm: w(&format!("{p}.post_attention_layernorm.weight"))?,
                mlp: Mlp {
                    gate_proj: w(&format!("{p}.mlp.gate_proj.weight"))?,
                    up_proj: w(&format!("{p}.mlp.up_proj.weight"))?,
                    down_proj: w(&format!("{p}.mlp.down_proj.weight"))?,
                },
            });
        }
        let max_positions = opts.max_positions.min(spec.max_position_embeddings).max(1);
        let table = rope::table_bf16(&spec.rope, max_positions);
        let table_view = TensorView::owned(
            "rope.table",
            TensorFormat::Plain(DType::BF16),
            vec![max_positions, spec.rope.dim],
            table,
        );
        let rope_table = backend.load_weight(&table_view)?;
        let embed_tokens = w("model.embed_tokens.weight")?;
        let norm = w("model.norm.weight")?;
        let lm_head = opt("lm_head.weight", !spec.tie_word_embeddings)?;
        let scratch = Scratch::new(&backend, &spec, opts.max_rows)?;
        Ok(Llama {
            spec,
            backend,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope_table,
            scratch,
            max_rows: opts.max_rows,
            max_positions,
            ahead: None,
        })
    }
}

impl<B: Backend> Scratch<B> {
    fn new(be: &B, s: &ModelSpec, rows: usize) -> Result<Self> {
        let bf = |cols| be.alloc(ActDType::Bf16, rows, cols);
        let qk = if s.qk_norm { (s.q_dim(), s.kv_dim()) } else { (1, 1) };
        Ok(Scratch {
            hidden: bf(s.hidden_size)?,
            normed: bf(s.hidden_size)?,
            q: bf(s.q_dim())?,
            q_normed: bf(qk.0)?,
            k: bf(s.kv_dim())?,
            k_normed: bf(qk.1)?,
            v: bf(s.kv_dim())?,
            attn: bf(s.q_dim())?,
            proj: bf(s.hidden_size)?,
            gate: bf(s.intermediate_size)?,
            up: bf(s.intermediate_size)?,
            act: bf(s.intermediate_size)?,
            logits: be.alloc(ActDType::F32, rows, s.vocab_size)?,
        })
    }
}

impl<B: Backend> Llama<B> {
    /// `normed = weight(hidden)` after `hidden += proj` when `pending` (the previous block's
    /// output, added here so the backend can fuse the add with the norm: same bits).
    fn residual_norm(&mut self, weight: Which, pending: bool) -> Result<()> {
        let (be, s, sc) = (&self.backend, &self.spec, &mut self.scratch);
        let weight = match weight {
            Which::Input(li) => &self.layers[li].input_layernorm,
            Which::Final => &self.norm,
        };
        let (eps, group) = (s.rms_norm_eps as f32, s.hidden_size);
        if pending {
            let (acc, x, out) = (&mut sc.hidden, &sc.proj, &mut sc.normed);
            be.add_rms_norm(AddNormArgs { acc, x, weight, eps, group, out })?;
        } else {
            be.rms_norm(NormArgs { x: &sc.hidden, weight, eps, group, out: &mut sc.normed })?;
        }
        Ok(())
    }

    /// `proj = o_proj(attention(rope(q), rope(k), v))` of `normed` for one layer (the caller
    /// adds `proj` to `hidden`). Past layer 0, `normed` is first the input norm of `hidden +=
    /// proj` (the previous block's output), fused with q/k/v where the backend can.
    fn attention_block(&mut self, li: usize, kv: &mut B::Kv, batch: &B::Batch) -> Result<()> {
        let (be, s, sc) = (&self.backend, &self.spec, &mut self.scratch);
        let layer = &self.layers[li];
        let at = &layer.self_attn;
        let eps = s.rms_norm_eps as f32;
        let mut parts = [
            LinearPart { w: &at.q_proj, bias: at.q_bias.as_ref(), out: &mut sc.q },
            LinearPart { w: &at.k_proj, bias: at.k_bias.as_ref(), out: &mut sc.k },
            LinearPart { w: &at.v_proj, bias: at.v_bias.as_ref(), out: &mut sc.v },
        ];
        let input = if li > 0 {
            let (acc, x, out) = (&mut sc.hidden, &sc.proj, &mut sc.normed);
            let (weight, group) = (&layer.input_layernorm, s.hidden_size);
            QkvInput::AddNorm(AddNormArgs { acc, x, weight, eps, group, out })
        } else {
            QkvInput::Normed(&sc.normed)
        };
        let (hd, style, table) = (s.head_dim, s.rope.style, &self.rope_table);
        let (heads, kv_heads) = (s.num_attention_heads, s.num_key_value_heads);
        let q = match (&at.q_norm, &at.k_norm) {
            (Some(qn), Some(kn)) => {
                input.products(be, &mut parts)?;
                let g = s.head_dim;
                be.rms_norm(NormArgs {
                    x: &sc.q,
                    weight: qn,
                    eps,
                    group: g,
                    out: &mut sc.q_normed,
                })?;
                be.rms_norm(NormArgs {
                    x: &sc.k,
                    weight: kn,
                    eps,
                    group: g,
                    out: &mut sc.k_normed,
                })?;
                be.rope_kv_store(RopeKvArgs {
                    q: &mut sc.q_normed,
                    k: &mut sc.k_normed,
                    v: &sc.v,
                    kv: &mut *kv,
                    layer: li,
                    heads,
                    kv_heads,
                    head_dim: hd,
                    style,
                    table,
                    batch,
                })?;
                &sc.q_normed
            }
            // q, k, v, their rope and the KV write: one launch where the backend can.
            _ => {
                be.qkv_rope_kv_store(QkvRopeArgs {
                    input,
                    parts,
                    kv: &mut *kv,
                    layer: li,
                    heads,
                    kv_heads,
                    head_dim: hd,
                    style,
                    table,
                    batch,
                })?;
                &sc.q
            }
        };
        be.attention(AttnArgs {
            q,
            kv,
            layer: li,
            batch,
            heads,
            kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            out: &mut sc.attn,
        })?;
        be.linear(&sc.attn, &at.o_proj, at.o_bias.as_ref(), &mut sc.proj)?;
        Ok(())
    }

    /// `proj = down(bf16(silu(gate(x))) * up(x))` with `x = normed`, the post-attention norm
    /// of `hidden += proj` (fused with gate/up where the backend can; the caller adds the new
    /// `proj` to `hidden`).
    fn mlp_block(&mut self, li: usize) -> Result<()> {
        let (be, s, sc) = (&self.backend, &self.spec, &mut self.scratch);
        let layer = &self.layers[li];
        let mlp = &layer.mlp;
        let (acc, x, out) = (&mut sc.hidden, &sc.proj, &mut sc.normed);
        let (weight, eps, group) =
            (&layer.post_attention_layernorm, s.rms_norm_eps as f32, s.hidden_size);
        be.add_norm_linear_swiglu(
            AddNormArgs { acc, x, weight, eps, group, out },
            &mlp.gate_proj,
            &mlp.up_proj,
            &mut sc.gate,
            &mut sc.up,
            &mut sc.act,
        )?;
        be.linear(&sc.act, &mlp.down_proj, None, &mut sc.proj)?;
        Ok(())
    }
}

/// Which RMSNorm weight `residual_norm` applies.
#[derive(Clone, Copy)]
enum Which {
    Input(usize),
    Final,
}

impl<B: Backend> CausalLm<B> for Llama<B> {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn backend(&self) -> &B {
        &self.backend
    }

    fn max_rows(&self) -> usize {
        self.max_rows
    }

    fn max_positions(&self) -> usize {
        self.max_positions
    }

    fn kv_geometry(&self, block_size: usize, num_blocks: usize) -> KvGeometry {
        KvGeometry {
            layers: self.spec.num_hidden_layers,
            kv_heads: self.spec.num_key_value_heads,
            head_dim: self.spec.head_dim,
            block_size,
            num_blocks,
        }
    }

    fn forward(&mut self, kv: &mut B::Kv, meta: &BatchMeta) -> Result<Vec<f32>> {
        let n = self.step(kv, meta)?;
        Ok(self.backend.read_f32(&self.scratch.logits, n)?)
    }

    fn forward_greedy(&mut self, kv: &mut B::Kv, meta: &BatchMeta) -> Result<Vec<u32>> {
        let n = self.step(kv, meta)?;
        Ok(self.backend.argmax(&self.scratch.logits, n)?)
    }

    fn decode_ahead(&self) -> bool {
        self.backend.decode_ahead()
    }

    fn ahead_step(&mut self, kv: &mut B::Kv, first: Option<&BatchMeta>) -> Result<()> {
        let batch = match first {
            Some(meta) => {
                self.ahead = None;
                self.check_step(meta)?;
                if meta.rows() != 1 || meta.logit_rows != [0] {
                    return Err(EngineError::Refused("decode ahead takes one row".into()));
                }
                self.backend.prepare_batch(meta)?
            }
            None => self.ahead.take().ok_or_else(|| {
                EngineError::Refused("decode ahead: no step was issued before".into())
            })?,
        };
        self.backend.step_begin(&batch)?;
        let issued = self.issue(kv, &batch);
        let next =
            issued.and_then(|()| Ok(self.backend.argmax_ahead(&self.scratch.logits, &batch)?));
        let ended = self.backend.step_end();
        let next = next?;
        ended?;
        self.ahead = Some(next);
        Ok(())
    }

    fn ahead_token(&mut self, position: usize) -> Result<u32> {
        Ok(self.backend.ahead_token(position)?)
    }

    fn ahead_end(&mut self) -> Result<()> {
        self.ahead = None;
        Ok(self.backend.synchronize()?)
    }

    fn forward_sample(
        &mut self,
        kv: &mut B::Kv,
        meta: &BatchMeta,
        draws: &[tf_backend::sample::Draw],
        penalties: &[tf_backend::penalty::Penalties<'_>],
    ) -> Result<Vec<u32>> {
        let n = self.step(kv, meta)?;
        Ok(self.backend.sample(&self.scratch.logits, n, draws, penalties)?)
    }
}

impl<B: Backend> Llama<B> {
    /// Runs one step over `meta` (stores its KV), leaving the logits of `meta.logit_rows` in
    /// `scratch.logits`; returns their count. The ops between `step_begin` and `step_end` are
    /// one step to the backend (CUDA may replay them as a graph: same launches, same bits).
    fn step(&mut self, kv: &mut B::Kv, meta: &BatchMeta) -> Result<usize> {
        self.check_step(meta)?;
        let batch = self.backend.prepare_batch(meta)?;
        self.backend.step_begin(&batch)?;
        let issued = self.issue(kv, &batch);
        // Closed on every path: the ops issued before an error run, as they would unrecorded.
        let ended = self.backend.step_end();
        issued?;
        ended?;
        Ok(meta.logit_rows.len())
    }

    /// A step's rows against the loaded sizes: 1 to `max_rows`, positions inside the context.
    fn check_step(&self, meta: &BatchMeta) -> Result<()> {
        let rows = meta.rows();
        if rows == 0 || rows > self.max_rows {
            return Err(EngineError::Refused(format!(
                "forward: {rows} rows, the model was loaded for 1 to {}",
                self.max_rows
            )));
        }
        if let Some(&p) = meta.positions.iter().find(|&&p| p as usize >= self.max_positions) {
            return Err(EngineError::Refused(format!(
                "position {p} is past the context of {} tokens",
                self.max_positions
            )));
        }
        Ok(())
    }

    /// Every op of one step: embed, the layers, the final norm, the logits.
    fn issue(&mut self, kv: &mut B::Kv, batch: &B::Batch) -> Result<()> {
        // Each block leaves its output in `proj`; the next norm adds it to `hidden` first
        // (`hidden = bf16(hidden + proj)`, HF's residual rounding), fused where the backend can.
        self.backend.embed(&self.embed_tokens, batch, &mut self.scratch.hidden)?;
        // The pending add and the norm go into the products that read the normed rows
        // (`qkv_rope_kv_store`'s `QkvInput::AddNorm`, or `add_norm_linear_group` with q/k
        // norms; `add_norm_linear_swiglu`: the same bits, fewer launches).
        for li in 0..self.layers.len() {
            if li == 0 {
                self.residual_norm(Which::Input(li), false)?;
            }
            self.attention_block(li, kv, batch)?;
            self.mlp_block(li)?;
        }
        self.residual_norm(Which::Final, !self.layers.is_empty())?;
        let (be, sc) = (&self.backend, &mut self.scratch);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        be.logits(&sc.normed, head, batch, &mut sc.logits)?;
        Ok(())
    }
}
