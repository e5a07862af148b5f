//! The float64 reference backend's weight loading and row-local ops, each against its direct
//! float64 formula on small random inputs (activations are arbitrary f64 values, not f32 or
//! bf16 ones, so any narrowing inside an op shows), and its refusals of bad shapes.
//! Where the formula fixes the order (a dot product over k from 0, a sum of squares in order)
//! the comparison is bit for bit; elsewhere a stated f64-level bound.

use tf_backend::batch::{BatchMeta, SeqMeta};
use tf_backend::f64ref::{F64Backend, F64Tensor, F64Weight};
use tf_backend::{ActDType, Backend, BackendError, NormArgs};
use tf_checkpoint::quant::tensor_to_f32;
use tf_checkpoint::spec::{RopeScaling, RopeSpec, RopeStyle};
use tf_checkpoint::{DType, GgmlType, TensorFormat, TensorView};

/// splitmix64, seeded.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1), full f64 precision.
    fn sym(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| self.sym() * scale).collect()
    }
}

fn backend() -> F64Backend {
    let rope =
        RopeSpec { theta: 10000.0, style: RopeStyle::Neox, scaling: RopeScaling::None, dim: 8 };
    F64Backend::with_threads(&rope, Some(2)).unwrap()
}

/// An F32 weight of `shape` holding `values` rounded to f32; returns it and the f32 values
/// widened back (what the backend must hold).
fn f32_weight(
    be: &F64Backend,
    name: &str,
    shape: Vec<usize>,
    values: &[f64],
) -> (F64Weight, Vec<f64>) {
    let vals: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = TensorView::owned(name, TensorFormat::Plain(DType::F32), shape, bytes);
    (be.load_weight(&view).unwrap(), vals.iter().map(|&v| f64::from(v)).collect())
}

fn tensor(rows: usize, cols: usize, v: Vec<f64>) -> F64Tensor {
    F64Tensor::from_f64(rows, cols, v).unwrap()
}

fn batch_meta(tokens: Vec<u32>) -> BatchMeta {
    let rows = tokens.len();
    BatchMeta {
        tokens,
        positions: (0..rows as u32).collect(),
        row_seq: vec![0; rows],
        seqs: vec![SeqMeta { block_table: (0..(rows / 16 + 1) as u32).collect() }],
        logit_rows: vec![],
        block_size: 16,
    }
}

/// Sum over k from 0 of `x[k] * w[k]`, in order: the order the backend promises.
fn dot(x: &[f64], w: &[f64]) -> f64 {
    x.iter().zip(w).fold(0.0, |a, (&x, &w)| a + x * w)
}

#[test]
fn every_format_decodes_exactly_row_by_row() {
    let be = backend();
    let mut rng = Rng(1);
    let formats = [
        TensorFormat::Plain(DType::BF16),
        TensorFormat::Plain(DType::F16),
        TensorFormat::Plain(DType::F32),
        TensorFormat::Ggml(GgmlType::Q4_0),
        TensorFormat::Ggml(GgmlType::Q4_1),
        TensorFormat::Ggml(GgmlType::Q5_0),
        TensorFormat::Ggml(GgmlType::Q5_1),
        TensorFormat::Ggml(GgmlType::Q8_0),
        TensorFormat::Ggml(GgmlType::Q4_K),
        TensorFormat::Ggml(GgmlType::Q5_K),
        TensorFormat::Ggml(GgmlType::Q6_K),
    ];
    for f in formats {
        let (n, k) = (5, 512);
        let len = f.tensor_bytes(&[n, k]).unwrap();
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let view = TensorView::owned("w", f, vec![n, k], bytes);
        let w = be.load_weight(&view).unwrap();
        assert_eq!(w.shape(), (n, k), "{f}");
        // The checkpoint's scalar reference (itself checked against gguf-py), widened.
        let want = tensor_to_f32(&view).unwrap();
        let same =
            w.values().iter().zip(&want).all(|(&a, &b)| a.to_bits() == f64::from(b).to_bits());
        assert!(same, "{f}: f64 weights are not the exact decoded values");
    }
}

#[test]
fn unsupported_formats_and_bad_lengths_are_refused() {
    let be = backend();
    let v = TensorView::owned("ints", TensorFormat::Plain(DType::I32), vec![2, 4], vec![0; 32]);
    assert!(matches!(be.load_weight(&v), Err(BackendError::Format { .. })));
    let mut v =
        TensorView::owned("q", TensorFormat::Ggml(GgmlType::Q8_0), vec![1, 32], vec![0; 34]);
    v.shape = vec![2, 32]; // claims twice the bytes it has
    assert!(matches!(be.load_weight(&v), Err(BackendError::Shape { .. })));
}

