//! `resumed == fresh`: a sequence continued from KV restored out of a prompt cache equals the
//! same sequence computed from scratch.
//!
//! Sequence A computes a prefix. Sequence B's block table starts with A's *full* blocks of the
//! shared prefix (the same block ids: B reads A's KV, it is not copied), B prefills only the
//! rest from position `k * BLOCK_SIZE`, then continues one row per call. B's logits (of the
//! rows B computed) and KV (of every position, A's blocks included) must equal those of the
//! same token sequence computed fresh in new blocks from position 0; and A's KV must be
//! unchanged after B ran (a cached block is read-only to the sequences reusing it).
//! The case with A's prefix ending exactly on a block boundary is always among the cases.

use tf_backend::Backend;

use super::fingerprint::{self, Fnv};
use super::pool::{blocks_for, need, teacher, Pool};
use super::record::{Record, SeqRecord, Widths};
use super::rng::Rng;
use super::{CheckOutcome, Collector, Progress};
use crate::error::{EngineError, Result};
use crate::family::CausalLm;
use crate::generate::BLOCK_SIZE;

/// What `resumed` runs.
#[derive(Clone, Debug)]
pub struct ResumedOpts {
    pub cases: usize,
    /// Rows B adds one per call after its prefill.
    pub extra_steps: usize,
    pub seed: u64,
}

impl Default for ResumedOpts {
    fn default() -> Self {
        ResumedOpts { cases: 3, extra_steps: 8, seed: 0 }
    }
}

/// One case's token layout.
struct Case {
    /// A's tokens (the cached prompt).
    a: Vec<u32>,
    /// B's tokens: A's first `shared` tokens, then its own.
    b: Vec<u32>,
    shared: usize,
    /// B's prefill ends here; the rest are one-row steps.
    prefill_end: usize,
}

impl Case {
    fn draw(h: &[u32], first: bool, extra: usize, rng: &mut Rng) -> Case {
        let n = h.len();
        let p = rng.range(BLOCK_SIZE, (n / 2).max(BLOCK_SIZE));
        // The first case ends A's prefix exactly on a block boundary.
        let p = if first { p / BLOCK_SIZE * BLOCK_SIZE } else { p };
        let shared = p / BLOCK_SIZE * BLOCK_SIZE;
        let m = rng.range(1, n.saturating_sub(shared + extra).max(1));
        let q = rng.range(0, n - (m + extra).min(n));
        let mut b = h[..shared].to_vec();
        b.extend_from_slice(&h[q..(q + m + extra).min(n)]);
        Case { a: h[..p].to_vec(), b, shared, prefill_end: shared + m }
    }
}

/// Runs B's tokens `from..` on `table`: whole up to `prefill_end`, then one row per call.
fn continue_b<B: Backend>(
    model: &mut dyn CausalLm<B>,
    kv: &mut B::Kv,
    table: &[u32],
    c: &Case,
    from: usize,
) -> Result<Vec<f32>> {
    let max = model.max_rows();
    let mut logits = teacher(model, kv, table, &c.b[from..c.prefill_end], from, &mut |_, _| max)?;
    let rest = &c.b[c.prefill_end..];
    if !rest.is_empty() {
        logits.extend(teacher(model, kv, table, rest, c.prefill_end, &mut |_, _| 1)?);
    }
    Ok(logits)
}

/// Records of one case: (A before, A after, B resumed, B fresh).
fn run_case<B: Backend>(
    model: &mut dyn CausalLm<B>,
    pool: &mut Pool<B>,
    c: &Case,
    rng: &mut Rng,
) -> Result<[Record; 4]> {
    let w = Widths::of(model);
    let one = |s: SeqRecord| Record { seqs: vec![s], vocab: w.vocab, kv_dim: w.kv_dim };
    let max = model.max_rows();
    let table_a = pool.table(c.a.len(), Some(rng))?;
    let la = teacher(model, &mut pool.kv, &table_a, &c.a, 0, &mut |_, _| max)?;
    let a_before = SeqRecord::capture(model, &pool.kv, &table_a, c.a.clone(), (0, la))?;

    let k = c.shared / BLOCK_SIZE;
    let mut table_b = table_a[..k].to_vec();
    table_b.extend(pool.table(c.b.len() - c.shared, Some(rng))?);
    let lb = continue_b(model, &mut pool.kv, &table_b, c, c.shared)?;
    let b = SeqRecord::capture(model, &pool.kv, &table_b, c.b.clone(), (c.shared, lb))?;
    let a_after =
        SeqRecord::capture(model, &pool.kv, &table_a, c.a.clone(), (0, a_before.logits.clone()))?;

    let table_f = pool.table(c.b.len(), Some(rng))?;
    let lf = continue_b(model, &mut pool.kv, &table_f, c, 0)?;
    let fresh = SeqRecord::capture(model, &pool.kv, &table_f, c.b.clone(), (0, lf))?
        .logits_from(c.shared, w.vocab);
    Ok([one(a_before), one(a_after), one(b), one(fresh)])
}

/// Checks `resumed == fresh` on prefixes and continuations cut from `history`.
pub fn resumed<B: Backend>(
    model: &mut dyn CausalLm<B>,
    history: &[u32],
    opts: &ResumedOpts,
    progress: Progress<'_>,
) -> Result<CheckOutcome> {
    let n = history.len();
    if n < 2 * BLOCK_SIZE + opts.extra_steps + 1 || opts.cases == 0 {
        return Err(EngineError::Refused(format!(
            "resumed: needs at least one case and {} history tokens, has {n}",
            2 * BLOCK_SIZE + opts.extra_steps + 1
        )));
    }
    need(model, "resumed", 1, n)?;
    let w = Widths::of(model);
    let mut rng = Rng::derive(opts.seed, "resumed");
    let mut col = Collector::new("resumed", opts.seed, 2 * opts.cases, w.layers);
    let mut fp = Fnv::new();
    let mut shapes = Vec::new();
    for i in 0..opts.cases {
        let c = Case::draw(history, i == 0, opts.extra_steps, &mut rng);
        let mut pool = Pool::new(model, blocks_for([c.a.len(), c.b.len(), c.b.len()]))?;
        let (k, p, m) = (c.shared / BLOCK_SIZE, c.a.len(), c.prefill_end - c.shared);
        let steps = c.b.len() - c.prefill_end;
        progress(&format!(
            "resumed: case {i}: A {p} tokens; B reuses {k} blocks, prefills {m} rows at {}, \
             {steps} steps; fresh B",
            c.shared
        ));
        let [a_before, a_after, b, fresh] = run_case(model, &mut pool, &c, &mut rng)?;
        col.compare(format!("case {i}: B resumed on A's {k} blocks vs fresh"), &fresh, &b);
        col.compare(format!("case {i}: A's KV after B vs before"), &a_before, &a_after);
        shapes.push(format!("{k} blocks+{m}+{steps}"));
        fp.u64(fingerprint::record(&fresh));
    }
    let what = format!(
        "{} cases (shared blocks + prefill + steps: {}) vs fresh, and the cached blocks untouched",
        opts.cases,
        shapes.join(", ")
    );
    Ok(col.finish(what, fp.finish(), Vec::new()))
}
