//! `tensorfold info PATH`: the spec and the admission verdict, without loading weights.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use tf_checkpoint::{admission, Checkpoint};

#[derive(Args)]
pub struct InfoArgs {
    /// A GGUF file or an HF checkpoint directory (default: the test model).
    pub path: Option<PathBuf>,
    /// Print the spec as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: InfoArgs) -> Result<()> {
    let path = crate::model_path::resolve(a.path)?;
    let ckpt = Checkpoint::open(&path)?;
    let s = &ckpt.spec;
    let refusals = admission::refusals(&ckpt);
    if a.json {
        let v = serde_json::json!({
            "path": path.display().to_string(),
            "format": format!("{:?}", ckpt.format),
            "spec": s,
            "tensors": ckpt.tensors.len(),
            "weight_bytes": ckpt.weight_bytes(),
            "admitted": refusals.is_empty(),
            "refusals": refusals,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("path           {}", path.display());
    println!(
        "format         {:?}, {} tensors, {:.1} MiB",
        ckpt.format,
        ckpt.tensors.len(),
        ckpt.weight_bytes() as f64 / 1048576.0
    );
    println!("architecture   {}", s.architecture);
    println!("layers         {}", s.num_hidden_layers);
    println!("hidden         {} (intermediate {})", s.hidden_size, s.intermediate_size);
    println!(
        "heads          {} query, {} key/value, head_dim {}",
        s.num_attention_heads, s.num_key_value_heads, s.head_dim
    );
    println!("vocab          {}", s.vocab_size);
    println!(
        "rope           theta {}, {:?}, {:?}, dim {}",
        s.rope.theta, s.rope.style, s.rope.scaling, s.rope.dim
    );
    println!("rms_norm_eps   {:e}", s.rms_norm_eps);
    println!("context        {}", s.max_position_embeddings);
    println!("tied embedding {}", s.tie_word_embeddings);
    println!(
        "biases         attention {}, o_proj {}, mlp {}",
        s.attention_bias, s.o_proj_bias, s.mlp_bias
    );
    println!("qk_norm        {}", s.qk_norm);
    println!(
        "special        bos {:?}, eos {:?}, pad {:?}",
        s.special.bos, s.special.eos, s.special.pad
    );
    println!("parameters     {:.1} M", s.param_count() as f64 / 1e6);
    let mut formats = std::collections::BTreeMap::<String, usize>::new();
    for t in ckpt.tensors.values() {
        *formats.entry(t.format.to_string()).or_default() += 1;
    }
    println!(
        "tensor formats {}",
        formats.iter().map(|(k, v)| format!("{k} x{v}")).collect::<Vec<_>>().join(", ")
    );
    println!("chat template  {}", if ckpt.chat_template.is_some() { "yes" } else { "no" });
    if refusals.is_empty() {
        println!("admission      admitted (family llama)");
    } else {
        println!("admission      REFUSED");
        for r in &refusals {
            println!("  - {r}");
        }
    }
    Ok(())
}
