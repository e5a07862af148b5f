//! `linear` / `logits` against a float64 reference, row invariance, and SIMD == scalar bits.
//!
//! Reference: the weights decoded by `tf_checkpoint::quant` (the scalar port of ggml, itself
//! checked against gguf-py fixtures), cast to f64, times the exact bf16 inputs, summed in f64.
//! Bound (notes/quant-formats.md §4.2): the kernel's longest rounding path is K/16 fma
//! roundings in a lane, 4 tree additions, plus the dequant, so with one spare level
//! `d = K/16 + 4 + 2` and `|y - y64| <= gamma_d * sum|w||x|`, plus `u*|y|` for the bias add.
//! The planted control recomputes the reference with every block scale 1% off (each value 1%
//! off for plain formats): at least 95% of the outputs must then exceed the bound.

mod common;

use common::*;
use tf_backend::batch::{BatchMeta, SeqMeta};
use tf_backend::cpu::{CpuBackend, CpuTensor, SimdLevel};
use tf_backend::{ActDType, Backend};
use tf_checkpoint::{DType, GgmlType, TensorFormat, TensorView};

/// (N, K) shapes per format: K must be whole blocks; plain formats also get ragged K.
fn shapes(f: TensorFormat) -> Vec<(usize, usize)> {
    match f {
        TensorFormat::Plain(_) => vec![(37, 576), (19, 40), (9, 7), (33, 1000)],
        TensorFormat::Ggml(t) if t.block_elems() == 256 => vec![(37, 256), (13, 1536)],
        TensorFormat::Ggml(_) => vec![(37, 576), (21, 96), (5, 32)],
    }
}

