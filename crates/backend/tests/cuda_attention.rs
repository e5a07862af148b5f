//! Decode attention on the CUDA backend: the decode CTAs (`attention_dec_hd*`, split mode)
//! give the bits of the same rows inside one long prefill call (one CTA walking every split),
//! and what one decode attention call costs per layer inside a CUDA graph, and what a
//! prefill call costs (`TENSORFOLD_ATTN_WG=0`: the mma.sync walk CTA instead of the wgmma one).
//!
//! Every test needs an NVIDIA GPU and is ignored elsewhere; on the GPU machine:
//! `cargo test --release -p tf-backend --test cuda_attention -- --ignored --nocapture`.
//! `TENSORFOLD_DECODE_ATTN=0` runs split mode on the general kernel instead (the kernel before
//! the decode entries): the A/B baseline of the timing; the bitwise test must pass either way.

mod common;

use common::cuda::*;
use common::*;
use tf_backend::batch::{BatchMeta, KvGeometry, SeqMeta};
use tf_backend::cuda::{CudaBackend, CudaKv, CudaTensor};
use tf_backend::{ActDType, AttnArgs, Backend};

/// One sequence of `len` random positions stored at `layer` of a pool with scrambled blocks.
struct Seq {
    heads: usize,
    kvh: usize,
    hd: usize,
    table: Vec<u32>,
    /// q rows `(len, heads * hd)`.
    q: Vec<u16>,
}

fn pool(g: &CudaBackend, layers: usize, kvh: usize, hd: usize, len: usize) -> CudaKv {
    let geom = KvGeometry {
        layers,
        kv_heads: kvh,
        head_dim: hd,
        block_size: 16,
        num_blocks: len / 16 + 8,
    };
    g.alloc_kv(&geom).unwrap()
}

fn seq(
    g: &CudaBackend,
    kv: &mut CudaKv,
    rng: &mut Rng,
    shape: (usize, usize, usize),
    len: usize,
) -> Seq {
    let (heads, kvh, hd) = shape;
    let nb = len.div_ceil(16);
    let mut blocks: Vec<u32> = (0..nb as u32 + 5).collect();
    for i in (1..blocks.len()).rev() {
        blocks.swap(i, rng.below(i + 1));
    }
    let table = blocks[..nb].to_vec();
    let (kb, _) = random_bf16(rng, len * kvh * hd, 1.0);
    let (vb, _) = random_bf16(rng, len * kvh * hd, 1.0);
    // q scaled up so the softmax is peaked (large score ranges stress the rescale chains).
    let (q, _) = random_bf16(rng, len * heads * hd, 3.0);
    let meta = one_seq(0, len, &table);
    let b = g.prepare_batch(&meta).unwrap();
    let (k, v) = (up(g, len, kvh * hd, &kb), up(g, len, kvh * hd, &vb));
    for layer in 0..2 {
        g.kv_store(kv, layer, &k, &v, &b).unwrap();
    }
    Seq { heads, kvh, hd, table, q }
}

fn one_seq(start: usize, end: usize, table: &[u32]) -> BatchMeta {
    batch(
        (start as u32..end as u32).collect(),
        vec![0; end - start],
        vec![SeqMeta { block_table: table.to_vec() }],
        16,
    )
}

fn args<'a>(
    s: &Seq,
    kv: &'a CudaKv,
    q: &'a CudaTensor,
    b: &'a tf_backend::cuda::CudaBatch,
    layer: usize,
    out: &'a mut CudaTensor,
) -> AttnArgs<'a, CudaBackend> {
    AttnArgs {
        q,
        kv,
        layer,
        batch: b,
        heads: s.heads,
        kv_heads: s.kvh,
        head_dim: s.hd,
        scale: 1.0 / (s.hd as f32).sqrt(),
        out,
    }
}

