//! The kv_store and attention units: 2,048 query rows of seven sequences (lengths 1,027
//! down to 16, none a multiple of the block size but the last) over one paged pool.
//!
//! For each call size n of `rows::ROW_COUNTS` a schedule runs every sequence from position 0
//! to its end in steps of n rows (the final one possibly fewer): each step takes the
//! unfinished sequences in a random order and gives each a chunk of random length (the last
//! one, then the others, lengthened to fill the step), so decode rows (chunks of 1) and prefill chunks of other
//! sequences share calls, and a prompt is chunked differently in every schedule. A step
//! embeds each row's q, k and v (tables of the 2,048 rows), stores k and v with `kv_store`
//! at layer 1 of a two-layer pool, and runs `attention` on its rows. Every schedule uses a
//! fresh random assignment of pool blocks to sequences, so stale KV of the previous schedule
//! lies in blocks a bug could read. The n = 2,048 schedule is one call of every row (each
//! sequence one chunk): the anchor.
//!
//! Gate 3: every query row's output, and every stored KV row (`read_kv`), has the anchor's
//! bits in every schedule. Gate 2: attention on the last position of each sequence and
//! positions 0 and 1 (9 rows, every head); kv_store on all 2,048 rows (exact copies).

use super::compare::{differing_rows, Anchor};
use super::data::{read, Rng, Scratch, Table, BLOCK_SIZE};
use super::geometry::Geometry;
use super::reference::{self, AttnShape, Expect};
use super::report::{Judged, Verdict};
use super::rows::{bound_gate, counts, row_control, ROW_COUNTS, UNIVERSE};
use super::ContractError;
use crate::batch::{BatchMeta, KvGeometry, SeqMeta};
use crate::{ActDType, AttnArgs, Backend};

/// Sequence lengths; they sum to `UNIVERSE`.
const SEQ_LENS: [usize; 7] = [1027, 515, 259, 131, 67, 33, 16];
const LAYERS: usize = 2;
/// The layer written and read (not 0, so a layer offset is exercised).
const LAYER: usize = 1;
/// Pool blocks beyond what the sequences need, so assignments differ in more than order.
const SPARE_BLOCKS: usize = 9;

/// A chunk of one sequence in a step: positions `start..start + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    seq: usize,
    start: usize,
    len: usize,
}

/// Universe id of (sequence s, position 0).
fn start_of(s: usize) -> usize {
    SEQ_LENS[..s].iter().sum()
}

/// Steps of at most `cap` rows covering every position of every sequence once, in order.
fn schedule(cap: usize, rng: &mut Rng) -> Vec<Vec<Chunk>> {
    let mut done = [0usize; SEQ_LENS.len()];
    let mut steps = Vec::new();
    loop {
        let mut order: Vec<usize> =
            (0..SEQ_LENS.len()).filter(|&s| done[s] < SEQ_LENS[s]).collect();
        if order.is_empty() {
            return steps;
        }
        rng.shuffle(&mut order);
        let (mut budget, mut step) = (cap, Vec::new());
        for (i, &seq) in order.iter().enumerate() {
            if budget == 0 {
                break;
            }
            let most = (SEQ_LENS[seq] - done[seq]).min(budget);
            let fill = cap >= UNIVERSE || i + 1 == order.len();
            let len = if fill { most } else { 1 + rng.below(most) };
            step.push(Chunk { seq, start: done[seq], len });
            (done[seq], budget) = (done[seq] + len, budget - len);
        }
        // Lengthen the chunks while rows are left, so only the final step can be short.
        for c in step.iter_mut() {
            let more = (SEQ_LENS[c.seq] - done[c.seq]).min(budget);
            (c.len, done[c.seq], budget) = (c.len + more, done[c.seq] + more, budget - more);
        }
        steps.push(step);
    }
}

