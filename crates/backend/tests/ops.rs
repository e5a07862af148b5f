//! Row-local ops (rms_norm, swiglu, add, rope, embed) against float64 references with stated
//! bounds and against the documented bf16 rounding recipe, and SIMD == scalar bits for each.

mod common;

use common::*;
use tf_backend::batch::{BatchMeta, SeqMeta};
use tf_backend::cpu::{CpuBackend, CpuTensor, SimdLevel};
use tf_backend::{ActDType, Backend, NormArgs, RopeArgs};
use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::{DType, TensorFormat, TensorView};

const U8: f64 = 1.0 / 256.0; // bf16 unit roundoff 2^-8

fn meta(tokens: Vec<u32>, positions: Vec<u32>) -> BatchMeta {
    let rows = tokens.len();
    let max = positions.iter().copied().max().unwrap_or(0) as usize;
    BatchMeta {
        tokens,
        positions,
        row_seq: vec![0; rows],
        seqs: vec![SeqMeta { block_table: (0..(max / 16 + 1) as u32).collect() }],
        logit_rows: vec![],
        block_size: 16,
    }
}

/// rms_norm of (rows, cols) in groups, on `be`; returns the bf16 output as f32.
fn norm(
    be: &CpuBackend,
    x: &[u16],
    rows: usize,
    cols: usize,
    w: &TensorView,
    group: usize,
) -> Vec<f32> {
    let x = bf16_tensor(rows, cols, x);
    let w = load(be, w);
    let mut out = be.alloc(ActDType::Bf16, rows, cols).unwrap();
    be.rms_norm(NormArgs { x: &x, weight: &w, eps: 1e-5, group, out: &mut out }).unwrap();
    be.read_f32(&out, rows).unwrap()
}

#[test]
fn rms_norm_follows_the_recipe_and_the_float64_bound() {
    let mut rng = Rng::new(21);
    let be = backend(SimdLevel::detect(), 2);
    for (rows, cols, group) in [(5, 576, 576), (3, 9 * 64, 64), (4, 3 * 40, 40), (2, 7, 7)] {
        let (bits, x) = random_bf16(&mut rng, rows * cols, 2.0);
        let wv = random_vector(&mut rng, group, 1.0, 0.2);
        let w = reference_values(&wv);
        let got = norm(&be, &bits, rows, cols, &wv, group);
        for (r, row) in x.chunks(cols).enumerate() {
            for (g, xs) in row.chunks(group).enumerate() {
                // The recipe: sum of squares in 16 lanes (element i in lane i % 16) and the
                // fixed tree, mean and rsqrt in f32, then bf16(w * bf16(x * r)).
                let mut lanes = [0f32; 16];
                for (i, &v) in xs.iter().enumerate() {
                    lanes[i % 16] = v.mul_add(v, lanes[i % 16]);
                }
                for wdt in [8, 4, 2, 1] {
                    for i in 0..wdt {
                        lanes[i] += lanes[i + wdt];
                    }
                }
                let rs = 1.0 / (lanes[0] / group as f32 + 1e-5).sqrt();
                let ms: f64 = xs.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / group as f64;
                let r64 = 1.0 / (ms + 1e-5).sqrt();
                for (i, &v) in xs.iter().enumerate() {
                    let y = got[r * cols + g * group + i];
                    let want = bf16(w[i] * bf16(v * rs));
                    assert_eq!(y.to_bits(), want.to_bits(), "row {r} group {g} elem {i}");
                    let y64 = w[i] as f64 * v as f64 * r64;
                    let b = 2.0 * U8 * y64.abs() + 1e-6 * (w[i] as f64 * v as f64 * r64).abs();
                    assert!(
                        (y as f64 - y64).abs() <= b + f64::MIN_POSITIVE,
                        "row {r}: {y} vs {y64}"
                    );
                }
            }
        }
    }
}

#[test]
fn swiglu_and_add_round_as_hf_does() {
    let mut rng = Rng::new(22);
    let be = backend(SimdLevel::detect(), 2);
    let (rows, cols) = (3, 1536 + 5);
    let (gb, g) = random_bf16(&mut rng, rows * cols, 3.0);
    let (ub, u) = random_bf16(&mut rng, rows * cols, 1.0);
    let (gt, ut) = (bf16_tensor(rows, cols, &gb), bf16_tensor(rows, cols, &ub));
    let mut out = be.alloc(ActDType::Bf16, rows, cols).unwrap();
    be.swiglu(&gt, &ut, &mut out).unwrap();
    let got = be.read_f32(&out, rows).unwrap();
    for i in 0..rows * cols {
        // float64 reference; bound: two bf16 roundings plus a few f32 ulps of silu.
        let s64 = g[i] as f64 / (1.0 + (-g[i] as f64).exp());
        let y64 = s64 * u[i] as f64;
        let b = (2.0 * U8 + 1e-6) * y64.abs();
        assert!(
            (got[i] as f64 - y64).abs() <= b,
            "swiglu {i}: g {} u {} -> {} vs {y64}",
            g[i],
            u[i],
            got[i]
        );
        // bf16(bf16(silu) * u): the product of two bf16 values is exact in f32.
        let s = got[i] / u[i];
        if u[i] != 0.0 && got[i] != 0.0 && got[i].is_finite() {
            assert!(
                (s as f64 - s64).abs() <= 2.0 * U8 * s64.abs(),
                "swiglu {i}: silu part {s} vs {s64}"
            );
        }
    }
    let mut acc = bf16_tensor(rows, cols, &gb);
    be.add(&mut acc, &ut).unwrap();
    let got = be.read_f32(&acc, rows).unwrap();
    for i in 0..rows * cols {
        assert_eq!(got[i].to_bits(), bf16(g[i] + u[i]).to_bits(), "add {i}");
    }
}

