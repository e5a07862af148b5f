//! `tensorfold info PATH`: the spec and the admission verdict, without loading weights.

use std::fmt::Write as _;
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
        crate::cmd::print_out(&(serde_json::to_string_pretty(&v)? + "\n"));
        return Ok(());
    }
    let mut o = String::new();
    let _ = writeln!(o, "path           {}", path.display());
    let _ = writeln!(
        o,
        "format         {:?}, {} tensors, {:.1} MiB",
        ckpt.format,
        ckpt.tensors.len(),
        ckpt.weight_bytes() as f64 / 1048576.0
    );
    let _ = writeln!(o, "architecture   {}", s.architecture);
    let _ = writeln!(o, "layers         {}", s.num_hidden_layers);
    let _ = writeln!(o, "hidden         {} (intermediate {})", s.hidden_size, s.intermediate_size);
    let _ = writeln!(
        o,
        "heads          {} query, {} key/value, head_dim {}",
        s.num_attention_heads, s.num_key_value_heads, s.head_dim
    );
    let _ = writeln!(o, "vocab          {}", s.vocab_size);
    let _ = writeln!(
        o,
        "rope           theta {}, {:?}, {:?}, dim {}",
        s.rope.theta, s.rope.style, s.rope.scaling, s.rope.dim
    );
    let _ = writeln!(o, "rms_norm_eps   {:e}", s.rms_norm_eps);
    let _ = writeln!(o, "context        {}", s.max_position_embeddings);
    let _ = writeln!(o, "tied embedding {}", s.tie_word_embeddings);
    let _ = writeln!(
        o,
        "biases         attention {}, o_proj {}, mlp {}",
        s.attention_bias, s.o_proj_bias, s.mlp_bias
    );
    let _ = writeln!(o, "qk_norm        {}", s.qk_norm);
    let _ = writeln!(
        o,
        "special        bos {:?}, eos {:?}, pad {:?}",
        s.special.bos, s.special.eos, s.special.pad
    );
    let _ = writeln!(o, "parameters     {:.1} M", s.param_count() as f64 / 1e6);
    let mut formats = std::collections::BTreeMap::<String, usize>::new();
    for t in ckpt.tensors.values() {
        *formats.entry(t.format.to_string()).or_default() += 1;
    }
    let _ = writeln!(
        o,
        "tensor formats {}",
        formats.iter().map(|(k, v)| format!("{k} x{v}")).collect::<Vec<_>>().join(", ")
    );
    let _ =
        writeln!(o, "chat template  {}", if ckpt.chat_template.is_some() { "yes" } else { "no" });
    if refusals.is_empty() {
        let _ = writeln!(o, "admission      admitted (family llama)");
    } else {
        let _ = writeln!(o, "admission      REFUSED");
        for r in &refusals {
            let _ = writeln!(o, "  - {r}");
        }
    }
    crate::cmd::print_out(&o);
    Ok(())
}
