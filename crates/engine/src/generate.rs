//! Generation for one sequence at a time: prefill in chunks, then decode row by row.
//!
//! Every step is a `BatchMeta` through the same `CausalLm::forward` a multi-sequence scheduler
//! will call; chunk boundaries change no value (the `windows == steps` invariant), so the chunk
//! size is a speed knob only.

use std::time::{Duration, Instant};

use tf_backend::penalty::Seen;
use tf_backend::{Backend, BatchMeta, SeqMeta};

use crate::ahead::AheadRun;
use crate::error::{EngineError, Result};
use crate::family::CausalLm;
use crate::kv::{BlockAllocator, BlockId};
use crate::sampler::Sampler;

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = 16;

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was sampled (it is not part of the output).
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The callback asked to stop.
    Cancelled,
}

/// Timings and counts of one generation.
#[derive(Clone, Debug)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    /// From the call to the first output token.
    pub time_to_first_token: Duration,
    pub finish: FinishReason,
}

impl GenStats {
    pub fn prompt_tok_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Tokens after the first, over the time spent producing them.
    pub fn decode_tok_per_s(&self) -> f64 {
        self.output_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenRequest<'a> {
    pub prompt: &'a [u32],
    pub max_tokens: usize,
    pub sampler: Sampler,
    pub stop_tokens: &'a [u32],
    /// Prefill rows per step.
    pub chunk: usize,
}

/// A loaded model with its KV pool, serving one sequence at a time.
pub struct Generator<B: Backend> {
    pub model: Box<dyn CausalLm<B>>,
    /// Greedy decode runs a step ahead of the host where the model can (`decode_ahead`); on
    /// by default, `TENSORFOLD_DECODE_AHEAD=0` or setting this false turns it off (the same
    /// tokens either way).
    pub ahead: bool,
    kv: B::Kv,
    blocks: BlockAllocator,
}

impl<B: Backend> Generator<B> {
    /// A KV pool of `num_blocks` blocks of `BLOCK_SIZE` tokens.
    pub fn new(model: Box<dyn CausalLm<B>>, num_blocks: usize) -> Result<Self> {
        let geom = model.kv_geometry(BLOCK_SIZE, num_blocks);
        let kv = model.backend().alloc_kv(&geom)?;
        Ok(Generator { model, ahead: true, kv, blocks: BlockAllocator::new(num_blocks as u32) })
    }

    /// Generates from `req.prompt`; `on_token(id, logits)` sees each chosen token (also a stop
    /// token, before generation ends on it) with the logits it was chosen from, and returns
    /// `false` to stop. KV blocks are returned to the pool on every exit path.
    pub fn generate(
        &mut self,
        req: &GenRequest<'_>,
        on_token: &mut dyn FnMut(u32, &[f32]) -> bool,
    ) -> Result<(Vec<u32>, GenStats)> {
        self.generate_with(req, true, on_token)
    }

    /// As [`Generator::generate`] for a caller that reads no logits: each token then comes
    /// from the device (`CausalLm::forward_greedy` at temperature 0 without penalties,
    /// `CausalLm::forward_sample` otherwise: the same token as the host's sampler) and no
    /// logits are copied back.
    pub fn generate_tokens(
        &mut self,
        req: &GenRequest<'_>,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenStats)> {
        self.generate_with(req, false, &mut |t, _| on_token(t))
    }

    fn generate_with(
        &mut self,
        req: &GenRequest<'_>,
        want_logits: bool,
        on_token: &mut dyn FnMut(u32, &[f32]) -> bool,
    ) -> Result<(Vec<u32>, GenStats)> {
        let total = req.prompt.len() + req.max_tokens;
        if req.prompt.is_empty() {
            return Err(EngineError::Refused("the prompt is empty".into()));
        }
        if total > self.model.max_positions() {
            return Err(EngineError::Refused(format!(
                "prompt ({} tokens) + max_tokens ({}) exceeds the context of {} tokens",
                req.prompt.len(),
                req.max_tokens,
                self.model.max_positions()
            )));
        }
        let table = self.blocks.alloc(total.div_ceil(BLOCK_SIZE))?;
        let on_device = !want_logits;
        let out = self.run(req, &table, on_device, on_token);
        self.blocks.free(&table)?;
        out
    }

