//! The served geometries and the units (op, shape, variant) the contract checks at each.
//!
//! Shapes are those of the model families' published configs (SmolLM2-135M and
//! Llama-3-8B `config.json`); a geometry lists only what the ops see. Linear shapes are
//! deduplicated by (N, K): q_proj and o_proj are both square in these geometries, and k/v and
//! gate/up share a shape, so each distinct product is checked once, labelled with every
//! projection it serves.

use tf_checkpoint::spec::RopeStyle;

/// A model geometry as the ops see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Geometry {
    pub name: &'static str,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    /// RoPE base of the bf16 cos/sin table (its values are inputs; any table would do).
    pub rope_theta: f64,
    pub rms_eps: f32,
}

/// HuggingFaceTB/SmolLM2-135M(-Instruct) config.json.
pub const SMOLLM2: Geometry = Geometry {
    name: "smollm2",
    hidden: 576,
    heads: 9,
    kv_heads: 3,
    head_dim: 64,
    intermediate: 1536,
    vocab: 49152,
    rope_theta: 100_000.0,
    rms_eps: 1e-5,
};

/// meta-llama/Meta-Llama-3-8B config.json.
pub const LLAMA3_8B: Geometry = Geometry {
    name: "llama3-8b",
    hidden: 4096,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    intermediate: 14336,
    vocab: 128256,
    rope_theta: 500_000.0,
    rms_eps: 1e-5,
};

impl Geometry {
    /// `smollm2`, `llama3-8b` or `all`.
    pub fn parse_like(s: &str) -> Option<Vec<Geometry>> {
        match s {
            "smollm2" => Some(vec![SMOLLM2]),
            "llama3-8b" => Some(vec![LLAMA3_8B]),
            "all" => Some(vec![SMOLLM2, LLAMA3_8B]),
            _ => None,
        }
    }
}

/// Op families, as `--only` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Embed,
    RmsNorm,
    Linear,
    Rope,
    /// kv_store and attention, checked together (attention reads what kv_store wrote).
    Attention,
    Swiglu,
    Add,
    Logits,
    /// Greedy sampling on the device (`Backend::argmax`).
    Sample,
    /// The fused decode ops: `add_rms_norm`, `linear_group` (q, k, v), `linear_swiglu`,
    /// `rope_kv_store`.
    Fused,
}

impl Family {
    pub const ALL: [Family; 10] = [
        Family::Embed,
        Family::RmsNorm,
        Family::Linear,
        Family::Rope,
        Family::Attention,
        Family::Swiglu,
        Family::Add,
        Family::Logits,
        Family::Sample,
        Family::Fused,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Embed => "embed",
            Family::RmsNorm => "rms_norm",
            Family::Linear => "linear",
            Family::Rope => "rope",
            Family::Attention => "attention",
            Family::Swiglu => "swiglu",
            Family::Add => "add",
            Family::Logits => "logits",
            Family::Sample => "sample",
            Family::Fused => "fused",
        }
    }

    /// A family by name (`kv_store` names the attention family, which checks both ops).
    pub fn parse(s: &str) -> Option<Family> {
        if s == "kv_store" {
            return Some(Family::Attention);
        }
        Family::ALL.into_iter().find(|f| f.name() == s)
    }

    /// The `KernelInfo::family` values (kernel source files) behind this op family's units.
    pub(crate) fn kernel_sources(self) -> &'static [&'static str] {
        match self {
            Family::Embed => &["embed"],
            Family::RmsNorm => &["norm"],
            Family::Linear | Family::Logits => &["linear", "gemm", "gemm90"],
            Family::Rope => &["rope"],
            Family::Attention => &["kv", "attention"],
            Family::Swiglu | Family::Add => &["elementwise"],
            Family::Sample => &["sample"],
            // The fused kernels live beside the ops they fuse; where a call takes the unfused
            // path (prefill rows), the tiled GEMM and the swiglu kernel serve it.
            Family::Fused => &["norm", "linear", "gemm", "gemm90", "elementwise", "rope", "kv"],
        }
    }
}

/// One unit to check (see the module doc of `contract`).
#[derive(Clone, Debug)]
pub(crate) enum Unit {
    Embed,
    /// RMSNorm over `cols` columns in groups of `group`.
    Norm {
        what: &'static str,
        cols: usize,
        group: usize,
    },
    /// `(rows, k) @ (n, k)^T (+ bias)`.
    Linear {
        what: String,
        n: usize,
        k: usize,
        bias: bool,
    },
    Rope {
        what: &'static str,
        heads: usize,
        style: RopeStyle,
    },
    /// kv_store + attention (two results).
    Attention,
    Swiglu,
    Add,
    Logits,
    /// argmax over rows of `vocab` logits.
    Argmax,
    /// `add_rms_norm` of the hidden state: outputs (acc, normed).
    AddNorm,
    /// `linear_group` of q, k, v over the hidden state: outputs (q, k, v).
    LinearGroup {
        bias: bool,
    },
    /// `linear_swiglu` of gate and up: outputs (gate, up, act).
    LinearSwiglu,
    /// `rope_kv_store`: outputs (q, k rotated; k, v read back from the pool).
    RopeKv {
        style: RopeStyle,
    },
    /// `add_norm_linear_group`: outputs (acc, normed, q, k, v).
    AddNormGroup,
    /// `add_norm_linear_swiglu`: outputs (acc, normed, gate, up, act).
    AddNormSwiglu,
    /// `qkv_rope_kv_store` (after the add + norm when `norm`): outputs ((acc, normed,) q, k
    /// rotated, v; k, v read back from the pool).
    QkvRope {
        norm: bool,
        style: RopeStyle,
    },
}

