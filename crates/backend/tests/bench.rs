//! Micro-benchmarks of the CPU backend on SmolLM2-135M shapes (ignored by default):
//!
//! ```text
//! cargo test --release -p tf-backend --test bench -- --ignored --nocapture --test-threads=1
//! ```
//!
//! `linear_shapes` prints GFLOP/s and weight GB/s per shape, format and row count;
//! `model_forward` runs the op sequence of the whole model (30 layers, random weights in the
//! GGUF's formats: Q4_1 matrices, Q8_0 tied embedding/lm_head) and prints decode and
//! 512-token prefill tokens per second.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tf_backend::batch::{BatchMeta, KvGeometry, SeqMeta};
use tf_backend::cpu::{CpuBackend, CpuConfig, CpuTensor, CpuWeight};
use tf_backend::{ActDType, AttnArgs, Backend, NormArgs, RopeArgs};
use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::{DType, GgmlType, TensorFormat, TensorView};

/// The backend under test: `BENCH_THREADS` threads if set, else all cores.
fn bench_backend() -> CpuBackend {
    let threads = std::env::var("BENCH_THREADS").ok().and_then(|t| t.parse().ok());
    CpuBackend::with_config(CpuConfig { threads, level: None }).unwrap()
}

/// Runs `f` repeatedly for at least `min` and returns the best time per call.
fn time(min: Duration, mut f: impl FnMut()) -> f64 {
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

#[test]
#[ignore]
fn linear_shapes() {
    let be = bench_backend();
    println!("{}", be.name());
    let mut rng = Rng::new(1);
    let shapes = [
        ("q/o", 576, 576),
        ("k/v", 192, 576),
        ("gate/up", 1536, 576),
        ("down", 576, 1536),
        ("lm_head", 49152, 576),
    ];
    let formats = [
        TensorFormat::Ggml(GgmlType::Q4_1),
        TensorFormat::Ggml(GgmlType::Q8_0),
        TensorFormat::Plain(DType::BF16),
    ];
    for f in formats {
        for &(name, n, k) in &shapes {
            let view = random_weight(&mut rng, f, n, k, 0.05);
            let w = load(&be, &view);
            for rows in [1usize, 512] {
                if rows == 512 && name == "lm_head" {
                    continue;
                }
                let (bits, _) = random_bf16(&mut rng, rows * k, 1.0);
                let x = bf16_tensor(rows, k, &bits);
                let mut out = be.alloc(ActDType::Bf16, rows, n).unwrap();
                let t =
                    time(Duration::from_millis(300), || be.linear(&x, &w, None, &mut out).unwrap());
                let flops = 2.0 * (rows * n * k) as f64 / t / 1e9;
                let gbs = view.bytes().len() as f64 / t / 1e9;
                println!(
                    "{f:>5} {name:>8} [{n:>5},{k:>4}] rows {rows:>3}: {:>9.1} us  {flops:>6.1} GFLOP/s  {gbs:>6.2} GB/s",
                    t * 1e6
                );
            }
        }
    }
}

/// SmolLM2-135M geometry.
const HIDDEN: usize = 576;
const INTER: usize = 1536;
const LAYERS: usize = 30;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const VOCAB: usize = 49152;

struct Layer {
    attn_norm: CpuWeight,
    q: CpuWeight,
    k: CpuWeight,
    v: CpuWeight,
    o: CpuWeight,
    ffn_norm: CpuWeight,
    gate: CpuWeight,
    up: CpuWeight,
    down: CpuWeight,
}

struct Model {
    embed: CpuWeight,
    layers: Vec<Layer>,
    norm: CpuWeight,
    rope: CpuWeight,
}

struct Acts {
    h: CpuTensor,
    n: CpuTensor,
    q: CpuTensor,
    k: CpuTensor,
    v: CpuTensor,
    a: CpuTensor,
    o: CpuTensor,
    g: CpuTensor,
    u: CpuTensor,
    s: CpuTensor,
    logits: CpuTensor,
}

fn build(be: &CpuBackend, rng: &mut Rng) -> Model {
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

fn acts(be: &CpuBackend, rows: usize) -> Acts {
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

fn forward(
    be: &CpuBackend,
    m: &Model,
    kv: &mut tf_backend::cpu::CpuKv,
    b: &tf_backend::cpu::CpuBatch,
    a: &mut Acts,
) {
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

fn batch(tokens: &[u32], pos0: usize, block_table: &[u32]) -> BatchMeta {
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

#[test]
#[ignore]
fn model_forward() {
    let be = bench_backend();
    println!("{}", be.name());
    let mut rng = Rng::new(7);
    let m = build(&be, &mut rng);
    let geom = KvGeometry {
        layers: LAYERS,
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        block_size: 16,
        num_blocks: 64,
    };
    let mut kv = be.alloc_kv(&geom).unwrap();
    let table: Vec<u32> = (0..64).collect();
    let prompt: Vec<u32> = (0..512).map(|_| rng.below(VOCAB) as u32).collect();

    let mut a = acts(&be, 512);
    let b = be.prepare_batch(&batch(&prompt, 0, &table)).unwrap();
    let t = time(Duration::from_secs(3), || forward(&be, &m, &mut kv, &b, &mut a));
    println!("prefill 512: {:.1} ms, {:.1} tok/s", t * 1e3, 512.0 / t);

    let mut a1 = acts(&be, 1);
    for pos0 in [16usize, 512] {
        let b = be.prepare_batch(&batch(&[42], pos0, &table)).unwrap();
        let t = time(Duration::from_secs(2), || forward(&be, &m, &mut kv, &b, &mut a1));
        println!("decode at position {pos0}: {:.2} ms, {:.1} tok/s", t * 1e3, 1.0 / t);
    }
}

#[test]
#[ignore]
fn decode_op_costs() {
    let be = bench_backend();
    println!("{}", be.name());
    let mut rng = Rng::new(9);
    let m = build(&be, &mut rng);
    let geom = KvGeometry {
        layers: LAYERS,
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        block_size: 16,
        num_blocks: 64,
    };
    let mut kv = be.alloc_kv(&geom).unwrap();
    let table: Vec<u32> = (0..64).collect();
    let b = be.prepare_batch(&batch(&[42], 16, &table)).unwrap();
    let mut a = acts(&be, 1);
    let l = &m.layers[0];
    let d = Duration::from_millis(300);
    let us = |t: f64| t * 1e6;
    println!("add        {:7.2} us", us(time(d, || be.add(&mut a.h, &a.o).unwrap())));
    println!(
        "rms_norm   {:7.2} us",
        us(time(d, || {
            be.rms_norm(NormArgs {
                x: &a.h,
                weight: &l.attn_norm,
                eps: 1e-5,
                group: HIDDEN,
                out: &mut a.n,
            })
            .unwrap()
        }))
    );
    println!(
        "rope q     {:7.2} us",
        us(time(d, || {
            let style = RopeStyle::Interleaved;
            be.rope(RopeArgs {
                x: &mut a.q,
                heads: HEADS,
                head_dim: HEAD_DIM,
                style,
                table: &m.rope,
                batch: &b,
            })
            .unwrap()
        }))
    );
    println!("swiglu     {:7.2} us", us(time(d, || be.swiglu(&a.g, &a.u, &mut a.s).unwrap())));
    println!(
        "kv_store   {:7.2} us",
        us(time(d, || be.kv_store(&mut kv, 0, &a.k, &a.v, &b).unwrap()))
    );
    println!(
        "attention  {:7.2} us",
        us(time(d, || {
            let args = AttnArgs {
                q: &a.q,
                kv: &kv,
                layer: 0,
                batch: &b,
                heads: HEADS,
                kv_heads: KV_HEADS,
                head_dim: HEAD_DIM,
                scale: 0.125,
                out: &mut a.a,
            };
            be.attention(args).unwrap()
        }))
    );
    for pos in [128usize, 512, 1000] {
        let b = be.prepare_batch(&batch(&[42], pos, &table)).unwrap();
        println!(
            "attn @{pos:<4} {:7.2} us",
            us(time(d, || {
                let args = AttnArgs {
                    q: &a.q,
                    kv: &kv,
                    layer: 0,
                    batch: &b,
                    heads: HEADS,
                    kv_heads: KV_HEADS,
                    head_dim: HEAD_DIM,
                    scale: 0.125,
                    out: &mut a.a,
                };
                be.attention(args).unwrap()
            }))
        );
    }
    println!("embed      {:7.2} us", us(time(d, || be.embed(&m.embed, &b, &mut a.h).unwrap())));
    println!(
        "q linear   {:7.2} us",
        us(time(d, || be.linear(&a.n, &l.q, None, &mut a.q).unwrap()))
    );
    println!(
        "k linear   {:7.2} us",
        us(time(d, || be.linear(&a.n, &l.k, None, &mut a.k).unwrap()))
    );
    println!(
        "gate lin.  {:7.2} us",
        us(time(d, || be.linear(&a.n, &l.gate, None, &mut a.g).unwrap()))
    );
    println!(
        "down lin.  {:7.2} us",
        us(time(d, || be.linear(&a.s, &l.down, None, &mut a.o).unwrap()))
    );
    println!(
        "logits     {:7.2} us",
        us(time(d, || be.logits(&a.n, &m.embed, &b, &mut a.logits).unwrap()))
    );
    // Cold weights: cycle through all 30 layers' gate matrices (66 MB of Q4_1 in all).
    let mut i = 0;
    println!(
        "gate cold  {:7.2} us",
        us(time(d, || {
            be.linear(&a.n, &m.layers[i % LAYERS].gate, None, &mut a.g).unwrap();
            i += 1;
        }))
    );
}

/// Single-thread decode-kernel cost on a cache-resident weight (robust on a busy machine):
/// nanoseconds per 1,000 weights for one row, every format.
#[test]
#[ignore]
fn gemv_efficiency() {
    let be = CpuBackend::with_config(CpuConfig { threads: Some(1), level: None }).unwrap();
    println!("{}", be.name());
    let mut rng = Rng::new(3);
    let (n, k) = (1536, 512);
    for f in ALL_FORMATS {
        let view = random_weight(&mut rng, f, n, k, 0.05);
        let w = load(&be, &view);
        let (bits, _) = random_bf16(&mut rng, k, 1.0);
        let x = bf16_tensor(1, k, &bits);
        let mut out = be.alloc(ActDType::Bf16, 1, n).unwrap();
        let t = time(Duration::from_millis(400), || be.linear(&x, &w, None, &mut out).unwrap());
        println!("{f:>5}: {:6.1} ns per 1k weights ({:.1} us)", t * 1e12 / (n * k) as f64, t * 1e6);
    }
}

/// The real GGUF (scripts/fetch-model.sh), through the same op sequence as `model_forward`:
/// weights as mapped from the file, then as owned copies (to separate paging effects).
#[test]
#[ignore]
fn real_model_decode() {
    let root = std::env::var("TENSORFOLD_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache"));
    let path = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let file = tf_checkpoint::gguf::GgufFile::open(&path).expect("run scripts/fetch-model.sh");
    let be = bench_backend();
    println!("{}", be.name());
    for owned in [false, true] {
        let get = |name: &str| {
            let v = file.tensor_view(name).unwrap();
            let v = if owned {
                TensorView::owned(&v.name, v.format, v.shape.clone(), v.bytes().to_vec())
            } else {
                v
            };
            load(&be, &v)
        };
        let layers = (0..LAYERS)
            .map(|i| Layer {
                attn_norm: get(&format!("blk.{i}.attn_norm.weight")),
                q: get(&format!("blk.{i}.attn_q.weight")),
                k: get(&format!("blk.{i}.attn_k.weight")),
                v: get(&format!("blk.{i}.attn_v.weight")),
                o: get(&format!("blk.{i}.attn_output.weight")),
                ffn_norm: get(&format!("blk.{i}.ffn_norm.weight")),
                gate: get(&format!("blk.{i}.ffn_gate.weight")),
                up: get(&format!("blk.{i}.ffn_up.weight")),
                down: get(&format!("blk.{i}.ffn_down.weight")),
            })
            .collect();
        let synthetic = build(&be, &mut Rng::new(1));
        let m = Model {
            embed: get("token_embd.weight"),
            layers,
            norm: get("output_norm.weight"),
            rope: synthetic.rope,
        };
        let geom = KvGeometry {
            layers: LAYERS,
            kv_heads: KV_HEADS,
            head_dim: HEAD_DIM,
            block_size: 16,
            num_blocks: 64,
        };
        let mut kv = be.alloc_kv(&geom).unwrap();
        let table: Vec<u32> = (0..64).collect();
        let mut a1 = acts(&be, 1);
        let b = be.prepare_batch(&batch(&[42], 16, &table)).unwrap();
        let t = time(Duration::from_secs(2), || forward(&be, &m, &mut kv, &b, &mut a1));
        println!(
            "real weights ({}): decode {:.2} ms, {:.1} tok/s",
            if owned { "owned" } else { "mapped" },
            t * 1e3,
            1.0 / t
        );
    }
}

/// Where a decode step's time goes: the `forward` op sequence with each op timed, summed per
/// op kind, median over many steps.
#[test]
#[ignore]
fn decode_breakdown() {
    let be = bench_backend();
    println!("{}", be.name());
    let mut rng = Rng::new(7);
    let m = build(&be, &mut rng);
    let geom = KvGeometry {
        layers: LAYERS,
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        block_size: 16,
        num_blocks: 64,
    };
    let mut kv = be.alloc_kv(&geom).unwrap();
    let table: Vec<u32> = (0..64).collect();
    let b = be.prepare_batch(&batch(&[42], 100, &table)).unwrap();
    let mut a = acts(&be, 1);
    let names = [
        "embed",
        "norm",
        "qkv",
        "rope",
        "kv_store",
        "attention",
        "o",
        "add",
        "gate/up",
        "swiglu",
        "down",
        "logits",
        "total",
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let stats0 = be.pool_stats();
    for _ in 0..300 {
        let mut t = [0f64; 13];
        let start = Instant::now();
        let lap = |i: usize, t: &mut [f64; 13], f: &mut dyn FnMut()| {
            let s = Instant::now();
            f();
            t[i] += s.elapsed().as_secs_f64();
        };
        lap(0, &mut t, &mut || be.embed(&m.embed, &b, &mut a.h).unwrap());
        for (li, l) in m.layers.iter().enumerate() {
            lap(1, &mut t, &mut || {
                be.rms_norm(NormArgs {
                    x: &a.h,
                    weight: &l.attn_norm,
                    eps: 1e-5,
                    group: HIDDEN,
                    out: &mut a.n,
                })
                .unwrap()
            });
            lap(2, &mut t, &mut || {
                be.linear(&a.n, &l.q, None, &mut a.q).unwrap();
                be.linear(&a.n, &l.k, None, &mut a.k).unwrap();
                be.linear(&a.n, &l.v, None, &mut a.v).unwrap();
            });
            lap(3, &mut t, &mut || {
                let style = RopeStyle::Interleaved;
                be.rope(RopeArgs {
                    x: &mut a.q,
                    heads: HEADS,
                    head_dim: HEAD_DIM,
                    style,
                    table: &m.rope,
                    batch: &b,
                })
                .unwrap();
                be.rope(RopeArgs {
                    x: &mut a.k,
                    heads: KV_HEADS,
                    head_dim: HEAD_DIM,
                    style,
                    table: &m.rope,
                    batch: &b,
                })
                .unwrap();
            });
            lap(4, &mut t, &mut || be.kv_store(&mut kv, li, &a.k, &a.v, &b).unwrap());
            lap(5, &mut t, &mut || {
                let args = AttnArgs {
                    q: &a.q,
                    kv: &kv,
                    layer: li,
                    batch: &b,
                    heads: HEADS,
                    kv_heads: KV_HEADS,
                    head_dim: HEAD_DIM,
                    scale: 0.125,
                    out: &mut a.a,
                };
                be.attention(args).unwrap()
            });
            lap(6, &mut t, &mut || be.linear(&a.a, &l.o, None, &mut a.o).unwrap());
            lap(7, &mut t, &mut || be.add(&mut a.h, &a.o).unwrap());
            lap(1, &mut t, &mut || {
                be.rms_norm(NormArgs {
                    x: &a.h,
                    weight: &l.ffn_norm,
                    eps: 1e-5,
                    group: HIDDEN,
                    out: &mut a.n,
                })
                .unwrap()
            });
            lap(8, &mut t, &mut || {
                be.linear(&a.n, &l.gate, None, &mut a.g).unwrap();
                be.linear(&a.n, &l.up, None, &mut a.u).unwrap();
            });
            lap(9, &mut t, &mut || be.swiglu(&a.g, &a.u, &mut a.s).unwrap());
            lap(10, &mut t, &mut || be.linear(&a.s, &l.down, None, &mut a.o).unwrap());
            lap(7, &mut t, &mut || be.add(&mut a.h, &a.o).unwrap());
        }
        lap(1, &mut t, &mut || {
            be.rms_norm(NormArgs {
                x: &a.h,
                weight: &m.norm,
                eps: 1e-5,
                group: HIDDEN,
                out: &mut a.n,
            })
            .unwrap()
        });
        lap(11, &mut t, &mut || be.logits(&a.n, &m.embed, &b, &mut a.logits).unwrap());
        t[12] = start.elapsed().as_secs_f64();
        for (s, v) in samples.iter_mut().zip(t) {
            s.push(v);
        }
    }
    let stats = be.pool_stats();
    println!("pool: {} jobs, {} worker joins", stats.0 - stats0.0, stats.1 - stats0.1);
    for (name, mut s) in names.iter().zip(samples) {
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("{name:>10}: median {:8.1} us, min {:8.1} us", s[s.len() / 2] * 1e6, s[0] * 1e6);
    }
}