#[test]
fn linear_is_the_ordered_dot_product_plus_bias_for_any_row_count() {
    let be = backend();
    let mut rng = Rng(2);
    for (rows, n, k) in [(1, 1, 3), (3, 5, 70), (4, 37, 64), (9, 70, 33), (5, 130, 17)] {
        let xv = rng.vec(rows * k, 3.0);
        let (w, wv) = f32_weight(&be, "w", vec![n, k], &rng.vec(n * k, 1.0));
        let (b, bv) = f32_weight(&be, "b", vec![n], &rng.vec(n, 1.0));
        let x = tensor(rows, k, xv.clone());
        let mut out = be.alloc(ActDType::Bf16, rows, n).unwrap();
        be.linear(&x, &w, Some(&b), &mut out).unwrap();
        let got = be.read_f64(&out, rows).unwrap();
        be.linear(&x, &w, None, &mut out).unwrap();
        let nobias = be.read_f64(&out, rows).unwrap();
        for r in 0..rows {
            for j in 0..n {
                let s = dot(&xv[r * k..(r + 1) * k], &wv[j * k..(j + 1) * k]);
                assert_eq!(
                    got[r * n + j].to_bits(),
                    (s + bv[j]).to_bits(),
                    "({rows},{n},{k}) [{r},{j}]"
                );
                assert_eq!(nobias[r * n + j].to_bits(), s.to_bits());
            }
        }
        // Row contract: each row alone gives the same bits.
        for r in 0..rows {
            let one = tensor(1, k, xv[r * k..(r + 1) * k].to_vec());
            let mut o1 = be.alloc(ActDType::F32, 1, n).unwrap();
            be.linear(&one, &w, Some(&b), &mut o1).unwrap();
            assert_eq!(be.read_f64(&o1, 1).unwrap(), got[r * n..(r + 1) * n]);
        }
    }
}

#[test]
fn logits_are_the_listed_rows_products() {
    let be = backend();
    let mut rng = Rng(3);
    let (rows, vocab, k) = (7, 101, 24);
    let xv = rng.vec(rows * k, 2.0);
    let (w, wv) = f32_weight(&be, "lm_head", vec![vocab, k], &rng.vec(vocab * k, 1.0));
    let x = tensor(rows, k, xv.clone());
    let mut meta = batch_meta(vec![0; rows]);
    meta.logit_rows = vec![0, 3, 6];
    let batch = be.prepare_batch(&meta).unwrap();
    let mut out = be.alloc(ActDType::F32, rows, vocab).unwrap();
    be.logits(&x, &w, &batch, &mut out).unwrap();
    let got = be.read_f64(&out, 3).unwrap();
    for (i, &r) in meta.logit_rows.iter().enumerate() {
        let r = r as usize;
        for v in 0..vocab {
            let want = dot(&xv[r * k..(r + 1) * k], &wv[v * k..(v + 1) * k]);
            assert_eq!(got[i * vocab + v].to_bits(), want.to_bits(), "row {r} token {v}");
        }
    }
    assert!(be.read_f64(&out, 4).is_err(), "only 3 rows are valid");
    meta.logit_rows.clear();
    let none = be.prepare_batch(&meta).unwrap();
    be.logits(&x, &w, &none, &mut out).unwrap();
    assert_eq!(be.read_f64(&out, 0).unwrap(), Vec::<f64>::new());
}

#[test]
fn rms_norm_is_w_times_x_over_root_mean_square() {
    let be = backend();
    let mut rng = Rng(4);
    for (rows, cols, group) in [(3, 576, 576), (2, 9 * 64, 64), (4, 7, 7)] {
        let xv = rng.vec(rows * cols, 5.0);
        let (w, wv) = f32_weight(&be, "norm", vec![group], &rng.vec(group, 2.0));
        let x = tensor(rows, cols, xv.clone());
        let mut out = be.alloc(ActDType::Bf16, rows, cols).unwrap();
        let eps = 1e-5f32;
        be.rms_norm(NormArgs { x: &x, weight: &w, eps, group, out: &mut out }).unwrap();
        let got = be.read_f64(&out, rows).unwrap();
        for (gi, xs) in xv.chunks(group).enumerate() {
            let ss = xs.iter().fold(0.0, |a, &v| a + v * v);
            let s = (ss / group as f64 + f64::from(eps)).sqrt();
            for (i, &v) in xs.iter().enumerate() {
                let want = wv[i] * (v / s);
                assert_eq!(got[gi * group + i].to_bits(), want.to_bits(), "group {gi} col {i}");
            }
        }
    }
}

#[test]
fn swiglu_and_add_are_their_formulas() {
    let be = backend();
    let mut rng = Rng(5);
    let (rows, cols) = (6, 300); // 1,800 elements, and a larger case over the threads below
    for (rows, cols) in [(rows, cols), (40, 1536)] {
        let (gv, uv) = (rng.vec(rows * cols, 12.0), rng.vec(rows * cols, 3.0));
        let (g, u) = (tensor(rows, cols, gv.clone()), tensor(rows, cols, uv.clone()));
        let mut out = be.alloc(ActDType::Bf16, rows, cols).unwrap();
        be.swiglu(&g, &u, &mut out).unwrap();
        let got = be.read_f64(&out, rows).unwrap();
        for i in 0..rows * cols {
            // silu(g) = g * sigmoid(g): the same value as g / (1 + e^-g) to a few f64 ulps.
            let want = gv[i] * (1.0 / (1.0 + (-gv[i]).exp())) * uv[i];
            assert!(
                (got[i] - want).abs() <= 4.0 * f64::EPSILON * want.abs(),
                "{i}: {} vs {want}",
                got[i]
            );
        }
        let mut acc = tensor(rows, cols, gv.clone());
        be.add(&mut acc, &u).unwrap();
        let sum = be.read_f64(&acc, rows).unwrap();
        assert!(sum
            .iter()
            .zip(gv.iter().zip(&uv))
            .all(|(&s, (&a, &b))| s.to_bits() == (a + b).to_bits()));
    }
}

