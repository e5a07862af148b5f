//! `linear_bf16_ring` (the decode product fed by a shared-memory ring, `kernels/linear_ring.cu`)
//! against `linear_bf16`, bit for bit, on every shape it takes (K slices of 1, 4, 8 and 16:
//! bundles of 8, 2 and 1 tiles and two rounds a tile; a last bundle short of tiles; 14 runs a
//! slice), 1 to 8 rows, bf16 and f32 outputs, bias, rows of -0.0; `logits` with a row map;
//! `linear_swiglu` on `linear_bf16_swiglu_ring` against `linear_bf16_swiglu_d8` (gate, up and
//! act; tiles of 8, 4 and 2 jobs); planted weight changes that the comparisons must see; and
//! the speed of the entries, alone and as a chain of products (prints only).
//!
//! Every test needs an NVIDIA GPU (sm_90a) and is ignored elsewhere; on the GPU machine:
//! `cargo test --release -p tf-backend --test cuda_ring -- --ignored --nocapture`.

mod common;

use common::cuda::*;
use common::*;
use tf_backend::batch::SeqMeta;
use tf_backend::cuda::{CudaBackend, CudaWeight, DecodeRing};
use tf_backend::{ActDType, Backend, SwigluArgs};
use tf_checkpoint::{DType, TensorFormat, TensorView};

/// The ring entries: bulk copies, tensor copies.
const RINGS: [&str; 2] = ["linear_bf16_ring", "linear_bf16_ring_tma"];
/// The SwiGLU ring's forms.
const FORMS: [DecodeRing; 2] = [DecodeRing::Bulk, DecodeRing::Tensor];

/// (features, K, bias): o / q (8 slices), k and v (16: two rounds), gate and up (4: bundles of
/// 2 tiles), down (8 slices of 1,792 k: 14 runs), q/k/v's 6,144 and a head of 2,053 tiles (one
/// slice: bundles of 8, the last of 5).
const SHAPES: [(usize, usize, bool); 6] = [
    (4096, 4096, false),
    (1024, 4096, true),
    (14336, 4096, false),
    (4096, 14336, false),
    (6144, 4096, true),
    (2053 * 16, 4096, false),
];

fn weight(g: &CudaBackend, rng: &mut Rng, n: usize, k: usize) -> (Vec<u8>, CudaWeight) {
    let fmt = TensorFormat::Plain(DType::BF16);
    let v = random_weight(rng, fmt, n, k, 1.0 / (k as f64).sqrt());
    let bytes = v.bytes().to_vec();
    (bytes, g.load_weight(&v).unwrap())
}

fn weight_from(g: &CudaBackend, n: usize, k: usize, bytes: Vec<u8>) -> CudaWeight {
    let v = TensorView::owned("w", TensorFormat::Plain(DType::BF16), vec![n, k], bytes);
    g.load_weight(&v).unwrap()
}

/// `name`'s product of `rows` rows of x by the (n, k) weight w.
struct Case<'a> {
    x: &'a tf_backend::cuda::CudaTensor,
    rows: usize,
    w: &'a CudaWeight,
    n: usize,
    bias: Option<&'a CudaWeight>,
}

fn product(g: &CudaBackend, name: &str, c: &Case<'_>, dt: ActDType) -> Vec<u32> {
    let mut o = g.alloc(dt, c.rows, c.n).unwrap();
    g.linear_with_kernel(name, c.x, c.w, c.bias, &mut o).unwrap();
    read_bits(g, &o, c.rows)
}

#[test]
#[ignore = "needs an NVIDIA GPU (sm_90a): run with --ignored on the GPU machine"]
fn ring_product_equals_linear_bf16_bitwise() {
    let g = gpu();
    let mut rng = Rng::new(31);
    let mut failed = Vec::new();
    for (n, k, with_bias) in SHAPES {
        let (wb, w) = weight(&g, &mut rng, n, k);
        let b = g.load_weight(&random_vector(&mut rng, n, 0.0, 0.5)).unwrap();
        let bias = with_bias.then_some(&b);
        let (mut xb, _) = random_bf16(&mut rng, 8 * k, 1.0);
        xb[2 * k..3 * k].fill(0x8000); // a row of -0.0
        for rows in [1usize, 2, 3, 8] {
            let x = up(&g, rows, k, &xb[..rows * k]);
            let c = Case { x: &x, rows, w: &w, n, bias };
            for dt in [ActDType::Bf16, ActDType::F32] {
                let want = product(&g, "linear_bf16", &c, dt);
                for ring in RINGS {
                    let got = product(&g, ring, &c, dt);
                    let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
                    if differ > 0 {
                        failed.push(format!("{ring} {n}x{k} rows {rows} {dt:?}: {differ} differ"));
                    }
                }
            }
        }
        // Control: one weight element of tile 1's slice 0 changed must change the ring's
        // output (the comparison sees a wrong chain).
        let mut planted = wb.clone();
        let at = (17 * k + 5) * 2;
        planted[at + 1] ^= 0x40;
        let wp = weight_from(&g, n, k, planted);
        let x = up(&g, 1, k, &xb[..k]);
        let c = Case { x: &x, rows: 1, w: &w, n, bias };
        let want = product(&g, "linear_bf16", &c, ActDType::F32);
        for ring in RINGS {
            let got = product(&g, ring, &Case { w: &wp, ..c }, ActDType::F32);
            let seen = want.iter().zip(&got).filter(|(a, b)| a != b).count();
            println!(
                "{ring} == linear_bf16 {n}x{k} bias={with_bias} rows 1/2/3/8; control: {seen}"
            );
            if seen == 0 {
                failed.push(format!("{ring} {n}x{k}: the planted weight change was not seen"));
            }
        }
    }
    assert!(failed.is_empty(), "ring product differs:\n{}", failed.join("\n"));
}

