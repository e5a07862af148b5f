//! q/k/v with rope and the KV write in one launch (`qkv_rope_kv_store`, kernels/linear_rope.cu)
//! on the GPU against the ops it stands for (`qkv_rope_kv_store_unfused`: the grouped product,
//! after the add + norm in the norm form, then `rope_kv_store`), bit for bit, and its speed.
//!
//! - `qkv_rope_equals_the_unfused_ops_bitwise`: every output (the residual and the normed rows
//!   in the norm form; q and k rotated, v; every slot of the pool's written layer, read back by
//!   `read_kv`) at the SmolLM2, llama3-8b and nanbeige-33b head shapes, both rope styles, both
//!   input forms, with and without biases, in calls of 1, 2, 3 and 8 rows (the one-token-tile
//!   entries: the call must be one launch) and 17, 33 and 64 (`linear_bf16_qkv_rope_nt`, after
//!   `add_rms_norm` in the norm form: one launch, two with the norm), rows of two sequences
//!   over shuffled blocks, layer 1 of a 2-layer pool. Controls: a planted sign flip of one
//!   input element changes every output of the fused call (the comparison can fail), and a
//!   fused call is asserted to be one launch (so the fused kernel is what is compared).
//! - `qkv_rope_speed_llama3_8b`: microseconds per call at one row, fused vs unfused (weights
//!   cycled out of L2). Prints only.
//!
//! On the GPU machine: `cargo test --release -p tf-backend --test cuda_fused_rope -- --ignored
//! --nocapture`.

mod common;

use common::cuda::{
    bf, gpu, per_call, rand_vector, rand_weight, read_bits, rope_table, table_weight, up,
};
use common::{random_bf16, Rng};
use tf_backend::batch::{KvGeometry, SeqMeta};
use tf_backend::cuda::{CudaBackend, CudaBatch, CudaKv, CudaTensor, CudaWeight};
use tf_backend::{
    qkv_rope_kv_store_unfused, AddNormArgs, Backend, BatchMeta, LinearPart, QkvInput, QkvRopeArgs,
};
use tf_checkpoint::spec::RopeStyle;

const ROWS: [usize; 7] = [1, 2, 3, 8, 17, 33, 64];
const BS: usize = 16;

/// One head shape's weights: q, k, v (+ biases), the norm, the rope table.
struct Model {
    h: usize,
    heads: usize,
    kvh: usize,
    hd: usize,
    qkv: [(CudaWeight, CudaWeight); 3],
    norm: CudaWeight,
    table: CudaWeight,
}

/// How a call runs: the input form, biases, the rope style, fused or as the unfused ops.
#[derive(Clone, Copy, Debug)]
struct Form {
    norm: bool,
    bias: bool,
    style: RopeStyle,
    fused: bool,
}

/// A call's rows: their inputs and where they sit (positions of two sequences, block tables).
#[derive(Clone)]
struct Call {
    rows: usize,
    acc: Vec<u16>,
    x: Vec<u16>,
    meta: BatchMeta,
    blocks: usize,
}

impl Call {
    /// The first rows / 2 rows at positions 40.., the rest at 130.., over shuffled blocks.
    fn new(rng: &mut Rng, h: usize, rows: usize) -> Call {
        let (acc, _) = random_bf16(rng, rows * h, 4.0);
        let (x, _) = random_bf16(rng, rows * h, 1.0);
        let n0 = rows / 2;
        let mut positions: Vec<u32> = (0..n0 as u32).map(|p| 40 + p).collect();
        positions.extend((0..(rows - n0) as u32).map(|p| 130 + p));
        let row_seq: Vec<u32> = (0..rows).map(|r| (r >= n0) as u32).collect();
        let need = [(40 + n0).div_ceil(BS), (130 + rows - n0).div_ceil(BS)];
        let blocks = need[0] + need[1];
        let mut ids: Vec<u32> = (0..blocks as u32).collect();
        for i in (1..blocks).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let seqs = vec![
            SeqMeta { block_table: ids[..need[0]].to_vec() },
            SeqMeta { block_table: ids[need[0]..].to_vec() },
        ];
        let meta = BatchMeta {
            tokens: vec![0; rows],
            positions,
            row_seq,
            seqs,
            logit_rows: vec![],
            block_size: BS,
        };
        Call { rows, acc, x, meta, blocks }
    }
}

