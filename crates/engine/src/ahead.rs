//! One decode-ahead run (`CausalLm::ahead_step`): the bookkeeping shared by
//! `Generator::decode_ahead` and the engine thread's `step_ahead`. Step j feeds position
//! p0 + j and yields the token of p0 + j + 1; before the host waits for a step's token, the
//! step after it is issued (the device feeds it that token), so the GPU does not wait for
//! the host between steps, and no step past the run's last is issued.

use tf_backend::{Backend, BatchMeta};

use crate::error::Result;
use crate::family::CausalLm;

pub(crate) struct AheadRun {
    /// The first step's metadata (one row, its logits wanted), until it is issued.
    first: Option<BatchMeta>,
    /// The position the first step feeds.
    p0: usize,
    /// Steps the run may issue (>= 1).
    steps: usize,
    issued: usize,
    taken: usize,
}

impl AheadRun {
    /// A run of at most `steps` steps starting with `first`.
    pub(crate) fn new(first: BatchMeta, steps: usize) -> Self {
        let p0 = first.positions.first().map_or(0, |&p| p as usize);
        AheadRun { first: Some(first), p0, steps: steps.max(1), issued: 0, taken: 0 }
    }

    /// The next step's token: issues up to one step beyond it, then waits for it.
    pub(crate) fn next<B: Backend>(
        &mut self,
        model: &mut dyn CausalLm<B>,
        kv: &mut B::Kv,
    ) -> Result<u32> {
        let want = (self.taken + 1).min(self.steps - 1);
        while self.issued <= want {
            model.ahead_step(kv, self.first.take().as_ref())?;
            self.issued += 1;
        }
        let tok = model.ahead_token(self.p0 + self.taken + 1)?;
        self.taken += 1;
        Ok(tok)
    }

    /// Issues no more steps: `next` only takes the steps in flight.
    pub(crate) fn stop_issuing(&mut self) {
        self.steps = self.steps.min(self.issued.max(1));
    }

    /// Whether a step was issued whose token was not taken.
    pub(crate) fn in_flight(&self) -> bool {
        self.issued > self.taken
    }
}
