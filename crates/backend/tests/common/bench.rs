//! Benchmark helpers shared by `tests/bench*.rs`: the backend under test, a best-of timer, and
//! SmolLM2-135M's forward pass as a sequence of backend ops (random or real weights).

use std::time::{Duration, Instant};

use super::*;
use tf_backend::batch::{BatchMeta, SeqMeta};
use tf_backend::cpu::{CpuBackend, CpuBatch, CpuConfig, CpuKv, CpuTensor, CpuWeight};
use tf_backend::{ActDType, AttnArgs, Backend, NormArgs, RopeArgs};
use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::{DType, GgmlType, TensorFormat, TensorView};

/// The backend under test: `BENCH_THREADS` threads if set, else all cores.
pub fn bench_backend() -> CpuBackend {
    let threads = std::env::var("BENCH_THREADS").ok().and_then(|t| t.parse().ok());
    CpuBackend::with_config(CpuConfig { threads, level: None }).unwrap()
}

/// Runs `f` repeatedly for at least `min` and returns the best time per call.
pub fn time(min: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::MAX;
    let mut n = 0;
    while start.elapsed() < min || n < 3 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        n += 1;
    }
    best
}

/// SmolLM2-135M geometry.
pub const HIDDEN: usize = 576;
pub const INTER: usize = 1536;
pub const LAYERS: usize = 30;
pub const HEADS: usize = 9;
pub const KV_HEADS: usize = 3;
pub const HEAD_DIM: usize = 64;
pub const VOCAB: usize = 49152;

pub struct Layer {
    pub attn_norm: CpuWeight,
    pub q: CpuWeight,
    pub k: CpuWeight,
    pub v: CpuWeight,
    pub o: CpuWeight,
    pub ffn_norm: CpuWeight,
    pub gate: CpuWeight,
    pub up: CpuWeight,
    pub down: CpuWeight,
}

pub struct Model {
    pub embed: CpuWeight,
    pub layers: Vec<Layer>,
    pub norm: CpuWeight,
    pub rope: CpuWeight,
}

pub struct Acts {
    pub h: CpuTensor,
    pub n: CpuTensor,
    pub q: CpuTensor,
    pub k: CpuTensor,
    pub v: CpuTensor,
    pub a: CpuTensor,
    pub o: CpuTensor,
    pub g: CpuTensor,
    pub u: CpuTensor,
    pub s: CpuTensor,
    pub logits: CpuTensor,
}

pub fn build(be: &CpuBackend, rng: &mut Rng) -> Model {
    let q41 = TensorFormat::Ggml(GgmlType::Q4_1);
    let mut mat = |n, k| load(be, &random_weight(rng, q41, n, k, 0.05));
    let mut layers = Vec::new();
    for _ in 0..LAYERS {
        layers.push(Layer {
            attn_norm: load(be, &random_vector(&mut Rng::new(3), HIDDEN, 1.0, 0.1)),
            q: mat(HIDDEN, HIDDEN),
            k: mat(KV_HEADS * HEAD_DIM, HIDDEN),
            v: mat(KV_HEADS * HEAD_DIM, HIDDEN),
            o: mat(HIDDEN, HIDDEN),
            ffn_norm: load(be, &random_vector(&mut Rng::new(4), HIDDEN, 1.0, 0.1)),
            gate: mat(INTER, HIDDEN),
            up: mat(INTER, HIDDEN),
            down: mat(HIDDEN, INTER),
        });
    }
    let mut tab = Vec::new();
    for p in 0..2048 {
        for i in 0..HEAD_DIM {
            let f =
                (p as f64) * 10000f64.powf(-2.0 * (i % (HEAD_DIM / 2)) as f64 / HEAD_DIM as f64);
            let v = if i < HEAD_DIM / 2 { f.cos() } else { f.sin() };
            tab.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes());
        }
    }
    let rope =
        TensorView::owned("rope", TensorFormat::Plain(DType::BF16), vec![2048, HEAD_DIM], tab);
    Model {
        embed: load(
            be,
            &random_weight(rng, TensorFormat::Ggml(GgmlType::Q8_0), VOCAB, HIDDEN, 0.05),
        ),
        layers,
        norm: load(be, &random_vector(rng, HIDDEN, 1.0, 0.1)),
        rope: load(be, &rope),
    }
}