/// A bf16 rope table of `positions` rows: cos then sin of the head_dim/2 frequencies.
fn rope_table(positions: usize, hd: usize) -> (TensorView, Vec<f32>) {
    let mut vals = Vec::new();
    for p in 0..positions {
        for i in 0..hd {
            let f = p as f64 * 10000f64.powf(-2.0 * (i % (hd / 2)) as f64 / hd as f64);
            vals.push(bf16((if i < hd / 2 { f.cos() } else { f.sin() }) as f32));
        }
    }
    let bytes = vals.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
    (TensorView::owned("rope", TensorFormat::Plain(DType::BF16), vec![positions, hd], bytes), vals)
}

#[test]
fn rope_rotates_pairs_with_bf16_products() {
    let mut rng = Rng::new(23);
    let be = backend(SimdLevel::detect(), 2);
    let (heads, hd, rows) = (3, 64, 5);
    let (tv, tab) = rope_table(100, hd);
    let table = load(&be, &tv);
    let positions: Vec<u32> = (0..rows).map(|_| rng.below(100) as u32).collect();
    let batch = be.prepare_batch(&meta(vec![0; rows], positions.clone())).unwrap();
    for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
        let (bits, x) = random_bf16(&mut rng, rows * heads * hd, 1.0);
        let mut t = bf16_tensor(rows, heads * hd, &bits);
        be.rope(RopeArgs { x: &mut t, heads, head_dim: hd, style, table: &table, batch: &batch })
            .unwrap();
        let got = be.read_f32(&t, rows).unwrap();
        for r in 0..rows {
            let tr = &tab[positions[r] as usize * hd..][..hd];
            for h in 0..heads {
                let base = r * heads * hd + h * hd;
                for i in 0..hd / 2 {
                    let (i1, i2) = match style {
                        RopeStyle::Neox => (base + i, base + hd / 2 + i),
                        RopeStyle::Interleaved => (base + 2 * i, base + 2 * i + 1),
                    };
                    let (c, s) = (tr[i], tr[hd / 2 + i]);
                    let y1 = bf16(bf16(x[i1] * c) + bf16(-x[i2] * s));
                    let y2 = bf16(bf16(x[i2] * c) + bf16(x[i1] * s));
                    assert_eq!((got[i1], got[i2]), (y1, y2), "{style:?} row {r} head {h} pair {i}");
                    // float64: three bf16 roundings of values bounded by |x1|+|x2|.
                    let y64 = x[i1] as f64 * c as f64 - x[i2] as f64 * s as f64;
                    let b = 3.0 * U8 * (x[i1].abs() + x[i2].abs()) as f64;
                    assert!((got[i1] as f64 - y64).abs() <= b, "{style:?} row {r} pair {i}");
                }
            }
        }
    }
    // A position beyond the table is an error, not an out-of-bounds read.
    let far = be.prepare_batch(&meta(vec![0], vec![100])).unwrap();
    let mut t = be.alloc(ActDType::Bf16, 1, heads * hd).unwrap();
    let r = be.rope(RopeArgs {
        x: &mut t,
        heads,
        head_dim: hd,
        style: RopeStyle::Neox,
        table: &table,
        batch: &far,
    });
    assert!(r.is_err());
}

#[test]
fn embed_gathers_exact_rows_rounded_to_bf16() {
    let mut rng = Rng::new(24);
    let be = backend(SimdLevel::detect(), 2);
    for f in ALL_FORMATS {
        let k = if matches!(f, TensorFormat::Ggml(t) if t.block_elems() == 256) { 512 } else { 96 };
        let view = random_weight(&mut rng, f, 50, k, 0.3);
        let vals = reference_values(&view);
        let table = load(&be, &view);
        let tokens: Vec<u32> = (0..7).map(|_| rng.below(50) as u32).collect();
        let batch = be.prepare_batch(&meta(tokens.clone(), vec![0; 7])).unwrap();
        let mut out = be.alloc(ActDType::Bf16, 7, k).unwrap();
        be.embed(&table, &batch, &mut out).unwrap();
        let got = be.read_f32(&out, 7).unwrap();
        for (r, &t) in tokens.iter().enumerate() {
            for c in 0..k {
                assert_eq!(got[r * k + c], bf16(vals[t as usize * k + c]), "{f} token {t} col {c}");
            }
        }
        let bad = be.prepare_batch(&meta(vec![50], vec![0])).unwrap();
        assert!(be.embed(&table, &bad, &mut out).is_err(), "{f}: token beyond the table");
    }
}