/// Inputs, buffers and the pool, reused by every schedule.
struct World<B: Backend> {
    /// q `(UNIVERSE, heads * head_dim)`, k and v `(UNIVERSE, kv_heads * head_dim)`.
    tables: [Table<B>; 3],
    bufs: [B::Tensor; 3],
    out: B::Tensor,
    kv: B::Kv,
    num_blocks: usize,
    shape: AttnShape,
    scale: f32,
}

impl<B: Backend> World<B> {
    fn new(be: &B, g: &Geometry, s: &Scratch, rng: &mut Rng) -> Result<Self, ContractError> {
        let (q, kv) = (g.heads * g.head_dim, g.kv_heads * g.head_dim);
        let mut table = |name: &str, cols: usize, off: f32| {
            let gen = |_: usize, c: usize| rng.normalish() + if c % 2 == 1 { off } else { 0.0 };
            Table::new(be, s, name, (UNIVERSE, cols), gen)
        };
        let tables = [table("q", q, 0.0)?, table("k", kv, 0.0)?, table("v", kv, 2.0)?];
        let alloc = |cols| be.alloc(ActDType::Bf16, UNIVERSE, cols);
        let bufs = [alloc(q)?, alloc(kv)?, alloc(kv)?];
        let num_blocks =
            SEQ_LENS.iter().map(|l| l.div_ceil(BLOCK_SIZE)).sum::<usize>() + SPARE_BLOCKS;
        let geom = KvGeometry {
            layers: LAYERS,
            kv_heads: g.kv_heads,
            head_dim: g.head_dim,
            block_size: BLOCK_SIZE,
            num_blocks,
        };
        let scale = 1.0 / (g.head_dim as f32).sqrt();
        let shape = AttnShape {
            heads: g.heads,
            kv_heads: g.kv_heads,
            head_dim: g.head_dim,
            scale: scale as f64,
        };
        Ok(World {
            tables,
            bufs,
            out: alloc(q)?,
            kv: be.alloc_kv(&geom)?,
            num_blocks,
            shape,
            scale,
        })
    }

    /// Runs one schedule: every query row's output `(UNIVERSE, heads * head_dim)` and every
    /// stored KV row `(UNIVERSE, 2 * kv_heads * head_dim)` (k then v), by universe id.
    fn run(
        &mut self,
        be: &B,
        steps: &[Vec<Chunk>],
        rng: &mut Rng,
    ) -> Result<(Vec<f32>, Vec<f32>), ContractError> {
        let mut blocks: Vec<u32> = (0..self.num_blocks as u32).collect();
        rng.shuffle(&mut blocks);
        let mut tables = Vec::new();
        let mut at = 0;
        for len in SEQ_LENS {
            let n = len.div_ceil(BLOCK_SIZE);
            tables.push(blocks[at..at + n].to_vec());
            at += n;
        }
        let qc = self.shape.heads * self.shape.head_dim;
        let mut out = vec![0f32; UNIVERSE * qc];
        for step in steps {
            let meta = step_meta(step, &tables);
            let got = self.step(be, &meta)?;
            for (r, &id) in meta.tokens.iter().enumerate() {
                let id = id as usize;
                out[id * qc..(id + 1) * qc].copy_from_slice(&got[r * qc..(r + 1) * qc]);
            }
        }
        let kc = self.shape.kv_heads * self.shape.head_dim;
        let mut kv_rows = vec![0f32; UNIVERSE * 2 * kc];
        for (s, table) in tables.iter().enumerate() {
            let (k, v) = be.read_kv(&self.kv, LAYER, table, SEQ_LENS[s])?;
            if k.len() != SEQ_LENS[s] * kc || v.len() != k.len() {
                return Err(ContractError::Setup(format!(
                    "read_kv of {} positions returned {} and {} values",
                    SEQ_LENS[s],
                    k.len(),
                    v.len()
                )));
            }
            for p in 0..SEQ_LENS[s] {
                let row = &mut kv_rows[(start_of(s) + p) * 2 * kc..][..2 * kc];
                row[..kc].copy_from_slice(&k[p * kc..(p + 1) * kc]);
                row[kc..].copy_from_slice(&v[p * kc..(p + 1) * kc]);
            }
        }
        Ok((out, kv_rows))
    }

