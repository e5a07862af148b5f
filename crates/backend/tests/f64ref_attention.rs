//! The float64 reference backend's RoPE, paged KV and attention against direct float64
//! formulas: RoPE against `x cos + rotate(x) sin` with f64 angles and against the rotation's
//! defining property (scores depend on relative position only); attention against a naive
//! softmax over each sequence's KV kept contiguously on the host, with two sequences of
//! scattered blocks sharing each step, GQA, and every row recomputed alone (the row contract).

use tf_backend::batch::{BatchMeta, KvGeometry, SeqMeta};
use tf_backend::f64ref::{F64Backend, F64Kv, F64Tensor, F64Weight};
use tf_backend::{ActDType, AttnArgs, Backend, RopeArgs};
use tf_checkpoint::spec::{RopeScaling, RopeSpec, RopeStyle};
use tf_checkpoint::{DType, TensorFormat, TensorView};

/// splitmix64, seeded; uniform in [-1, 1) at full f64 precision.
struct Rng(u64);

impl Rng {
    fn sym(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.sym()).collect()
    }
}

const HD: usize = 8;
const THETA: f64 = 10000.0;

fn rope_spec(scaling: RopeScaling) -> RopeSpec {
    RopeSpec { theta: THETA, style: RopeStyle::Neox, scaling, dim: HD }
}

fn backend() -> F64Backend {
    F64Backend::with_threads(&rope_spec(RopeScaling::None), Some(2)).unwrap()
}

/// The fast path's bf16 RoPE table, here all zeros: the f64 backend must not read its values.
fn zero_table(be: &F64Backend, positions: usize) -> F64Weight {
    let fmt = TensorFormat::Plain(DType::BF16);
    let view =
        TensorView::owned("rope.table", fmt, vec![positions, HD], vec![0; positions * HD * 2]);
    be.load_weight(&view).unwrap()
}

fn one_seq(positions: Vec<u32>, block_size: usize, blocks: Vec<u32>) -> BatchMeta {
    let rows = positions.len();
    BatchMeta {
        tokens: vec![0; rows],
        positions,
        row_seq: vec![0; rows],
        seqs: vec![SeqMeta { block_table: blocks }],
        logit_rows: vec![],
        block_size,
    }
}

/// RoPE of `x` (rows, heads * HD) at `positions`, read back in f64.
fn rope(be: &F64Backend, x: &[f64], heads: usize, positions: &[u32], style: RopeStyle) -> Vec<f64> {
    let rows = positions.len();
    let mut t = F64Tensor::from_f64(rows, heads * HD, x.to_vec()).unwrap();
    let table = zero_table(be, 4096);
    let batch = be.prepare_batch(&one_seq(positions.to_vec(), 4096, vec![0])).unwrap();
    be.rope(RopeArgs { x: &mut t, heads, head_dim: HD, style, table: &table, batch: &batch })
        .unwrap();
    be.read_f64(&t, rows).unwrap()
}

#[test]
fn rope_rotates_by_f64_angles_ignoring_the_bf16_table() {
    let be = backend();
    let mut rng = Rng(11);
    let (heads, positions) = (3, vec![0u32, 1, 7, 1000, 4095]);
    let x = rng.vec(positions.len() * heads * HD);
    let got = rope(&be, &x, heads, &positions, RopeStyle::Neox);
    for (r, &p) in positions.iter().enumerate() {
        for h in 0..heads {
            let base = (r * heads + h) * HD;
            for i in 0..HD / 2 {
                let a = f64::from(p) / THETA.powf((2 * i) as f64 / HD as f64);
                let (x1, x2) = (x[base + i], x[base + i + HD / 2]);
                // HF: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1).
                let (w1, w2) = (x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin());
                for (g, w) in [(got[base + i], w1), (got[base + i + HD / 2], w2)] {
                    assert!((g - w).abs() < 1e-14, "pos {p} head {h} pair {i}: {g} vs {w}");
                }
            }
        }
    }
    assert_eq!(got[..heads * HD], x[..heads * HD], "position 0 is the identity");
}