impl Model {
    fn new(g: &CudaBackend, (h, heads, kvh, hd): (usize, usize, usize, usize)) -> Model {
        let rng = &mut Rng::new(h as u64 + 11);
        let mut wb = |n| (rand_weight(g, rng, n, h), rand_vector(g, rng, n));
        let qkv = [wb(heads * hd), wb(kvh * hd), wb(kvh * hd)];
        let norm = rand_vector(g, rng, h);
        // cos and sin of real angles at 256 positions.
        let table = table_weight(g, &rope_table(rng, 256, hd, true), 256, hd);
        Model { h, heads, kvh, hd, qkv, norm, table }
    }

    /// A call's buffers: acc, x and normed rows, q, k, v, a 2-layer pool.
    fn bufs(&self, g: &CudaBackend, c: &Call) -> Bufs {
        let (h, rows) = (self.h, c.rows);
        let geom = KvGeometry {
            layers: 2,
            kv_heads: self.kvh,
            head_dim: self.hd,
            block_size: BS,
            num_blocks: c.blocks,
        };
        Bufs {
            acc: up(g, rows, h, &c.acc),
            x: up(g, rows, h, &c.x),
            nrm: bf(g, rows, h),
            qkv: self.qkv.iter().map(|(w, _)| bf(g, rows, w.shape().0)).collect(),
            kv: g.alloc_kv(&geom).unwrap(),
        }
    }

    /// The op on `b` (layer 1 of its pool), fused or as the unfused ops; returns its launches.
    fn op(&self, g: &CudaBackend, b: &mut Bufs, batch: &CudaBatch, f: Form) -> u64 {
        let [q, k, v] = &mut b.qkv[..] else { unreachable!() };
        let bias = |j: usize| f.bias.then_some(&self.qkv[j].1);
        let parts = [
            LinearPart { w: &self.qkv[0].0, bias: bias(0), out: q },
            LinearPart { w: &self.qkv[1].0, bias: bias(1), out: k },
            LinearPart { w: &self.qkv[2].0, bias: bias(2), out: v },
        ];
        let (weight, eps, group) = (&self.norm, 1e-5, self.h);
        let input = match f.norm {
            true => {
                let (acc, x, out) = (&mut b.acc, &b.x, &mut b.nrm);
                QkvInput::AddNorm(AddNormArgs { acc, x, weight, eps, group, out })
            }
            false => QkvInput::Normed(&b.x),
        };
        let a = QkvRopeArgs {
            input,
            parts,
            kv: &mut b.kv,
            layer: 1,
            heads: self.heads,
            kv_heads: self.kvh,
            head_dim: self.hd,
            style: f.style,
            table: &self.table,
            batch,
        };
        let before = g.launches();
        match f.fused {
            true => g.qkv_rope_kv_store(a).unwrap(),
            false => qkv_rope_kv_store_unfused(g, a).unwrap(),
        }
        g.launches() - before
    }

    /// Every output: [acc, normed] (the norm form), q, k, v, then the pool's k and v of layer
    /// 1, every slot of both sequences.
    fn run(&self, g: &CudaBackend, c: &Call, f: Form) -> Vec<Vec<u32>> {
        let rows = c.rows;
        let mut b = self.bufs(g, c);
        let batch = g.prepare_batch(&c.meta).unwrap();
        let launches = self.op(g, &mut b, &batch, f);
        // One launch; the norm form runs add_rms_norm before it past 8 rows or when the normed
        // rows exceed the 16 KiB a CTA stages (`fused_norm::STAGE_MAX`, crate-private).
        let want = 1 + (f.norm && (rows > 8 || rows * self.h * 2 > 16 * 1024)) as u64;
        if f.fused {
            assert_eq!(launches, want, "{f:?} at {rows} rows: the fused call launched {launches}");
        }
        let mut all = Vec::new();
        if f.norm {
            all.extend([read_bits(g, &b.acc, rows), read_bits(g, &b.nrm, rows)]);
        }
        all.extend(b.qkv.iter().map(|t| read_bits(g, t, rows)));
        for s in &c.meta.seqs {
            let len = s.block_table.len() * BS;
            let (pk, pv) = g.read_kv(&b.kv, 1, &s.block_table, len).unwrap();
            all.push(pk.iter().map(|x| x.to_bits()).collect());
            all.push(pv.iter().map(|x| x.to_bits()).collect());
        }
        all
    }
}

