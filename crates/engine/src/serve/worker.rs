//! The engine thread: owns the model and the KV pool, and runs schedule -> forward -> sample
//! step after step for every running request. The server holds an `EngineHandle` and talks to
//! the thread over channels only (STYLE.md: one engine thread owns its state).
//!
//! Each step's rows come from `scheduler::schedule`; each sampled token's draw is keyed by
//! (seed, absolute position), so neither the step mix nor the prompt cache changes a token.
//! Cancellation (a `CancelToken`, or the client's event receiver dropped) frees the lane and
//! its blocks at the next step. The rows' next tokens are chosen after the forward pass, the
//! costly ones (sampling sorts the vocabulary) on scoped threads when several sequences
//! sample in one step; each token is a pure function of its own lane and logits row.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tf_backend::penalty::{Penalties, Seen};
use tf_backend::sample::Draw;
use tf_backend::{Backend, BatchMeta, SeqMeta};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::api::{
    CancelToken, EngineStats, Event, Finish, GenerateRequest, ModelInfo, Submission, SubmitError,
    Usage,
};
use super::cache::BlockManager;
use super::scheduler::{schedule, LaneView, StepPlan};
use crate::ahead::AheadRun;
use crate::error::Result;
use crate::family::CausalLm;
use crate::kv::BlockId;
use crate::sampler::Sampler;

/// How the engine thread runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub model_id: String,
    /// Running sequences at once (lanes).
    pub parallel: usize,
    /// Longest prompt + completion, tokens.
    pub context: usize,
    /// Rows per step.
    pub max_rows: usize,
    /// Rows of one prompt per step.
    pub prefill_chunk: usize,
    /// Requests waiting for a lane beyond which submissions are refused.
    pub queue_limit: usize,
    pub block_size: usize,
    /// Blocks of the KV pool (lanes + prompt cache).
    pub total_blocks: usize,
    /// Most unreferenced blocks the prompt cache keeps (0 turns it off).
    pub cache_blocks: usize,
}

struct Job {
    req: GenerateRequest,
    sampler: Sampler,
    tx: UnboundedSender<Event>,
    cancel: CancelToken,
}

impl Job {
    /// Cancelled, or its client left.
    fn gone(&self) -> bool {
        self.cancel.is_cancelled() || self.tx.is_closed()
    }
}

enum Msg {
    Submit(Box<Job>),
    Shutdown,
}

struct Shared {
    tx: Mutex<Option<Sender<Msg>>>,
    stats: Mutex<EngineStats>,
    info: ModelInfo,
    waiting: AtomicUsize,
    next_id: AtomicU64,
    stopping: AtomicBool,
    queue_limit: usize,
}

/// The server's handle on the engine thread; cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
}

impl EngineHandle {
    /// Starts the engine thread with a loaded model.
    pub fn start<B: Backend + 'static>(
        model: Box<dyn CausalLm<B>>,
        cfg: EngineConfig,
    ) -> Result<Self> {
        let geom = model.kv_geometry(cfg.block_size, cfg.total_blocks);
        let kv = model.backend().alloc_kv(&geom)?;
        let info = ModelInfo {
            id: cfg.model_id.clone(),
            context: cfg.context,
            vocab_size: model.spec().vocab_size,
            parallel: cfg.parallel,
        };
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            tx: Mutex::new(Some(tx)),
            stats: Mutex::new(EngineStats {
                kv_blocks_total: cfg.total_blocks,
                ..Default::default()
            }),
            info,
            waiting: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            queue_limit: cfg.queue_limit,
        });
        let blocks = BlockManager::new(cfg.total_blocks, cfg.block_size, cfg.cache_blocks);
        let worker = Worker {
            model,
            kv,
            blocks,
            cfg,
            lanes: Vec::new(),
            waiting: VecDeque::new(),
            shared: shared.clone(),
            stopping: false,
        };
        std::thread::Builder::new()
            .name("tf-engine".into())
            .spawn(move || worker.run(rx))
            .map_err(|e| crate::EngineError::Refused(format!("starting the engine thread: {e}")))?;
        Ok(EngineHandle { shared })
    }

    /// Queues a request; its events arrive on the returned receiver.
    pub fn submit(&self, req: GenerateRequest) -> Result<Submission, SubmitError> {
        let s = &self.shared;
        if s.stopping.load(Ordering::Relaxed) {
            return Err(SubmitError::ShuttingDown);
        }
        if req.prompt.is_empty() {
            return Err(SubmitError::Invalid("the prompt is empty".into()));
        }
        if req.max_tokens == 0 {
            return Err(SubmitError::Invalid("max_tokens must be at least 1".into()));
        }
        let needed = req.prompt.len().saturating_add(req.max_tokens);
        if needed > s.info.context {
            return Err(SubmitError::TooLong {
                prompt: req.prompt.len(),
                max_tokens: req.max_tokens,
                needed,
                context: s.info.context,
            });
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= s.info.vocab_size) {
            return Err(SubmitError::Invalid(format!(
                "token id {t} is outside the vocabulary of {}",
                s.info.vocab_size
            )));
        }
        let sampler =
            Sampler::new(req.sampling.clone()).map_err(|e| SubmitError::Invalid(e.to_string()))?;
        let waiting = s.waiting.load(Ordering::Relaxed);
        if waiting >= s.queue_limit {
            return Err(SubmitError::QueueFull { waiting, limit: s.queue_limit });
        }
        let (tx, rx) = unbounded_channel();
        let cancel = CancelToken::default();
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let job = Job { req, sampler, tx, cancel: cancel.clone() };
        let guard = s.tx.lock().map_err(|_| SubmitError::ShuttingDown)?;
        let sender = guard.as_ref().ok_or(SubmitError::ShuttingDown)?;
        s.waiting.fetch_add(1, Ordering::Relaxed);
        sender.send(Msg::Submit(Box::new(job))).map_err(|_| SubmitError::ShuttingDown)?;
        Ok(Submission { id, events: rx, cancel })
    }

    pub fn stats(&self) -> EngineStats {
        let mut st = self.shared.stats.lock().map(|g| g.clone()).unwrap_or_default();
        st.requests_waiting = self.shared.waiting.load(Ordering::Relaxed);
        st
    }

    pub fn info(&self) -> &ModelInfo {
        &self.shared.info
    }

    /// Stops taking requests; waiting ones fail, running ones finish.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        if let Ok(g) = self.shared.tx.lock() {
            if let Some(tx) = g.as_ref() {
                let _ = tx.send(Msg::Shutdown);
            }
        }
    }

    /// Whether the engine thread has stopped.
    pub fn is_stopped(&self) -> bool {
        self.shared.tx.lock().map(|g| g.is_none()).unwrap_or(true)
    }
}