#[test]
fn rope_scores_depend_on_relative_position_only() {
    let be = backend();
    let mut rng = Rng(12);
    let (q, k) = (rng.vec(HD), rng.vec(HD));
    let score = |pq: u32, pk: u32| {
        let a = rope(&be, &q, 1, &[pq], RopeStyle::Neox);
        let b = rope(&be, &k, 1, &[pk], RopeStyle::Neox);
        a.iter().zip(&b).map(|(x, y)| x * y).sum::<f64>()
    };
    for (pq, pk, shift) in [(5, 2, 100), (40, 40, 3000), (1000, 1, 2000)] {
        let (s0, s1) = (score(pq, pk), score(pq + shift, pk + shift));
        assert!((s0 - s1).abs() < 1e-12, "({pq},{pk}) vs +{shift}: {s0} vs {s1}");
    }
    // ...and on it: a different offset gives a different score.
    assert!((score(5, 2) - score(6, 2)).abs() > 1e-6);
    // Rotations keep each pair's length.
    let y = rope(&be, &q, 1, &[777], RopeStyle::Neox);
    for i in 0..HD / 2 {
        let n0 = q[i].hypot(q[i + HD / 2]);
        let n1 = y[i].hypot(y[i + HD / 2]);
        assert!((n0 - n1).abs() < 1e-15);
    }
}

