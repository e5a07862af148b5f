//! `tensorfold export GGUF --out DIR`: an HF-layout bf16 checkpoint of a GGUF file
//! (`config.json`, `tokenizer.json`, `tokenizer_config.json` with the chat template,
//! `generation_config.json`, `model.safetensors`), so the safetensors path runs on the same
//! weights. Each weight is decoded exactly (f32) and rounded once to bf16 (RNE). llama GGUF
//! files store q/k rows permuted for interleaved RoPE; export restores HF's row order, so the
//! written checkpoint uses HF's rotate-half RoPE like any HF llama.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use half::bf16;
use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::write::{write_safetensors, OutTensor};
use tf_checkpoint::{quant, Checkpoint, DType, ModelSpec, TensorFormat, TensorView};

#[derive(Args)]
pub struct ExportArgs {
    /// The GGUF file to export (default: the test model).
    pub path: Option<PathBuf>,
    /// Output directory (created; existing files in it are overwritten).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(a: ExportArgs) -> Result<()> {
    let path = crate::model_path::resolve(a.path)?;
    let ckpt = Checkpoint::open(&path)?;
    tf_checkpoint::admission::admit(&ckpt)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let spec = &ckpt.spec;
    let mut tensors = Vec::with_capacity(ckpt.tensors.len());
    for (name, view) in &ckpt.tensors {
        let mut vals = decode_f32(view)?;
        if spec.rope.style == RopeStyle::Interleaved {
            if name.ends_with("self_attn.q_proj.weight") || name.ends_with("self_attn.q_proj.bias")
            {
                vals = unpermute_rows(&vals, view.rows_cols(), spec.num_attention_heads);
            } else if name.ends_with("self_attn.k_proj.weight")
                || name.ends_with("self_attn.k_proj.bias")
            {
                vals = unpermute_rows(&vals, view.rows_cols(), spec.num_key_value_heads);
            }
        }
        let bytes = vals.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
        tensors.push(OutTensor {
            name: name.clone(),
            dtype: DType::BF16,
            shape: view.shape.clone(),
            bytes,
        });
    }
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(&a.out.join("model.safetensors"), &mut tensors, &meta)?;
    write_json(&a.out.join("config.json"), &config_json(spec)?)?;
    let gen = serde_json::json!({"bos_token_id": spec.special.bos, "eos_token_id": spec.special.eos, "do_sample": false});
    write_json(&a.out.join("generation_config.json"), &gen)?;
    crate::cmd::text::export_tokenizer(&ckpt, &a.out)?;
    println!("wrote {} ({} tensors, bf16)", a.out.display(), tensors.len());
    Ok(())
}

fn write_json(path: &std::path::Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// Every value of a tensor, exactly, as f32.
pub fn decode_f32(view: &TensorView) -> Result<Vec<f32>> {
    let b = view.bytes();
    Ok(match view.format {
        TensorFormat::Plain(DType::F32) => {
            b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
        }
        TensorFormat::Plain(DType::BF16) => {
            b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        TensorFormat::Plain(DType::F16) => {
            b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        TensorFormat::Ggml(t) => {
            let mut out = vec![0f32; view.numel()];
            quant::dequantize_row(t, b, &mut out)
                .with_context(|| format!("decoding {}", view.name))?;
            out
        }
        f => bail!("tensor {}: format {f} cannot be exported", view.name),
    })
}

/// Undoes llama.cpp's q/k row permutation: within each head, GGUF row `2b + a` holds HF row
/// `a * head_dim/2 + b` (convert_hf_to_gguf.py `permute`: reshape (heads, 2, hd/2) then swap).
fn unpermute_rows(vals: &[f32], (rows, cols): (usize, usize), heads: usize) -> Vec<f32> {
    let hd = rows / heads;
    let mut out = vec![0f32; vals.len()];
    for h in 0..heads {
        for a in 0..2 {
            for b in 0..hd / 2 {
                let src = h * hd + 2 * b + a;
                let dst = h * hd + a * (hd / 2) + b;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&vals[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

fn config_json(s: &ModelSpec) -> Result<serde_json::Value> {
    let model_type = match s.architecture.as_str() {
        "LlamaForCausalLM" => "llama",
        "Qwen2ForCausalLM" => "qwen2",
        "Qwen3ForCausalLM" => "qwen3",
        "MistralForCausalLM" => "mistral",
        a => bail!("export: no HF model_type known for architecture {a}"),
    };
    let eos = match s.special.eos.as_slice() {
        [one] => serde_json::json!(one),
        many => serde_json::json!(many),
    };
    Ok(serde_json::json!({
        "architectures": [s.architecture],
        "model_type": model_type,
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.num_hidden_layers,
        "num_attention_heads": s.num_attention_heads,
        "num_key_value_heads": s.num_key_value_heads,
        "head_dim": s.head_dim,
        "vocab_size": s.vocab_size,
        "rms_norm_eps": s.rms_norm_eps,
        "rope_theta": s.rope.theta,
        "rope_scaling": null,
        "max_position_embeddings": s.max_position_embeddings,
        "tie_word_embeddings": s.tie_word_embeddings,
        "attention_bias": s.attention_bias,
        "mlp_bias": false,
        "hidden_act": "silu",
        "bos_token_id": s.special.bos,
        "eos_token_id": eos,
        "pad_token_id": s.special.pad,
        "torch_dtype": "bfloat16",
    }))
}

#[cfg(test)]
mod tests {
    use super::unpermute_rows;

    /// Applies llama.cpp's permutation (HF row a*hd/2+b -> GGUF row 2b+a) and checks export
    /// undoes it.
    #[test]
    fn unpermute_inverts_the_gguf_permutation() {
        let (heads, hd, cols) = (2, 8, 3);
        let hf: Vec<f32> = (0..heads * hd * cols).map(|i| i as f32).collect();
        let mut gguf = vec![0f32; hf.len()];
        for h in 0..heads {
            for a in 0..2 {
                for b in 0..hd / 2 {
                    let (src, dst) = (h * hd + a * hd / 2 + b, h * hd + 2 * b + a);
                    gguf[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rows(&gguf, (heads * hd, cols), heads), hf);
    }
}