/// Runs every row-local op on one backend; returns all outputs' bits.
fn all_ops(be: &CpuBackend, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let (rows, heads, hd) = (6, 5, 40);
    let cols = heads * hd;
    let mut bits_out = Vec::new();
    let mut take = |t: &CpuTensor| bits_out.extend(t.to_f32(t.rows()).iter().map(|v| v.to_bits()));
    let (xb, _) = random_bf16(&mut rng, rows * cols, 2.0);
    let (yb, _) = random_bf16(&mut rng, rows * cols, 2.0);
    let (x, y) = (bf16_tensor(rows, cols, &xb), bf16_tensor(rows, cols, &yb));
    for group in [cols, hd] {
        let w = load(be, &random_vector(&mut rng, group, 1.0, 0.3));
        let mut out = be.alloc(ActDType::Bf16, rows, cols).unwrap();
        be.rms_norm(NormArgs { x: &x, weight: &w, eps: 1e-6, group, out: &mut out }).unwrap();
        take(&out);
    }
    let mut out = be.alloc(ActDType::F32, rows, cols).unwrap();
    be.swiglu(&x, &y, &mut out).unwrap();
    take(&out);
    let mut acc = bf16_tensor(rows, cols, &xb);
    be.add(&mut acc, &y).unwrap();
    take(&acc);
    let (tv, _) = rope_table(64, hd);
    let table = load(be, &tv);
    let batch =
        be.prepare_batch(&meta(vec![3; rows], (0..rows as u32).map(|p| p * 9).collect())).unwrap();
    for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
        let mut t = bf16_tensor(rows, cols, &xb);
        be.rope(RopeArgs { x: &mut t, heads, head_dim: hd, style, table: &table, batch: &batch })
            .unwrap();
        take(&t);
        // head_dim 64 takes the vector path (40 the scalar one).
        let (tv64, _) = rope_table(64, 64);
        let table64 = load(be, &tv64);
        let mut t = bf16_tensor(rows, 3 * 64, &xb[..rows * 3 * 64]);
        let args =
            RopeArgs { x: &mut t, heads: 3, head_dim: 64, style, table: &table64, batch: &batch };
        be.rope(args).unwrap();
        take(&t);
    }
    for f in ALL_FORMATS {
        let k = if matches!(f, TensorFormat::Ggml(t) if t.block_elems() == 256) { 256 } else { 64 };
        let table = load(be, &random_weight(&mut rng, f, 8, k, 0.3));
        let mut out = be.alloc(ActDType::Bf16, rows, k).unwrap();
        be.embed(&table, &batch, &mut out).unwrap();
        take(&out);
    }
    bits_out
}

#[test]
fn every_simd_level_gives_the_scalar_bits() {
    let want = all_ops(&backend(SimdLevel::Scalar, 1), 25);
    for level in levels() {
        for threads in [1, 2, 3] {
            let got = all_ops(&backend(level, threads), 25);
            assert_eq!(got.len(), want.len());
            let same = got.iter().zip(&want).all(|(a, b)| {
                a == b || (f32::from_bits(*a).is_nan() && f32::from_bits(*b).is_nan())
            });
            assert!(same, "{level} with {threads} threads differs from scalar");
        }
    }
}

#[test]
fn shape_errors_are_reported() {
    let be = backend(SimdLevel::detect(), 2);
    let x = CpuTensor::zeros(ActDType::Bf16, 2, 10).unwrap();
    let y = CpuTensor::zeros(ActDType::Bf16, 2, 12).unwrap();
    let mut out = be.alloc(ActDType::Bf16, 2, 10).unwrap();
    assert!(be.swiglu(&x, &y, &mut out).is_err());
    let w = load(&be, &random_vector(&mut Rng::new(1), 4, 1.0, 0.1));
    let r = be.rms_norm(NormArgs { x: &x, weight: &w, eps: 1e-6, group: 4, out: &mut out });
    assert!(r.is_err(), "group must divide the columns");
    let mut small = be.alloc(ActDType::Bf16, 1, 10).unwrap();
    let w = load(&be, &random_vector(&mut Rng::new(1), 10, 1.0, 0.1));
    let r = be.rms_norm(NormArgs { x: &x, weight: &w, eps: 1e-6, group: 10, out: &mut small });
    assert!(r.is_err(), "output too small");
}