    /// One step of one logits row: the row, or (`on_device`) the token the device chose for
    /// absolute position `next_pos` (greedy, or under the sampler's draw for that position).
    fn next(
        &mut self,
        meta: &BatchMeta,
        sampler: &Sampler,
        on_device: bool,
        next_pos: usize,
        seen: Option<&Seen>,
    ) -> Result<Next> {
        if !on_device {
            return Ok(Next::Logits(self.model.forward(&mut self.kv, meta)?));
        }
        let tokens = if device_greedy(sampler) {
            self.model.forward_greedy(&mut self.kv, meta)?
        } else {
            let pen = seen.map(|s| sampler.penalties(s));
            let draw = [sampler.draw(next_pos as u64)];
            self.model.forward_sample(&mut self.kv, meta, &draw, pen.as_slice())?
        };
        match tokens.first() {
            Some(&t) => Ok(Next::Token(t)),
            None => Err(EngineError::Refused("the device returned no token".into())),
        }
    }

    fn run(
        &mut self,
        req: &GenRequest<'_>,
        table: &[BlockId],
        on_device: bool,
        on_token: &mut dyn FnMut(u32, &[f32]) -> bool,
    ) -> Result<(Vec<u32>, GenStats)> {
        let seq = SeqMeta { block_table: table.iter().map(|b| b.0).collect() };
        let start = Instant::now();
        let chunk = req.chunk.clamp(1, self.model.max_rows());
        let mut next = Next::Logits(Vec::new());
        // The ids so far, for a device sampler with penalties.
        let mut seen = (on_device && req.sampler.uses_penalties()).then(|| Seen::new(req.prompt));
        for (ci, piece) in req.prompt.chunks(chunk).enumerate() {
            let meta = step_meta(piece, ci * chunk, &seq, true);
            let at = ci * chunk + piece.len();
            next = self.next(&meta, &req.sampler, on_device, at, seen.as_ref())?;
        }
        let prefill_time = start.elapsed();
        if let Next::Token(t0) = next {
            let greedy = device_greedy(&req.sampler) && req.max_tokens >= 2;
            if greedy && self.ahead && self.model.decode_ahead() {
                let (output, finish, first_at) = self.decode_ahead(req, &seq, t0, on_token)?;
                let st = stats(req, output.len(), prefill_time, start, first_at, finish);
                return Ok((output, st));
            }
        }
        let mut output: Vec<u32> = Vec::new();
        let mut first_at: Option<Instant> = None;
        let mut finish = FinishReason::Length;
        while output.len() < req.max_tokens {
            let pos = req.prompt.len() + output.len();
            let (tok, logits) = match &next {
                Next::Token(t) => (*t, &[][..]),
                Next::Logits(l) => (req.sampler.sample(l, req.prompt, &output, pos as u64), &l[..]),
            };
            first_at.get_or_insert_with(Instant::now);
            let go_on = on_token(tok, logits);
            if req.stop_tokens.contains(&tok) {
                finish = FinishReason::Stop;
                break;
            }
            output.push(tok);
            if let Some(s) = seen.as_mut() {
                s.push_output(tok);
            }
            if !go_on {
                finish = FinishReason::Cancelled;
                break;
            }
            if output.len() == req.max_tokens {
                break;
            }
            let meta = step_meta(&[tok], pos, &seq, true);
            next = self.next(&meta, &req.sampler, on_device, pos + 1, seen.as_ref())?;
        }
        let first_at = first_at.unwrap_or_else(Instant::now);
        let st = stats(req, output.len(), prefill_time, start, first_at, finish);
        Ok((output, st))
    }

