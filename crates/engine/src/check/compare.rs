//! Bit-for-bit comparison of two records, reporting *every* differing row, and the planted
//! control that proves the comparison can see a one-bit difference.
//!
//! A row is (sequence, position, part), the part being the input token, the sampled token, the
//! logits row, or one layer's K or V row. Values are compared by `to_bits()`. A difference in
//! shape (sequence count, length, logits range) is a `Shape` row, never a panic.
//!
//! The planted control (DESIGN.md §1): a copy of the compared result gets the lowest mantissa
//! bit of one value flipped, in a row chosen by the seeded generator among all float rows; the
//! comparison must report that row and no other, or the check fails. The copy is of the
//! candidate when it matched the baseline (then it is the baseline, bit for bit), else of the
//! baseline itself, so the control is always "baseline plus exactly one bit".

use std::fmt;

use super::record::{Record, SeqRecord};
use super::rng::Rng;

/// Which part of a position's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// The input token of the position.
    Token,
    /// The token sampled from this position's logits.
    Sampled,
    Logits,
    K(usize),
    V(usize),
    /// The records disagree in shape (sequence count, length or logits range).
    Shape,
}

/// A row of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowId {
    pub seq: usize,
    pub pos: usize,
    pub part: Part,
}

impl fmt::Display for RowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let RowId { seq, pos, part } = *self;
        match part {
            Part::Token => write!(f, "seq {seq} pos {pos} input token"),
            Part::Sampled => write!(f, "seq {seq} pos {pos} sampled token"),
            Part::Logits => write!(f, "seq {seq} pos {pos} logits"),
            Part::K(l) => write!(f, "seq {seq} pos {pos} layer {l} K"),
            Part::V(l) => write!(f, "seq {seq} pos {pos} layer {l} V"),
            Part::Shape => write!(f, "seq {seq} shape"),
        }
    }
}

/// One differing row: how many of its values differ and the first of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowDiff {
    pub row: RowId,
    pub values: usize,
    /// Column of the first differing value (for `Shape`: 0).
    pub col: usize,
    /// Bit patterns of that value: f32 bits for float rows, token ids for token rows, lengths
    /// for `Shape`.
    pub want: u32,
    pub got: u32,
}

impl fmt::Display for RowDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.row.part {
            Part::Token | Part::Sampled => {
                write!(f, "{}: want {} got {}", self.row, self.want, self.got)
            }
            Part::Shape => write!(f, "{}: want {} got {}", self.row, self.want, self.got),
            _ => write!(
                f,
                "{}: {} values differ, first col {}: want {:e} ({:#010x}) got {:e} ({:#010x})",
                self.row,
                self.values,
                self.col,
                f32::from_bits(self.want),
                self.want,
                f32::from_bits(self.got),
                self.got
            ),
        }
    }
}

/// Compares two value rows by bit pattern.
fn diff_row(row: RowId, want: &[f32], got: &[f32]) -> Option<RowDiff> {
    let mut d: Option<RowDiff> = None;
    for (col, (a, b)) in want.iter().zip(got).enumerate() {
        if a.to_bits() != b.to_bits() {
            let e = d.get_or_insert(RowDiff {
                row,
                values: 0,
                col,
                want: a.to_bits(),
                got: b.to_bits(),
            });
            e.values += 1;
        }
    }
    d
}

fn diff_tokens(
    seq: usize,
    start: usize,
    part: Part,
    want: &[u32],
    got: &[u32],
    out: &mut Vec<RowDiff>,
) {
    for (i, (&a, &b)) in want.iter().zip(got).enumerate() {
        if a != b {
            let row = RowId { seq, pos: start + i, part };
            out.push(RowDiff { row, values: 1, col: 0, want: a, got: b });
        }
    }
}

fn shape(seq: usize, want: usize, got: usize) -> RowDiff {
    let row = RowId { seq, pos: 0, part: Part::Shape };
    RowDiff { row, values: 1, col: 0, want: want as u32, got: got as u32 }
}

