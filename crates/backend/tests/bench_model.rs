//! Whole-model benchmarks of the CPU backend (ignored by default): SmolLM2-135M's forward pass
//! as a sequence of backend ops, with random weights in the GGUF's formats (Q4_1 matrices, Q8_0
//! tied embedding/lm_head) or the real GGUF (`real_model_decode`, needs scripts/fetch-model.sh).
//!
//! ```text
//! cargo test --release -p tf-backend --test bench_model -- --ignored --nocapture --test-threads=1
//! BENCH_THREADS=1 ... # thread count (default: all cores)
//! ```
//!
//! `model_forward`: 512-token prefill and decode tokens per second (best of many steps);
//! `decode_op_costs`: each decode op alone; `decode_breakdown`: a decode step's time per op
//! kind (median and best of 300 steps).

mod common;

use std::time::{Duration, Instant};

use common::bench::*;
use common::*;
use tf_backend::batch::KvGeometry;
use tf_backend::{AttnArgs, Backend, NormArgs, RopeArgs};
use tf_checkpoint::spec::RopeStyle;

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

/// The real GGUF (scripts/fetch-model.sh), through the same op sequence as `model_forward`:
/// weights as mapped from the file.
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
    {
        let get = |name: &str| load(&be, &file.tensor_view(name).unwrap());
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
        println!("real weights: decode {:.2} ms, {:.1} tok/s", t * 1e3, 1.0 / t);
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