    /// The greedy decode loop of `run` with the device a step ahead of the host
    /// (`CausalLm::ahead_step`): while the host reads token n, the step that feeds it to the
    /// model is already queued behind the step computing it, so the GPU does not wait for the
    /// host between steps. The same tokens, stops and callbacks as `run`'s loop; a stop or a
    /// cancel leaves at most two steps computed past it (their KV rows lie past the
    /// sequence's end, inside its blocks, which `generate_with` frees). Returns the output,
    /// the finish reason and when the first token was handled.
    fn decode_ahead(
        &mut self,
        req: &GenRequest<'_>,
        seq: &SeqMeta,
        t0: u32,
        on_token: &mut dyn FnMut(u32, &[f32]) -> bool,
    ) -> Result<(Vec<u32>, FinishReason, Instant)> {
        let first_at = Instant::now();
        let mut output: Vec<u32> = Vec::new();
        let mut finish = FinishReason::Length;
        // Step j feeds output[j] and yields output[j + 1]: max_tokens - 1 steps.
        let first = step_meta(&[t0], req.prompt.len(), seq, true);
        let mut run = AheadRun::new(first, req.max_tokens - 1);
        let mut tok = t0;
        let res = loop {
            let go_on = on_token(tok, &[]);
            if req.stop_tokens.contains(&tok) {
                finish = FinishReason::Stop;
                break Ok(());
            }
            output.push(tok);
            if !go_on {
                finish = FinishReason::Cancelled;
                break Ok(());
            }
            if output.len() == req.max_tokens {
                break Ok(());
            }
            match run.next(self.model.as_mut(), &mut self.kv) {
                Ok(t) => tok = t,
                Err(e) => break Err(e),
            }
        };
        let ended = self.model.ahead_end();
        res?;
        ended?;
        Ok((output, finish, first_at))
    }

    /// Logits of every position of `tokens` (teacher forcing), `(tokens, vocab)`, computed in
    /// chunks of `chunk` rows. For judges and exactness checks.
    pub fn score(&mut self, tokens: &[u32], chunk: usize) -> Result<Vec<f32>> {
        if tokens.is_empty() || tokens.len() > self.model.max_positions() {
            return Err(EngineError::Refused(format!(
                "score: {} tokens, context is {}",
                tokens.len(),
                self.model.max_positions()
            )));
        }
        let table = self.blocks.alloc(tokens.len().div_ceil(BLOCK_SIZE))?;
        let seq = SeqMeta { block_table: table.iter().map(|b| b.0).collect() };
        let chunk = chunk.clamp(1, self.model.max_rows());
        let mut all = Vec::new();
        let mut res = Ok(());
        for (ci, piece) in tokens.chunks(chunk).enumerate() {
            let mut meta = step_meta(piece, ci * chunk, &seq, false);
            meta.logit_rows = (0..piece.len() as u32).collect();
            match self.model.forward(&mut self.kv, &meta) {
                Ok(l) => all.extend(l),
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        self.blocks.free(&table)?;
        res.map(|_| all)
    }
}

/// A generation's counts and timings.
fn stats(
    req: &GenRequest<'_>,
    output_tokens: usize,
    prefill_time: Duration,
    start: Instant,
    first_at: Instant,
    finish: FinishReason,
) -> GenStats {
    GenStats {
        prompt_tokens: req.prompt.len(),
        output_tokens,
        prefill_time,
        decode_time: first_at.elapsed(),
        time_to_first_token: first_at.duration_since(start),
        finish,
    }
}

/// What one step gives the decode loop.
enum Next {
    Logits(Vec<f32>),
    Token(u32),
}

/// Whether a row sampled by `s` needs only the argmax of its logits: temperature 0 and no
/// penalty or bias (the sampler then returns `argmax` of the unmodified row).
pub(crate) fn device_greedy(s: &Sampler) -> bool {
    s.params.temperature == 0.0 && !s.uses_penalties()
}

/// A step of consecutive tokens of one sequence starting at `start`; logits of the last row
/// if `last_logits`.
fn step_meta(tokens: &[u32], start: usize, seq: &SeqMeta, last_logits: bool) -> BatchMeta {
    let rows = tokens.len();
    BatchMeta {
        tokens: tokens.to_vec(),
        positions: (start..start + rows).map(|p| p as u32).collect(),
        row_seq: vec![0; rows],
        seqs: vec![seq.clone()],
        logit_rows: if last_logits { vec![rows as u32 - 1] } else { Vec::new() },
        block_size: BLOCK_SIZE,
    }
}
