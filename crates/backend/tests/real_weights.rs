//! `linear` on the real test model's matrices (SmolLM2-135M Q4_1 GGUF: Q4_1 projections, the
//! Q8_0 tied embedding used as lm_head): the float64 bound with its planted 1%-scale control,
//! and the same bits for a row computed alone, in a GEMM batch, and at the scalar level.
//!
//! Needs the model: `scripts/fetch-model.sh` (cache: `$TENSORFOLD_CACHE` or `<repo>/.cache`).

mod common;

use std::path::PathBuf;

use common::*;
use tf_backend::cpu::SimdLevel;
use tf_backend::{ActDType, Backend};
use tf_checkpoint::gguf::GgufFile;
use tf_checkpoint::TensorView;

fn model() -> GgufFile {
    let cache = std::env::var("TENSORFOLD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"));
    let path = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-model.sh", path.display());
    GgufFile::open(&path).expect("open the test model")
}

/// `view` with every block's f16 `d` (offset 0: Q4_1 and Q8_0) multiplied by 1.01.
fn scales_off(view: &TensorView) -> TensorView {
    let tf_checkpoint::TensorFormat::Ggml(t) = view.format else { panic!("a ggml tensor") };
    let mut b = view.bytes().to_vec();
    for blk in b.chunks_exact_mut(t.block_bytes()) {
        let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f64() * 1.01;
        blk[..2].copy_from_slice(&half::f16::from_f64(d).to_le_bytes());
    }
    TensorView::owned(&view.name, view.format, view.shape.clone(), b)
}

#[test]
fn real_matrices_meet_the_bound_and_the_control_escapes() {
    let file = model();
    let be = backend(SimdLevel::detect(), 2);
    let mut rng = Rng::new(41);
    let names = [
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.0.ffn_gate.weight",
        "blk.0.ffn_down.weight",
        "blk.29.attn_v.weight",
        "token_embd.weight",
    ];
    for name in names {
        let view = file.tensor_view(name).unwrap();
        let (n, k) = view.rows_cols();
        let rows = 2;
        let w = load(&be, &view);
        let wv = reference_values(&view);
        let wv_off = reference_values(&scales_off(&view));
        let (bits, xv) = random_bf16(&mut rng, rows * k, 1.0);
        let x = bf16_tensor(rows, k, &bits);
        let mut out = be.alloc(ActDType::F32, rows, n).unwrap();
        be.linear(&x, &w, None, &mut out).unwrap();
        let got = be.read_f32(&out, rows).unwrap();
        let d = (k / 16 + 4 + 2) as f64;
        let (mut escaped, mut worst) = (0usize, 0f64);
        for r in 0..rows {
            for c in 0..n {
                let (mut y, mut y_off, mut m) = (0f64, 0f64, 0f64);
                for i in 0..k {
                    let xi = xv[r * k + i] as f64;
                    y += wv[c * k + i] as f64 * xi;
                    y_off += wv_off[c * k + i] as f64 * xi;
                    m += (wv[c * k + i] as f64 * xi).abs();
                }
                let (g, b) = (got[r * n + c] as f64, gamma(d) * m);
                assert!((g - y).abs() <= b, "{name} row {r} col {c}: {g} vs {y} (bound {b:e})");
                worst = worst.max((g - y).abs() / b);
                escaped += usize::from((g - y_off).abs() > b);
            }
        }
        println!(
            "{name}: worst error {worst:.4} of the bound, control escaped on {escaped} of {}",
            rows * n
        );
        assert!(
            escaped * 100 >= rows * n * 95,
            "{name}: the 1%-off control exceeded the bound on {escaped} of {}",
            rows * n
        );
    }
}

#[test]
fn real_matrices_give_the_same_bits_alone_batched_and_scalar() {
    let file = model();
    let fast = backend(SimdLevel::detect(), 2);
    let scalar = backend(SimdLevel::Scalar, 1);
    let mut rng = Rng::new(42);
    for name in ["blk.3.ffn_up.weight", "blk.3.ffn_down.weight", "token_embd.weight"] {
        let view = file.tensor_view(name).unwrap();
        let (n, k) = view.rows_cols();
        let rows = 7;
        let (bits, _) = random_bf16(&mut rng, rows * k, 1.0);
        let run = |be: &tf_backend::cpu::CpuBackend, bits: &[u16], rows: usize| {
            let w = load(be, &view);
            let mut out = be.alloc(ActDType::Bf16, rows, n).unwrap();
            be.linear(&bf16_tensor(rows, k, bits), &w, None, &mut out).unwrap();
            out.bf16_bits().unwrap().to_vec()
        };
        let batched = run(&fast, &bits, rows);
        for r in [0, 3, 6] {
            let alone = run(&fast, &bits[r * k..(r + 1) * k], 1);
            assert_eq!(
                alone,
                &batched[r * n..(r + 1) * n],
                "{name}: row {r} alone vs in a batch of {rows}"
            );
        }
        if name != "token_embd.weight" {
            assert_eq!(run(&scalar, &bits, rows), batched, "{name}: scalar level differs");
        }
    }
}
