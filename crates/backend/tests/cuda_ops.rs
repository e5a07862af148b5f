//! The CUDA backend's row-local ops and attention against the CPU backend, their row
//! invariance, the kernels' limits and a decode/prefill speed probe, on seeded inputs (the
//! linear kernels: `cuda_linear.rs`).
//!
//! Every test needs an NVIDIA GPU and is ignored elsewhere; on the GPU machine:
//! `cargo test --release -p tf-backend --test cuda_ops -- --ignored --nocapture`
//! (`TENSORFOLD_NVRTC_LIB` names libnvrtc's directory if the loader does not find it).

mod common;

use common::cuda::*;
use common::*;
use tf_backend::batch::{KvGeometry, SeqMeta};
use tf_backend::cpu::{CpuBackend, CpuTensor};
use tf_backend::cuda::CudaBackend;
use tf_backend::{ActDType, AttnArgs, Backend, NormArgs, RopeArgs};
use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::{DType, TensorFormat, TensorView};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn row_local_ops_match_the_cpu_backend() {
    let (g, c) = (gpu(), cpu());
    let mut rng = Rng::new(7);
    let rows = 37;
    // rms_norm: full rows and per-head groups.
    for (cols, group) in [(576, 576), (4096, 4096), (8 * 128, 128), (9 * 64, 64)] {
        let (xb, _) = random_bf16(&mut rng, rows * cols, 2.0);
        let wv = random_vector(&mut rng, group, 1.0, 0.2);
        let (wg, wc) = (g.load_weight(&wv).unwrap(), c.load_weight(&wv).unwrap());
        let xg = up(&g, rows, cols, &xb);
        let xc = CpuTensor::from_bf16_bits(rows, cols, xb.clone()).unwrap();
        let mut og = g.alloc(ActDType::Bf16, rows, cols).unwrap();
        let mut oc = c.alloc(ActDType::Bf16, rows, cols).unwrap();
        g.rms_norm(NormArgs { x: &xg, weight: &wg, eps: 1e-5, group, out: &mut og }).unwrap();
        c.rms_norm(NormArgs { x: &xc, weight: &wc, eps: 1e-5, group, out: &mut oc }).unwrap();
        let (a, b) = (g.read_f32(&og, rows).unwrap(), c.read_f32(&oc, rows).unwrap());
        let (m, n) = diff(&a, &b);
        let ulp =
            a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= x.abs().max(y.abs()) * 2f32.powi(-7));
        println!("rms_norm ({rows}, {cols}) group {group}: max |d| {m:.3e}, {n} of {} differ, all within one bf16 step: {ulp}", a.len());
        assert!(ulp);
        // Row invariance: rows alone equal rows in the call.
        let one = up(&g, 1, cols, &xb[5 * cols..6 * cols]);
        let mut o1 = g.alloc(ActDType::Bf16, 1, cols).unwrap();
        g.rms_norm(NormArgs { x: &one, weight: &wg, eps: 1e-5, group, out: &mut o1 }).unwrap();
        assert_eq!(bits(&g.read_f32(&o1, 1).unwrap()), bits(&a[5 * cols..6 * cols]));
    }
    // swiglu and add.
    let cols = 1536;
    let (gb, _) = random_bf16(&mut rng, rows * cols, 3.0);
    let (ub, _) = random_bf16(&mut rng, rows * cols, 1.0);
    let (gg, ug) = (up(&g, rows, cols, &gb), up(&g, rows, cols, &ub));
    let (gc, uc) = (
        CpuTensor::from_bf16_bits(rows, cols, gb.clone()).unwrap(),
        CpuTensor::from_bf16_bits(rows, cols, ub.clone()).unwrap(),
    );
    let mut og = g.alloc(ActDType::Bf16, rows, cols).unwrap();
    let mut oc = c.alloc(ActDType::Bf16, rows, cols).unwrap();
    g.swiglu(&gg, &ug, &mut og).unwrap();
    c.swiglu(&gc, &uc, &mut oc).unwrap();
    let (a, b) = (g.read_f32(&og, rows).unwrap(), c.read_f32(&oc, rows).unwrap());
    let (m, n) = diff(&a, &b);
    let ulp = a
        .iter()
        .zip(&b)
        .all(|(x, y)| (x - y).abs() <= x.abs().max(y.abs()) * 2f32.powi(-7) + 1e-30);
    println!(
        "swiglu ({rows}, {cols}): max |d| {m:.3e}, {n} of {} differ, within one bf16 step: {ulp}",
        a.len()
    );
    assert!(ulp);
    let mut ag = up(&g, rows, cols, &gb);
    let mut ac = CpuTensor::from_bf16_bits(rows, cols, gb.clone()).unwrap();
    g.add(&mut ag, &ug).unwrap();
    c.add(&mut ac, &uc).unwrap();
    let (a, b) = (g.read_f32(&ag, rows).unwrap(), c.read_f32(&ac, rows).unwrap());
    println!("add: {} of {} differ", diff(&a, &b).1, a.len());
    assert_eq!(bits(&a), bits(&b));
    // rope, both styles, and embed.
    let (heads, hd, maxpos) = (6, 64, 300);
    let tab: Vec<u8> =
        (0..maxpos * hd).flat_map(|_| half::bf16::from_f64(rng.normal()).to_le_bytes()).collect();
    let tv =
        TensorView::owned("rope.table", TensorFormat::Plain(DType::BF16), vec![maxpos, hd], tab);
    let (tg, tc) = (g.load_weight(&tv).unwrap(), c.load_weight(&tv).unwrap());
    let positions: Vec<u32> = (0..rows).map(|_| rng.below(maxpos) as u32).collect();
    let mut meta =
        batch(positions, vec![0; rows], vec![SeqMeta { block_table: (0..32).collect() }], 16);
    meta.tokens = (0..rows).map(|_| rng.below(maxpos) as u32).collect();
    let (bg, bc) = (g.prepare_batch(&meta).unwrap(), c.prepare_batch(&meta).unwrap());
    for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
        let (xb, _) = random_bf16(&mut rng, rows * heads * hd, 1.0);
        let mut xg = up(&g, rows, heads * hd, &xb);
        let mut xc = CpuTensor::from_bf16_bits(rows, heads * hd, xb).unwrap();
        g.rope(RopeArgs { x: &mut xg, heads, head_dim: hd, style, table: &tg, batch: &bg })
            .unwrap();
        c.rope(RopeArgs { x: &mut xc, heads, head_dim: hd, style, table: &tc, batch: &bc })
            .unwrap();
        let (a, b) = (g.read_f32(&xg, rows).unwrap(), c.read_f32(&xc, rows).unwrap());
        println!("rope {style:?}: {} of {} differ", diff(&a, &b).1, a.len());
        assert_eq!(bits(&a), bits(&b));
    }
    let mut eg = g.alloc(ActDType::Bf16, rows, hd).unwrap();
    let mut ec = c.alloc(ActDType::Bf16, rows, hd).unwrap();
    g.embed(&tg, &bg, &mut eg).unwrap();
    c.embed(&tc, &bc, &mut ec).unwrap();
    let (a, b) = (g.read_f32(&eg, rows).unwrap(), c.read_f32(&ec, rows).unwrap());
    println!("embed: {} of {} differ", diff(&a, &b).1, a.len());
    assert_eq!(bits(&a), bits(&b));
}