/// `logits` on the ring (6 of 11 input rows by the row map) equals `linear_bf16`'s logits.
#[test]
#[ignore = "needs an NVIDIA GPU (sm_90a): run with --ignored on the GPU machine"]
fn ring_logits_equal_linear_bf16_logits() {
    let g = gpu();
    let mut rng = Rng::new(32);
    let (n, k, rows) = (2053 * 16, 4096, 11);
    let (_, w) = weight(&g, &mut rng, n, k);
    let (xb, _) = random_bf16(&mut rng, rows * k, 1.0);
    let x = up(&g, rows, k, &xb);
    let sel: Vec<u32> = vec![0, 2, 3, 7, 9, 10];
    let mut meta = batch(vec![0; rows], vec![0; rows], vec![SeqMeta { block_table: vec![0] }], 16);
    meta.logit_rows = sel.clone();
    let b = g.prepare_batch(&meta).unwrap();
    let run = |name: &str| {
        let mut lo = g.alloc(ActDType::F32, sel.len(), n).unwrap();
        g.logits_with_kernel(name, &x, &w, &b, &mut lo).unwrap();
        read_bits(&g, &lo, sel.len())
    };
    let want = run("linear_bf16");
    for ring in RINGS {
        let got = run(ring);
        let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
        println!("{ring} logits of {} mapped rows == linear_bf16's: {differ} differ", sel.len());
        assert_eq!(differ, 0, "{ring}");
    }
}

/// gate, up and act of `linear_swiglu` at `rows` rows, with the ring switch at `form`.
fn swiglu(
    g: &CudaBackend,
    form: DecodeRing,
    x: &tf_backend::cuda::CudaTensor,
    (wg, wu): (&CudaWeight, &CudaWeight),
    (rows, n): (usize, usize),
) -> Vec<u32> {
    g.set_decode_ring(form);
    let (mut gate, mut up, mut out) = (bf(g, rows, n), bf(g, rows, n), bf(g, rows, n));
    let a = SwigluArgs { x, gate_w: wg, up_w: wu, gate: &mut gate, up: &mut up, out: &mut out };
    g.linear_swiglu(a).unwrap();
    g.set_decode_ring(DecodeRing::Off);
    [&gate, &up, &out].iter().flat_map(|t| read_bits(g, t, rows)).collect()
}

/// `linear_swiglu` on the ring equals `linear_bf16_swiglu_d8`: gate and up of 4 slices (a tile
/// a bundle), 2 (2 tiles) and 1 (4 tiles, the last bundle of 3).
#[test]
#[ignore = "needs an NVIDIA GPU (sm_90a): run with --ignored on the GPU machine"]
fn ring_swiglu_equals_the_register_entry_bitwise() {
    let g = gpu();
    let mut rng = Rng::new(33);
    let mut failed = Vec::new();
    for (n, k) in [(14336, 4096), (16384, 2048), (2051 * 16, 1024)] {
        assert!(g.decode_ring_takes(1, (n, k), 2), "{n}x{k}: the ring does not take it");
        let (gb, wg) = weight(&g, &mut rng, n, k);
        let (_, wu) = weight(&g, &mut rng, n, k);
        let (mut xb, _) = random_bf16(&mut rng, 8 * k, 1.0);
        xb[k..2 * k].fill(0x8000);
        for rows in [1usize, 2, 8] {
            let x = up(&g, rows, k, &xb[..rows * k]);
            let want = swiglu(&g, DecodeRing::Off, &x, (&wg, &wu), (rows, n));
            for form in FORMS {
                let got = swiglu(&g, form, &x, (&wg, &wu), (rows, n));
                let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
                if differ > 0 {
                    failed.push(format!("swiglu {form:?} {n}x{k} rows {rows}: {differ} differ"));
                }
            }
        }
        // Control: a gate weight of the last tile's last slice changed must show.
        let mut planted = gb;
        let at = ((n - 1) * k + k - 3) * 2;
        planted[at + 1] ^= 0x40;
        let wp = weight_from(&g, n, k, planted);
        let x = up(&g, 1, k, &xb[..k]);
        let want = swiglu(&g, DecodeRing::Off, &x, (&wg, &wu), (1, n));
        for form in FORMS {
            let got = swiglu(&g, form, &x, (&wp, &wu), (1, n));
            let seen = want.iter().zip(&got).filter(|(a, b)| a != b).count();
            println!("ring swiglu {form:?} == swiglu_d8 {n}x{k} rows 1/2/8; control: {seen}");
            if seen == 0 {
                failed.push(format!("swiglu {form:?} {n}x{k}: the planted change was not seen"));
            }
        }
    }
    assert!(failed.is_empty(), "ring swiglu differs:\n{}", failed.join("\n"));
}

