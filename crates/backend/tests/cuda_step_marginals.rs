//! What each op family costs inside the graphed llama3-8b decode step, as the model runs it
//! (the fused ops: `add_rms_norm`, `linear_group`, `rope_kv_store`, `attention`, the o
//! product, `linear_swiglu`, down, the final norm, logits, argmax): the step is timed whole and
//! with one family left out at a time, so each difference is that family's share of the
//! critical path (kernels overlap under programmatic dependent launch, so the per-kernel
//! durations of a profiler overstate it). Prints only; asserts nothing about speed. The values
//! are meaningless (flat weights) and never compared.
//!
//! On the GPU machine: `cargo test --release -p tf-backend --test cuda_step_marginals --
//! --ignored --nocapture` (`TF_MARGINAL_POS`: the row's position, 300).

mod common;

use common::cuda::{flat_weight, gpu, per_call};
use common::*;
use tf_backend::batch::{BatchMeta, KvGeometry, SeqMeta};
use tf_backend::cuda::CudaWeight;
use tf_backend::{ActDType, AddNormArgs, AttnArgs, Backend, LinearPart, RopeKvArgs, SwigluArgs};
use tf_checkpoint::spec::RopeStyle;

/// Op families a step may leave out.
#[derive(Clone, Copy, PartialEq)]
enum Skip {
    Nothing,
    /// Every op, the norms fused into the products that read them (the model's form since
    /// session 17: `add_norm_linear_group`, `add_norm_linear_swiglu`).
    Fused,
    Norms,
    Rope,
    Attention,
    Products,
    AllButProducts,
}

const LAYERS: usize = 32;
const COPIES: usize = 4;

