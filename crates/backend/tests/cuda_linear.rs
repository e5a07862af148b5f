//! The CUDA linear kernels: `linear_bf16` against the CPU backend and the fp32 bound, its
//! row invariance (rows 1, 2, 3, 8, 16, 17, 128, 2,048 bit for bit), and the tiled prefill
//! kernel `linear_bf16_tiled` bitwise equal to it (plus its speed), on seeded inputs.
//!
//! Every test needs an NVIDIA GPU and is ignored elsewhere; on the GPU machine:
//! `cargo test --release -p tf-backend --test cuda_linear -- --ignored --nocapture`.

mod common;

use common::cuda::*;
use common::*;
use tf_backend::batch::SeqMeta;
use tf_backend::cpu::CpuTensor;
use tf_backend::cuda::CudaBackend;
use tf_backend::{ActDType, Backend};
use tf_checkpoint::{DType, TensorFormat, TensorView};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn linear_within_the_fp32_bound_and_row_invariant() {
    let g = gpu();
    let c = cpu();
    let mut rng = Rng::new(5);
    let shapes = [
        (576, 576, true),
        (1536, 576, false),
        (4096, 4096, true),
        (1024, 4096, false),
        (4096, 14336, false),
        (200, 72, true),
    ];
    for (n, k, with_bias) in shapes {
        let wv = random_weight(&mut rng, TensorFormat::Plain(DType::BF16), n, k, 0.05);
        let bv = random_vector(&mut rng, n, 0.0, 0.5);
        let wf = reference_values(&wv);
        let bf = reference_values(&bv);
        let (w, b) = (g.load_weight(&wv).unwrap(), g.load_weight(&bv).unwrap());
        let bias = with_bias.then_some(&b);
        let max_rows = 128;
        let (xb, xf) = random_bf16(&mut rng, max_rows * k, 1.0);
        let full = gpu_linear(&g, &xb, max_rows, &w, bias, ActDType::Bf16);
        let full32 = gpu_linear(&g, &xb, max_rows, &w, bias, ActDType::F32);
        // float64 bound: |y - ref| <= gamma(k) sum|w x| (+ one bf16 rounding for bf16 out).
        let (mut worst, mut worst32) = (0f64, 0f64);
        for r in 0..16 {
            for f in 0..n {
                let (mut s, mut m) = (0f64, 0f64);
                for i in 0..k {
                    let p = wf[f * k + i] as f64 * xf[r * k + i] as f64;
                    s += p;
                    m += p.abs();
                }
                if with_bias {
                    s += bf[f] as f64;
                    m += (bf[f] as f64).abs();
                }
                let tol = gamma(k as f64 + 1.0) * m + 1e-30;
                let y32 = full32[r * n + f] as f64;
                worst32 = worst32.max((y32 - s).abs() / tol);
                let y = full[r * n + f] as f64;
                let tol16 = tol + y.abs() * 2f64.powi(-8);
                worst = worst.max((y - s).abs() / tol16);
            }
        }
        // The CPU backend's bf16 output (another summation order).
        let xc = CpuTensor::from_bf16_bits(max_rows, k, xb.clone()).unwrap();
        let (wc, bc) = (c.load_weight(&wv).unwrap(), c.load_weight(&bv).unwrap());
        let mut oc = c.alloc(ActDType::Bf16, max_rows, n).unwrap();
        c.linear(&xc, &wc, with_bias.then_some(&bc), &mut oc).unwrap();
        let (dmax, dn) = diff(&full, &c.read_f32(&oc, max_rows).unwrap());
        // Row invariance: every row of a call of r rows (taken at a shifting offset) equals
        // the same row of the 128-row call.
        let mut bad = 0;
        for &r in &ROWS {
            let off = (r * 7) % (max_rows - r + 1);
            let part = gpu_linear(&g, &xb[off * k..], r, &w, bias, ActDType::Bf16);
            bad += (bits(&part) != bits(&full[off * n..(off + r) * n])) as usize;
        }
        println!(
            "linear {n}x{k} bias={with_bias}: f32 out err/bound {worst32:.3}, bf16 out {worst:.3}; vs CPU max |d| {dmax:.3e}, {dn} of {} differ; row-invariance mismatching calls: {bad}",
            full.len()
        );
        assert!(worst32 <= 1.0 && worst <= 1.0, "outside the fp32 bound");
        assert_eq!(bad, 0, "a row's bits depend on the call's row count");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn linear_2048_rows_and_logits() {
    let g = gpu();
    let mut rng = Rng::new(6);
    let (n, k) = (1024, 2048);
    let wv = random_weight(&mut rng, TensorFormat::Plain(DType::BF16), n, k, 0.05);
    let w = g.load_weight(&wv).unwrap();
    let rows = 2048;
    let (xb, _) = random_bf16(&mut rng, rows * k, 1.0);
    let full = gpu_linear(&g, &xb, rows, &w, None, ActDType::Bf16);
    let mut bad = 0;
    for (r, off) in [(1usize, 2047usize), (17, 1000), (128, 1920)] {
        let part = gpu_linear(&g, &xb[off * k..], r, &w, None, ActDType::Bf16);
        bad += (bits(&part) != bits(&full[off * n..(off + r) * n])) as usize;
    }
    // logits: selected rows, f32 holding bf16-rounded values, equal to linear's bf16 rows.
    let x = up(&g, rows, k, &xb);
    let sel = vec![0u32, 5, 2047];
    let mut meta = batch(vec![0; rows], vec![0; rows], vec![SeqMeta { block_table: vec![0] }], 16);
    meta.logit_rows = sel.clone();
    let b = g.prepare_batch(&meta).unwrap();
    let mut lo = g.alloc(ActDType::F32, rows, n).unwrap();
    g.logits(&x, &w, &b, &mut lo).unwrap();
    let lv = g.read_f32(&lo, sel.len()).unwrap();
    let want: Vec<f32> =
        sel.iter().flat_map(|&r| full[r as usize * n..(r as usize + 1) * n].to_vec()).collect();
    println!("linear 2048 rows {n}x{k}: row-invariance mismatching calls {bad}; logits == linear rows: {}", bits(&lv) == bits(&want));
    assert_eq!(bad, 0);
    assert_eq!(bits(&lv), bits(&want));
}

/// The tiled linear kernels (gemm.cu's `TL_ENTRY`s): each must give `linear_bf16`'s bits.
const TILED: [&str; 2] = ["linear_bf16_tiled", "linear_bf16_tiled_r"];

/// A bf16 `(n, k)` weight with rows 0..4 made positive (so an input row of -0.0 gives -0.0
/// partials and the empty-slice combine shows), on the device.
fn tiled_case_weight(
    g: &CudaBackend,
    rng: &mut Rng,
    n: usize,
    k: usize,
) -> tf_backend::cuda::CudaWeight {
    let mut wv = random_weight(rng, TensorFormat::Plain(DType::BF16), n, k, 0.05);
    let mut bytes = wv.bytes().to_vec();
    for b in bytes[..4.min(n) * k * 2].chunks_exact_mut(2) {
        b[1] &= 0x7f;
    }
    wv = TensorView::owned("tiled.weight", TensorFormat::Plain(DType::BF16), vec![n, k], bytes);
    g.load_weight(&wv).unwrap()
}

/// `linear_bf16_tiled` against `linear_bf16`, bit for bit, forced onto each kernel, on every
/// llama3-8b and SmolLM2-135M product shape plus odd ones: K not a multiple of the 64-k tile
/// (72, 1000, 4104), an empty trailing K slice (1024 x 4104: 16 slices of 288), row counts that
/// are not a multiple of the 128-token tile, bf16 and f32 outputs, bias, and input rows of
/// -0.0 and +0.0 (signed-zero sums).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn tiled_linear_equals_streaming_linear_bitwise() {
    let g = gpu();
    let mut rng = Rng::new(11);
    let shapes = GEMM_CASE_SHAPES;
    let mut failed = Vec::new();
    for (n, k, with_bias) in shapes {
        let w = tiled_case_weight(&g, &mut rng, n, k);
        let b = g.load_weight(&random_vector(&mut rng, n, 0.0, 0.5)).unwrap();
        let bias = with_bias.then_some(&b);
        let max_rows = if n * k <= 4096 * 4096 { 2048 } else { 333 };
        let (mut xb, _) = random_bf16(&mut rng, max_rows * k, 1.0);
        xb[3 * k..6 * k].fill(0x8000);
        xb[6 * k..8 * k].fill(0);
        for rows in [1usize, 17, 333, max_rows] {
            let x = up(&g, rows, k, &xb[..rows * k]);
            for dt in [ActDType::Bf16, ActDType::F32] {
                let mut o = g.alloc(dt, rows, n).unwrap();
                g.linear_with_kernel("linear_bf16", &x, &w, bias, &mut o).unwrap();
                let a = bits(&g.read_f32(&o, rows).unwrap());
                for name in TILED {
                    let mut o = g.alloc(dt, rows, n).unwrap();
                    g.linear_with_kernel(name, &x, &w, bias, &mut o).unwrap();
                    let t = bits(&g.read_f32(&o, rows).unwrap());
                    let differ = a.iter().zip(&t).filter(|(p, q)| p != q).count();
                    if differ > 0 {
                        failed.push(format!("{name} {n}x{k} rows {rows} {dt:?}: {differ} differ"));
                    }
                }
            }
        }
        println!("tiled == streaming {n}x{k} bias={with_bias} rows 1/17/333/{max_rows}");
    }
    assert!(failed.is_empty(), "tiled kernel differs:\n{}", failed.join("\n"));
}

/// Row counts of `tiled_linear_speed`.
const ROWS_SPEED: [usize; 6] = [64, 128, 256, 512, 2048, 8192];

/// TFLOP/s of the linear kernels (forced) on llama3-8b shapes by row count; prints only.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn tiled_linear_speed() {
    let g = gpu();
    let mut rng = Rng::new(12);
    for (n, k) in [(4096, 4096), (6144, 4096), (1024, 4096), (14336, 4096), (4096, 14336)] {
        let w = tiled_case_weight(&g, &mut rng, n, k);
        let (xb, _) = random_bf16(&mut rng, 8192 * k, 1.0);
        let xs: Vec<_> = ROWS_SPEED.iter().map(|&r| up(&g, r, k, &xb[..r * k])).collect();
        for name in ["linear_bf16"].into_iter().chain(TILED) {
            let mut line = format!("{n}x{k} {name}:");
            for (&rows, x) in ROWS_SPEED.iter().zip(&xs) {
                if name == "linear_bf16" && rows > 2048 {
                    continue;
                }
                let mut out = g.alloc(ActDType::Bf16, rows, n).unwrap();
                for _ in 0..2 {
                    g.linear_with_kernel(name, x, &w, None, &mut out).unwrap();
                }
                g.synchronize().unwrap();
                let iters = 10;
                let t = std::time::Instant::now();
                for _ in 0..iters {
                    g.linear_with_kernel(name, x, &w, None, &mut out).unwrap();
                }
                g.synchronize().unwrap();
                let dt = t.elapsed().as_secs_f64() / iters as f64;
                let tf = 2.0 * (n * k * rows) as f64 / dt / 1e12;
                line += &format!(" r{rows}:{tf:.0}");
            }
            println!("linear TFLOP/s {line}");
        }
    }
}

