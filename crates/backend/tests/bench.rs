//! Kernel micro-benchmarks of the CPU backend on SmolLM2-135M shapes (ignored by default):
//!
//! ```text
//! cargo test --release -p tf-backend --test bench -- --ignored --nocapture --test-threads=1
//! ```
//!
//! `linear_shapes` prints GFLOP/s and weight GB/s per shape, format and row count (1 and 512);
//! `gemv_efficiency` the single-thread decode cost per 1,000 weights of every format. Whole-model
//! figures are in `bench_model.rs`.

mod common;

use std::time::Duration;

use common::bench::{bench_backend, time};
use common::*;
use tf_backend::cpu::{CpuBackend, CpuConfig};
use tf_backend::{ActDType, Backend};
use tf_checkpoint::{DType, GgmlType, TensorFormat};

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