/// Every differing row of sequence `seq`.
pub fn compare_seq(
    seq: usize,
    want: &SeqRecord,
    got: &SeqRecord,
    vocab: usize,
    kv_dim: usize,
) -> Vec<RowDiff> {
    let mut out = Vec::new();
    let shapes = [
        (want.len(), got.len()),
        (want.sampled.len(), got.sampled.len()),
        (want.logit_start, got.logit_start),
        (want.logits.len(), got.logits.len()),
        (want.k.len(), got.k.len()),
        (want.v.len(), got.v.len()),
    ];
    if let Some(&(a, b)) = shapes.iter().find(|(a, b)| a != b) {
        out.push(shape(seq, a, b));
        return out;
    }
    diff_tokens(seq, 0, Part::Token, &want.tokens, &got.tokens, &mut out);
    diff_tokens(seq, want.logit_start, Part::Sampled, &want.sampled, &got.sampled, &mut out);
    if vocab > 0 {
        for (i, (a, b)) in want.logits.chunks(vocab).zip(got.logits.chunks(vocab)).enumerate() {
            let row = RowId { seq, pos: want.logit_start + i, part: Part::Logits };
            out.extend(diff_row(row, a, b));
        }
    }
    for (layer, (wk, gk)) in want.k.iter().zip(&got.k).enumerate() {
        for (which, w, g) in
            [(Part::K(layer), wk, gk), (Part::V(layer), &want.v[layer], &got.v[layer])]
        {
            if w.len() != g.len() || kv_dim == 0 {
                out.push(shape(seq, w.len(), g.len()));
                continue;
            }
            for (pos, (a, b)) in w.chunks(kv_dim).zip(g.chunks(kv_dim)).enumerate() {
                out.extend(diff_row(RowId { seq, pos, part: which }, a, b));
            }
        }
    }
    out
}

/// Every differing row of two records, in (sequence, position order within part) order.
pub fn compare(want: &Record, got: &Record) -> Vec<RowDiff> {
    let mut out = Vec::new();
    if want.seqs.len() != got.seqs.len() || want.vocab != got.vocab || want.kv_dim != got.kv_dim {
        out.push(shape(0, want.seqs.len(), got.seqs.len()));
        return out;
    }
    for (i, (a, b)) in want.seqs.iter().zip(&got.seqs).enumerate() {
        out.extend(compare_seq(i, a, b, want.vocab, want.kv_dim));
    }
    out
}

/// The planted control of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plant {
    /// Which comparison of the check received the plant.
    pub label: String,
    pub row: RowId,
    pub col: usize,
    /// The rows the comparison reported for the planted copy.
    pub reported: Vec<RowId>,
}

impl Plant {
    /// The comparison reported the planted row and only it.
    pub fn caught(&self) -> bool {
        self.reported == [self.row]
    }
}

impl fmt::Display for Plant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} col {}: ", self.label, self.row, self.col)?;
        if self.caught() {
            write!(f, "caught")
        } else if self.reported.is_empty() {
            write!(f, "NOT CAUGHT (nothing reported)")
        } else {
            write!(f, "NOT CAUGHT exactly ({} rows reported)", self.reported.len())
        }
    }
}

/// Picks a float row of `r` uniformly among all its logits, K and V rows.
fn pick_row(r: &Record, rng: &mut Rng) -> Option<(RowId, usize)> {
    let per_seq: Vec<usize> =
        r.seqs.iter().map(|s| s.logit_rows(r.vocab) + 2 * s.k.len() * s.len()).collect();
    let mut i = rng.below(per_seq.iter().sum());
    for (seq, (s, &n)) in r.seqs.iter().zip(&per_seq).enumerate() {
        if i >= n {
            i -= n;
            continue;
        }
        let lr = s.logit_rows(r.vocab);
        if i < lr {
            let row = RowId { seq, pos: s.logit_start + i, part: Part::Logits };
            return Some((row, rng.below(r.vocab)));
        }
        let j = i - lr;
        let (layer, rest) = (j / (2 * s.len()), j % (2 * s.len()));
        let part = if rest < s.len() { Part::K(layer) } else { Part::V(layer) };
        let row = RowId { seq, pos: rest % s.len(), part };
        return Some((row, rng.below(r.kv_dim)));
    }
    None
}