/// `logits` through the tiled kernel (1,100 selected rows: `row_idx` gathers the input rows)
/// equals the same rows of a 2,048-row `linear` call and of single-row `linear_bf16` calls.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn tiled_logits_equal_linear_rows() {
    let g = gpu();
    let mut rng = Rng::new(13);
    let (n, k, rows) = (4096, 1024, 2048);
    let w = tiled_case_weight(&g, &mut rng, n, k);
    let (xb, _) = random_bf16(&mut rng, rows * k, 1.0);
    let full = gpu_linear(&g, &xb, rows, &w, None, ActDType::Bf16);
    let x = up(&g, rows, k, &xb);
    // Ascending (as `BatchMeta` requires), with gaps: row i of the output is input row 3i/2.
    let sel: Vec<u32> = (0..1100u32).map(|i| i + i / 2).collect();
    let mut meta = batch(vec![0; rows], vec![0; rows], vec![SeqMeta { block_table: vec![0] }], 16);
    meta.logit_rows = sel.clone();
    let b = g.prepare_batch(&meta).unwrap();
    let mut lo = g.alloc(ActDType::F32, sel.len(), n).unwrap();
    g.logits(&x, &w, &b, &mut lo).unwrap();
    let lv = g.read_f32(&lo, sel.len()).unwrap();
    let want: Vec<f32> =
        sel.iter().flat_map(|&r| full[r as usize * n..(r as usize + 1) * n].to_vec()).collect();
    let mut single = Vec::new();
    for &r in &sel[..8] {
        let one = up(&g, 1, k, &xb[r as usize * k..(r as usize + 1) * k]);
        let mut o = g.alloc(ActDType::Bf16, 1, n).unwrap();
        g.linear_with_kernel("linear_bf16", &one, &w, None, &mut o).unwrap();
        single.extend(g.read_f32(&o, 1).unwrap());
    }
    println!(
        "tiled logits of {} rows == linear rows: {}; == single-row linear_bf16: {}",
        sel.len(),
        bits(&lv) == bits(&want),
        bits(&lv[..8 * n]) == bits(&single)
    );
    assert_eq!(bits(&lv), bits(&want));
    assert_eq!(bits(&lv[..8 * n]), bits(&single));
}