    /// One step: embed q, k, v; kv_store; attention; the output rows.
    fn step(&mut self, be: &B, meta: &BatchMeta) -> Result<Vec<f32>, ContractError> {
        let batch = be.prepare_batch(meta)?;
        for (t, buf) in self.tables.iter().zip(self.bufs.iter_mut()) {
            t.embed(be, &batch, &meta.tokens, buf)?;
        }
        let [q, k, v] = &self.bufs;
        be.kv_store(&mut self.kv, LAYER, k, v, &batch)?;
        let sh = self.shape;
        be.attention(AttnArgs {
            q,
            kv: &self.kv,
            layer: LAYER,
            batch: &batch,
            heads: sh.heads,
            kv_heads: sh.kv_heads,
            head_dim: sh.head_dim,
            scale: self.scale,
            out: &mut self.out,
        })?;
        let cols = self.shape.heads * self.shape.head_dim;
        read(be, &self.out, (meta.rows(), cols), "attention output")
    }

    /// Reference of query rows `ids` (universe ids), and the rows' description.
    fn reference(&self, ids: &[usize]) -> Option<Expect> {
        let [q, k, v] = self.tables.each_ref().map(|t| t.mat());
        let mut e = Expect::default();
        for &id in ids {
            let s = (0..SEQ_LENS.len()).rev().find(|&s| start_of(s) <= id)?;
            let keys: Vec<Vec<f64>> = (start_of(s)..=id).map(|j| k.row(j)).collect();
            let vals: Vec<Vec<f64>> = (start_of(s)..=id).map(|j| v.row(j)).collect();
            e.append(reference::attention(&q.row(id), &keys, &vals, self.shape)?);
        }
        Some(e)
    }
}

/// The batch of one step: chunks in step order, positions ascending within each.
fn step_meta(step: &[Chunk], tables: &[Vec<u32>]) -> BatchMeta {
    let mut m = BatchMeta { block_size: BLOCK_SIZE, ..BatchMeta::default() };
    for (i, c) in step.iter().enumerate() {
        for p in c.start..c.start + c.len {
            m.tokens.push((start_of(c.seq) + p) as u32);
            m.positions.push(p as u32);
            m.row_seq.push(i as u32);
        }
        m.seqs.push(SeqMeta { block_table: tables[c.seq].clone() });
    }
    m
}

/// Judges kv_store and attention at geometry `g`: `[kv_store, attention]`.
pub fn run<B: Backend>(be: &B, g: &Geometry, s: &Scratch, rng: &mut Rng) -> [Judged; 2] {
    match judge(be, g, s, rng) {
        Ok(j) => j,
        Err(e) => [Judged::error(&e), Judged::error(&e)],
    }
}