/// The same weight with every block scale (or every plain value) multiplied by 1.01.
fn scales_off(view: &TensorView) -> TensorView {
    let mut b = view.bytes().to_vec();
    let scale16 = |b: &mut [u8], at: usize| {
        let v = half::f16::from_le_bytes([b[at], b[at + 1]]).to_f64() * 1.01;
        b[at..at + 2].copy_from_slice(&half::f16::from_f64(v).to_le_bytes());
    };
    match view.format {
        TensorFormat::Plain(DType::BF16) => {
            for c in b.chunks_exact_mut(2) {
                let v = half::bf16::from_le_bytes([c[0], c[1]]).to_f64() * 1.01;
                c.copy_from_slice(&half::bf16::from_f64(v).to_le_bytes());
            }
        }
        TensorFormat::Plain(DType::F16) => {
            for i in (0..b.len()).step_by(2) {
                scale16(&mut b, i);
            }
        }
        TensorFormat::Plain(_) => {
            for c in b.chunks_exact_mut(4) {
                let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * 1.01;
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        TensorFormat::Ggml(t) => {
            let at = if t == GgmlType::Q6_K { 208 } else { 0 };
            for blk in b.chunks_exact_mut(t.block_bytes()) {
                scale16(blk, at);
            }
        }
    }
    TensorView::owned(&view.name, view.format, view.shape.clone(), b)
}

/// Per output (r, n): (f64 value, sum |w||x|).
fn reference(
    w: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    rows: usize,
    n: usize,
    k: usize,
) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(rows * n);
    for r in 0..rows {
        for c in 0..n {
            let (mut y, mut m) = (bias.map_or(0.0, |b| b[c] as f64), 0.0);
            for i in 0..k {
                let t = w[c * k + i] as f64 * x[r * k + i] as f64;
                y += t;
                m += t.abs();
            }
            out.push((y, m));
        }
    }
    out
}

fn bound(k: usize, m: f64, y: f64, has_bias: bool) -> f64 {
    let d = (k / 16 + 4 + 2) as f64 + if k.is_multiple_of(16) { 0.0 } else { 1.0 };
    gamma(d) * m + if has_bias { 2f64.powi(-24) * y.abs() } else { 0.0 }
}

fn run_linear(
    be: &CpuBackend,
    x: &CpuTensor,
    view: &TensorView,
    bias: Option<&TensorView>,
    dtype: ActDType,
) -> CpuTensor {
    let w = load(be, view);
    let b = bias.map(|b| load(be, b));
    let mut out = be.alloc(dtype, x.rows(), w.shape().0).unwrap();
    be.linear(x, &w, b.as_ref(), &mut out).unwrap();
    out
}

#[test]
fn within_the_fp32_bound_of_a_float64_reference_and_the_control_escapes() {
    let be = backend(SimdLevel::detect(), 2);
    let mut rng = Rng::new(11);
    for f in ALL_FORMATS {
        for (n, k) in shapes(f) {
            let rows = 6;
            let view = random_weight(&mut rng, f, n, k, 0.05);
            let bias_view = random_vector(&mut rng, n, 0.0, 0.3);
            let bias = reference_values(&bias_view);
            let (bits, xv) = random_bf16(&mut rng, rows * k, 1.0);
            let x = bf16_tensor(rows, k, &bits);
            let wv = reference_values(&view);
            let wv_off = reference_values(&scales_off(&view));
            for with_bias in [false, true] {
                let bv = with_bias.then_some(&bias_view);
                let out = run_linear(&be, &x, &view, bv, ActDType::F32);
                let got = be.read_f32(&out, rows).unwrap();
                let want = reference(&wv, &xv, with_bias.then_some(&bias[..]), rows, n, k);
                let off = reference(&wv_off, &xv, with_bias.then_some(&bias[..]), rows, n, k);
                let mut escaped = 0;
                for (i, (&g, &(y, m))) in got.iter().zip(&want).enumerate() {
                    let b = bound(k, m, y, with_bias);
                    assert!(
                        (g as f64 - y).abs() <= b,
                        "{f} [{n},{k}] bias {with_bias} out {i}: got {g}, f64 {y}, bound {b:e}"
                    );
                    if (g as f64 - off[i].0).abs() > b {
                        escaped += 1;
                    }
                }
                assert!(
                    escaped * 100 >= got.len() * 95,
                    "{f} [{n},{k}]: the 1%-off control exceeded the bound on only {escaped} of {}",
                    got.len()
                );
                // The bf16 output is the same sum rounded once.
                let out16 = run_linear(&be, &x, &view, bv, ActDType::Bf16);
                let got16 = be.read_f32(&out16, rows).unwrap();
                for (a, b) in got16.iter().zip(&got) {
                    assert_eq!(a.to_bits(), bf16(*b).to_bits(), "{f} [{n},{k}] bf16 output");
                }
            }
        }
    }
}

/// Rows `sel` of `bits` (rows of k) as a tensor.
fn pick(bits: &[u16], k: usize, sel: &[usize]) -> CpuTensor {
    let v: Vec<u16> = sel.iter().flat_map(|&r| bits[r * k..(r + 1) * k].iter().copied()).collect();
    bf16_tensor(sel.len(), k, &v)
}

#[test]
fn each_row_is_the_same_in_calls_of_any_size() {
    let be = backend(SimdLevel::detect(), 2);
    let mut rng = Rng::new(12);
    let total = 128;
    for f in ALL_FORMATS {
        let (n, k) = shapes(f)[0];
        let view = random_weight(&mut rng, f, n, k, 0.05);
        let bias = random_vector(&mut rng, n, 0.0, 0.3);
        let (bits, _) = random_bf16(&mut rng, total * k, 1.0);
        let all =
            run_linear(&be, &bf16_tensor(total, k, &bits), &view, Some(&bias), ActDType::Bf16);
        let want = all.bf16_bits().unwrap().to_vec();
        for size in [1usize, 2, 3, 8, 16, 17, 128] {
            // A random selection of rows, in a random order.
            let sel: Vec<usize> = (0..size).map(|_| rng.below(total)).collect();
            let out = run_linear(&be, &pick(&bits, k, &sel), &view, Some(&bias), ActDType::Bf16);
            let got = out.bf16_bits().unwrap();
            for (i, &r) in sel.iter().enumerate() {
                assert_eq!(
                    &got[i * n..(i + 1) * n],
                    &want[r * n..(r + 1) * n],
                    "{f}: row {r} differs in a call of {size} rows"
                );
            }
        }
    }
}

#[test]
fn every_simd_level_and_thread_count_gives_the_scalar_bits() {
    let scalar = backend(SimdLevel::Scalar, 1);
    let mut rng = Rng::new(13);
    let others: Vec<CpuBackend> =
        levels().into_iter().flat_map(|l| [1, 2, 3].map(|t| backend(l, t))).collect();
    for f in ALL_FORMATS {
        for (n, k) in shapes(f) {
            let view = random_weight(&mut rng, f, n, k, 0.05);
            let bias = random_vector(&mut rng, n, 0.0, 0.3);
            for rows in [1usize, 3, 4, 5, 17] {
                let (bits, _) = random_bf16(&mut rng, rows * k, 1.0);
                let x = bf16_tensor(rows, k, &bits);
                for dtype in [ActDType::F32, ActDType::Bf16] {
                    let want = scalar
                        .read_f32(&run_linear(&scalar, &x, &view, Some(&bias), dtype), rows)
                        .unwrap();
                    for be in &others {
                        let got = be
                            .read_f32(&run_linear(be, &x, &view, Some(&bias), dtype), rows)
                            .unwrap();
                        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{f} [{n},{k}] rows {rows} {dtype:?}: {be:?} differs from scalar"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn logits_are_the_selected_rows_rounded_to_bf16() {
    let be = backend(SimdLevel::detect(), 2);
    let mut rng = Rng::new(14);
    let (rows, n, k) = (9, 300, 576);
    let view = random_weight(&mut rng, TensorFormat::Ggml(GgmlType::Q8_0), n, k, 0.05);
    let w = load(&be, &view);
    let (bits, _) = random_bf16(&mut rng, rows * k, 1.0);
    let x = bf16_tensor(rows, k, &bits);
    let full = run_linear(&be, &x, &view, None, ActDType::F32);
    let full = be.read_f32(&full, rows).unwrap();
    let meta = BatchMeta {
        tokens: vec![0; rows],
        positions: vec![0; rows],
        row_seq: vec![0; rows],
        seqs: vec![SeqMeta { block_table: vec![0] }],
        logit_rows: vec![0, 4, 8],
        block_size: 16,
    };
    let batch = be.prepare_batch(&meta).unwrap();
    let mut out = be.alloc(ActDType::F32, 3, n).unwrap();
    be.logits(&x, &w, &batch, &mut out).unwrap();
    let got = be.read_f32(&out, 3).unwrap();
    for (i, &r) in meta.logit_rows.iter().enumerate() {
        for c in 0..n {
            let want = bf16(full[r as usize * n + c]);
            assert_eq!(got[i * n + c].to_bits(), want.to_bits(), "logit row {r} col {c}");
        }
    }
    // A bf16 output tensor is refused: logits are f32 holding bf16 values.
    let mut bad = be.alloc(ActDType::Bf16, 3, n).unwrap();
    assert!(be.logits(&x, &w, &batch, &mut bad).is_err());
}

#[test]
fn bad_shapes_and_formats_are_errors_not_panics() {
    let be = backend(SimdLevel::detect(), 2);
    let mut rng = Rng::new(15);
    let view = random_weight(&mut rng, TensorFormat::Ggml(GgmlType::Q4_1), 8, 64, 0.05);
    let w = load(&be, &view);
    let x = CpuTensor::zeros(ActDType::Bf16, 2, 32).unwrap();
    let mut out = be.alloc(ActDType::Bf16, 2, 8).unwrap();
    assert!(be.linear(&x, &w, None, &mut out).is_err(), "K mismatch");
    let x = CpuTensor::zeros(ActDType::Bf16, 3, 64).unwrap();
    assert!(be.linear(&x, &w, None, &mut out).is_err(), "too many rows for the output");
    let short = TensorView::owned("v", TensorFormat::Plain(DType::I32), vec![4], vec![0; 16]);
    assert!(matches!(be.load_weight(&short), Err(tf_backend::BackendError::Format { .. })));
    let mut truncated = view.clone();
    truncated.shape = vec![9, 64];
    assert!(be.load_weight(&truncated).is_err(), "bytes shorter than the shape");
}
