//! Engine events to text: one [`Run`] per request turns `Started`/`Token`/`Finished` into text
//! deltas (incremental detokenizer, then stop-string holdback), and [`sse`] turns those into
//! `data: {...}` chunks ending with `data: [DONE]`. The non-streaming route drives the same
//! `Run`, so both modes return the same text, ids and finish reason.
//!
//! Invariants: the submission lives inside the `Run`; dropping the `Run` (the client went
//! away, so the SSE body or the handler future was dropped) or ending it on a stop string
//! cancels the request, so the engine frees the lane at its next step. Text is released only
//! through the `StopMatcher`, so nothing at or past a stop string is ever sent.
//! Rejected: detokenizing each token on its own (`decode([id])`): byte-level BPE spells a
//! character across tokens and SentencePiece strips leading spaces; `DecodeStream` keeps the
//! concatenation equal to the full decode.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use tf_engine::serve::api::{Event, Finish, Submission, Usage};
use tf_tokenizer::{DecodeStream, TextCodec};

use crate::errors::ApiError;
use crate::openai::{ChunkPart, FinishReason, ReplyMeta};
use crate::stop::{Released, StopMatcher};

/// A submission that cancels its request when dropped.
#[derive(Debug)]
struct Lane(Submission);

impl Drop for Lane {
    fn drop(&mut self) {
        // Harmless after the request finished; frees the lane if it had not.
        self.0.cancel.cancel();
    }
}

/// Text and token ids released by one step (either may be empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub text: String,
    pub ids: Vec<u32>,
}

/// What the next engine event amounts to.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Delta(Delta),
    /// The last text of the request, why it ended, and its token counts.
    End {
        delta: Delta,
        finish: FinishReason,
        usage: Usage,
    },
    /// The engine failed; nothing more follows.
    Failed(String),
}

/// One request's progress from engine events to text.
#[derive(Debug)]
pub struct Run {
    /// `None` once the request ended (finished, stopped or failed).
    lane: Option<Lane>,
    codec: Arc<TextCodec>,
    detok: DecodeStream,
    stop: StopMatcher,
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
}

impl Run {
    pub fn new(
        sub: Submission,
        codec: Arc<TextCodec>,
        prompt_tokens: usize,
        stop: Vec<String>,
    ) -> Self {
        Run {
            lane: Some(Lane(sub)),
            codec,
            detok: DecodeStream::new(true),
            stop: StopMatcher::new(stop),
            prompt_tokens,
            cached_tokens: 0,
            completion_tokens: 0,
        }
    }

    /// The next delta or the end; `None` after the end.
    pub async fn next(&mut self) -> Option<Step> {
        loop {
            let lane = self.lane.as_mut()?;
            let Some(event) = lane.0.events.recv().await else {
                self.lane = None;
                return Some(Step::Failed("the engine dropped the request unfinished".into()));
            };
            match event {
                Event::Started { cached_tokens } => self.cached_tokens = cached_tokens,
                Event::Token { id } => return Some(self.token(id)),
                Event::Finished { finish, usage } => return Some(self.finish(finish, usage)),
                Event::Failed { message } => {
                    self.lane = None;
                    return Some(Step::Failed(message));
                }
            }
        }
    }

    fn token(&mut self, id: u32) -> Step {
        self.completion_tokens += 1;
        let text = match self.detok.step(&self.codec, id) {
            Ok(text) => text,
            Err(e) => return self.fail(e.to_string()),
        };
        let ids = vec![id];
        match self.stop.push(&text) {
            Released::Text(text) => Step::Delta(Delta { text, ids }),
            Released::Stopped(text) => {
                self.lane = None; // cancels: the rest of the generation is not wanted
                Step::End {
                    delta: Delta { text, ids },
                    finish: FinishReason::Stop,
                    usage: self.usage(),
                }
            }
        }
    }