fn judge<B: Backend>(
    be: &B,
    g: &Geometry,
    s: &Scratch,
    rng: &mut Rng,
) -> Result<[Judged; 2], ContractError> {
    let mut w = World::new(be, g, s, rng)?;
    let all: Vec<u32> = (0..UNIVERSE as u32).collect();
    let (out, kv) = w.run(be, &schedule(UNIVERSE, rng), rng)?;
    let (qc, kc) = (out.len() / UNIVERSE, kv.len() / UNIVERSE);
    let (a_out, a_kv) = (Anchor::new(all.clone(), out, qc), Anchor::new(all.clone(), kv, kc));
    let (mut bad_out, mut bad_kv, mut steps) = (Vec::new(), Vec::new(), 0);
    for cap in ROW_COUNTS.into_iter().filter(|&n| n < UNIVERSE) {
        let plan = schedule(cap, rng);
        steps += plan.len();
        let (o, k) = w.run(be, &plan, rng)?;
        bad_out.extend(differing_rows(&a_out, &all, &o).into_iter().map(|r| (cap, r)));
        bad_kv.extend(differing_rows(&a_kv, &all, &k).into_iter().map(|r| (cap, r)));
    }
    let rows_verdict = |bad: &[(usize, usize)], what: &str| {
        let detail = format!(
            "{what} rows of schedules of at most {} rows ({steps} steps, shuffled block tables)",
            counts()
        );
        match bad.first() {
            None => Verdict::pass(format!("all {UNIVERSE} {detail} equal the one-call schedule")),
            Some((cap, r)) => Verdict::fail(format!(
                "{} {detail} differ, first: id {r} (seq/pos {:?}) at n = {cap}",
                bad.len(),
                seq_pos(*r)
            )),
        }
    };
    // kv_store: every stored row is the k and v input, exactly.
    let [_, k, v] = w.tables.each_ref().map(|t| t.mat());
    let want_kv = Expect::exact(
        all.iter().flat_map(|&i| [k.row(i as usize), v.row(i as usize)].concat()).collect(),
    );
    let (kv_bound, kv_ctl) = bound_gate(&a_kv.data, &want_kv, UNIVERSE);
    let kv_j = Judged {
        bound: kv_bound,
        rows: rows_verdict(&bad_kv, "stored KV"),
        ctl_bound: kv_ctl,
        ctl_row: row_control(&a_kv, rng),
    };
    let mut sample: Vec<usize> = (0..SEQ_LENS.len()).map(|s| start_of(s + 1) - 1).collect();
    sample.extend([start_of(0), start_of(1) + 1]);
    let got: Vec<f32> =
        sample.iter().filter_map(|&id| a_out.row(id as u32)).flatten().copied().collect();
    let (bound, ctl_bound) = match w.reference(&sample) {
        Some(want) => bound_gate(&got, &want, sample.len()),
        None => {
            let why = "scores too large for the attention bound (see bound::attention_factor)";
            (Verdict::fail(why.into()), Verdict::fail(why.into()))
        }
    };
    let rows = rows_verdict(&bad_out, "query");
    let at_j = Judged { bound, rows, ctl_bound, ctl_row: row_control(&a_out, rng) };
    Ok([kv_j, at_j])
}

/// (sequence, position) of a universe id.
fn seq_pos(id: usize) -> (usize, usize) {
    let s = (0..SEQ_LENS.len()).rev().find(|&s| start_of(s) <= id).unwrap_or(0);
    (s, id - start_of(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_cover_every_position_once_in_order() {
        assert_eq!(SEQ_LENS.iter().sum::<usize>(), UNIVERSE);
        let mut rng = Rng::new(5);
        for cap in ROW_COUNTS {
            let steps = schedule(cap, &mut rng);
            let mut next = [0usize; SEQ_LENS.len()];
            for (i, step) in steps.iter().enumerate() {
                let rows: usize = step.iter().map(|c| c.len).sum();
                assert!(rows >= 1 && rows <= cap, "cap {cap}: {rows} rows");
                // Only the final step may be short.
                assert!(rows == cap || i + 1 == steps.len(), "cap {cap}: short step {i}");
                for c in step {
                    assert_eq!(c.start, next[c.seq]);
                    next[c.seq] += c.len;
                }
            }
            assert_eq!(next, SEQ_LENS);
            if cap == UNIVERSE {
                assert_eq!(steps.len(), 1);
            }
        }
    }

    #[test]
    fn step_meta_validates_and_maps_ids() {
        let tables: Vec<Vec<u32>> = SEQ_LENS.iter().map(|l| vec![0; l.div_ceil(16)]).collect();
        let step = [Chunk { seq: 2, start: 5, len: 3 }, Chunk { seq: 0, start: 0, len: 1 }];
        let m = step_meta(&step, &tables);
        m.validate(Some(1)).unwrap();
        assert_eq!(m.tokens, [1547, 1548, 1549, 0]);
        assert_eq!(m.positions, [5, 6, 7, 0]);
        assert_eq!(m.row_seq, [0, 0, 0, 1]);
        assert_eq!(seq_pos(1547), (2, 5));
    }
}