/// Microseconds and GB/s of weights a call at one row, each entry alone (back to back) and as
/// a chain o -> gate -> down -> o ... (each input the previous output), 10 rounds; prints only.
#[test]
#[ignore = "needs an NVIDIA GPU (sm_90a): run with --ignored on the GPU machine"]
fn ring_speed() {
    let g = gpu();
    let shapes = [(4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (128_256, 4096)];
    let ws: Vec<CudaWeight> = shapes.iter().map(|&(n, k)| flat_weight(&g, n, k)).collect();
    for (&(n, k), w) in shapes.iter().zip(&ws) {
        let x = up(&g, 1, k, &vec![0x3c00; k]);
        let mut out = g.alloc(ActDType::Bf16, 1, n).unwrap();
        let mut line = format!("{n}x{k}:");
        for name in ["linear_bf16", RINGS[0], RINGS[1]] {
            let dt =
                per_call(&g, 50, || g.linear_with_kernel(name, &x, w, None, &mut out).unwrap());
            let gbs = (n * k * 2) as f64 / dt / 1e9;
            line += &format!(" {name} {:.1} us {gbs:.0} GB/s;", dt * 1e6);
        }
        println!("ring speed {line}");
    }
    // gate + up + SwiGLU (2 x 14336 x 4096) at one row, register entry and ring.
    let (wg, wu) = (&ws[2], flat_weight(&g, 14336, 4096));
    let x = up(&g, 1, 4096, &vec![0x3c00; 4096]);
    let (mut gt, mut u, mut act) = (bf(&g, 1, 14336), bf(&g, 1, 14336), bf(&g, 1, 14336));
    for form in [DecodeRing::Off, DecodeRing::Bulk, DecodeRing::Tensor] {
        g.set_decode_ring(form);
        let dt = per_call(&g, 50, || {
            let a = SwigluArgs {
                x: &x,
                gate_w: wg,
                up_w: &wu,
                gate: &mut gt,
                up: &mut u,
                out: &mut act,
            };
            g.linear_swiglu(a).unwrap();
        });
        let gbs = (2 * 14336 * 4096 * 2) as f64 / dt / 1e9;
        println!("ring speed swiglu {form:?}: {:.1} us {gbs:.0} GB/s", dt * 1e6);
    }
    g.set_decode_ring(DecodeRing::Off);
    // The chain: o (4096 x 4096), gate (14336 x 4096), down (4096 x 14336), 10 times.
    let (o, gate, down) = (&ws[0], &ws[2], &ws[3]);
    let mut a = up(&g, 1, 4096, &vec![0x3c00; 4096]);
    let mut h = g.alloc(ActDType::Bf16, 1, 14336).unwrap();
    let mut y = g.alloc(ActDType::Bf16, 1, 4096).unwrap();
    let bytes = 10.0 * 2.0 * (4096.0 * 4096.0 + 2.0 * 14336.0 * 4096.0);
    for name in ["linear_bf16", RINGS[0], RINGS[1], "linear_bf16", RINGS[0], RINGS[1]] {
        let dt = per_call(&g, 5, || {
            for _ in 0..10 {
                g.linear_with_kernel(name, &a, o, None, &mut y).unwrap();
                g.linear_with_kernel(name, &y, gate, None, &mut h).unwrap();
                g.linear_with_kernel(name, &h, down, None, &mut a).unwrap();
            }
        });
        println!("ring chain {name}: {:.1} us, {:.0} GB/s", dt * 1e6, bytes / dt / 1e9);
    }
}