    fn finish(&mut self, finish: Finish, usage: Usage) -> Step {
        self.lane = None;
        let tail = match self.detok.finish(&self.codec) {
            Ok(tail) => tail,
            Err(e) => return self.fail(e.to_string()),
        };
        let (text, stopped) = match self.stop.push(&tail) {
            Released::Text(mut text) => {
                text.push_str(&self.stop.flush());
                (text, false)
            }
            Released::Stopped(text) => (text, true),
        };
        let finish = match finish {
            _ if stopped => FinishReason::Stop,
            Finish::Stop => FinishReason::Stop,
            Finish::Length => FinishReason::Length,
            Finish::Cancelled => FinishReason::Abort,
        };
        Step::End { delta: Delta { text, ids: Vec::new() }, finish, usage }
    }

    fn fail(&mut self, message: String) -> Step {
        self.lane = None;
        Step::Failed(format!("detokenizing the output: {message}"))
    }

    /// Counts as the client saw them (a stop string ended the request before the engine did).
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.completion_tokens,
        }
    }
}

/// How a stream is answered.
#[derive(Clone, Debug)]
pub struct StreamOpts {
    pub include_usage: bool,
    /// `return_token_ids`: the prompt's ids (sent on the first chunk) and each chunk's ids.
    pub prompt_ids: Option<Vec<u32>>,
}

/// Comment lines while no token comes (a long queue or prefill): proxies keep the
/// connection, and a client that left is noticed when the write fails.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The SSE response of a streaming request.
pub fn sse(
    run: Run,
    meta: ReplyMeta,
    opts: StreamOpts,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static> {
    let mut state =
        SseState { run, meta, opts, pending: VecDeque::new(), first: true, done: false };
    if state.meta.endpoint == crate::validate::Endpoint::Chat {
        // The role chunk goes out at once, before the first token.
        state.push_text(Delta::default());
    }
    let stream = futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.pending.pop_front() {
                return Some((Ok(event), st));
            }
            if st.done {
                return None;
            }
            match st.run.next().await {
                Some(step) => st.push_step(step),
                None => st.done = true,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

struct SseState {
    run: Run,
    meta: ReplyMeta,
    opts: StreamOpts,
    pending: VecDeque<SseEvent>,
    /// No chunk has been queued yet.
    first: bool,
    done: bool,
}

impl SseState {
    fn push_step(&mut self, step: Step) {
        match step {
            Step::Delta(delta) => self.push_text(delta),
            Step::End { delta, finish, usage } => {
                self.push_text(delta);
                let token_ids = self.opts.prompt_ids.as_ref().map(|_| Vec::new());
                let part = ChunkPart { finish: Some(finish), token_ids, ..self.part() };
                self.pending.push_back(data(self.meta.chunk(part)));
                if self.opts.include_usage {
                    self.pending.push_back(data(self.meta.usage_chunk(usage)));
                }
                self.end();
            }
            Step::Failed(message) => {
                let error = ApiError::Internal(message).to_json().to_string();
                self.pending.push_back(data(error));
                self.end();
            }
        }
    }

    /// A content chunk, unless it would carry nothing. The first chunk of a chat stream (the
    /// role) or of a stream with `return_token_ids` (the prompt ids) goes out even if empty.
    fn push_text(&mut self, delta: Delta) {
        let want_ids = self.opts.prompt_ids.is_some();
        let chat = self.meta.endpoint == crate::validate::Endpoint::Chat;
        let announce = self.first && (chat || want_ids);
        let carries = !delta.text.is_empty() || (want_ids && !delta.ids.is_empty());
        if !carries && !announce {
            return;
        }
        let first = self.first;
        let base = self.part();
        let part = ChunkPart {
            text: delta.text,
            first: first && chat,
            token_ids: want_ids.then_some(delta.ids),
            ..base
        };
        self.pending.push_back(data(self.meta.chunk(part)));
    }

    /// The fields every chunk shares; the prompt ids go on the first one only.
    fn part(&mut self) -> ChunkPart {
        let prompt_token_ids = if self.first { self.opts.prompt_ids.clone() } else { None };
        self.first = false;
        ChunkPart { usage_null: self.opts.include_usage, prompt_token_ids, ..Default::default() }
    }

    fn end(&mut self) {
        self.pending.push_back(data("[DONE]".to_string()));
        self.done = true;
    }
}

fn data(text: String) -> SseEvent {
    SseEvent::default().data(text)
}
