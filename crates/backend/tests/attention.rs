//! Paged KV and attention: store/read round trip, a float64 reference with a stated bound,
//! row invariance over random mixes of sequences and positions, and SIMD == scalar bits.
//!
//! Bound: the output is rounded once to bf16 (relative 2^-8); before that, scores carry an
//! fp32 dot-product error of at most gamma_(hd+1) * scale * sum|q||k| each, which moves the
//! softmax weights by a relative `2 * max score error` at most, plus a few ulp of exp and the
//! sums; so `|o - o64| <= 2^-8 |o64| + (2 e_s + 1e-6) * max_j |v_j|` with e_s the largest
//! score error bound of the row.

mod common;

use common::*;
use tf_backend::batch::{BatchMeta, KvGeometry, SeqMeta};
use tf_backend::cpu::{CpuBackend, CpuKv, SimdLevel};
use tf_backend::{ActDType, AttnArgs, Backend};

/// Test geometry: `(kv_heads, heads, head_dim, block_size)`.
const GEOMS: [(usize, usize, usize, usize); 4] =
    [(3, 9, 64, 16), (2, 2, 40, 5), (1, 4, 16, 32), (2, 6, 128, 8)];
const LAYERS: usize = 2;
const LAYER: usize = 1;

/// Sequences of random lengths, scattered over a pool with shuffled block ids, with random
/// bf16 K/V stored at every position and a random query per (sequence, position).
struct World {
    geom: KvGeometry,
    heads: usize,
    tables: Vec<Vec<u32>>,
    lens: Vec<usize>,
    /// [seq][pos] -> (k, v) rows, kv_heads * head_dim, exact f32 values.
    kv: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    /// [seq][pos] -> q bits, heads * head_dim.
    q: Vec<Vec<Vec<u16>>>,
}

fn world(rng: &mut Rng, g: (usize, usize, usize, usize)) -> World {
    let (kvh, heads, hd, bs) = g;
    let lens = vec![1 + rng.below(70), 1 + rng.below(200), 1 + rng.below(20)];
    let need: usize = lens.iter().map(|l| l.div_ceil(bs)).sum();
    let mut ids: Vec<u32> = (0..need as u32 + 3).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i + 1));
    }
    let mut tables = Vec::new();
    let mut at = 0;
    for l in &lens {
        tables.push(ids[at..at + l.div_ceil(bs)].to_vec());
        at += l.div_ceil(bs);
    }
    let geom = KvGeometry {
        layers: LAYERS,
        kv_heads: kvh,
        head_dim: hd,
        block_size: bs,
        num_blocks: ids.len(),
    };
    let mut kv = Vec::new();
    let mut q = Vec::new();
    for &l in &lens {
        kv.push(
            (0..l)
                .map(|_| (random_bf16(rng, kvh * hd, 1.0).1, random_bf16(rng, kvh * hd, 1.0).1))
                .collect(),
        );
        q.push((0..l).map(|_| random_bf16(rng, heads * hd, 1.0).0).collect());
    }
    World { geom, heads, tables, lens, kv, q }
}

fn batch_of(w: &World, rows: &[(usize, usize)]) -> BatchMeta {
    BatchMeta {
        tokens: vec![0; rows.len()],
        positions: rows.iter().map(|&(_, p)| p as u32).collect(),
        row_seq: rows.iter().map(|&(s, _)| s as u32).collect(),
        seqs: w.tables.iter().map(|t| SeqMeta { block_table: t.clone() }).collect(),
        logit_rows: vec![],
        block_size: w.geom.block_size,
    }
}

/// A pool with every sequence's K/V stored (one call per sequence, layer LAYER).
fn filled_pool(be: &CpuBackend, w: &World) -> CpuKv {
    let mut kv = be.alloc_kv(&w.geom).unwrap();
    let c = w.geom.kv_heads * w.geom.head_dim;
    for s in 0..w.lens.len() {
        let rows: Vec<(usize, usize)> = (0..w.lens[s]).map(|p| (s, p)).collect();
        let b = be.prepare_batch(&batch_of(w, &rows)).unwrap();
        let kf: Vec<f32> = w.kv[s].iter().flat_map(|(k, _)| k.iter().copied()).collect();
        let vf: Vec<f32> = w.kv[s].iter().flat_map(|(_, v)| v.iter().copied()).collect();
        let kt = tf_backend::cpu::CpuTensor::from_f32_as_bf16(rows.len(), c, &kf).unwrap();
        let vt = tf_backend::cpu::CpuTensor::from_f32_as_bf16(rows.len(), c, &vf).unwrap();
        be.kv_store(&mut kv, LAYER, &kt, &vt, &b).unwrap();
    }
    kv
}