/// Stores random k/v for positions 0..len of one sequence on both backends; returns the
/// sequence's block table and the q rows (len, heads * hd).
struct AttnCase {
    heads: usize,
    hd: usize,
    table: Vec<u32>,
    q: Vec<u16>,
}

fn attention_case(
    rng: &mut Rng,
    g: &CudaBackend,
    c: &CpuBackend,
    kv: (&mut tf_backend::cuda::CudaKv, &mut tf_backend::cpu::CpuKv),
    (heads, kvh, hd, len): (usize, usize, usize, usize),
) -> AttnCase {
    let bs = 16;
    // Blocks in a scrambled order: the table, not the pool order, defines positions.
    let nb = len.div_ceil(bs);
    let mut pool: Vec<u32> = (0..nb as u32 + 5).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.below(i + 1));
    }
    let table = pool[..nb].to_vec();
    let (kb, _) = random_bf16(rng, len * kvh * hd, 1.0);
    let (vb, _) = random_bf16(rng, len * kvh * hd, 1.0);
    let (q, _) = random_bf16(rng, len * heads * hd, 1.0);
    let meta = batch(
        (0..len as u32).collect(),
        vec![0; len],
        vec![SeqMeta { block_table: table.clone() }],
        bs,
    );
    let (bg, bc) = (g.prepare_batch(&meta).unwrap(), c.prepare_batch(&meta).unwrap());
    g.kv_store(kv.0, 1, &up(g, len, kvh * hd, &kb), &up(g, len, kvh * hd, &vb), &bg).unwrap();
    let (kc, vc) = (
        CpuTensor::from_bf16_bits(len, kvh * hd, kb).unwrap(),
        CpuTensor::from_bf16_bits(len, kvh * hd, vb).unwrap(),
    );
    c.kv_store(kv.1, 1, &kc, &vc, &bc).unwrap();
    AttnCase { heads, hd, table, q }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn attention_matches_the_cpu_and_any_chunking_gives_the_same_bits() {
    let (g, c) = (gpu(), cpu());
    let mut rng = Rng::new(8);
    for (heads, kvh, hd, len) in
        [(9usize, 3usize, 64usize, 1100usize), (8, 2, 128, 700), (4, 4, 256, 40)]
    {
        let geom = KvGeometry {
            layers: 2,
            kv_heads: kvh,
            head_dim: hd,
            block_size: 16,
            num_blocks: len.div_ceil(16) + 5,
        };
        let (mut kg, mut kc) = (g.alloc_kv(&geom).unwrap(), c.alloc_kv(&geom).unwrap());
        let case = attention_case(&mut rng, &g, &c, (&mut kg, &mut kc), (heads, kvh, hd, len));
        let (k1, v1) = g.read_kv(&kg, 1, &case.table, len).unwrap();
        let (k2, v2) = c.read_kv(&kc, 1, &case.table, len).unwrap();
        assert_eq!((bits(&k1), bits(&v1)), (bits(&k2), bits(&v2)), "read_kv");
        let qw = case.heads * case.hd;
        let scale = 1.0 / (case.hd as f32).sqrt();
        // Rows start..end of the sequence as one call.
        let run = |be_g: bool, start: usize, end: usize| -> Vec<f32> {
            let n = end - start;
            let meta = batch(
                (start as u32..end as u32).collect(),
                vec![0; n],
                vec![SeqMeta { block_table: case.table.clone() }],
                16,
            );
            let q = &case.q[start * qw..end * qw];
            if be_g {
                let b = g.prepare_batch(&meta).unwrap();
                let qt = up(&g, n, qw, q);
                let mut out = g.alloc(ActDType::Bf16, n, qw).unwrap();
                g.attention(AttnArgs {
                    q: &qt,
                    kv: &kg,
                    layer: 1,
                    batch: &b,
                    heads,
                    kv_heads: kvh,
                    head_dim: hd,
                    scale,
                    out: &mut out,
                })
                .unwrap();
                g.read_f32(&out, n).unwrap()
            } else {
                let b = c.prepare_batch(&meta).unwrap();
                let qt = CpuTensor::from_bf16_bits(n, qw, q.to_vec()).unwrap();
                let mut out = c.alloc(ActDType::Bf16, n, qw).unwrap();
                c.attention(AttnArgs {
                    q: &qt,
                    kv: &kc,
                    layer: 1,
                    batch: &b,
                    heads,
                    kv_heads: kvh,
                    head_dim: hd,
                    scale,
                    out: &mut out,
                })
                .unwrap();
                c.read_f32(&out, n).unwrap()
            }
        };
        let full = run(true, 0, len);
        let (m, n) = diff(&full, &run(false, 0, len));
        let step = full
            .iter()
            .zip(&run(false, 0, len))
            .all(|(x, y)| (x - y).abs() <= x.abs().max(y.abs()) * 2f32.powi(-7) + 1e-6);
        // Chunks of 7, 128, 17 and single decode rows must give the full call's bits.
        let mut bad = 0;
        for chunk in [7usize, 128, 17, 1] {
            let mut s = 0;
            while s < len {
                let e = (s + chunk).min(len);
                if chunk == 1 && s % 97 != 0 && s + 1 != len {
                    s = e;
                    continue;
                }
                bad += (bits(&run(true, s, e)) != bits(&full[s * qw..e * qw])) as usize;
                s = e;
            }
        }
        println!("attention {heads}/{kvh} heads of {hd}, {len} positions: vs CPU max |d| {m:.3e}, {n} of {} differ, within one bf16 step: {step}; chunked calls differing: {bad}", full.len());
        assert!(step, "attention differs from the CPU by more than a bf16 step");
        assert_eq!(bad, 0, "a row's attention depends on its chunk");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn kernels_compile_and_fit_the_device() {
    let g = gpu();
    let ks = g.kernels().unwrap();
    for k in &ks {
        println!(
            "{:<20} {:<12} regs {:>3} smem {:>6} threads {:>4}/{:<4} {:?} {:?}",
            k.name,
            k.family,
            k.registers,
            k.shared_bytes,
            k.launch_threads,
            k.max_threads,
            k.compiled.as_ref().map_err(|e| e.lines().next().unwrap_or("").to_string()),
            k.limits
        );
    }
    assert!(ks.iter().all(|k| k.compiled.is_ok() && k.limits.is_ok()));
    println!(
        "total {} MiB, free {} MiB, arch {}",
        g.total_memory() >> 20,
        g.free_memory() >> 20,
        g.arch()
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn decode_and_prefill_speed() {
    let g = gpu();
    let mut rng = Rng::new(9);
    for (n, k) in [(4096, 4096), (14336, 4096), (4096, 14336), (1024, 4096), (128256, 4096)] {
        let bytes: Vec<u8> = (0..n * k)
            .flat_map(|_| half::bf16::from_f32((rng.uniform() as f32 - 0.5) * 0.1).to_le_bytes())
            .collect();
        let w = g
            .load_weight(&TensorView::owned(
                "w",
                TensorFormat::Plain(DType::BF16),
                vec![n, k],
                bytes,
            ))
            .unwrap();
        for rows in [1usize, 8, 2048] {
            if rows == 2048 && n > 20000 {
                continue;
            }
            let (xb, _) = random_bf16(&mut rng, rows * k, 1.0);
            let x = up(&g, rows, k, &xb);
            let mut out = g.alloc(ActDType::Bf16, rows, n).unwrap();
            for _ in 0..3 {
                g.linear(&x, &w, None, &mut out).unwrap();
            }
            g.synchronize().unwrap();
            let iters = if rows == 2048 { 20 } else { 100 };
            let t = std::time::Instant::now();
            for _ in 0..iters {
                g.linear(&x, &w, None, &mut out).unwrap();
            }
            g.synchronize().unwrap();
            let dt = t.elapsed().as_secs_f64() / iters as f64;
            let gbs = (n * k * 2) as f64 / dt / 1e9;
            let tflops = 2.0 * (n * k * rows) as f64 / dt / 1e12;
            println!(
                "linear {n}x{k} rows {rows}: {:.1} us, weights {gbs:.0} GB/s, {tflops:.1} TFLOP/s",
                dt * 1e6
            );
        }
    }
}

/// Attention of rows `start..end` of one sequence (table `table`) on the GPU.
fn gpu_attention(
    g: &CudaBackend,
    kv: &tf_backend::cuda::CudaKv,
    case: &AttnCase,
    kvh: usize,
    (start, end): (usize, usize),
) -> Vec<f32> {
    let (n, qw) = (end - start, case.heads * case.hd);
    let meta = batch(
        (start as u32..end as u32).collect(),
        vec![0; n],
        vec![SeqMeta { block_table: case.table.clone() }],
        16,
    );
    let b = g.prepare_batch(&meta).unwrap();
    let qt = up(g, n, qw, &case.q[start * qw..end * qw]);
    let mut out = g.alloc(ActDType::Bf16, n, qw).unwrap();
    let args = AttnArgs {
        q: &qt,
        kv,
        layer: 1,
        batch: &b,
        heads: case.heads,
        kv_heads: kvh,
        head_dim: case.hd,
        scale: 1.0 / (case.hd as f32).sqrt(),
        out: &mut out,
    };
    g.attention(args).unwrap();
    g.read_f32(&out, n).unwrap()
}

/// NaN K and V in the slots of the sequence's last block past its end (pool memory no row
/// wrote) change no output bit: the tensor-core kernel loads those rows as zeros, so a 0
/// weight never meets a NaN value. Checked for a prefill call (one CTA walking all splits)
/// and for decode rows (split CTAs and the combine).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn attention_ignores_nan_in_unwritten_kv() {
    let (g, c) = (gpu(), cpu());
    let mut rng = Rng::new(9);
    for (heads, kvh, hd, len) in [(32usize, 8usize, 128usize, 1100usize), (9, 3, 64, 530)] {
        let geom = KvGeometry {
            layers: 2,
            kv_heads: kvh,
            head_dim: hd,
            block_size: 16,
            num_blocks: len.div_ceil(16) + 5,
        };
        let (mut kg, mut kc) = (g.alloc_kv(&geom).unwrap(), c.alloc_kv(&geom).unwrap());
        let case = attention_case(&mut rng, &g, &c, (&mut kg, &mut kc), (heads, kvh, hd, len));
        let before = gpu_attention(&g, &kg, &case, kvh, (0, len));
        let decode_before: Vec<Vec<f32>> = [0, len / 2, len - 1]
            .iter()
            .map(|&p| gpu_attention(&g, &kg, &case, kvh, (p, p + 1)))
            .collect();
        // Positions len..end of the last block: NaN K and V (bf16 0x7fc0).
        let end = len.div_ceil(16) * 16;
        assert!(end > len, "the case must leave unwritten slots");
        let nan = vec![0x7fc0u16; (end - len) * kvh * hd];
        let meta = batch(
            (len as u32..end as u32).collect(),
            vec![0; end - len],
            vec![SeqMeta { block_table: case.table.clone() }],
            16,
        );
        let b = g.prepare_batch(&meta).unwrap();
        let t = up(&g, end - len, kvh * hd, &nan);
        g.kv_store(&mut kg, 1, &t, &t, &b).unwrap();
        let after = gpu_attention(&g, &kg, &case, kvh, (0, len));
        assert!(after.iter().all(|x| x.is_finite()), "NaN reached an output");
        assert_eq!(bits(&before), bits(&after), "NaN in unwritten KV changed a prefill row");
        for (i, &p) in [0, len / 2, len - 1].iter().enumerate() {
            let d = gpu_attention(&g, &kg, &case, kvh, (p, p + 1));
            assert_eq!(bits(&decode_before[i]), bits(&d), "decode row {p} changed");
            assert_eq!(bits(&d), bits(&before[p * heads * hd..(p + 1) * heads * hd]), "row {p}");
        }
        println!(
            "attention {heads}/{kvh} heads of {hd}, {len} positions: NaN past the end ignored"
        );
    }
}
