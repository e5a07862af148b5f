//! `seeded == seeded`: a sampled generation (temperature 0.8, top_p 0.95, seed S by default)
//! gives the same tokens, logits and KV
//! (a) after a restart: a second model built by the caller's factory, with a fresh KV pool;
//! (b) when its calls are shared with other sequences' rows (prefill chunks of random size,
//!     other seeds, greedy ones, joining at random calls), through `multigen`;
//! and a different seed (S + 1) must change the tokens, or the check fails (a sampler that
//! ignored its seed would pass (a) and (b) trivially).

use tf_backend::Backend;

use super::fingerprint;
use super::multigen::{self, Chunking, GenSeq};
use super::pool::{blocks_for, need, Pool};
use super::record::{Record, Widths};
use super::rng::Rng;
use super::{CheckOutcome, Collector, Progress};
use crate::error::{EngineError, Result};
use crate::family::CausalLm;
use crate::sampler::{Sampler, SamplingParams};

/// What `seeded` runs.
#[derive(Clone, Debug)]
pub struct SeededOpts {
    pub prompt_len: usize,
    pub gen_tokens: usize,
    /// Other sequences sharing the calls in run (b).
    pub others: usize,
    pub temperature: f32,
    pub top_p: f32,
    /// The sampler's seed (also seeds the checker's own choices).
    pub seed: u64,
}

impl Default for SeededOpts {
    fn default() -> Self {
        SeededOpts {
            prompt_len: 48,
            gen_tokens: 24,
            others: 5,
            temperature: 0.8,
            top_p: 0.95,
            seed: 0,
        }
    }
}

/// Builds a freshly loaded model (for the restart run).
pub type ModelFactory<'a, B> = &'a mut dyn FnMut() -> Result<Box<dyn CausalLm<B>>>;

impl SeededOpts {
    fn sampler(&self, seed: u64) -> Result<Sampler> {
        Sampler::new(SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            seed,
            ..SamplingParams::default()
        })
    }
}

/// The sequence under test alone, prompt prefilled whole, in a fresh pool of `model`.
fn alone<B: Backend>(
    model: &mut dyn CausalLm<B>,
    prompt: &[u32],
    opts: &SeededOpts,
    seed: u64,
    rng: &mut Rng,
) -> Result<Record> {
    let w = Widths::of(model);
    let mut pool = Pool::new(model, blocks_for([prompt.len() + opts.gen_tokens]))?;
    let table = pool.table(prompt.len() + opts.gen_tokens, Some(rng))?;
    let mut seqs = [GenSeq::new(prompt.to_vec(), opts.sampler(seed)?, opts.gen_tokens, table)];
    multigen::run(model, &mut pool.kv, &mut seqs, rng)?;
    let rec = seqs[0].record(model, &pool.kv)?;
    Ok(Record { seqs: vec![rec], vocab: w.vocab, kv_dim: w.kv_dim })
}

/// The sequence under test beside `opts.others` sequences, sharing every call.
fn beside_others<B: Backend>(
    model: &mut dyn CausalLm<B>,
    history: &[u32],
    prompt: &[u32],
    opts: &SeededOpts,
    rng: &mut Rng,
) -> Result<(Record, usize)> {
    let w = Widths::of(model);
    let mut seqs =
        vec![GenSeq::new(prompt.to_vec(), opts.sampler(opts.seed)?, opts.gen_tokens, Vec::new())];
    seqs[0].chunking = Chunking::Random(16);
    seqs[0].start_call = rng.range(0, 2);
    for i in 0..opts.others {
        let len = rng.range(1, (2 * opts.prompt_len).min(history.len()));
        let off = rng.range(0, history.len() - len);
        // Every third other sequence is greedy; the rest sample with their own seeds.
        let sampler = if i % 3 == 2 {
            Sampler::new(SamplingParams::default())?
        } else {
            opts.sampler(opts.seed ^ (0x5eed_0000 + i as u64))?
        };
        let max_tokens = rng.range(1, 2 * opts.gen_tokens);
        let mut s = GenSeq::new(history[off..off + len].to_vec(), sampler, max_tokens, Vec::new());
        s.chunking = Chunking::Random(32);
        s.start_call = rng.range(0, opts.gen_tokens);
        seqs.push(s);
    }
    let lens: Vec<usize> = seqs.iter().map(|s| s.kv_len() + 1).collect();
    let mut pool = Pool::new(model, blocks_for(lens.iter().copied()))?;
    for (s, t) in seqs.iter_mut().zip(pool.tables(&lens, rng)?) {
        s.table = t;
    }
    let calls = multigen::run(model, &mut pool.kv, &mut seqs, rng)?;
    let rec = seqs[0].record(model, &pool.kv)?;
    Ok((Record { seqs: vec![rec], vocab: w.vocab, kv_dim: w.kv_dim }, calls))
}

