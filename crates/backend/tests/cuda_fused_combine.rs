//! Attention and the o product with the split merge in the product's prologue
//! (`attention_linear`, kernels/linear_combine.cu) on the GPU against the two ops it stands for
//! (`attention`, whose split mode ends in `attention_combine`, then `linear`), bit for bit, and
//! its speed.
//!
//! - `attention_linear_equals_the_two_ops_bitwise`: the attention output and the product, at
//!   the SmolLM2, llama3-8b and nanbeige-33b head shapes (with and without a bias), in calls of
//!   1-4 rows of sequences whose rows need 1, 2, 3 and 9 splits of 128 positions (mixed in one
//!   call), over scrambled blocks. A fused call must be two launches where its rows fit the
//!   stage (16 KiB) and three otherwise (the two ops), so the fused kernel is what is compared.
//!   Control: a planted sign flip of one q element of a row of several splits changes the
//!   fused call's product (the comparison can fail).
//! - `attention_linear_speed_llama3_8b`: microseconds per call at one row, position 300, fused
//!   vs the two ops. Prints only.
//!
//! On the GPU machine: `TENSORFOLD_COMBINE_FUSE=1 cargo test --release -p tf-backend --test
//! cuda_fused_combine -- --ignored --nocapture` (the fused path is off by default; without
//! the switch the launch count assertion fails: the test is for the fused kernel).

mod common;

use common::cuda::{bf, gpu, per_call, rand_vector, rand_weight, read_bits, up};
use common::{random_bf16, Rng};
use tf_backend::batch::{BatchMeta, KvGeometry, SeqMeta};
use tf_backend::cuda::{CudaBackend, CudaKv, CudaWeight};
use tf_backend::{AttnArgs, Backend};

const BS: usize = 16;
/// Sequence lengths: a row at each one's last position needs 1, 2, 3 and 9 splits of 128.
const LENS: [usize; 4] = [41, 131, 301, 1101];
/// Calls: rows of these sequences, each at its last position.
const CALLS: [&[usize]; 8] = [&[0], &[1], &[2], &[3], &[0, 2], &[3, 1], &[1, 2, 3], &[3, 0, 2, 1]];

/// A head shape: hidden, heads, kv heads, head_dim.
type Geo = (usize, usize, usize, usize);

/// The sequences of `LENS` at layer 1 of a 2-layer pool (random K and V, scrambled blocks).
struct Pool {
    kv: CudaKv,
    tables: Vec<Vec<u32>>,
}