/// Flips the lowest mantissa bit of (row, col) of `s`.
fn flip(s: &mut SeqRecord, row: RowId, col: usize, vocab: usize, kv_dim: usize) {
    let (buf, idx) = match row.part {
        Part::Logits => (&mut s.logits, (row.pos - s.logit_start) * vocab + col),
        Part::K(l) => (&mut s.k[l], row.pos * kv_dim + col),
        Part::V(l) => (&mut s.v[l], row.pos * kv_dim + col),
        _ => return,
    };
    if let Some(x) = buf.get_mut(idx) {
        *x = f32::from_bits(x.to_bits() ^ 1);
    }
}

/// Plants one flipped bit in a copy of the compared result and records what `compare` reports
/// for it. `matched`: the candidate `got` equalled `want` (see the module doc).
pub fn plant(label: &str, want: &Record, got: &Record, matched: bool, rng: &mut Rng) -> Plant {
    let src = if matched { got } else { want };
    let Some((row, col)) = pick_row(src, rng) else {
        let row = RowId { seq: 0, pos: 0, part: Part::Shape };
        return Plant { label: label.into(), row, col: 0, reported: Vec::new() };
    };
    let mut copy = src.seqs[row.seq].clone();
    flip(&mut copy, row, col, src.vocab, src.kv_dim);
    let mut reported = Vec::new();
    for (i, w) in want.seqs.iter().enumerate() {
        let g = if i == row.seq { &copy } else { &src.seqs[i] };
        reported.extend(compare_seq(i, w, g, want.vocab, want.kv_dim).into_iter().map(|d| d.row));
    }
    Plant { label: label.into(), row, col, reported }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seqs: usize) -> Record {
        let s = |n: usize| SeqRecord {
            tokens: (0..n as u32).collect(),
            sampled: vec![7; 2],
            logit_start: n - 2,
            logits: (0..2 * 5).map(|i| i as f32 * 0.25).collect(),
            k: vec![vec![1.5; n * 3]; 2],
            v: vec![vec![-2.0; n * 3]; 2],
        };
        Record { seqs: (0..seqs).map(|i| s(4 + i)).collect(), vocab: 5, kv_dim: 3 }
    }

    #[test]
    fn reports_every_differing_row() {
        let a = rec(3);
        assert!(compare(&a, &a).is_empty());
        let mut b = a.clone();
        b.seqs[1].k[1][2 * 3 + 1] = 0.0;
        b.seqs[1].k[1][2 * 3 + 2] = 0.0;
        b.seqs[2].logits[9] = -0.0;
        b.seqs[0].sampled[1] = 8;
        let d = compare(&a, &b);
        let rows: Vec<String> = d.iter().map(|d| d.row.to_string()).collect();
        assert_eq!(
            rows,
            ["seq 0 pos 3 sampled token", "seq 1 pos 2 layer 1 K", "seq 2 pos 5 logits"]
        );
        assert_eq!(d[1].values, 2);
        assert_eq!(d[1].col, 1);
        b.seqs[2].tokens.pop();
        assert_eq!(compare(&a, &b).last().map(|d| d.row.part), Some(Part::Shape));
    }

    #[test]
    fn plant_is_caught_exactly_and_varies_with_the_seed() {
        let a = rec(3);
        let mut rows = std::collections::BTreeSet::new();
        for seed in 0..40 {
            let p = plant("x", &a, &a, true, &mut Rng::new(seed));
            assert!(p.caught(), "{p}");
            rows.insert(p.row.part);
        }
        assert!(rows.contains(&Part::Logits) && rows.len() > 4, "{rows:?}");
        // A report with the planted row and another is not an exact catch.
        let p = plant("x", &a, &a, true, &mut Rng::new(1));
        let extra = Plant { reported: vec![p.row, RowId { seq: 9, ..p.row }], ..p.clone() };
        assert!(!extra.caught() && !Plant { reported: vec![], ..p }.caught());
    }
}