struct Weights {
    q: Vec<CudaWeight>,
    kv: Vec<CudaWeight>,
    o: Vec<CudaWeight>,
    gate: Vec<CudaWeight>,
    up: Vec<CudaWeight>,
    down: Vec<CudaWeight>,
    head: CudaWeight,
    norm: CudaWeight,
    rope: CudaWeight,
    embed: CudaWeight,
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn decode_step_marginals_llama3_8b() {
    let g = gpu();
    let (h, kvd, inter, vocab, hd) = (4096usize, 1024usize, 14336usize, 128256usize, 128usize);
    let pos: u32 =
        std::env::var("TF_MARGINAL_POS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let many = |n, k| (0..COPIES).map(|_| flat_weight(&g, n, k)).collect::<Vec<_>>();
    let w = Weights {
        q: many(h, h),
        kv: many(kvd, h),
        o: many(h, h),
        gate: many(inter, h),
        up: many(inter, h),
        down: many(h, inter),
        head: flat_weight(&g, vocab, h),
        norm: g.load_weight(&random_vector(&mut Rng::new(1), h, 1.0, 0.1)).unwrap(),
        rope: flat_weight(&g, 4096 * 8, hd),
        embed: flat_weight(&g, 1000, h),
    };
    let blocks = (pos as usize + 1).div_ceil(16);
    let geom = KvGeometry {
        layers: LAYERS,
        kv_heads: 8,
        head_dim: hd,
        block_size: 16,
        num_blocks: blocks,
    };
    let mut kv = g.alloc_kv(&geom).unwrap();
    let meta = BatchMeta {
        tokens: vec![1],
        positions: vec![pos],
        row_seq: vec![0],
        seqs: vec![SeqMeta { block_table: (0..blocks as u32).collect() }],
        logit_rows: vec![0],
        block_size: 16,
    };
    let bf = |c| g.alloc(ActDType::Bf16, 1, c).unwrap();
    let (mut hid, mut nrm, mut q, mut k, mut v) = (bf(h), bf(h), bf(h), bf(kvd), bf(kvd));
    let (mut at, mut pr, mut ga, mut up, mut act) = (bf(h), bf(h), bf(inter), bf(inter), bf(inter));
    let mut lo = g.alloc(ActDType::F32, 1, vocab).unwrap();
    let order = [
        Skip::Nothing,
        Skip::Fused,
        Skip::Norms,
        Skip::Rope,
        Skip::Attention,
        Skip::AllButProducts,
        Skip::Products,
        Skip::Nothing,
        Skip::Fused,
    ];
    let mut whole = 0.0;
    for skip in order {
        let mut step = || {
            let b = g.prepare_batch(&meta).unwrap();
            g.step_begin(&b).unwrap();
            g.embed(&w.embed, &b, &mut hid).unwrap();
            let norms = !matches!(skip, Skip::Norms | Skip::AllButProducts);
            let products = skip != Skip::Products;
            let fused = skip == Skip::Fused;
            // The separate add_rms_norm launch, unless the norms are left out.
            let norm = |hid: &mut _, pr: &_, nrm: &mut _| {
                if norms {
                    g.add_rms_norm(add_norm(hid, pr, &w.norm, nrm)).unwrap();
                }
            };
            for l in 0..LAYERS {
                let c = l % COPIES;
                let parts = &mut [
                    LinearPart { w: &w.q[c], bias: None, out: &mut q },
                    LinearPart { w: &w.kv[c], bias: None, out: &mut k },
                    LinearPart { w: &w.kv[(c + 1) % COPIES], bias: None, out: &mut v },
                ];
                if fused {
                    let n = add_norm(&mut hid, &pr, &w.norm, &mut nrm);
                    g.add_norm_linear_group(n, parts).unwrap();
                } else {
                    norm(&mut hid, &pr, &mut nrm);
                    if products {
                        g.linear_group(&nrm, parts).unwrap();
                    }
                }
                if !matches!(skip, Skip::Rope | Skip::AllButProducts) {
                    g.rope_kv_store(RopeKvArgs {
                        q: &mut q,
                        k: &mut k,
                        v: &v,
                        kv: &mut kv,
                        layer: l,
                        heads: 32,
                        kv_heads: 8,
                        head_dim: hd,
                        style: RopeStyle::Neox,
                        table: &w.rope,
                        batch: &b,
                    })
                    .unwrap();
                }
                if !matches!(skip, Skip::Attention | Skip::AllButProducts) {
                    g.attention(AttnArgs {
                        q: &q,
                        kv: &kv,
                        layer: l,
                        batch: &b,
                        heads: 32,
                        kv_heads: 8,
                        head_dim: hd,
                        scale: 0.088,
                        out: &mut at,
                    })
                    .unwrap();
                }
                if products {
                    g.linear(&at, &w.o[c], None, &mut pr).unwrap();
                }
                if fused {
                    let n = add_norm(&mut hid, &pr, &w.norm, &mut nrm);
                    let (gw, uw) = (&w.gate[c], &w.up[c]);
                    g.add_norm_linear_swiglu(n, gw, uw, &mut ga, &mut up, &mut act).unwrap();
                } else {
                    norm(&mut hid, &pr, &mut nrm);
                    if products {
                        g.linear_swiglu(SwigluArgs {
                            x: &nrm,
                            gate_w: &w.gate[c],
                            up_w: &w.up[c],
                            gate: &mut ga,
                            up: &mut up,
                            out: &mut act,
                        })
                        .unwrap();
                    }
                }
                if products {
                    g.linear(&act, &w.down[c], None, &mut pr).unwrap();
                }
            }
            norm(&mut hid, &pr, &mut nrm);
            if products {
                g.logits(&nrm, &w.head, &b, &mut lo).unwrap();
            }
            g.step_end().unwrap();
            g.argmax(&lo, 1).unwrap();
        };
        step();
        let dt = per_call(&g, 100, &mut step);
        let what = match skip {
            Skip::Nothing => "every op",
            Skip::Fused => "every op, norms fused (TENSORFOLD_NORM_FUSE's products)",
            Skip::Norms => "without the norms",
            Skip::Rope => "without rope_kv_store",
            Skip::Attention => "without attention",
            Skip::Products => "without the products",
            Skip::AllButProducts => "products only",
        };
        if skip == Skip::Nothing {
            whole = dt;
        }
        println!(
            "decode step at position {pos}, {what}: {:.3} ms = {:.1} tok/s; saves {:.0} us ({:.0} us a layer)",
            dt * 1e3,
            1.0 / dt,
            (whole - dt) * 1e6,
            (whole - dt) * 1e6 / LAYERS as f64
        );
    }
}

/// The step's residual add and norm over hidden 4,096.
fn add_norm<'a>(
    hid: &'a mut tf_backend::cuda::CudaTensor,
    pr: &'a tf_backend::cuda::CudaTensor,
    weight: &'a CudaWeight,
    nrm: &'a mut tf_backend::cuda::CudaTensor,
) -> AddNormArgs<'a, tf_backend::cuda::CudaBackend> {
    AddNormArgs { acc: hid, x: pr, weight, eps: 1e-5, group: 4096, out: nrm }
}
