//! Admission: a checkpoint is served only if every feature it uses is implemented.
//!
//! Refusals name the feature and the family (`rope_scaling type "yarn" is not implemented for
//! family llama`) and happen before any weight is read: at `info`, `plan` and load time.

use crate::error::{CheckpointError, Result};
use crate::Checkpoint;

/// HF architectures the llama family serves (llama with options).
pub const LLAMA_ARCHITECTURES: &[&str] =
    &["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"];

/// Every reason the checkpoint cannot be served; empty means admitted.
pub fn refusals(ckpt: &Checkpoint) -> Vec<String> {
    let spec = &ckpt.spec;
    let mut reasons: Vec<String> = Vec::new();
    if !LLAMA_ARCHITECTURES.contains(&spec.architecture.as_str()) {
        reasons.push(format!(
            "architecture `{}` is not implemented (families: llama = {})",
            spec.architecture,
            LLAMA_ARCHITECTURES.join(", ")
        ));
    }
    reasons.extend(
        spec.unsupported.iter().map(|u| format!("{u} is not implemented for family llama")),
    );
    if spec.head_dim == 0 || !spec.head_dim.is_multiple_of(2) || spec.head_dim > 256 {
        reasons.push(format!("head_dim {} is not implemented (even, <= 256)", spec.head_dim));
    }
    if spec.rope.dim != spec.head_dim {
        reasons.push(format!(
            "partial rotary (rotary dim {} of head_dim {}) is not implemented for family llama",
            spec.rope.dim, spec.head_dim
        ));
    }
    if spec.num_key_value_heads == 0
        || !spec.num_attention_heads.is_multiple_of(spec.num_key_value_heads)
    {
        reasons.push(format!(
            "{} query heads over {} key/value heads is not a grouped-query layout",
            spec.num_attention_heads, spec.num_key_value_heads
        ));
    }
    if spec.mlp_bias {
        reasons.push("mlp_bias is not implemented for family llama".to_string());
    }
    reasons
}

/// `Ok` if admitted, else `NotAdmitted` listing every reason.
pub fn admit(ckpt: &Checkpoint) -> Result<()> {
    let reasons = refusals(ckpt);
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(CheckpointError::NotAdmitted { path: ckpt.path.clone(), reasons })
    }
}