pub fn acts(be: &CpuBackend, rows: usize) -> Acts {
    let t = |c| be.alloc(ActDType::Bf16, rows, c).unwrap();
    Acts {
        h: t(HIDDEN),
        n: t(HIDDEN),
        q: t(HIDDEN),
        k: t(KV_HEADS * HEAD_DIM),
        v: t(KV_HEADS * HEAD_DIM),
        a: t(HIDDEN),
        o: t(HIDDEN),
        g: t(INTER),
        u: t(INTER),
        s: t(INTER),
        logits: be.alloc(ActDType::F32, 1, VOCAB).unwrap(),
    }
}

pub fn forward(be: &CpuBackend, m: &Model, kv: &mut CpuKv, b: &CpuBatch, a: &mut Acts) {
    be.embed(&m.embed, b, &mut a.h).unwrap();
    for (li, l) in m.layers.iter().enumerate() {
        be.rms_norm(NormArgs {
            x: &a.h,
            weight: &l.attn_norm,
            eps: 1e-5,
            group: HIDDEN,
            out: &mut a.n,
        })
        .unwrap();
        be.linear(&a.n, &l.q, None, &mut a.q).unwrap();
        be.linear(&a.n, &l.k, None, &mut a.k).unwrap();
        be.linear(&a.n, &l.v, None, &mut a.v).unwrap();
        let style = RopeStyle::Interleaved;
        be.rope(RopeArgs {
            x: &mut a.q,
            heads: HEADS,
            head_dim: HEAD_DIM,
            style,
            table: &m.rope,
            batch: b,
        })
        .unwrap();
        be.rope(RopeArgs {
            x: &mut a.k,
            heads: KV_HEADS,
            head_dim: HEAD_DIM,
            style,
            table: &m.rope,
            batch: b,
        })
        .unwrap();
        be.kv_store(kv, li, &a.k, &a.v, b).unwrap();
        be.attention(AttnArgs {
            q: &a.q,
            kv,
            layer: li,
            batch: b,
            heads: HEADS,
            kv_heads: KV_HEADS,
            head_dim: HEAD_DIM,
            scale: 0.125,
            out: &mut a.a,
        })
        .unwrap();
        be.linear(&a.a, &l.o, None, &mut a.o).unwrap();
        be.add(&mut a.h, &a.o).unwrap();
        be.rms_norm(NormArgs {
            x: &a.h,
            weight: &l.ffn_norm,
            eps: 1e-5,
            group: HIDDEN,
            out: &mut a.n,
        })
        .unwrap();
        be.linear(&a.n, &l.gate, None, &mut a.g).unwrap();
        be.linear(&a.n, &l.up, None, &mut a.u).unwrap();
        be.swiglu(&a.g, &a.u, &mut a.s).unwrap();
        be.linear(&a.s, &l.down, None, &mut a.o).unwrap();
        be.add(&mut a.h, &a.o).unwrap();
    }
    be.rms_norm(NormArgs { x: &a.h, weight: &m.norm, eps: 1e-5, group: HIDDEN, out: &mut a.n })
        .unwrap();
    be.logits(&a.n, &m.embed, b, &mut a.logits).unwrap();
}

pub fn batch(tokens: &[u32], pos0: usize, block_table: &[u32]) -> BatchMeta {
    let rows = tokens.len();
    BatchMeta {
        tokens: tokens.to_vec(),
        positions: (pos0..pos0 + rows).map(|p| p as u32).collect(),
        row_seq: vec![0; rows],
        seqs: vec![SeqMeta { block_table: block_table.to_vec() }],
        logit_rows: vec![rows as u32 - 1],
        block_size: 16,
    }
}
