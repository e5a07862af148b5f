//! The norm-fused decode products on the GPU against `add_rms_norm` followed by the product,
//! bit for bit, and their speed at one row.
//!
//! - `norm_fused_products_equal_the_two_ops_bitwise`: `add_norm_linear_group` (q, k, v, with
//!   and without biases) and `add_norm_linear_swiglu` against `add_rms_norm` then
//!   `linear_group` / `linear_swiglu`, comparing every output (the residual, the normed rows,
//!   the products) at the SmolLM2, llama3-8b and nanbeige-33b shapes, in calls of 1, 2, 3 and 8 rows (the
//!   fused kernels) and 17 and 64 (the two launches). Each call runs three times on other
//!   inputs in a row (the grid's CTA count must be reset by each launch for the next one's
//!   residual to be written). Controls: a planted change of one residual element changes the
//!   fused products (the comparison can fail), and `TENSORFOLD_NORM_FUSE=0` is not needed to
//!   see the fused kernel run (the speed test prints both).
//! - `norm_fused_products_speed_llama3_8b`: microseconds per call at one row, fused vs the
//!   two launches (weights cycled out of L2). Prints only.
//!
//! On the GPU machine: `TENSORFOLD_NORM_FUSE=all cargo test --release -p tf-backend --test
//! cuda_fused_norm -- --ignored --nocapture` (the default fuses q/k/v only; `all` runs the
//! gate/up entry too; the bitwise test refuses to run without it).

mod common;

use common::cuda::{bf, gpu, per_call, rand_vector, rand_weight, read_bits, up};
use common::{random_bf16, Rng};
use tf_backend::cuda::{CudaBackend, CudaTensor, CudaWeight};
use tf_backend::{AddNormArgs, Backend, LinearPart, SwigluArgs};

const ROWS: [usize; 6] = [1, 2, 3, 8, 17, 64];