impl Unit {
    pub(crate) fn family(&self) -> Family {
        match self {
            Unit::Embed => Family::Embed,
            Unit::Norm { .. } => Family::RmsNorm,
            Unit::Linear { .. } => Family::Linear,
            Unit::Rope { .. } => Family::Rope,
            Unit::Attention => Family::Attention,
            Unit::Swiglu => Family::Swiglu,
            Unit::Add => Family::Add,
            Unit::Logits => Family::Logits,
            Unit::Argmax => Family::Sample,
            Unit::AddNorm
            | Unit::LinearGroup { .. }
            | Unit::LinearSwiglu
            | Unit::RopeKv { .. }
            | Unit::AddNormGroup
            | Unit::AddNormSwiglu
            | Unit::QkvRope { .. } => Family::Fused,
        }
    }
}

/// Every unit of a geometry, in the order they run.
pub(crate) fn units(g: &Geometry) -> Vec<Unit> {
    let (q, kv) = (g.heads * g.head_dim, g.kv_heads * g.head_dim);
    let mut out = vec![
        Unit::Embed,
        Unit::Norm { what: "hidden", cols: g.hidden, group: g.hidden },
        Unit::Norm { what: "q heads", cols: q, group: g.head_dim },
        Unit::Norm { what: "k heads", cols: kv, group: g.head_dim },
    ];
    for (what, n, k) in linear_shapes(g) {
        out.push(Unit::Linear { what: what.clone(), n, k, bias: false });
        if what != "lm_head" {
            out.push(Unit::Linear { what, n, k, bias: true });
        }
    }
    for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
        out.push(Unit::Rope { what: "q", heads: g.heads, style });
        out.push(Unit::Rope { what: "k", heads: g.kv_heads, style });
    }
    out.extend([Unit::Attention, Unit::Swiglu, Unit::Add, Unit::Logits, Unit::Argmax]);
    out.extend([
        Unit::AddNorm,
        Unit::LinearGroup { bias: false },
        Unit::LinearGroup { bias: true },
        Unit::LinearSwiglu,
        Unit::RopeKv { style: RopeStyle::Neox },
        Unit::RopeKv { style: RopeStyle::Interleaved },
        Unit::AddNormGroup,
        Unit::AddNormSwiglu,
        Unit::QkvRope { norm: true, style: RopeStyle::Neox },
        Unit::QkvRope { norm: false, style: RopeStyle::Interleaved },
    ]);
    out
}

/// Distinct (N, K) of the geometry's projections, labelled with the projections they serve.
fn linear_shapes(g: &Geometry) -> Vec<(String, usize, usize)> {
    let (q, kv) = (g.heads * g.head_dim, g.kv_heads * g.head_dim);
    let all = [
        ("q", q, g.hidden),
        ("k", kv, g.hidden),
        ("v", kv, g.hidden),
        ("o", g.hidden, q),
        ("gate", g.intermediate, g.hidden),
        ("up", g.intermediate, g.hidden),
        ("down", g.hidden, g.intermediate),
    ];
    let mut out: Vec<(String, usize, usize)> = Vec::new();
    for (name, n, k) in all {
        match out.iter_mut().find(|(_, n2, k2)| (*n2, *k2) == (n, k)) {
            Some(e) => e.0 = format!("{},{name}", e.0),
            None => out.push((name.to_string(), n, k)),
        }
    }
    out.push(("lm_head".to_string(), g.vocab, g.hidden));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_deduplicated_and_labelled() {
        let s = linear_shapes(&SMOLLM2);
        let names: Vec<_> = s.iter().map(|(w, n, k)| format!("{w} {n}x{k}")).collect();
        assert_eq!(
            names,
            [
                "q,o 576x576",
                "k,v 192x576",
                "gate,up 1536x576",
                "down 576x1536",
                "lm_head 49152x576"
            ]
        );
        // 5 shapes, 4 of them with a bias variant, 3 norms, 4 ropes, embed, attention,
        // swiglu, add, logits, argmax; the fused add_rms_norm, q/k/v (with and without bias)
        // gate/up+swiglu, rope+kv_store (both styles), the two norm-fused products and
        // q/k/v + rope + kv_store (with the norm, Neox; without, interleaved).
        assert_eq!(units(&SMOLLM2).len(), 9 + 3 + 4 + 6 + 10);
        assert_eq!(linear_shapes(&LLAMA3_8B)[0], ("q,o".into(), 4096, 4096));
    }

    #[test]
    fn families_parse_by_name() {
        for f in Family::ALL {
            assert_eq!(Family::parse(f.name()), Some(f));
        }
        assert_eq!(Family::parse("kv_store"), Some(Family::Attention));
        assert_eq!(Family::parse("matmul"), None);
        assert_eq!(Geometry::parse_like("all").map(|v| v.len()), Some(2));
        assert!(Geometry::parse_like("llama3").is_none());
    }
}
