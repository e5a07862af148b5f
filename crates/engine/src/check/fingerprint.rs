//! The state fingerprint: one 64-bit FNV-1a hash (Fowler, Noll, Vo; the 64-bit offset basis
//! and prime of the published parameters) over the f32 bit patterns of every layer's visible
//! K and V rows and of the last row's logits, so two runs (two machines, two builds, two
//! thread counts) can be compared by one printed line.
//!
//! Order, per sequence: its length as a little-endian u64, then for each layer the K rows and
//! the V rows (position order), then the last logits row. The bytes of each f32 are its
//! `to_bits()` little-endian. A record of several sequences chains them in order.
//! Rejected: a cryptographic hash (a dependency, and collisions are not the threat here: the
//! fingerprint only says "same" or "different" between honest runs).

use tf_backend::Backend;

use super::record::{Record, SeqRecord};
use crate::error::Result;

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// An FNV-1a 64 hasher.
#[derive(Clone, Debug)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv {
    pub fn new() -> Self {
        Fnv(OFFSET)
    }

    pub fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(PRIME);
        }
    }

    pub fn u64(&mut self, x: u64) {
        self.bytes(&x.to_le_bytes());
    }

    pub fn f32s(&mut self, xs: &[f32]) {
        for x in xs {
            self.bytes(&x.to_bits().to_le_bytes());
        }
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

fn seq_into(h: &mut Fnv, len: usize, layers: &[(&[f32], &[f32])], last_logits: &[f32]) {
    h.u64(len as u64);
    for (k, v) in layers {
        h.f32s(k);
        h.f32s(v);
    }
    h.f32s(last_logits);
}

fn seq_record_into(h: &mut Fnv, s: &SeqRecord, vocab: usize) {
    let layers: Vec<(&[f32], &[f32])> =
        s.k.iter().zip(&s.v).map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
    let rows = s.logit_rows(vocab);
    let last = if rows == 0 { &[][..] } else { &s.logits[(rows - 1) * vocab..] };
    seq_into(h, s.len(), &layers, last);
}

/// The fingerprint of every sequence of a record.
pub fn record(r: &Record) -> u64 {
    let mut h = Fnv::new();
    for s in &r.seqs {
        seq_record_into(&mut h, s, r.vocab);
    }
    h.finish()
}

/// The fingerprint of one sequence straight from the pool: its `len` positions through
/// `block_table` in each of `layers` layers, and `last_logits`. Equals [`record`] of a
/// one-sequence record of the same state.
pub fn state<B: Backend>(
    be: &B,
    kv: &B::Kv,
    layers: usize,
    block_table: &[u32],
    len: usize,
    last_logits: &[f32],
) -> Result<u64> {
    let mut read = Vec::with_capacity(layers);
    for layer in 0..layers {
        read.push(be.read_kv(kv, layer, block_table, len)?);
    }
    let views: Vec<(&[f32], &[f32])> =
        read.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
    let mut h = Fnv::new();
    seq_into(&mut h, len, &views, last_logits);
    Ok(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_known_answers() {
        // Published FNV-1a 64 test vectors: "" and "a" and "foobar".
        let h = |s: &str| {
            let mut f = Fnv::new();
            f.bytes(s.as_bytes());
            f.finish()
        };
        assert_eq!(h(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(h("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(h("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn one_bit_changes_the_fingerprint() {
        let s = SeqRecord {
            tokens: vec![1, 2],
            sampled: vec![],
            logit_start: 0,
            logits: vec![0.5; 8],
            k: vec![vec![1.0; 6]],
            v: vec![vec![2.0; 6]],
        };
        let r = Record { seqs: vec![s], vocab: 4, kv_dim: 3 };
        let base = record(&r);
        let mut r2 = r.clone();
        r2.seqs[0].v[0][5] = f32::from_bits(r2.seqs[0].v[0][5].to_bits() ^ 1);
        assert_ne!(base, record(&r2));
        let mut r3 = r.clone();
        r3.seqs[0].logits[7] = -0.5;
        assert_ne!(base, record(&r3));
        // Only the last logits row counts.
        let mut r4 = r.clone();
        r4.seqs[0].logits[0] = -0.5;
        assert_eq!(base, record(&r4));
    }
}