/// Attention of rows `start..end` of `s` at layer 1, as one call.
fn run(g: &CudaBackend, kv: &CudaKv, s: &Seq, start: usize, end: usize) -> Vec<f32> {
    let (n, qw) = (end - start, s.heads * s.hd);
    let b = g.prepare_batch(&one_seq(start, end, &s.table)).unwrap();
    let q = up(g, n, qw, &s.q[start * qw..end * qw]);
    let mut out = g.alloc(ActDType::Bf16, n, qw).unwrap();
    g.attention(args(s, kv, &q, &b, 1, &mut out)).unwrap();
    g.read_f32(&out, n).unwrap()
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn decode_rows_equal_the_same_rows_of_a_prefill_call_bitwise() {
    let g = gpu();
    let mut rng = Rng::new(11);
    // (heads, kv heads, head_dim): llama3-8b, smollm2, G = 8, G = 1, G = 7 (nanbeige-33b: the
    // wgmma CTA's 128 M-rows hold 18 rows of 7), head_dim 96 and 256.
    let shapes = [
        (32, 8, 128),
        (9, 3, 64),
        (32, 4, 128),
        (8, 8, 128),
        (14, 2, 128),
        (12, 4, 96),
        (8, 2, 256),
    ];
    let len = 1100;
    for shape in shapes {
        let mut kv = pool(&g, 2, shape.1, shape.2, len);
        let s = seq(&g, &mut kv, &mut rng, shape, len);
        let full = run(&g, &kv, &s, 0, len);
        let qw = s.heads * s.hd;
        let mut calls = 0;
        let mut bad = Vec::new();
        // Single rows around tile and split edges, and short chunks (row tiles of 2..5 rows).
        let mut ends: Vec<(usize, usize)> =
            [0usize, 1, 63, 64, 127, 128, 129, 255, 256, 257, 383, 511, 512, 1099]
                .iter()
                .map(|&p| (p, p + 1))
                .collect();
        ends.extend([(254, 258), (380, 383), (600, 605), (1096, 1100), (0, 3)]);
        // Prefill chunks (walk mode) starting off the row-tile alignment.
        ends.extend([(37, 137), (300, 1100), (1000, 1100)]);
        for (a, e) in ends {
            calls += 1;
            if bits(&run(&g, &kv, &s, a, e)) != bits(&full[a * qw..e * qw]) {
                bad.push((a, e));
            }
        }
        println!("{shape:?}: {calls} decode calls, differing from the {len}-row call: {bad:?}");
        assert!(bad.is_empty(), "{shape:?}: decode rows differ from prefill rows: {bad:?}");
    }
}

/// Prefill rows whose block table outgrows the wgmma CTA's shared copy (4,096 ids: positions
/// past 65,536 in blocks of 16) read the table from global memory: still the decode rows' bits.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn prefill_rows_past_the_staged_table_equal_decode_rows() {
    let g = gpu();
    let mut rng = Rng::new(14);
    let shape = (8, 2, 128);
    let len = 66_000;
    let mut kv = pool(&g, 2, shape.1, shape.2, len);
    let s = seq(&g, &mut kv, &mut rng, shape, len);
    let qw = s.heads * s.hd;
    let (a, e) = (len - 200, len);
    let chunk = run(&g, &kv, &s, a, e);
    let bad: Vec<usize> = [a, a + 1, a + 63, a + 100, e - 1]
        .into_iter()
        .filter(|&p| {
            bits(&run(&g, &kv, &s, p, p + 1)) != bits(&chunk[(p - a) * qw..(p - a + 1) * qw])
        })
        .collect();
    // Control: neighbouring rows differ, so the comparison above can fail.
    assert_ne!(bits(&chunk[..qw]), bits(&chunk[qw..2 * qw]), "control: rows alike");
    println!("{shape:?}, rows {a}..{e} of {len}: decode rows differing from the chunk's: {bad:?}");
    assert!(bad.is_empty(), "rows past the staged table differ from decode rows: {bad:?}");
}

/// Microseconds per decode attention call (llama3-8b: 32/8 heads of 128, one row), as the
/// marginal cost of 32 more calls in a replayed CUDA graph (attention + combine). Prints only.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn decode_attention_time_per_layer() {
    let g = gpu();
    let mut rng = Rng::new(12);
    let shape = (32, 8, 128);
    let len = 4096;
    // 32 layers (two written; the rest hold whatever the allocation left): a graph of 32
    // calls reads 32 different layers, so the KV is not simply L2-resident.
    let mut kv = pool(&g, 32, shape.1, shape.2, len);
    let s = seq(&g, &mut kv, &mut rng, shape, len);
    let qw = s.heads * s.hd;
    let q = up(&g, 1, qw, &s.q[..qw]);
    let mut out = g.alloc(ActDType::Bf16, 1, qw).unwrap();
    let env = std::env::var("TENSORFOLD_DECODE_ATTN").unwrap_or_default();
    for positions in [128usize, 384, 1024, 4096] {
        let meta = one_seq(positions - 1, positions, &s.table);
        let mut time = |calls: usize| {
            per_call(&g, 200, || {
                let b = g.prepare_batch(&meta).unwrap();
                g.step_begin(&b).unwrap();
                for i in 0..calls {
                    g.attention(args(&s, &kv, &q, &b, i % 32, &mut out)).unwrap();
                }
                g.step_end().unwrap();
            })
        };
        let (t32, t64) = (time(32), time(64));
        println!(
            "decode attention, 1 row at {positions} positions (TENSORFOLD_DECODE_ATTN={env:?}): {:.2} us a call ({:.1} us for 32 calls in a graph)",
            (t64 - t32) / 32.0 * 1e6,
            t32 * 1e6
        );
    }
}

/// Microseconds per prefill attention call of one sequence (llama3-8b heads) at 2,048 and
/// 8,192 rows from position 0, and the rate of the causal attention's useful FLOPs
/// (4 x head_dim x heads x the sum of the rows' positions + 1). Prints only.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn prefill_attention_time() {
    let g = gpu();
    let mut rng = Rng::new(13);
    let shape = (32, 8, 128);
    let len = 8192;
    let mut kv = pool(&g, 2, shape.1, shape.2, len);
    let s = seq(&g, &mut kv, &mut rng, shape, len);
    let qw = s.heads * s.hd;
    let env =
        ["TENSORFOLD_ATTN_WG", "TENSORFOLD_ATTN_WS"].map(|k| std::env::var(k).unwrap_or_default());
    for rows in [2048usize, 8192] {
        let b = g.prepare_batch(&one_seq(0, rows, &s.table)).unwrap();
        let q = up(&g, rows, qw, &s.q[..rows * qw]);
        let mut out = g.alloc(ActDType::Bf16, rows, qw).unwrap();
        let t = per_call(&g, 20, || {
            g.attention(args(&s, &kv, &q, &b, 1, &mut out)).unwrap();
        });
        let flops = 4.0 * (s.hd * s.heads) as f64 * (rows * (rows + 1) / 2) as f64;
        println!(
            "prefill attention, {rows} rows (TENSORFOLD_ATTN_WG, _WS = {env:?}): {:.1} us a call, {:.0} TFLOP/s causal",
            t * 1e6,
            flops / t / 1e12
        );
    }
}
