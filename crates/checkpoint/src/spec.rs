//! `ModelSpec`: the one description of a model that every layer above reads.
//!
//! Both an HF `config.json` (`spec::hf`) and GGUF metadata (`gguf::spec`) become this struct,
//! so a family never looks at a file format. Field names follow `config.json` keys.
//! Features a family may or may not implement (RoPE scaling kinds, biases, q/k norms,
//! sliding windows...) are explicit fields; `unsupported` collects what the parser saw but
//! cannot represent, so admission can refuse it by name instead of silently ignoring it.

pub mod hf;

use serde::{Deserialize, Serialize};

/// How rotary pairs are formed within a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RopeStyle {
    /// HF `rotate_half`: dim i pairs with i + head_dim/2 (GPT-NeoX style).
    Neox,
    /// Dims (2i, 2i+1) pair up (GPT-J style). llama-architecture GGUF files store q/k rows
    /// permuted so that this style on them equals `Neox` on the HF weights.
    Interleaved,
}

/// RoPE frequency scaling, as HF `rope_scaling` / `rope_parameters` name them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    None,
    /// Llama 3.x: `rope_type: "llama3"`.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// `rope_type: "linear"`: positions divided by `factor`.
    Linear {
        factor: f64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeSpec {
    pub theta: f64,
    pub style: RopeStyle,
    pub scaling: RopeScaling,
    /// Rotated dims per head (== head_dim unless partial rotary).
    pub dim: usize,
}

/// Token ids the engine must know without a tokenizer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    /// Any of these ends generation (HF `eos_token_id` may be a list).
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// HF `architectures[0]`, e.g. `LlamaForCausalLM`; GGUF `general.architecture` is mapped
    /// to the HF name.
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope: RopeSpec,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v (and o, for llama `attention_bias`) projection biases.
    pub attention_bias: bool,
    /// Bias on o_proj too (llama `attention_bias` covers o; Qwen2 has q/k/v only).
    pub o_proj_bias: bool,
    pub mlp_bias: bool,
    /// Qwen3: RMSNorm over each head of q and k before RoPE.
    pub qk_norm: bool,
    pub special: SpecialTokens,
    /// Features present in the checkpoint that this spec cannot represent, by name
    /// (e.g. `rope_scaling type "yarn"`). Non-empty means refusal at admission.
    pub unsupported: Vec<String>,
}

impl ModelSpec {
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Parameters of the weight matrices and vectors the llama family loads.
    pub fn param_count(&self) -> usize {
        let (h, i, l) = (self.hidden_size, self.intermediate_size, self.num_hidden_layers);
        let attn = h * self.q_dim() * 2 + h * self.kv_dim() * 2;
        let per_layer = attn + 3 * h * i + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { self.vocab_size * h };
        self.vocab_size * h + l * per_layer + h + head
    }
}
