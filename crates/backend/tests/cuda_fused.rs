//! The fused decode ops on the GPU against their unfused composition, bit for bit, and their
//! speed at one row.
//!
//! - `fused_ops_equal_the_unfused_composition_bitwise`: `add_rms_norm` (= `add`, `rms_norm`),
//!   `linear_group` of q, k, v with and without biases (= three `linear`), `linear_swiglu`
//!   (= two `linear` and `swiglu`: gate, up and act compared) on random data at the
//!   llama3-8b and SmolLM2 shapes, in calls of 1, 8, 17, 64, 128 and 2,048 rows (decode rows
//!   take the fused kernels, large calls the tiled GEMM fallback). A control: other inputs
//!   give other outputs, so the comparison can fail.
//! - `fused_decode_profile_llama3_8b`: microseconds per op at one row (weights cycled out of
//!   L2) fused vs unfused, a graphed 32-layer step in the fused form, and what attention,
//!   `rope_kv_store` and the norms cost inside that step (the step minus the step without
//!   them; attention by position and pool size). Prints only.
//!
//! Both need an NVIDIA GPU and are ignored elsewhere; on the GPU machine:
//! `cargo test --release -p tf-backend --test cuda_fused -- --ignored --nocapture`.

mod common;

use common::cuda::{bf, decode_step_meta, gpu, per_call, rand_vector, rand_weight, read_bits, up};
use common::{random_bf16, Rng};
use tf_backend::batch::KvGeometry;
use tf_backend::cuda::{CudaBackend, CudaWeight};
use tf_backend::{
    ActDType, AddNormArgs, AttnArgs, Backend, LinearPart, NormArgs, RopeKvArgs, SwigluArgs,
};
use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::{DType, TensorFormat};

const ROWS: [usize; 6] = [1, 8, 17, 64, 128, 2048];

fn same(what: &str, rows: usize, a: &[u32], b: &[u32]) {
    assert_eq!(a.len(), b.len(), "{what}, {rows} rows: lengths");
    let bad = a.iter().zip(b).filter(|(x, y)| x != y).count();
    assert_eq!(bad, 0, "{what}, {rows} rows: {bad} elements differ from the unfused ops");
}