/// Attention of `rows` in one call; the output rows' bits.
fn attend(be: &CpuBackend, w: &World, kv: &CpuKv, rows: &[(usize, usize)]) -> Vec<Vec<u16>> {
    let (hd, c) = (w.geom.head_dim, w.heads * w.geom.head_dim);
    let b = be.prepare_batch(&batch_of(w, rows)).unwrap();
    let qbits: Vec<u16> = rows.iter().flat_map(|&(s, p)| w.q[s][p].iter().copied()).collect();
    let q = bf16_tensor(rows.len(), c, &qbits);
    let mut out = be.alloc(ActDType::Bf16, rows.len(), c).unwrap();
    let scale = 1.0 / (hd as f32).sqrt();
    let args = AttnArgs {
        q: &q,
        kv,
        layer: LAYER,
        batch: &b,
        heads: w.heads,
        kv_heads: w.geom.kv_heads,
        head_dim: hd,
        scale,
        out: &mut out,
    };
    be.attention(args).unwrap();
    out.bf16_bits().unwrap().chunks(c).map(|r| r.to_vec()).collect()
}

fn all_rows(w: &World) -> Vec<(usize, usize)> {
    (0..w.lens.len()).flat_map(|s| (0..w.lens[s]).map(move |p| (s, p))).collect()
}

#[test]
fn kv_round_trips_through_the_pool() {
    let be = backend(SimdLevel::detect(), 2);
    for g in GEOMS {
        let w = world(&mut Rng::new(31), g);
        let kv = filled_pool(&be, &w);
        for s in 0..w.lens.len() {
            let (k, v) = be.read_kv(&kv, LAYER, &w.tables[s], w.lens[s]).unwrap();
            let c = w.geom.kv_heads * w.geom.head_dim;
            for p in 0..w.lens[s] {
                assert_eq!(&k[p * c..(p + 1) * c], &w.kv[s][p].0[..], "k seq {s} pos {p}");
                assert_eq!(&v[p * c..(p + 1) * c], &w.kv[s][p].1[..], "v seq {s} pos {p}");
            }
            // The other layer is untouched.
            let (k0, _) = be.read_kv(&kv, 0, &w.tables[s], w.lens[s]).unwrap();
            assert!(k0.iter().all(|&x| x == 0.0));
        }
        assert!(be.read_kv(&kv, LAYERS, &w.tables[0], 1).is_err());
        assert!(be.read_kv(&kv, 0, &[w.geom.num_blocks as u32], 1).is_err());
    }
}

#[test]
fn within_the_bound_of_a_float64_reference() {
    let be = backend(SimdLevel::detect(), 2);
    for g in GEOMS {
        let w = world(&mut Rng::new(32), g);
        let kv = filled_pool(&be, &w);
        let rows = all_rows(&w);
        let got = attend(&be, &w, &kv, &rows);
        let (kvh, hd) = (w.geom.kv_heads, w.geom.head_dim);
        let group = w.heads / kvh;
        let scale = (1.0 / (hd as f32).sqrt()) as f64;
        for (i, &(s, p)) in rows.iter().enumerate() {
            let q: Vec<f64> =
                w.q[s][p].iter().map(|&b| f32::from_bits((b as u32) << 16) as f64).collect();
            for h in 0..w.heads {
                let g = h / group;
                let qh = &q[h * hd..(h + 1) * hd];
                let mut sc = Vec::new();
                let mut e_s = 0f64;
                for j in 0..=p {
                    let k = &w.kv[s][j].0[g * hd..(g + 1) * hd];
                    let dot: f64 = qh.iter().zip(k).map(|(a, &b)| a * b as f64).sum();
                    let m: f64 = qh.iter().zip(k).map(|(a, &b)| (a * b as f64).abs()).sum();
                    sc.push(dot * scale);
                    e_s = e_s.max(gamma(hd as f64 + 1.0) * m * scale);
                }
                let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                let l: f64 = e.iter().sum();
                for d in 0..hd {
                    let vs = (0..=p).map(|j| w.kv[s][j].1[g * hd + d] as f64);
                    let vmax = vs.clone().fold(0f64, |a, b| a.max(b.abs()));
                    let o64: f64 = vs.zip(&e).map(|(v, e)| v * e).sum::<f64>() / l;
                    let o = f32::from_bits((got[i][h * hd + d] as u32) << 16) as f64;
                    let b = (o64.abs() / 256.0) + (2.0 * e_s + 1e-6) * vmax;
                    assert!(
                        (o - o64).abs() <= b,
                        "seq {s} pos {p} head {h} dim {d}: {o} vs {o64} (bound {b:e})"
                    );
                }
            }
        }
    }
}