#[test]
fn interleaved_pairs_are_neox_pairs_permuted() {
    let be = backend();
    let mut rng = Rng(13);
    let (heads, positions) = (2, vec![3u32, 9, 200]);
    let x = rng.vec(positions.len() * heads * HD);
    // Interleaved pairs (2i, 2i+1) are Neox pairs (i, i + HD/2) after this permutation.
    let perm = |v: &[f64]| -> Vec<f64> {
        v.chunks(HD)
            .flat_map(|h| {
                (0..HD / 2)
                    .map(|i| h[2 * i])
                    .chain((0..HD / 2).map(|i| h[2 * i + 1]))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let inter = rope(&be, &x, heads, &positions, RopeStyle::Interleaved);
    let neox = rope(&be, &perm(&x), heads, &positions, RopeStyle::Neox);
    assert_eq!(perm(&inter), neox);
}

#[test]
fn rope_scaling_frequencies_and_refusals() {
    let plain = F64Backend::new(&rope_spec(RopeScaling::None)).unwrap();
    let linear = F64Backend::new(&rope_spec(RopeScaling::Linear { factor: 4.0 })).unwrap();
    for (a, b) in plain.inv_freq().iter().zip(linear.inv_freq()) {
        assert_eq!(*b, a / 4.0);
    }
    let bad = RopeSpec { dim: 7, ..rope_spec(RopeScaling::None) };
    assert!(F64Backend::new(&bad).is_err());
    // A head_dim other than the RoPE's, and a position past the table, are refused.
    let be = backend();
    let mut t = F64Tensor::from_f64(1, 16, vec![0.0; 16]).unwrap();
    let table = zero_table(&be, 8);
    let b = be.prepare_batch(&one_seq(vec![3], 16, vec![0])).unwrap();
    let args = |x| RopeArgs {
        x,
        heads: 1,
        head_dim: 16,
        style: RopeStyle::Neox,
        table: &table,
        batch: &b,
    };
    assert!(be.rope(args(&mut t)).is_err());
    let mut t = F64Tensor::from_f64(1, HD, vec![0.0; HD]).unwrap();
    let far = be.prepare_batch(&one_seq(vec![8], 16, vec![0])).unwrap();
    let args = RopeArgs {
        x: &mut t,
        heads: 1,
        head_dim: HD,
        style: RopeStyle::Neox,
        table: &table,
        batch: &far,
    };
    assert!(be.rope(args).is_err());
}

const HEADS: usize = 6;
const KV_HEADS: usize = 2;
const KVD: usize = KV_HEADS * HD;
const BS: usize = 4;
const LAYER: usize = 1;

fn geom() -> KvGeometry {
    KvGeometry { layers: 2, kv_heads: KV_HEADS, head_dim: HD, block_size: BS, num_blocks: 12 }
}

/// Host copy of each sequence's K and V rows (position order) and its block table.
struct Seq {
    table: Vec<u32>,
    k: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
}

/// Naive attention of `q` (one row) for a sequence at position `p`.
fn naive(q: &[f64], s: &Seq, p: usize, scale: f64) -> Vec<f64> {
    let mut out = vec![0.0; HEADS * HD];
    for h in 0..HEADS {
        let g = h / (HEADS / KV_HEADS);
        let qh = &q[h * HD..(h + 1) * HD];
        let sc: Vec<f64> = (0..=p)
            .map(|j| {
                qh.iter().zip(&s.k[j][g * HD..(g + 1) * HD]).map(|(a, b)| a * b).sum::<f64>()
                    * scale
            })
            .collect();
        let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = sc.iter().map(|&x| (x - m).exp()).collect();
        let l: f64 = e.iter().sum();
        for (j, &ej) in e.iter().enumerate() {
            for d in 0..HD {
                out[h * HD + d] += ej / l * s.v[j][g * HD + d];
            }
        }
    }
    out
}

/// One step: rows (sequence, position) in this order; stores fresh random k/v for each row,
/// attends, and checks every row against `naive` and against itself computed alone.
fn step(
    be: &F64Backend,
    kv: &mut F64Kv,
    seqs: &mut [Seq],
    rows: &[(usize, usize)],
    scale: (f32, f64),
    rng: &mut Rng,
) {
    let n = rows.len();
    let meta = BatchMeta {
        tokens: vec![0; n],
        positions: rows.iter().map(|&(_, p)| p as u32).collect(),
        row_seq: rows.iter().map(|&(s, _)| s as u32).collect(),
        seqs: seqs.iter().map(|s| SeqMeta { block_table: s.table.clone() }).collect(),
        logit_rows: vec![],
        block_size: BS,
    };
    let (kv_, vv, qv) = (rng.vec(n * KVD), rng.vec(n * KVD), rng.vec(n * HEADS * HD));
    for (r, &(s, p)) in rows.iter().enumerate() {
        assert_eq!(seqs[s].k.len(), p, "rows of a sequence come in position order");
        seqs[s].k.push(kv_[r * KVD..(r + 1) * KVD].to_vec());
        seqs[s].v.push(vv[r * KVD..(r + 1) * KVD].to_vec());
    }
    let batch = be.prepare_batch(&meta).unwrap();
    let (k, v) =
        (F64Tensor::from_f64(n, KVD, kv_).unwrap(), F64Tensor::from_f64(n, KVD, vv).unwrap());
    be.kv_store(kv, LAYER, &k, &v, &batch).unwrap();
    let q = F64Tensor::from_f64(n, HEADS * HD, qv.clone()).unwrap();
    let got = attend(be, kv, &q, &batch, scale.0);
    for (r, &(s, p)) in rows.iter().enumerate() {
        let want = naive(&qv[r * HEADS * HD..(r + 1) * HEADS * HD], &seqs[s], p, scale.1);
        for (i, (g, w)) in got[r * HEADS * HD..].iter().zip(&want).enumerate() {
            assert!((g - w).abs() < 1e-14, "seq {s} pos {p} elem {i}: {g} vs {w}");
        }
        // The row alone, in a batch of its own, gives the same bits.
        let mut alone = meta.clone();
        (alone.tokens, alone.positions, alone.row_seq) = (vec![0], vec![p as u32], vec![s as u32]);
        let b1 = be.prepare_batch(&alone).unwrap();
        let q1 =
            F64Tensor::from_f64(1, HEADS * HD, qv[r * HEADS * HD..(r + 1) * HEADS * HD].to_vec())
                .unwrap();
        assert_eq!(attend(be, kv, &q1, &b1, scale.0), got[r * HEADS * HD..(r + 1) * HEADS * HD]);
    }
}

fn attend(
    be: &F64Backend,
    kv: &F64Kv,
    q: &F64Tensor,
    batch: &tf_backend::f64ref::F64Batch,
    scale: f32,
) -> Vec<f64> {
    let rows = batch.rows();
    let mut out = be.alloc(ActDType::Bf16, rows, HEADS * HD).unwrap();
    let args = AttnArgs {
        q,
        kv,
        layer: LAYER,
        batch,
        heads: HEADS,
        kv_heads: KV_HEADS,
        head_dim: HD,
        scale,
        out: &mut out,
    };
    be.attention(args).unwrap();
    be.read_f64(&out, rows).unwrap()
}

#[test]
fn paged_gqa_attention_is_the_softmax_formula_per_row() {
    let be = backend();
    let mut rng = Rng(14);
    // 1/sqrt(HD) as f32 stands for the exact f64 value; any other scale is widened.
    let scales =
        [(1.0 / (HD as f32).sqrt(), 1.0 / (HD as f64).sqrt()), (0.1f32, f64::from(0.1f32))];
    for scale in scales {
        let mut kv = be.alloc_kv(&geom()).unwrap();
        let mut seqs = vec![
            Seq { table: vec![7, 2, 10], k: vec![], v: vec![] },
            Seq { table: vec![0, 5], k: vec![], v: vec![] },
        ];
        // A prefill chunk of each sequence interleaved, then a short chunk and a decode row.
        let first: Vec<(usize, usize)> =
            (0..6).flat_map(|p| [(0, p), (1, p)]).filter(|&(s, p)| s == 0 || p < 4).collect();
        step(&be, &mut kv, &mut seqs, &first, scale, &mut rng);
        step(&be, &mut kv, &mut seqs, &[(1, 4), (0, 6), (0, 7), (0, 8), (1, 5)], scale, &mut rng);
        // read_kv_f64 gives back what was stored; layer 0 was never written.
        let s = &seqs[0];
        let (k, v) = be.read_kv_f64(&kv, LAYER, &s.table, 9).unwrap();
        assert_eq!(k, s.k.concat());
        assert_eq!(v, s.v.concat());
        let (k32, _) = be.read_kv(&kv, LAYER, &s.table, 9).unwrap();
        assert!(k32.iter().zip(&k).all(|(&a, &b)| a == b as f32));
        let (k0, _) = be.read_kv_f64(&kv, 0, &s.table, 9).unwrap();
        assert!(k0.iter().all(|&x| x == 0.0));
    }
}

#[test]
fn bad_kv_batches_are_refused() {
    let be = backend();
    let mut kv = be.alloc_kv(&geom()).unwrap();
    let k = F64Tensor::from_f64(1, KVD, vec![0.0; KVD]).unwrap();
    let beyond = be.prepare_batch(&one_seq(vec![0], BS, vec![12])).unwrap();
    assert!(be.kv_store(&mut kv, LAYER, &k, &k, &beyond).is_err(), "block past the pool");
    let other_bs = be.prepare_batch(&one_seq(vec![0], 8, vec![0])).unwrap();
    assert!(be.kv_store(&mut kv, LAYER, &k, &k, &other_bs).is_err(), "block size mismatch");
    let ok = be.prepare_batch(&one_seq(vec![0], BS, vec![0])).unwrap();
    assert!(be.kv_store(&mut kv, 2, &k, &k, &ok).is_err(), "layer past the pool");
    let q = F64Tensor::from_f64(1, 5 * HD, vec![0.0; 5 * HD]).unwrap();
    let mut out = be.alloc(ActDType::Bf16, 1, 5 * HD).unwrap();
    let args = AttnArgs {
        q: &q,
        kv: &kv,
        layer: 0,
        batch: &ok,
        heads: 5,
        kv_heads: KV_HEADS,
        head_dim: HD,
        scale: 1.0,
        out: &mut out,
    };
    assert!(be.attention(args).is_err(), "5 heads over 2 kv heads");
    assert!(be.read_kv_f64(&kv, 0, &[0], 5).is_err(), "5 positions in one block of 4");
}