/// One geometry: hidden, q width, kv width, intermediate.
fn check_geometry(g: &CudaBackend, (h, qd, kvd, inter): (usize, usize, usize, usize)) {
    let mut rng = Rng::new(h as u64);
    let max = *ROWS.iter().max().unwrap();
    let (xb, _) = random_bf16(&mut rng, max * h, 1.0);
    let (ab, _) = random_bf16(&mut rng, max * h, 4.0);
    let (wq, wk, wv) = (
        rand_weight(g, &mut rng, qd, h),
        rand_weight(g, &mut rng, kvd, h),
        rand_weight(g, &mut rng, kvd, h),
    );
    let (bq, bk, bv) = (
        rand_vector(g, &mut rng, qd),
        rand_vector(g, &mut rng, kvd),
        rand_vector(g, &mut rng, kvd),
    );
    let (wg, wu) = (rand_weight(g, &mut rng, inter, h), rand_weight(g, &mut rng, inter, h));
    let norm = rand_vector(g, &mut rng, h);
    let mut first: Option<Vec<u32>> = None;
    for rows in ROWS {
        let x = up(g, rows, h, &xb[..rows * h]);
        // add_rms_norm
        let (mut acc1, mut acc2) =
            (up(g, rows, h, &ab[..rows * h]), up(g, rows, h, &ab[..rows * h]));
        let (mut o1, mut o2) = (bf(g, rows, h), bf(g, rows, h));
        g.add(&mut acc1, &x).unwrap();
        let na = NormArgs { x: &acc1, weight: &norm, eps: 1e-5, group: h, out: &mut o1 };
        g.rms_norm(na).unwrap();
        let (acc, weight, out) = (&mut acc2, &norm, &mut o2);
        g.add_rms_norm(AddNormArgs { acc, x: &x, weight, eps: 1e-5, group: h, out }).unwrap();
        same("add_rms_norm acc", rows, &read_bits(g, &acc1, rows), &read_bits(g, &acc2, rows));
        same("add_rms_norm out", rows, &read_bits(g, &o1, rows), &read_bits(g, &o2, rows));
        // linear_group, with and without biases
        for bias in [false, true] {
            let mut sep = [bf(g, rows, qd), bf(g, rows, kvd), bf(g, rows, kvd)];
            let mut grp = [bf(g, rows, qd), bf(g, rows, kvd), bf(g, rows, kvd)];
            for ((w, bw), o) in [(&wq, &bq), (&wk, &bk), (&wv, &bv)].into_iter().zip(&mut sep) {
                g.linear(&x, w, bias.then_some(bw), o).unwrap();
            }
            let [q, k, v] = &mut grp;
            let mut parts = [
                LinearPart { w: &wq, bias: bias.then_some(&bq), out: q },
                LinearPart { w: &wk, bias: bias.then_some(&bk), out: k },
                LinearPart { w: &wv, bias: bias.then_some(&bv), out: v },
            ];
            g.linear_group(&x, &mut parts).unwrap();
            for (j, (s, f)) in sep.iter().zip(&grp).enumerate() {
                same(
                    &format!("linear_group part {j} bias {bias}"),
                    rows,
                    &read_bits(g, s, rows),
                    &read_bits(g, f, rows),
                );
            }
        }
        // linear_swiglu
        let (mut g1, mut u1, mut a1) = (bf(g, rows, inter), bf(g, rows, inter), bf(g, rows, inter));
        let (mut g2, mut u2, mut a2) = (bf(g, rows, inter), bf(g, rows, inter), bf(g, rows, inter));
        g.linear(&x, &wg, None, &mut g1).unwrap();
        g.linear(&x, &wu, None, &mut u1).unwrap();
        g.swiglu(&g1, &u1, &mut a1).unwrap();
        let (gate, up_, out) = (&mut g2, &mut u2, &mut a2);
        g.linear_swiglu(SwigluArgs { x: &x, gate_w: &wg, up_w: &wu, gate, up: up_, out }).unwrap();
        same("linear_swiglu gate", rows, &read_bits(g, &g1, rows), &read_bits(g, &g2, rows));
        same("linear_swiglu up", rows, &read_bits(g, &u1, rows), &read_bits(g, &u2, rows));
        let act = read_bits(g, &a2, rows);
        same("linear_swiglu act", rows, &read_bits(g, &a1, rows), &act);
        // Row invariance of the fused op itself: row 0 of every call has the same bits.
        match &first {
            None => first = Some(act[..inter].to_vec()),
            Some(f) => assert_eq!(f[..], act[..inter], "act row 0 differs at {rows} rows"),
        }
        println!("h={h}: fused == unfused bit for bit at {rows} rows");
    }
    // Control: other inputs, other outputs (the comparison above can fail).
    let x2 = up(g, 1, h, &ab[..h]);
    let (mut g2, mut u2, mut a2) = (bf(g, 1, inter), bf(g, 1, inter), bf(g, 1, inter));
    let (gate, up_, out) = (&mut g2, &mut u2, &mut a2);
    g.linear_swiglu(SwigluArgs { x: &x2, gate_w: &wg, up_w: &wu, gate, up: up_, out }).unwrap();
    assert_ne!(first.unwrap(), read_bits(g, &a2, 1)[..inter].to_vec(), "control: inputs ignored");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn fused_ops_equal_the_unfused_composition_bitwise() {
    let g = gpu();
    check_geometry(&g, (576, 576, 192, 1536));
    check_geometry(&g, (4096, 4096, 1024, 14336));
}

/// A bf16 `(n, k)` matrix of one repeated value (speed only).
fn flat(g: &CudaBackend, n: usize, k: usize) -> CudaWeight {
    let bytes = [0x3cu8, 0x3c].repeat(n * k);
    let view =
        tf_checkpoint::TensorView::owned("w", TensorFormat::Plain(DType::BF16), vec![n, k], bytes);
    g.load_weight(&view).unwrap()
}

const C: usize = 8;

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn fused_decode_profile_llama3_8b() {
    let g = gpu();
    let (h, kvd, inter) = (4096usize, 1024usize, 14336usize);
    let mk = |n, k| (0..C).map(|_| flat(&g, n, k)).collect::<Vec<_>>();
    let (wq, wk, wv, wo) = (mk(h, h), mk(kvd, h), mk(kvd, h), mk(h, h));
    let (wg, wu, wd) = (mk(inter, h), mk(inter, h), mk(h, inter));
    let norm = rand_vector(&g, &mut Rng::new(1), h);
    let x = bf(&g, 1, h);
    let (mut q, mut k, mut v) = (bf(&g, 1, h), bf(&g, 1, kvd), bf(&g, 1, kvd));
    let (mut ga, mut up_, mut act) = (bf(&g, 1, inter), bf(&g, 1, inter), bf(&g, 1, inter));
    let (mut hid, mut nrm) = (bf(&g, 1, h), bf(&g, 1, h));
    let mb = |b: usize, dt: f64| format!("{:.1} us, {:.0} GB/s", dt * 1e6, b as f64 / dt / 1e9);
    let mut i = 0;
    let dt = per_call(&g, 400, || {
        let c = i % C;
        g.linear(&x, &wq[c], None, &mut q).unwrap();
        g.linear(&x, &wk[c], None, &mut k).unwrap();
        g.linear(&x, &wv[c], None, &mut v).unwrap();
        i += 1;
    });
    let qkv_bytes = (h * h + 2 * kvd * h) * 2;
    println!("q,k,v as 3 linear: {}", mb(qkv_bytes, dt));
    let dt = per_call(&g, 400, || {
        let c = i % C;
        let mut parts = [
            LinearPart { w: &wq[c], bias: None, out: &mut q },
            LinearPart { w: &wk[c], bias: None, out: &mut k },
            LinearPart { w: &wv[c], bias: None, out: &mut v },
        ];
        g.linear_group(&x, &mut parts).unwrap();
        i += 1;
    });
    println!("q,k,v as linear_group: {}", mb(qkv_bytes, dt));
    let gu_bytes = 2 * inter * h * 2;
    let dt = per_call(&g, 200, || {
        let c = i % C;
        g.linear(&x, &wg[c], None, &mut ga).unwrap();
        g.linear(&x, &wu[c], None, &mut up_).unwrap();
        g.swiglu(&ga, &up_, &mut act).unwrap();
        i += 1;
    });
    println!("gate,up,swiglu unfused: {}", mb(gu_bytes, dt));
    let dt = per_call(&g, 200, || {
        let c = i % C;
        let (gate, up, out) = (&mut ga, &mut up_, &mut act);
        g.linear_swiglu(SwigluArgs { x: &x, gate_w: &wg[c], up_w: &wu[c], gate, up, out }).unwrap();
        i += 1;
    });
    println!("gate,up as linear_swiglu: {}", mb(gu_bytes, dt));
    for (name, w) in [("o", &wo), ("down", &wd)] {
        let xin = bf(&g, 1, w[0].shape().1);
        let mut out = bf(&g, 1, h);
        let dt = per_call(&g, 400, || {
            g.linear(&xin, &w[i % C], None, &mut out).unwrap();
            i += 1;
        });
        println!("{name} {:?}: {}", w[0].shape(), mb(w[0].shape().0 * w[0].shape().1 * 2, dt));
    }
    let dt = per_call(&g, 400, || {
        g.add(&mut hid, &x).unwrap();
        g.rms_norm(NormArgs { x: &hid, weight: &norm, eps: 1e-5, group: h, out: &mut nrm })
            .unwrap();
    });
    println!("add + rms_norm: {:.1} us", dt * 1e6);
    let dt = per_call(&g, 400, || {
        let (acc, weight, out) = (&mut hid, &norm, &mut nrm);
        g.add_rms_norm(AddNormArgs { acc, x: &x, weight, eps: 1e-5, group: h, out }).unwrap();
    });
    println!("add_rms_norm: {:.1} us", dt * 1e6);
    let ws = Weights { wq, wk, wv, wo, wg, wu, wd, norm };
    let full = graphed_fused_step(&g, &ws, Skip::default());
    // What each non-product op costs inside the graphed chain: the step without it.
    let marginal = |what: &str, skip: Skip| {
        let base = graphed_fused_step(&g, &ws, Skip { attention: false, ..skip });
        let dt = graphed_fused_step(&g, &ws, skip);
        println!("  {what}: {:.1} us a layer", (base - dt) * 1e6 / 32.0);
    };
    println!("marginal cost in the graphed step (full minus the step without):");
    // Attention by position and pool size (the split grid is sized by the pool's capacity).
    for (pos, blocks) in [(300, 512), (300, 24), (200, 24), (1000, 512), (4000, 512)] {
        let at = Skip { attention: true, pos, blocks, ..Skip::default() };
        marginal(&format!("attention at position {pos}, pool of {blocks} blocks"), at);
    }
    // Pools of 4 and 1 layers that the 32 layers share (layer l % n): a block's stride in the
    // pool is layers x (K and V of every head), so these pack a split's blocks 8x and 32x
    // closer (1 layer: the strides a layer-major pool would have).
    for n in [4, 1] {
        let at = Skip { attention: true, pool_layers: n, ..Skip::default() };
        marginal(&format!("attention at position 300, 512 blocks of a {n}-layer pool"), at);
    }
    marginal("rope_kv_store", Skip { rope_kv: true, ..Skip::default() });
    marginal("both add_rms_norm", Skip { norms: true, ..Skip::default() });
    let all = Skip { attention: true, rope_kv: true, norms: true, ..Skip::default() };
    println!(
        "  all three kinds: {:.1} us a layer",
        (full - graphed_fused_step(&g, &ws, all)) * 1e6 / 32.0
    );
}

/// A profiling step's row position and KV pool size, and the ops it leaves out (the values
/// are then meaningless; only the time counts).
#[derive(Clone, Copy)]
struct Skip {
    pos: u32,
    blocks: usize,
    pool_layers: usize,
    attention: bool,
    rope_kv: bool,
    norms: bool,
}

impl Default for Skip {
    fn default() -> Self {
        let (attention, rope_kv, norms) = (false, false, false);
        Skip { pos: 300, blocks: 512, pool_layers: 32, attention, rope_kv, norms }
    }
}

struct Weights {
    wq: Vec<CudaWeight>,
    wk: Vec<CudaWeight>,
    wv: Vec<CudaWeight>,
    wo: Vec<CudaWeight>,
    wg: Vec<CudaWeight>,
    wu: Vec<CudaWeight>,
    wd: Vec<CudaWeight>,
    norm: CudaWeight,
}

/// A graphed 32-layer llama3-8b step at one row, as family/llama.rs issues it now (fused
/// ops), with the lm_head, at `skip`'s position and pool, less its ops; seconds a step.
fn graphed_fused_step(g: &CudaBackend, w: &Weights, skip: Skip) -> f64 {
    let (h, kvd, inter, vocab, hd) = (4096usize, 1024usize, 14336usize, 128256usize, 128usize);
    let geom = KvGeometry {
        layers: skip.pool_layers,
        kv_heads: 8,
        head_dim: hd,
        block_size: 16,
        num_blocks: skip.blocks,
    };
    let mut kv = g.alloc_kv(&geom).unwrap();
    let b1 = |c| bf(g, 1, c);
    let (mut hid, mut nrm, mut q, mut k, mut v) = (b1(h), b1(h), b1(h), b1(kvd), b1(kvd));
    let (mut at, mut pr, mut ga, mut up_, mut act) =
        (b1(h), b1(h), b1(inter), b1(inter), b1(inter));
    let mut lo = g.alloc(ActDType::F32, 1, vocab).unwrap();
    let (rope, embed, head) = (flat(g, 4096, hd), flat(g, 1000, h), flat(g, vocab, h));
    let mut meta = decode_step_meta();
    meta.positions[0] = skip.pos;
    meta.seqs[0].block_table = (0..(skip.pos / 16 + 1).min(skip.blocks as u32)).collect();
    let (norm, eps) = (&w.norm, 1e-5);
    let mut step = || {
        let b = g.prepare_batch(&meta).unwrap();
        g.step_begin(&b).unwrap();
        g.embed(&embed, &b, &mut hid).unwrap();
        for l in 0..32 {
            let c = l % C;
            if l == 0 {
                g.rms_norm(NormArgs { x: &hid, weight: norm, eps, group: h, out: &mut nrm })
                    .unwrap();
            } else if !skip.norms {
                let (acc, x, out) = (&mut hid, &pr, &mut nrm);
                g.add_rms_norm(AddNormArgs { acc, x, weight: norm, eps, group: h, out }).unwrap();
            }
            let mut parts = [
                LinearPart { w: &w.wq[c], bias: None, out: &mut q },
                LinearPart { w: &w.wk[c], bias: None, out: &mut k },
                LinearPart { w: &w.wv[c], bias: None, out: &mut v },
            ];
            g.linear_group(&nrm, &mut parts).unwrap();
            let (style, table) = (RopeStyle::Neox, &rope);
            if !skip.rope_kv {
                g.rope_kv_store(RopeKvArgs {
                    q: &mut q,
                    k: &mut k,
                    v: &v,
                    kv: &mut kv,
                    layer: l % skip.pool_layers,
                    heads: 32,
                    kv_heads: 8,
                    head_dim: hd,
                    style,
                    table,
                    batch: &b,
                })
                .unwrap();
            }
            let (kv_heads, scale) = (8, 0.088);
            let a = AttnArgs {
                q: &q,
                kv: &kv,
                layer: l % skip.pool_layers,
                batch: &b,
                heads: 32,
                kv_heads,
                head_dim: hd,
                scale,
                out: &mut at,
            };
            if !skip.attention {
                g.attention(a).unwrap();
            }
            g.linear(&at, &w.wo[c], None, &mut pr).unwrap();
            let (acc, x, out) = (&mut hid, &pr, &mut nrm);
            if !skip.norms {
                g.add_rms_norm(AddNormArgs { acc, x, weight: norm, eps, group: h, out }).unwrap();
            }
            let (gate, up, out) = (&mut ga, &mut up_, &mut act);
            g.linear_swiglu(SwigluArgs {
                x: &nrm,
                gate_w: &w.wg[c],
                up_w: &w.wu[c],
                gate,
                up,
                out,
            })
            .unwrap();
            g.linear(&act, &w.wd[c], None, &mut pr).unwrap();
        }
        let (acc, x, out) = (&mut hid, &pr, &mut nrm);
        g.add_rms_norm(AddNormArgs { acc, x, weight: norm, eps, group: h, out }).unwrap();
        g.logits(&nrm, &head, &b, &mut lo).unwrap();
        g.step_end().unwrap();
        g.argmax(&lo, 1).unwrap();
    };
    step();
    let dt = per_call(g, 100, &mut step);
    println!(
        "graphed fused 32-layer step, 1 row at position {}: {:.3} ms = {:.0} tok/s; {:?}",
        skip.pos,
        dt * 1e3,
        1.0 / dt,
        g.graph_stats()
    );
    dt
}