fn count_diff(a: &[u32], b: &[u32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// One geometry's weights: q, k, v (+ biases), gate, up, the norm.
struct Model {
    h: usize,
    qkv: [(CudaWeight, CudaWeight); 3],
    gate: CudaWeight,
    up: CudaWeight,
    norm: CudaWeight,
}

impl Model {
    fn new(g: &CudaBackend, (h, qd, kvd, inter): (usize, usize, usize, usize)) -> Model {
        let rng = &mut Rng::new(h as u64 + 7);
        let mut wb = |n| (rand_weight(g, rng, n, h), rand_vector(g, rng, n));
        let qkv = [wb(qd), wb(kvd), wb(kvd)];
        let (gate, up) = (rand_weight(g, rng, inter, h), rand_weight(g, rng, inter, h));
        Model { h, qkv, gate, up, norm: rand_vector(g, rng, h) }
    }

    /// Every output of the q/k/v form, `fused` or as the two ops: [acc, normed, q, k, v].
    fn group(
        &self,
        g: &CudaBackend,
        acc0: &[u16],
        x0: &[u16],
        rows: usize,
        bias: bool,
        fused: bool,
    ) -> Vec<Vec<u32>> {
        let h = self.h;
        let (mut acc, x, mut nrm) = (up(g, rows, h, acc0), up(g, rows, h, x0), bf(g, rows, h));
        let mut outs: Vec<CudaTensor> =
            self.qkv.iter().map(|(w, _)| bf(g, rows, w.shape().0)).collect();
        let [q, k, v] = &mut outs[..] else { unreachable!() };
        let b = |j: usize| bias.then_some(&self.qkv[j].1);
        let mut parts = [
            LinearPart { w: &self.qkv[0].0, bias: b(0), out: q },
            LinearPart { w: &self.qkv[1].0, bias: b(1), out: k },
            LinearPart { w: &self.qkv[2].0, bias: b(2), out: v },
        ];
        let (weight, eps) = (&self.norm, 1e-5);
        let n = AddNormArgs { acc: &mut acc, x: &x, weight, eps, group: h, out: &mut nrm };
        if fused {
            g.add_norm_linear_group(n, &mut parts).unwrap();
        } else {
            g.add_rms_norm(n).unwrap();
            g.linear_group(&nrm, &mut parts).unwrap();
        }
        let mut all = vec![read_bits(g, &acc, rows), read_bits(g, &nrm, rows)];
        all.extend(outs.iter().map(|t| read_bits(g, t, rows)));
        all
    }

    /// Every output of the gate/up form: [acc, normed, gate, up, act].
    fn swiglu(
        &self,
        g: &CudaBackend,
        acc0: &[u16],
        x0: &[u16],
        rows: usize,
        fused: bool,
    ) -> Vec<Vec<u32>> {
        let (h, inter) = (self.h, self.gate.shape().0);
        let (mut acc, x, mut nrm) = (up(g, rows, h, acc0), up(g, rows, h, x0), bf(g, rows, h));
        let (mut ga, mut u, mut act) = (bf(g, rows, inter), bf(g, rows, inter), bf(g, rows, inter));
        let (weight, eps) = (&self.norm, 1e-5);
        let n = AddNormArgs { acc: &mut acc, x: &x, weight, eps, group: h, out: &mut nrm };
        if fused {
            g.add_norm_linear_swiglu(n, &self.gate, &self.up, &mut ga, &mut u, &mut act).unwrap();
        } else {
            g.add_rms_norm(n).unwrap();
            let a = SwigluArgs {
                x: &nrm,
                gate_w: &self.gate,
                up_w: &self.up,
                gate: &mut ga,
                up: &mut u,
                out: &mut act,
            };
            g.linear_swiglu(a).unwrap();
        }
        [&acc, &nrm, &ga, &u, &act].iter().map(|t| read_bits(g, t, rows)).collect()
    }
}

const NAMES: [&str; 5] = ["acc", "normed", "product 0", "product 1", "product 2"];

fn check_geometry(g: &CudaBackend, geo: (usize, usize, usize, usize)) {
    let m = Model::new(g, geo);
    let h = m.h;
    let mut rng = Rng::new(h as u64);
    for rows in ROWS {
        for rep in 0..3 {
            let (ab, _) = random_bf16(&mut rng, rows * h, 4.0);
            let (xb, _) = random_bf16(&mut rng, rows * h, 1.0);
            for bias in [false, true] {
                let (a, b) = (
                    m.group(g, &ab, &xb, rows, bias, false),
                    m.group(g, &ab, &xb, rows, bias, true),
                );
                for (j, (s, f)) in a.iter().zip(&b).enumerate() {
                    let bad = count_diff(s, f);
                    assert_eq!(
                        bad, 0,
                        "h={h} rows={rows} rep {rep} q/k/v bias {bias}: {} {bad} differ",
                        NAMES[j]
                    );
                }
            }
            let (a, b) = (m.swiglu(g, &ab, &xb, rows, false), m.swiglu(g, &ab, &xb, rows, true));
            for (j, (s, f)) in a.iter().zip(&b).enumerate() {
                let bad = count_diff(s, f);
                assert_eq!(
                    bad, 0,
                    "h={h} rows={rows} rep {rep} gate/up: {} {bad} differ",
                    NAMES[j]
                );
            }
        }
        println!("h={h}: norm-fused products == add_rms_norm + product bit for bit at {rows} rows (3 calls)");
    }
    // Control: one residual element changed (its sign) changes the fused products and the
    // residual, so the comparisons above can fail.
    let (ab, _) = random_bf16(&mut rng, h, 4.0);
    let (xb, _) = random_bf16(&mut rng, h, 1.0);
    let mut planted = ab.clone();
    planted[h / 3] ^= 0x8000;
    let (a, b) = (m.group(g, &ab, &xb, 1, false, false), m.group(g, &planted, &xb, 1, false, true));
    let diffs: Vec<usize> = a.iter().zip(&b).map(|(s, f)| count_diff(s, f)).collect();
    assert!(
        diffs.iter().all(|&d| d > 0),
        "control: a planted residual change went unseen: {diffs:?}"
    );
    let (a, b) = (m.swiglu(g, &ab, &xb, 1, false), m.swiglu(g, &planted, &xb, 1, true));
    let diffs2: Vec<usize> = a.iter().zip(&b).map(|(s, f)| count_diff(s, f)).collect();
    assert!(
        diffs2.iter().all(|&d| d > 0),
        "control: a planted residual change went unseen: {diffs2:?}"
    );
    println!("h={h}: control: a planted residual sign flip changes {diffs:?} / {diffs2:?} values");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn norm_fused_products_equal_the_two_ops_bitwise() {
    // The default fuses q/k/v only; `all` makes the gate/up entry run too.
    let mode = std::env::var("TENSORFOLD_NORM_FUSE");
    assert_eq!(mode.as_deref(), Ok("all"), "run with TENSORFOLD_NORM_FUSE=all");
    let g = gpu();
    check_geometry(&g, (576, 576, 192, 1536));
    check_geometry(&g, (4096, 4096, 1024, 14336));
    // nanbeige-33b's: more q/k/v tiles than CTAs an H200 holds (the persistent loop), and a
    // hidden size whose two rows pass STAGE_MAX (the two launches from 2 rows on).
    check_geometry(&g, (7168, 7168, 1024, 22016));
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn norm_fused_products_speed_llama3_8b() {
    let g = gpu();
    let models: Vec<Model> = (0..4).map(|_| Model::new(&g, (4096, 4096, 1024, 14336))).collect();
    let (h, inter) = (4096, 14336);
    let (mut acc, x, mut nrm) = (bf(&g, 1, h), bf(&g, 1, h), bf(&g, 1, h));
    let (mut q, mut k, mut v) = (bf(&g, 1, h), bf(&g, 1, 1024), bf(&g, 1, 1024));
    let (mut ga, mut u, mut act) = (bf(&g, 1, inter), bf(&g, 1, inter), bf(&g, 1, inter));
    for (qkv, mlp) in [(true, false), (false, true), (true, true)] {
        for fused in [false, true, false, true] {
            let mut i = 0;
            let dt = per_call(&g, 200, || {
                let m = &models[i % models.len()];
                i += 1;
                let (weight, eps) = (&m.norm, 1e-5);
                if qkv {
                    let n =
                        AddNormArgs { acc: &mut acc, x: &x, weight, eps, group: h, out: &mut nrm };
                    let mut parts = [
                        LinearPart { w: &m.qkv[0].0, bias: None, out: &mut q },
                        LinearPart { w: &m.qkv[1].0, bias: None, out: &mut k },
                        LinearPart { w: &m.qkv[2].0, bias: None, out: &mut v },
                    ];
                    if fused {
                        g.add_norm_linear_group(n, &mut parts).unwrap();
                    } else {
                        g.add_rms_norm(n).unwrap();
                        g.linear_group(&nrm, &mut parts).unwrap();
                    }
                }
                if mlp {
                    let n =
                        AddNormArgs { acc: &mut acc, x: &x, weight, eps, group: h, out: &mut nrm };
                    if fused {
                        g.add_norm_linear_swiglu(n, &m.gate, &m.up, &mut ga, &mut u, &mut act)
                            .unwrap();
                    } else {
                        g.add_rms_norm(n).unwrap();
                        let a = SwigluArgs {
                            x: &nrm,
                            gate_w: &m.gate,
                            up_w: &m.up,
                            gate: &mut ga,
                            up: &mut u,
                            out: &mut act,
                        };
                        g.linear_swiglu(a).unwrap();
                    }
                }
            });
            let what = if fused { "fused" } else { "add_rms_norm + product" };
            let ops = match (qkv, mlp) {
                (true, false) => "norm + q/k/v",
                (false, true) => "norm + gate/up",
                _ => "norm + q/k/v + norm + gate/up",
            };
            println!("{ops} at one row, {what}: {:.1} us", dt * 1e6);
        }
    }
}