#[test]
fn each_row_is_the_same_in_any_mix_of_rows() {
    let be = backend(SimdLevel::detect(), 2);
    let mut rng = Rng::new(33);
    for g in GEOMS {
        let w = world(&mut Rng::new(34), g);
        let kv = filled_pool(&be, &w);
        let rows = all_rows(&w);
        let want = attend(&be, &w, &kv, &rows);
        for size in [1usize, 2, 3, 8, 16, 17, 128] {
            for _ in 0..3 {
                let pick: Vec<usize> = (0..size).map(|_| rng.below(rows.len())).collect();
                let sel: Vec<(usize, usize)> = pick.iter().map(|&i| rows[i]).collect();
                let got = attend(&be, &w, &kv, &sel);
                for (j, &i) in pick.iter().enumerate() {
                    assert_eq!(
                        got[j], want[i],
                        "{g:?}: row {:?} differs in a call of {size}",
                        rows[i]
                    );
                }
            }
        }
    }
}

#[test]
fn every_simd_level_and_thread_count_gives_the_scalar_bits() {
    let scalar = backend(SimdLevel::Scalar, 1);
    for g in GEOMS {
        let w = world(&mut Rng::new(35), g);
        let rows = all_rows(&w);
        let want = attend(&scalar, &w, &filled_pool(&scalar, &w), &rows);
        for level in levels() {
            for threads in [1, 2, 3] {
                let be = backend(level, threads);
                let got = attend(&be, &w, &filled_pool(&be, &w), &rows);
                assert!(got == want, "{g:?}: {level} with {threads} threads differs from scalar");
            }
        }
    }
}

#[test]
fn pool_and_batch_mismatches_are_errors() {
    let be = backend(SimdLevel::detect(), 2);
    let w = world(&mut Rng::new(36), GEOMS[0]);
    let kv = filled_pool(&be, &w);
    let (hd, c) = (w.geom.head_dim, w.heads * w.geom.head_dim);
    let q = be.alloc(ActDType::Bf16, 1, c).unwrap();
    let mut out = be.alloc(ActDType::Bf16, 1, c).unwrap();
    let mut m = batch_of(&w, &[(0, 0)]);
    m.block_size = 8;
    let b = be.prepare_batch(&m).unwrap();
    let args = AttnArgs {
        q: &q,
        kv: &kv,
        layer: LAYER,
        batch: &b,
        heads: w.heads,
        kv_heads: 3,
        head_dim: hd,
        scale: 1.0,
        out: &mut out,
    };
    assert!(be.attention(args).is_err(), "block size differs from the pool's");
    let mut m = batch_of(&w, &[(0, 0)]);
    m.seqs[0].block_table[0] = w.geom.num_blocks as u32;
    let b = be.prepare_batch(&m).unwrap();
    let mut out = be.alloc(ActDType::Bf16, 1, c).unwrap();
    let args = AttnArgs {
        q: &q,
        kv: &kv,
        layer: LAYER,
        batch: &b,
        heads: w.heads,
        kv_heads: 3,
        head_dim: hd,
        scale: 1.0,
        out: &mut out,
    };
    assert!(be.attention(args).is_err(), "block beyond the pool");
}