#[test]
fn embed_copies_decoded_rows_and_refuses_unknown_tokens() {
    let be = backend();
    let mut rng = Rng(6);
    let (vocab, k) = (11, 64);
    let bytes: Vec<u8> = (0..TensorFormat::Ggml(GgmlType::Q8_0).tensor_bytes(&[vocab, k]).unwrap())
        .map(|_| rng.next() as u8)
        .collect();
    let view =
        TensorView::owned("embed", TensorFormat::Ggml(GgmlType::Q8_0), vec![vocab, k], bytes);
    let table = be.load_weight(&view).unwrap();
    let decoded = tensor_to_f32(&view).unwrap();
    let tokens = vec![3, 10, 0, 3];
    let batch = be.prepare_batch(&batch_meta(tokens.clone())).unwrap();
    let mut out = be.alloc(ActDType::Bf16, 4, k).unwrap();
    be.embed(&table, &batch, &mut out).unwrap();
    let got = be.read_f64(&out, 4).unwrap();
    for (r, &t) in tokens.iter().enumerate() {
        let want = &decoded[t as usize * k..(t as usize + 1) * k];
        assert!(got[r * k..(r + 1) * k]
            .iter()
            .zip(want)
            .all(|(&a, &b)| a.to_bits() == f64::from(b).to_bits()));
    }
    let bad = be.prepare_batch(&batch_meta(vec![11])).unwrap();
    assert!(be.embed(&table, &bad, &mut out).is_err());
}

#[test]
fn values_are_rounded_once_when_read_as_f32() {
    let be = backend();
    // 1 + 2^-24 + 2^-40: above the f32 midpoint between 1 and 1 + 2^-23, so it rounds up; a
    // value first narrowed to a shorter float would have lost the 2^-40 and rounded to even (1).
    let v = 1.0 + 2f64.powi(-24) + 2f64.powi(-40);
    let t = tensor(1, 1, vec![v]);
    assert_eq!(be.read_f64(&t, 1).unwrap(), vec![v]);
    assert_eq!(be.read_f32(&t, 1).unwrap(), vec![1.0 + 2f32.powi(-23)]);
    // Through an op too: add keeps the 2^-40.
    let mut acc = tensor(1, 1, vec![1.0 + 2f64.powi(-24)]);
    be.add(&mut acc, &tensor(1, 1, vec![2f64.powi(-40)])).unwrap();
    assert_eq!(be.read_f64(&acc, 1).unwrap(), vec![v]);
    assert_eq!(be.read_f32(&acc, 1).unwrap(), vec![1.0 + 2f32.powi(-23)]);
}

#[test]
fn mismatched_shapes_are_errors_not_panics() {
    let be = backend();
    let mut rng = Rng(7);
    let (w, _) = f32_weight(&be, "w", vec![4, 8], &rng.vec(32, 1.0));
    let (v, _) = f32_weight(&be, "v", vec![8], &rng.vec(8, 1.0));
    let x = tensor(2, 8, rng.vec(16, 1.0));
    let mut small = be.alloc(ActDType::Bf16, 1, 4).unwrap();
    assert!(be.linear(&x, &w, None, &mut small).is_err(), "output too few rows");
    let mut out = be.alloc(ActDType::Bf16, 2, 4).unwrap();
    assert!(be.linear(&x, &v, None, &mut out).is_err(), "a vector is not a matrix");
    assert!(be.linear(&tensor(2, 7, vec![0.0; 14]), &w, None, &mut out).is_err(), "k mismatch");
    assert!(be.linear(&x, &w, Some(&w), &mut out).is_err(), "bias must be a vector of n");
    let mut o8 = be.alloc(ActDType::Bf16, 2, 8).unwrap();
    assert!(be
        .rms_norm(NormArgs { x: &x, weight: &v, eps: 1e-5, group: 3, out: &mut o8 })
        .is_err());
    assert!(be
        .rms_norm(NormArgs { x: &x, weight: &w, eps: 1e-5, group: 8, out: &mut o8 })
        .is_err());
    let mut acc = tensor(2, 8, vec![0.0; 16]);
    assert!(be.add(&mut acc, &tensor(1, 8, vec![0.0; 8])).is_err());
    assert!(be.swiglu(&x, &tensor(2, 4, vec![0.0; 8]), &mut o8).is_err());
}