/// A running sequence.
struct Lane {
    job: Box<Job>,
    /// Prompt then output tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose KV is written.
    computed: usize,
    table: Vec<BlockId>,
    cached_tokens: usize,
    /// The ids so far with their output counts, for a sampler with penalties.
    seen: Option<Seen>,
}

struct Worker<B: Backend> {
    model: Box<dyn CausalLm<B>>,
    kv: B::Kv,
    blocks: BlockManager,
    cfg: EngineConfig,
    lanes: Vec<Lane>,
    waiting: VecDeque<Box<Job>>,
    shared: Arc<Shared>,
    /// A shutdown was asked for: no new lanes; the running ones finish.
    stopping: bool,
}

impl<B: Backend> Worker<B> {
    fn run(mut self, rx: Receiver<Msg>) {
        loop {
            if self.lanes.is_empty() && self.waiting.is_empty() {
                if self.stopping {
                    break;
                }
                match rx.recv() {
                    Ok(m) => self.take(m),
                    Err(_) => break,
                }
            }
            self.poll(&rx);
            if self.stopping {
                for job in self.waiting.drain(..) {
                    self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
                    let _ = job
                        .tx
                        .send(Event::Failed { message: "the server is shutting down".into() });
                }
            }
            self.reap_cancelled();
            self.admit();
            if self.ahead_ready() {
                self.step_ahead(&rx);
            } else if !self.lanes.is_empty() {
                self.step();
            }
            self.publish();
        }
        if let Ok(mut g) = self.shared.tx.lock() {
            *g = None;
        }
    }

    /// Takes the messages that arrived, without waiting.
    fn poll(&mut self, rx: &Receiver<Msg>) {
        while let Ok(m) = rx.try_recv() {
            self.take(m);
        }
    }

    fn take(&mut self, m: Msg) {
        match m {
            Msg::Submit(job) => self.waiting.push_back(job),
            Msg::Shutdown => self.stopping = true,
        }
    }

