//! Model families, registered in one table keyed by the HF `architectures` string.
//!
//! A family is one file written top-down as the HF `modeling_*.py` reads; it knows geometry
//! and rounding points, not kernels, paging or batching (those arrive as a `BatchMeta`).

pub mod llama;

use tf_backend::penalty::Penalties;
use tf_backend::sample::{sample_row, Draw};
use tf_backend::{Backend, BatchMeta, KvGeometry};
use tf_checkpoint::{admission, Checkpoint, ModelSpec};

use crate::error::{EngineError, Result};

/// What the engine needs of any loaded causal LM.
pub trait CausalLm<B: Backend>: Send {
    fn spec(&self) -> &ModelSpec;
    fn backend(&self) -> &B;
    /// The most rows one `forward` call takes.
    fn max_rows(&self) -> usize;
    /// Longest sequence the loaded RoPE table covers.
    fn max_positions(&self) -> usize;
    fn kv_geometry(&self, block_size: usize, num_blocks: usize) -> KvGeometry;
    /// Runs one step over `batch` (stores its KV) and returns the logits of
    /// `batch.logit_rows`, `(logit_rows, vocab)` row-major.
    fn forward(&mut self, kv: &mut B::Kv, batch: &BatchMeta) -> Result<Vec<f32>>;
    /// Runs one step like [`CausalLm::forward`] and returns the greedy token of each logit
    /// row (`Backend::argmax`: highest value, ties to the lowest id, NaN never wins), so a
    /// GPU copies back 4 bytes a row instead of the vocabulary. For rows sampled at
    /// temperature 0 without penalties whose logits nobody reads; the same tokens as
    /// `sampler::argmax` on `forward`'s rows.
    fn forward_greedy(&mut self, kv: &mut B::Kv, batch: &BatchMeta) -> Result<Vec<u32>> {
        let logits = self.forward(kv, batch)?;
        let vocab = self.spec().vocab_size.max(1);
        Ok(logits.chunks_exact(vocab).map(tf_backend::argmax_row).collect())
    }

    /// Whether greedy decode can run ahead of the host ([`CausalLm::ahead_step`]): the
    /// backend's `decode_ahead`.
    fn decode_ahead(&self) -> bool {
        false
    }

    /// Decode ahead (one sequence, one row a step, greedy): issues a step whose greedy token
    /// the device feeds to the next step, and returns without waiting for it. `first`: the
    /// first such step (its token from the host); None: the step after the last one issued.
    /// The same tokens as `forward_greedy` step by step.
    fn ahead_step(&mut self, _kv: &mut B::Kv, _first: Option<&BatchMeta>) -> Result<()> {
        Err(EngineError::Refused("this model has no decode ahead".into()))
    }

    /// The token an ahead step chose for sequence position `position`, waiting for it.
    fn ahead_token(&mut self, _position: usize) -> Result<u32> {
        Err(EngineError::Refused("this model has no decode ahead".into()))
    }

    /// Ends a decode-ahead sequence: waits for the steps still in flight.
    fn ahead_end(&mut self) -> Result<()> {
        Ok(())
    }

    /// Runs one step like [`CausalLm::forward`] and returns the token of each logit row under
    /// its [`Draw`] (`draws[i]` for logit row `i`) after its [`Penalties`] (`penalties`
    /// empty: none; else one a row), sampled where the logits are (`Backend::sample`, the
    /// definitions of `Penalties::apply` and `tf_backend::sample::sample_row`): a GPU copies
    /// back 4 bytes a row. For rows whose logits nobody reads; the same tokens as
    /// `Sampler::sample` on `forward`'s rows.
    fn forward_sample(
        &mut self,
        kv: &mut B::Kv,
        batch: &BatchMeta,
        draws: &[Draw],
        penalties: &[Penalties<'_>],
    ) -> Result<Vec<u32>> {
        let mut logits = self.forward(kv, batch)?;
        let vocab = self.spec().vocab_size.max(1);
        if logits.len() != vocab * draws.len()
            || !(penalties.is_empty() || penalties.len() == draws.len())
        {
            return Err(EngineError::Refused(format!(
                "forward_sample: {} draws and {} penalty rows for {} logit rows",
                draws.len(),
                penalties.len(),
                logits.len() / vocab
            )));
        }
        let rows = logits.chunks_exact_mut(vocab).enumerate().zip(draws);
        let tokens = rows.map(|((i, r), d)| {
            penalties.get(i).inspect(|p| p.apply(r));
            sample_row(r, d)
        });
        Ok(tokens.collect())
    }
}

/// Load-time options that do not change any value computed.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    pub max_rows: usize,
    pub max_positions: usize,
}

/// One entry of the family table.
pub struct Family {
    pub name: &'static str,
    pub architectures: &'static [&'static str],
}

/// Every family tensorfold serves.
pub const FAMILIES: &[Family] =
    &[Family { name: "llama", architectures: admission::LLAMA_ARCHITECTURES }];

/// The family serving `architecture`, if any.
pub fn family_of(architecture: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.architectures.contains(&architecture))
}

/// Admits the checkpoint and loads it with its family onto `backend`.
pub fn load<B: Backend + 'static>(
    ckpt: &Checkpoint,
    backend: B,
    opts: LoadOptions,
) -> Result<Box<dyn CausalLm<B>>> {
    admission::admit(ckpt)?;
    match family_of(&ckpt.spec.architecture).map(|f| f.name) {
        Some("llama") => Ok(Box::new(llama::Llama::load(ckpt, backend, opts)?)),
        _ => Err(EngineError::Refused(format!(
            "no family serves architecture `{}`",
            ckpt.spec.architecture
        ))),
    }
}
