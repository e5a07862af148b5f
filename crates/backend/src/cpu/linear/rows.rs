//! Row counts of `linear`: every row count the fused decode kernel serves (1..=8) gives the
//! bits of the same rows computed by the panel GEMM in a larger call, for every ggml format;
//! and (ignored by default) the time of one product of 1..16 rows on SmolLM2-135M shapes,
//! per call and per row, to show how well a batched decode step amortizes weight decoding.
//!
//! ```text
//! cargo test --release -p tf-backend --lib linear::rows -- --ignored --nocapture
//! BENCH_THREADS=1 ... # thread count (default: all cores)
//! ```

use std::time::{Duration, Instant};

use tf_checkpoint::{GgmlType, TensorFormat, TensorView};

use crate::cpu::{CpuBackend, CpuConfig, CpuTensor};
use crate::{ActDType, Backend};

/// Best time per call of `f`, run for at least `min`.
fn best(min: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::MAX;
    while start.elapsed() < min {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// Random ggml blocks with small f16 scales (the values only need to be finite).
fn weight(t: GgmlType, n: usize, k: usize, seed: u64) -> TensorView {
    let mut x = seed;
    let mut bytes: Vec<u8> = (0..n * k / t.block_elems() * t.block_bytes())
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect();
    // Finite f16 scales where each format keeps them (Q6_K's d is its last 2 bytes).
    let at = if t == GgmlType::Q6_K { t.block_bytes() - 2 } else { 0 };
    for blk in bytes.chunks_exact_mut(t.block_bytes()) {
        blk[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        if matches!(t, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K) {
            blk[2..4].copy_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
        }
    }
    TensorView::owned("bench.weight", TensorFormat::Ggml(t), vec![n, k], bytes)
}

/// Rows `0..rows` of a 20-row input; the 20-row call takes the panel GEMM.
fn rows_of(
    be: &CpuBackend,
    w: &crate::cpu::CpuWeight,
    k: usize,
    n: usize,
    rows: usize,
) -> Vec<u16> {
    let vals: Vec<f32> = (0..20 * k).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
    let x = CpuTensor::from_f32_as_bf16(rows, k, &vals[..rows * k]).unwrap();
    let mut out = CpuTensor::zeros(ActDType::Bf16, rows, n).unwrap();
    be.linear(&x, w, None, &mut out).unwrap();
    out.bf16_bits().unwrap()[..rows * n].to_vec()
}

#[test]
fn fused_row_counts_equal_the_panel_gemm() {
    let be = CpuBackend::with_config(CpuConfig { threads: Some(2), level: None }).unwrap();
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    for t in types {
        let (n, k) = (70, 512); // 70 columns: whole and partial column groups
        let w = be.load_weight(&weight(t, n, k, 3)).unwrap();
        let all = rows_of(&be, &w, k, n, 20);
        for rows in 1..=9 {
            assert_eq!(rows_of(&be, &w, k, n, rows), all[..rows * n], "{t:?}: {rows} rows");
        }
    }
}

#[test]
#[ignore]
fn linear_rows() {
    let threads = std::env::var("BENCH_THREADS").ok().and_then(|t| t.parse().ok());
    let be = CpuBackend::with_config(CpuConfig { threads, level: None }).unwrap();
    println!("{} threads", be.threads());
    let shapes = [
        ("q/o", GgmlType::Q4_1, 576, 576),
        ("gate/up", GgmlType::Q4_1, 1536, 576),
        ("down", GgmlType::Q4_1, 576, 1536),
        ("lm_head", GgmlType::Q8_0, 49152, 576),
    ];
    for (name, t, n, k) in shapes {
        let w = be.load_weight(&weight(t, n, k, 7)).unwrap();
        let mut line = format!("{name:>8} {t:?} [{n}x{k}]:");
        for rows in [1usize, 2, 4, 5, 8, 12, 16] {
            let vals: Vec<f32> = (0..rows * k).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
            let x = CpuTensor::from_f32_as_bf16(rows, k, &vals).unwrap();
            let mut out = CpuTensor::zeros(ActDType::Bf16, rows, n).unwrap();
            let s = best(Duration::from_millis(400), || be.linear(&x, &w, None, &mut out).unwrap());
            line += &format!(" r{rows} {:.0}us ({:.0}/row)", s * 1e6, s * 1e6 / rows as f64);
        }
        println!("{line}");
    }
}
