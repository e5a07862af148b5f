//! Continuous batching: which rows of which running sequences go into the next step.
//!
//! Pure function over lane views. Every running sequence in decode phase gets its one row
//! (decode first, so streaming latency does not wait behind long prompts); prompts being
//! prefilled share the rest of the row budget, oldest first, in chunks of at most
//! `prefill_chunk`. A chunk boundary never changes a value (`windows == steps`), and the mix of
//! rows never changes a value (`concurrent == solo`): the plan is about speed and fairness only.

/// What the scheduler needs to know of a running sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneView {
    /// Tokens whose KV is written.
    pub computed: usize,
    /// Tokens known (prompt + output so far); `known - computed` rows are pending.
    pub known: usize,
}

/// Rows `start..start + len` of lane `lane`'s tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub lane: usize,
    pub start: usize,
    pub len: usize,
    /// The piece reaches the last known token: its last row's logits choose the next token.
    pub wants_logits: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    pub pieces: Vec<Piece>,
}

impl StepPlan {
    pub fn rows(&self) -> usize {
        self.pieces.iter().map(|p| p.len).sum()
    }
}

/// Plans one step of at most `max_rows` rows (>= 1).
pub fn schedule(lanes: &[LaneView], max_rows: usize, prefill_chunk: usize) -> StepPlan {
    let mut budget = max_rows.max(1);
    let mut pieces = Vec::new();
    for (i, l) in lanes.iter().enumerate() {
        if l.known == l.computed + 1 && budget > 0 {
            pieces.push(Piece { lane: i, start: l.computed, len: 1, wants_logits: true });
            budget -= 1;
        }
    }
    for (i, l) in lanes.iter().enumerate() {
        if l.known > l.computed + 1 && budget > 0 {
            let len = (l.known - l.computed).min(prefill_chunk.max(1)).min(budget);
            let wants_logits = l.computed + len == l.known;
            pieces.push(Piece { lane: i, start: l.computed, len, wants_logits });
            budget -= len;
        }
    }
    pieces.sort_by_key(|p| p.lane);
    StepPlan { pieces }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(computed: usize, known: usize) -> LaneView {
        LaneView { computed, known }
    }

    #[test]
    fn decode_rows_first_then_prefill_in_chunks() {
        let lanes = [lane(0, 100), lane(50, 51), lane(10, 11)];
        let p = schedule(&lanes, 40, 32);
        assert_eq!(
            p.pieces,
            vec![
                Piece { lane: 0, start: 0, len: 32, wants_logits: false },
                Piece { lane: 1, start: 50, len: 1, wants_logits: true },
                Piece { lane: 2, start: 10, len: 1, wants_logits: true },
            ]
        );
        assert_eq!(p.rows(), 34);
    }

    #[test]
    fn budget_limits_prefill_and_last_chunk_wants_logits() {
        let lanes = [lane(0, 10), lane(0, 10)];
        let p = schedule(&lanes, 12, 64);
        assert_eq!(p.pieces[0], Piece { lane: 0, start: 0, len: 10, wants_logits: true });
        assert_eq!(p.pieces[1], Piece { lane: 1, start: 0, len: 2, wants_logits: false });
        let idle = schedule(&[lane(5, 5)], 8, 8);
        assert!(idle.pieces.is_empty());
    }
}