impl Pool {
    fn new(g: &CudaBackend, rng: &mut Rng, (_, _, kvh, hd): Geo) -> Pool {
        let need: Vec<usize> = LENS.iter().map(|l| l.div_ceil(BS)).collect();
        let total: usize = need.iter().sum();
        let geom = KvGeometry {
            layers: 2,
            kv_heads: kvh,
            head_dim: hd,
            block_size: BS,
            num_blocks: total + 3,
        };
        let mut kv = g.alloc_kv(&geom).unwrap();
        let mut ids: Vec<u32> = (0..geom.num_blocks as u32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let mut tables = Vec::new();
        let mut at = 0;
        for (len, nb) in LENS.iter().zip(&need) {
            let table = ids[at..at + nb].to_vec();
            at += nb;
            let (kb, _) = random_bf16(rng, len * kvh * hd, 1.0);
            let (vb, _) = random_bf16(rng, len * kvh * hd, 1.0);
            let meta = meta(&[(*len, table.clone())], 0);
            let b = g.prepare_batch(&meta).unwrap();
            let (k, v) = (up(g, *len, kvh * hd, &kb), up(g, *len, kvh * hd, &vb));
            g.kv_store(&mut kv, 1, &k, &v, &b).unwrap();
            tables.push(table);
        }
        Pool { kv, tables }
    }

    /// A decode call: a row of each sequence `seqs[i]` at its last position.
    fn call(&self, seqs: &[usize]) -> BatchMeta {
        let s: Vec<(usize, Vec<u32>)> =
            seqs.iter().map(|&i| (LENS[i], self.tables[i].clone())).collect();
        meta(&s, 1)
    }
}

/// Rows of sequences (length, block table): each sequence's last `last` positions, or all of
/// them when `last` is 0.
fn meta(seqs: &[(usize, Vec<u32>)], last: usize) -> BatchMeta {
    let (mut positions, mut row_seq) = (Vec::new(), Vec::new());
    for (i, (len, _)) in seqs.iter().enumerate() {
        let from = if last == 0 { 0 } else { len - last };
        positions.extend(from as u32..*len as u32);
        row_seq.extend(std::iter::repeat_n(i as u32, len - from));
    }
    BatchMeta {
        tokens: vec![0; positions.len()],
        positions,
        row_seq,
        seqs: seqs.iter().map(|(_, t)| SeqMeta { block_table: t.clone() }).collect(),
        logit_rows: vec![],
        block_size: BS,
    }
}

/// (attention output bits, product bits, launches) of one call on q rows `qb`.
fn run(
    g: &CudaBackend,
    (h, heads, kvh, hd): Geo,
    pool: &Pool,
    (w, bias): (&CudaWeight, Option<&CudaWeight>),
    seqs: &[usize],
    qb: &[u16],
    fused: bool,
) -> (Vec<u32>, Vec<u32>, u64) {
    let rows = seqs.len();
    let batch = g.prepare_batch(&pool.call(seqs)).unwrap();
    let q = up(g, rows, heads * hd, qb);
    let (mut out, mut proj) = (bf(g, rows, heads * hd), bf(g, rows, h));
    let a = AttnArgs {
        q: &q,
        kv: &pool.kv,
        layer: 1,
        batch: &batch,
        heads,
        kv_heads: kvh,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        out: &mut out,
    };
    let before = g.launches();
    if fused {
        g.attention_linear(a, w, bias, &mut proj).unwrap();
    } else {
        g.attention(a).unwrap();
        g.linear(&out, w, bias, &mut proj).unwrap();
    }
    let launches = g.launches() - before;
    (read_bits(g, &out, rows), read_bits(g, &proj, rows), launches)
}

fn check_geometry(g: &CudaBackend, geo: Geo, with_bias: bool) {
    let (h, heads, _, hd) = geo;
    let rng = &mut Rng::new(h as u64 + 7);
    let pool = Pool::new(g, rng, geo);
    let w = rand_weight(g, rng, h, heads * hd);
    let bias = with_bias.then(|| rand_vector(g, rng, h));
    let wb = (&w, bias.as_ref());
    for seqs in CALLS {
        let rows = seqs.len();
        // q scaled up so the softmax is peaked (large score ranges stress the merges).
        let (mut qb, _) = random_bf16(rng, rows * heads * hd, 3.0);
        let (ao, po, lo) = run(g, geo, &pool, wb, seqs, &qb, false);
        let (af, pf, lf) = run(g, geo, &pool, wb, seqs, &qb, true);
        let fits = rows * heads * hd * 2 <= 16 * 1024;
        let want = if fits { 2 } else { 3 };
        assert_eq!(lo, 3, "{geo:?} {seqs:?}: the two ops launched {lo}");
        assert_eq!(lf, want, "{geo:?} {seqs:?}: the fused call launched {lf}");
        let da = ao.iter().zip(&af).filter(|(a, b)| a != b).count();
        let dp = po.iter().zip(&pf).filter(|(a, b)| a != b).count();
        println!(
            "{geo:?} rows of {seqs:?} ({} launches): attention {da} of {} differ, product {dp} of {} differ",
            lf,
            ao.len(),
            po.len()
        );
        assert_eq!((da, dp), (0, 0), "{geo:?} {seqs:?}: the fused call differs");
        // Control: a sign flip of q in the first row of several splits must show.
        if let Some(r) = seqs.iter().position(|&s| LENS[s] > 128) {
            qb[r * heads * hd] ^= 0x8000;
            let (_, pc, _) = run(g, geo, &pool, wb, seqs, &qb, true);
            let dc = po.iter().zip(&pc).filter(|(a, b)| a != b).count();
            println!("  control (q sign flip in row {r}): product {dc} of {} differ", po.len());
            assert!(dc > 0, "{geo:?} {seqs:?}: the planted q flip changed nothing");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn attention_linear_equals_the_two_ops_bitwise() {
    let g = gpu();
    check_geometry(&g, (576, 9, 3, 64), true);
    check_geometry(&g, (4096, 32, 8, 128), false);
    // nanbeige-33b's: one row fits the stage (14 KiB), two do not.
    check_geometry(&g, (7168, 56, 8, 128), false);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn attention_linear_speed_llama3_8b() {
    let g = gpu();
    let geo = (4096, 32, 8, 128);
    let rng = &mut Rng::new(5);
    let pool = Pool::new(&g, rng, geo);
    let w = rand_weight(&g, rng, 4096, 4096);
    let (qb, _) = random_bf16(rng, 4096, 3.0);
    let batch = g.prepare_batch(&pool.call(&[2])).unwrap();
    let q = up(&g, 1, 4096, &qb);
    let (mut out, mut proj) = (bf(&g, 1, 4096), bf(&g, 1, 4096));
    for fused in [false, true, false, true] {
        let dt = per_call(&g, 400, || {
            let a = AttnArgs {
                q: &q,
                kv: &pool.kv,
                layer: 1,
                batch: &batch,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                scale: 1.0 / (128f32).sqrt(),
                out: &mut out,
            };
            if fused {
                g.attention_linear(a, &w, None, &mut proj).unwrap();
            } else {
                g.attention(a).unwrap();
                g.linear(&out, &w, None, &mut proj).unwrap();
            }
        });
        println!(
            "attention + o at one row, position 300, fused {fused}: {:.1} us a call",
            dt * 1e6
        );
    }
}