fn head(tokens: &[u32]) -> String {
    let s: Vec<String> = tokens.iter().take(8).map(u32::to_string).collect();
    format!("[{}{}]", s.join(" "), if tokens.len() > 8 { " ..." } else { "" })
}

/// Checks `seeded == seeded` with the prompt `history[..prompt_len]`; `restart` builds the
/// second model of run (a).
pub fn seeded<B: Backend>(
    model: &mut dyn CausalLm<B>,
    restart: ModelFactory<'_, B>,
    history: &[u32],
    opts: &SeededOpts,
    progress: Progress<'_>,
) -> Result<CheckOutcome> {
    if opts.prompt_len == 0 || opts.prompt_len > history.len() || opts.gen_tokens == 0 {
        return Err(EngineError::Refused(format!(
            "seeded: needs a prompt of 1 to {} tokens and tokens to generate",
            history.len()
        )));
    }
    let positions = (2 * opts.prompt_len).min(history.len()) + 2 * opts.gen_tokens;
    need(model, "seeded", opts.prompt_len, positions)?;
    let prompt = &history[..opts.prompt_len];
    let w = Widths::of(model);
    let mut rng = Rng::derive(opts.seed, "seeded");
    let mut col = Collector::new("seeded", opts.seed, 2, w.layers);
    let g = opts.gen_tokens;

    progress(&format!(
        "seeded: seed {}: {g} tokens from a {}-token prompt, alone",
        opts.seed,
        prompt.len()
    ));
    let base = alone(model, prompt, opts, opts.seed, &mut rng)?;
    progress("seeded: the same after a restart (a second model, a fresh KV pool)");
    let mut second = restart()?;
    let again = alone(second.as_mut(), prompt, opts, opts.seed, &mut rng)?;
    drop(second);
    col.compare("after a restart".into(), &base, &again);
    progress(&format!("seeded: the same beside {} other sequences in shared calls", opts.others));
    let (shared, calls) = beside_others(model, history, prompt, opts, &mut rng)?;
    col.compare(format!("beside {} others ({calls} shared calls)", opts.others), &base, &shared);

    let other_seed = opts.seed.wrapping_add(1);
    progress(&format!("seeded: seed {other_seed} must change the tokens"));
    let other = alone(model, prompt, opts, other_seed, &mut rng)?;
    let (a, b) = (&base.seqs[0].sampled, &other.seqs[0].sampled);
    let changed = a.iter().zip(b).filter(|(x, y)| x != y).count();
    let mut failures = Vec::new();
    if changed == 0 {
        failures.push(format!("seed {other_seed} gave the same {g} tokens as seed {}", opts.seed));
    }
    let notes = vec![
        format!("seed {} sampled {}", opts.seed, head(a)),
        format!("seed {other_seed} changed {changed} of {g} tokens"),
    ];
    let what = format!(
        "{g} tokens at T={} top_p={}: alone vs after a restart and vs beside {} others",
        opts.temperature, opts.top_p, opts.others
    );
    Ok(col.finish_with(what, fingerprint::record(&base), notes, failures))
}