/// A call's device buffers (`Model::bufs`).
struct Bufs {
    acc: CudaTensor,
    x: CudaTensor,
    nrm: CudaTensor,
    qkv: Vec<CudaTensor>,
    kv: CudaKv,
}

fn count_diff(a: &[u32], b: &[u32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

fn forms() -> Vec<Form> {
    let mut v = Vec::new();
    for norm in [true, false] {
        for bias in [false, true] {
            for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
                v.push(Form { norm, bias, style, fused: true });
            }
        }
    }
    v
}

fn check_geometry(g: &CudaBackend, geo: (usize, usize, usize, usize)) {
    let m = Model::new(g, geo);
    let mut rng = Rng::new(m.h as u64);
    for rows in ROWS {
        for rep in 0..2 {
            let c = Call::new(&mut rng, m.h, rows);
            for f in forms() {
                let (a, b) = (m.run(g, &c, Form { fused: false, ..f }), m.run(g, &c, f));
                for (j, (s, fu)) in a.iter().zip(&b).enumerate() {
                    let bad = count_diff(s, fu);
                    assert_eq!(
                        bad, 0,
                        "{geo:?} rows={rows} rep {rep} {f:?}: output {j}: {bad} differ"
                    );
                }
            }
        }
        println!("{geo:?}: q/k/v + rope + kv fused == the unfused ops bit for bit at {rows} rows");
    }
    // Control: one input element's sign flipped in each of two rows (one a sequence, so both
    // sequences' pool slots are written) changes every output of the fused call. The row's
    // largest |x| is flipped: a small one may vanish in bf16(acc + x) (H200, session 29: the
    // 33B geometry's row 0 at h / 3 changed no output of its sequence).
    for f in forms() {
        let c = Call::new(&mut rng, m.h, 2);
        let mut planted = c.clone();
        for r in 0..2 {
            let row = &c.x[r * m.h..(r + 1) * m.h];
            let mag = |b: u16| half::bf16::from_bits(b).to_f32().abs();
            let j = (0..m.h).max_by(|&a, &b| mag(row[a]).total_cmp(&mag(row[b]))).unwrap_or(0);
            planted.x[r * m.h + j] ^= 0x8000;
        }
        let (a, b) = (m.run(g, &c, Form { fused: false, ..f }), m.run(g, &planted, f));
        let diffs: Vec<usize> = a.iter().zip(&b).map(|(s, fu)| count_diff(s, fu)).collect();
        assert!(
            diffs.iter().all(|&d| d > 0),
            "control {f:?}: a planted change went unseen: {diffs:?}"
        );
        println!("{geo:?} {f:?}: control: a planted sign flip changes {diffs:?} values");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn qkv_rope_equals_the_unfused_ops_bitwise() {
    let g = gpu();
    check_geometry(&g, (576, 9, 3, 64));
    check_geometry(&g, (4096, 32, 8, 128));
    // nanbeige-33b's: more q/k/v tiles than the CTAs an H200 holds (the persistent loop).
    check_geometry(&g, (7168, 56, 8, 128));
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn qkv_rope_speed_llama3_8b() {
    let g = gpu();
    let models: Vec<Model> = (0..4).map(|_| Model::new(&g, (4096, 32, 8, 128))).collect();
    let c = Call::new(&mut Rng::new(3), 4096, 1);
    let mut b = models[0].bufs(&g, &c);
    let batch = g.prepare_batch(&c.meta).unwrap();
    for norm in [true, false] {
        for fused in [false, true, false, true] {
            let f = Form { norm, bias: false, style: RopeStyle::Neox, fused };
            let mut i = 0;
            let dt = per_call(&g, 200, || {
                models[i % models.len()].op(&g, &mut b, &batch, f);
                i += 1;
            });
            println!(
                "q/k/v + rope + kv at one row, norm {norm}, fused {fused}: {:.1} us a call",
                dt * 1e6
            );
        }
    }
}
