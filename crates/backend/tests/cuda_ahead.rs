//! Decode ahead on the GPU (`Backend::argmax_ahead`, `ahead_token`): a chain of greedy steps
//! whose tokens and positions advance on the device equals the same chain run step by step
//! with the host reading each token and uploading the next step's metadata.
//!
//! The model is a toy with every part that reads the step metadata: `embed` (the token),
//! `kv_store` (the position, through the block table) and `logits` (the logits row map), a
//! 4,096-id table and head of width 256; each step stores its embedded row as K and V at its
//! position. Both chains run 40 steps as graphed steps; the tokens and the KV pool must be
//! equal. Controls: the same plain chain started one position later must leave another pool
//! (so the comparison sees positions), and a two-row batch must be refused.
//!
//! Needs an NVIDIA GPU and is ignored elsewhere; on the GPU machine:
//! `cargo test --release -p tf-backend --test cuda_ahead -- --ignored --nocapture`.

mod common;

use common::cuda::gpu;
use common::{random_bf16, Rng};
use tf_backend::batch::{BatchMeta, KvGeometry, SeqMeta};
use tf_backend::cuda::{CudaBackend, CudaBatch, CudaKv, CudaTensor, CudaWeight};
use tf_backend::{ActDType, Backend};
use tf_checkpoint::{DType, TensorFormat, TensorView};

const VOCAB: usize = 4096;
const WIDTH: usize = 256;
const STEPS: usize = 40;
const BS: usize = 16;
const GEOM: KvGeometry =
    KvGeometry { layers: 1, kv_heads: 2, head_dim: 128, block_size: BS, num_blocks: 8 };

struct Toy {
    table: CudaWeight,
    head: CudaWeight,
}

fn weight(g: &CudaBackend, rng: &mut Rng, name: &str) -> CudaWeight {
    let (bits, _) = random_bf16(rng, VOCAB * WIDTH, 1.0);
    let bytes = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let view = TensorView::owned(name, TensorFormat::Plain(DType::BF16), vec![VOCAB, WIDTH], bytes);
    g.load_weight(&view).unwrap()
}

fn meta(token: u32, pos: usize) -> BatchMeta {
    BatchMeta {
        tokens: vec![token],
        positions: vec![pos as u32],
        row_seq: vec![0],
        seqs: vec![SeqMeta { block_table: (0..GEOM.num_blocks as u32).collect() }],
        logit_rows: vec![0],
        block_size: BS,
    }
}

/// A chain's pool and activations (allocated once, so its steps replay one graph).
struct Chain {
    kv: CudaKv,
    x: CudaTensor,
    logits: CudaTensor,
}

impl Chain {
    fn new(g: &CudaBackend) -> Chain {
        Chain {
            kv: g.alloc_kv(&GEOM).unwrap(),
            x: g.alloc(ActDType::Bf16, 1, WIDTH).unwrap(),
            logits: g.alloc(ActDType::F32, 1, VOCAB).unwrap(),
        }
    }

    /// Opens a toy step over `b` (embed, the row stored as K and V, logits).
    fn issue(&mut self, g: &CudaBackend, toy: &Toy, b: &CudaBatch) {
        g.step_begin(b).unwrap();
        g.embed(&toy.table, b, &mut self.x).unwrap();
        g.kv_store(&mut self.kv, 0, &self.x, &self.x, b).unwrap();
        g.logits(&self.x, &toy.head, b, &mut self.logits).unwrap();
    }

    /// K and V of positions p0 .. p0 + STEPS, as bits.
    fn kv_bits(&self, g: &CudaBackend, p0: usize) -> Vec<u32> {
        let table: Vec<u32> = (0..GEOM.num_blocks as u32).collect();
        let (k, v) = g.read_kv(&self.kv, 0, &table, p0 + STEPS + 1).unwrap();
        let w = GEOM.kv_heads * GEOM.head_dim;
        let at = |t: &[f32]| -> Vec<u32> {
            t[p0 * w..(p0 + STEPS) * w].iter().map(|x| x.to_bits()).collect()
        };
        [at(&k), at(&v)].concat()
    }
}

/// The plain chain from position p0: each step's metadata uploaded by the host, its token
/// read back; the tokens and the pool's K and V at positions `view .. view + STEPS`.
fn plain(g: &CudaBackend, toy: &Toy, t0: u32, p0: usize, view: usize) -> (Vec<u32>, Vec<u32>) {
    let mut c = Chain::new(g);
    let mut toks = vec![t0];
    for i in 0..STEPS {
        let b = g.prepare_batch(&meta(toks[i], p0 + i)).unwrap();
        c.issue(g, toy, &b);
        g.step_end().unwrap();
        toks.push(g.argmax(&c.logits, 1).unwrap()[0]);
    }
    (toks, c.kv_bits(g, view))
}

/// The ahead chain: step i + 1 issued before step i's token is read.
fn ahead(g: &CudaBackend, toy: &Toy, t0: u32, p0: usize) -> (Vec<u32>, Vec<u32>) {
    let mut c = Chain::new(g);
    let mut toks = vec![t0];
    let mut b = g.prepare_batch(&meta(t0, p0)).unwrap();
    for i in 0..STEPS {
        c.issue(g, toy, &b);
        b = g.argmax_ahead(&c.logits, &b).unwrap();
        g.step_end().unwrap();
        if i > 0 {
            toks.push(g.ahead_token(p0 + i).unwrap());
        }
    }
    toks.push(g.ahead_token(p0 + STEPS).unwrap());
    g.synchronize().unwrap();
    (toks, c.kv_bits(g, p0))
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn ahead_chain_equals_the_plain_chain() {
    let g = gpu();
    assert!(g.decode_ahead(), "decode ahead is off (TENSORFOLD_DECODE_AHEAD=0?)");
    let mut rng = Rng::new(21);
    let toy = Toy { table: weight(&g, &mut rng, "table"), head: weight(&g, &mut rng, "head") };
    for (t0, p0) in [(7u32, 0usize), (4095, 13), (1234, 61)] {
        let (pt, pkv) = plain(&g, &toy, t0, p0, p0);
        let (at, akv) = ahead(&g, &toy, t0, p0);
        let distinct = pt.iter().collect::<std::collections::BTreeSet<_>>().len();
        println!("start {t0} at {p0}: plain {:?}..., {distinct} distinct", &pt[..8]);
        assert_eq!(at, pt, "start {t0} at {p0}: the ahead chain's tokens");
        let differ = akv.iter().zip(&pkv).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "start {t0} at {p0}: {differ} KV values differ");
        // Control: the chain one position later leaves other rows at these positions.
        let (_, skv) = plain(&g, &toy, t0, p0 + 1, p0);
        let moved = skv.iter().zip(&pkv).filter(|(a, b)| a != b).count();
        assert!(moved > 0, "start {t0} at {p0}: a shifted chain left the same pool");
    }
    // Two rows are refused by name, nothing launched.
    let mut m = meta(1, 3);
    m.tokens.push(2);
    m.positions.push(4);
    m.row_seq.push(0);
    let b = g.prepare_batch(&m).unwrap();
    let l = g.alloc(ActDType::F32, 2, VOCAB).unwrap();
    let e = g.argmax_ahead(&l, &b).unwrap_err().to_string();
    assert!(e.contains("argmax_ahead"), "{e}");
}