    fn reap_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|j| !j.gone());
        self.shared.waiting.fetch_sub(before - self.waiting.len(), Ordering::Relaxed);
        let mut i = 0;
        while i < self.lanes.len() {
            if self.lanes[i].job.gone() {
                self.finish(i, Finish::Cancelled);
            } else {
                i += 1;
            }
        }
    }

    /// Moves waiting requests into free lanes while blocks allow. The stats are published
    /// before the `Started` events go out, so a client that saw `Started` (and `/metrics`
    /// during the first step, which may be a long prefill chunk) sees the lane as running.
    fn admit(&mut self) {
        let first = self.lanes.len();
        while self.lanes.len() < self.cfg.parallel {
            let Some(job) = self.waiting.pop_front() else { break };
            let prompt = job.req.prompt.clone();
            let reused = if job.req.use_prompt_cache {
                self.blocks.reuse_prefix(&prompt)
            } else {
                Vec::new()
            };
            let need = (prompt.len() + job.req.max_tokens).div_ceil(self.cfg.block_size);
            let Some(fresh) = self.blocks.allocate(need - reused.len()) else {
                self.blocks.release(&reused);
                self.waiting.push_front(job);
                break;
            };
            self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
            let cached_tokens = reused.len() * self.cfg.block_size;
            let table = reused.into_iter().chain(fresh).collect();
            let prompt_len = prompt.len();
            let seen = job.sampler.uses_penalties().then(|| Seen::new(&prompt));
            self.lanes.push(Lane {
                job,
                tokens: prompt,
                prompt_len,
                computed: cached_tokens,
                table,
                cached_tokens,
                seen,
            });
        }
        if self.lanes.len() > first {
            self.publish();
            for lane in &self.lanes[first..] {
                let _ = lane.job.tx.send(Event::Started { cached_tokens: lane.cached_tokens });
            }
        }
    }

    /// The next step's plan and its rows' metadata.
    fn plan(&self) -> (StepPlan, BatchMeta) {
        let views: Vec<LaneView> = self
            .lanes
            .iter()
            .map(|l| LaneView { computed: l.computed, known: l.tokens.len() })
            .collect();
        let plan = schedule(&views, self.cfg.max_rows, self.cfg.prefill_chunk);
        let mut meta = BatchMeta { block_size: self.cfg.block_size, ..Default::default() };
        for (si, p) in plan.pieces.iter().enumerate() {
            let lane = &self.lanes[p.lane];
            meta.seqs.push(SeqMeta { block_table: lane.table.iter().map(|b| b.0).collect() });
            for pos in p.start..p.start + p.len {
                meta.tokens.push(lane.tokens[pos]);
                meta.positions.push(pos as u32);
                meta.row_seq.push(si as u32);
            }
            if p.wants_logits {
                meta.logit_rows.push(meta.tokens.len() as u32 - 1);
            }
        }
        (plan, meta)
    }

    fn step(&mut self) {
        let (plan, meta) = self.plan();
        // The backend chooses the tokens where the logits are (its argmax when every choosing
        // row is greedy without penalties, else `Backend::sample` under each row's draw and
        // penalties: the host sampler's tokens by construction); no logits come back.
        let choosing =
            || plan.pieces.iter().filter(|p| p.wants_logits).map(|p| &self.lanes[p.lane]);
        let greedy = choosing().all(|l| crate::generate::device_greedy(&l.job.sampler));
        let draws: Vec<Draw> =
            choosing().map(|l| l.job.sampler.draw(l.tokens.len() as u64)).collect();
        let penalties: Vec<Penalties<'_>> = if choosing().any(|l| l.seen.is_some()) {
            choosing()
                .map(|l| l.seen.as_ref().map_or(Penalties::NONE, |s| l.job.sampler.penalties(s)))
                .collect()
        } else {
            Vec::new()
        };
        let t0 = Instant::now();
        let result = if greedy {
            self.model.forward_greedy(&mut self.kv, &meta)
        } else {
            self.model.forward_sample(&mut self.kv, &meta, &draws, &penalties)
        };
        self.count_step(t0);
        let tokens = match result {
            Ok(t) => t,
            Err(e) => return self.fail_all(&e.to_string()),
        };
        // The lane of each piece that chooses a next token, in logits-row order.
        let mut picks: Vec<usize> = Vec::new();
        for p in &plan.pieces {
            let lane = &mut self.lanes[p.lane];
            lane.computed += p.len;
            if lane.computed == lane.prompt_len && lane.job.req.use_prompt_cache {
                self.blocks.register(&lane.tokens[..lane.computed], &lane.table);
            }
            if p.wants_logits {
                picks.push(p.lane);
            }
        }
        let mut done: Vec<(usize, Finish)> = Vec::new();
        for (&i, tok) in picks.iter().zip(tokens) {
            if let Some(f) = accept(&mut self.lanes[i], tok) {
                done.push((i, f));
            }
        }
        done.sort_by_key(|d| std::cmp::Reverse(d.0));
        for (i, f) in done {
            self.finish(i, f);
        }
    }

    fn count_step(&self, since: Instant) {
        if let Ok(mut st) = self.shared.stats.lock() {
            st.steps_total += 1;
            st.step_seconds_total += since.elapsed().as_secs_f64();
        }
    }

    /// Whether a lane could be admitted now or a waiting request needs the loop (cancelled,
    /// or refused at shutdown): what ends a decode-ahead run.
    fn queue_wants_turn(&self) -> bool {
        !self.waiting.is_empty()
            && (self.lanes.len() < self.cfg.parallel
                || self.stopping
                || self.waiting.iter().any(|j| j.gone()))
    }

    /// Whether the next steps can run ahead of the host (`CausalLm::ahead_step`): one lane,
    /// no waiting request it would delay (`queue_wants_turn`), the lane decoding (its prompt
    /// computed, one token to feed), greedy without penalties, two or more tokens still to
    /// come, and a model that runs ahead.
    fn ahead_ready(&self) -> bool {
        let [l] = &self.lanes[..] else { return false };
        let made = l.tokens.len() - l.prompt_len;
        !self.queue_wants_turn()
            && made > 0
            && l.computed + 1 == l.tokens.len()
            && l.seen.is_none()
            && crate::generate::device_greedy(&l.job.sampler)
            && l.job.req.max_tokens >= made + 2
            && self.model.decode_ahead()
    }

    /// Decodes the lone lane ahead of the host (an `AheadRun`, as `Generator::decode_ahead`):
    /// while the host reads one step's token the next step is already queued behind it. The
    /// same tokens as `step`
    /// (`CausalLm::ahead_step`'s contract; tests/serve_ahead.rs). It returns when the lane
    /// finishes or is cancelled (a step in flight is dropped), or when a waiting request
    /// wants the loop (`queue_wants_turn`; the step in flight is taken first, and the lanes
    /// then share `step`s).
    fn step_ahead(&mut self, rx: &Receiver<Msg>) {
        let (_, first) = self.plan();
        let lane = &self.lanes[0];
        let left = lane.job.req.max_tokens - (lane.tokens.len() - lane.prompt_len);
        let mut run = AheadRun::new(first, left);
        let res = self.run_ahead(&mut run, rx);
        let ended = self.model.ahead_end();
        match res.and_then(|f| ended.map(|()| f)) {
            Ok(Some(f)) => self.finish(0, f),
            Ok(None) => {}
            Err(e) => self.fail_all(&e.to_string()),
        }
    }

    /// `step_ahead`'s loop: takes the run's tokens into the lane until it finishes (its
    /// finish returned), is cancelled, or the queue wants a turn (then only the step in
    /// flight is taken).
    fn run_ahead(&mut self, run: &mut AheadRun, rx: &Receiver<Msg>) -> Result<Option<Finish>> {
        let mut draining = false;
        let mut since = Instant::now();
        while !draining || run.in_flight() {
            let tok = run.next(self.model.as_mut(), &mut self.kv)?;
            self.count_step(since);
            since = Instant::now();
            let lane = &mut self.lanes[0];
            lane.computed += 1;
            if let Some(f) = accept(lane, tok) {
                return Ok(Some(f));
            }
            if !draining {
                self.poll(rx);
                if self.lanes[0].job.cancel.is_cancelled() {
                    return Ok(None);
                }
                // A request can start: the step in flight is work done, so it is taken.
                draining = self.queue_wants_turn();
                if draining {
                    run.stop_issuing();
                }
            }
        }
        Ok(None)
    }

    fn finish(&mut self, i: usize, finish: Finish) {
        let lane = self.lanes.remove(i);
        if lane.job.req.use_prompt_cache {
            self.blocks.register(&lane.tokens[..lane.computed], &lane.table);
        }
        self.blocks.release(&lane.table);
        let usage = Usage {
            prompt_tokens: lane.prompt_len,
            cached_tokens: lane.cached_tokens,
            completion_tokens: lane.tokens.len() - lane.prompt_len,
        };
        if let Ok(mut st) = self.shared.stats.lock() {
            st.requests_total += 1;
            st.prompt_tokens_total += usage.prompt_tokens as u64;
            st.cached_tokens_total += usage.cached_tokens as u64;
            st.completion_tokens_total += usage.completion_tokens as u64;
        }
        let _ = lane.job.tx.send(Event::Finished { finish, usage });
    }

    fn fail_all(&mut self, message: &str) {
        for lane in self.lanes.drain(..) {
            self.blocks.release(&lane.table);
            let _ = lane.job.tx.send(Event::Failed { message: format!("engine error: {message}") });
        }
    }

    fn publish(&self) {
        if let Ok(mut st) = self.shared.stats.lock() {
            st.requests_running = self.lanes.len();
            st.kv_blocks_free = self.blocks.free_count();
            st.prompt_cache_blocks = self.blocks.cached_count();
        }
    }
}

/// Appends a chosen token to the lane and sends it; returns how the lane finished, if it did.
fn accept(lane: &mut Lane, tok: u32) -> Option<Finish> {
    if lane.job.req.stop_tokens.contains(&tok) {
        return Some(Finish::Stop);
    }
    lane.tokens.push(tok);
    if let Some(seen) = lane.seen.as_mut() {
        seen.push_output(tok);
    }
    if lane.job.tx.send(Event::Token { id: tok }).is_err() {
        return Some(Finish::Cancelled);
    }
    (lane.tokens.len() - lane.prompt_len >= lane.job.req.max_tokens).then_some(Finish::Length)
}
