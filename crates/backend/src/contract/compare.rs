//! The two comparators of the contract and their planted controls: gate 2 (outputs within a
//! bound of the float64 reference) and gate 3 (rows bit-identical to the 2,048-row call).
//!
//! Both report *where* they fail (the worst element, the exact rows), because a control is
//! only red as planted when the comparator names what was planted.

use super::data::Rng;
use super::reference::Expect;

/// Gate 2 over a set of outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct BoundCheck {
    pub checked: usize,
    /// Elements outside their bound (non-finite outputs included).
    pub exceed: usize,
    /// max |out - ref| / bound (0 when every output equals an exact reference).
    pub worst: f64,
    pub worst_at: usize,
}

impl BoundCheck {
    pub fn ok(&self) -> bool {
        self.exceed == 0 && self.checked > 0
    }

    pub fn describe(&self) -> String {
        format!(
            "{} of {} outside; max |err|/bound {:.3} at element {}",
            self.exceed, self.checked, self.worst, self.worst_at
        )
    }
}

/// Checks `out` against `want` with the reference and its bound scaled by `scale` (1 for the
/// gate, 1.01 for the planted control). `None` when the lengths differ.
pub fn check_bound(out: &[f32], want: &Expect, scale: f64) -> Option<BoundCheck> {
    if out.len() != want.value.len() || want.bound.len() != want.value.len() {
        return None;
    }
    let mut c = BoundCheck { checked: out.len(), exceed: 0, worst: 0.0, worst_at: 0 };
    for (i, ((&o, &v), &b)) in out.iter().zip(&want.value).zip(&want.bound).enumerate() {
        let err = (o as f64 - v * scale).abs();
        let b = b * scale;
        let ratio = match (o.is_finite(), err == 0.0) {
            (false, _) => f64::INFINITY,
            (true, true) => 0.0,
            (true, false) if b > 0.0 => err / b,
            (true, false) => f64::INFINITY,
        };
        // NaN ratios count as exceeding: written as a partial_cmp so NaN is explicit.
        if !matches!(
            ratio.partial_cmp(&1.0),
            Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
        ) {
            c.exceed += 1;
        }
        if !matches!(
            ratio.partial_cmp(&c.worst),
            Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
        ) {
            (c.worst, c.worst_at) = (ratio, i);
        }
    }
    Some(c)
}

/// The 2,048-row call's output, by universe row id.
#[derive(Clone, Debug)]
pub struct Anchor {
    pub cols: usize,
    /// The ids in call order (row i of `data` is id `ids[i]`).
    pub ids: Vec<u32>,
    pub data: Vec<f32>,
    /// Row of `data` holding each id (`usize::MAX` when absent).
    index: Vec<usize>,
}

impl Anchor {
    pub fn new(ids: Vec<u32>, data: Vec<f32>, cols: usize) -> Anchor {
        let universe = ids.iter().map(|&i| i as usize + 1).max().unwrap_or(0);
        let mut index = vec![usize::MAX; universe];
        for (r, &id) in ids.iter().enumerate() {
            index[id as usize] = r;
        }
        Anchor { cols, ids, data, index }
    }

    pub fn row(&self, id: u32) -> Option<&[f32]> {
        let r = *self.index.get(id as usize)?;
        self.data.get(r * self.cols..(r + 1) * self.cols)
    }
}

/// Rows of a call (`call_ids[i]` is row i) whose bits differ from the anchor's row of the
/// same id; a row whose id the anchor lacks, or that the call lacks, differs.
pub fn differing_rows(anchor: &Anchor, call_ids: &[u32], call: &[f32]) -> Vec<usize> {
    let cols = anchor.cols;
    (0..call_ids.len())
        .filter(|&i| {
            let got = call.get(i * cols..(i + 1) * cols);
            match (anchor.row(call_ids[i]), got) {
                (Some(a), Some(g)) => a.iter().zip(g).any(|(x, y)| x.to_bits() != y.to_bits()),
                _ => true,
            }
        })
        .collect()
}

/// The planted row control: flips the lowest bf16 mantissa bit (f32 bit 16) of one element
/// of one row of a copy of the anchor and runs the comparator on the copy. Returns the
/// planted row and what the comparator reported; red iff the report is exactly that row.
pub fn plant_row(anchor: &Anchor, rng: &mut Rng) -> (usize, Vec<usize>) {
    let rows = anchor.ids.len();
    let row = rng.below(rows);
    let at = row * anchor.cols + rng.below(anchor.cols);
    let mut copy = anchor.data.clone();
    copy[at] = f32::from_bits(copy[at].to_bits() ^ (1 << 16));
    (row, differing_rows(anchor, &anchor.ids, &copy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_check_counts_and_locates() {
        let want = Expect { value: vec![1.0, 2.0, 0.0], bound: vec![0.1, 0.1, 0.0] };
        let c = check_bound(&[1.05, 2.0, 0.0], &want, 1.0).unwrap();
        assert!(c.ok() && (c.worst - 0.5).abs() < 1e-6 && c.worst_at == 0, "{c:?}");
        let bad = check_bound(&[1.0, 2.2, 0.0], &want, 1.0).unwrap();
        assert_eq!((bad.exceed, bad.worst_at), (1, 1));
        // An exact reference (bound 0) fails on any difference, and NaN always fails.
        assert_eq!(check_bound(&[1.0, 2.0, 1e-30], &want, 1.0).unwrap().exceed, 1);
        assert_eq!(check_bound(&[f32::NAN, 2.0, 0.0], &want, 1.0).unwrap().exceed, 1);
        // A reference 1% off shows only where the bound is under 1% of the value.
        assert!(check_bound(&[1.0, 2.0, 0.0], &want, 1.01).unwrap().ok());
        let tight = Expect { value: vec![1.0], bound: vec![0.004] };
        assert_eq!(check_bound(&[1.0], &tight, 1.01).unwrap().exceed, 1);
        assert!(check_bound(&[1.0, 2.0], &want, 1.0).is_none());
    }

    #[test]
    fn comparator_reports_exactly_the_differing_rows() {
        let anchor = Anchor::new(vec![2, 0, 1], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 2);
        assert_eq!(anchor.row(0), Some(&[2.0f32, 3.0][..]));
        // A call of ids [1, 2]: row 0 must be (4, 5), row 1 (0, 1).
        assert!(differing_rows(&anchor, &[1, 2], &[4.0, 5.0, 0.0, 1.0]).is_empty());
        assert_eq!(differing_rows(&anchor, &[1, 2], &[4.0, 5.0, 0.0, -1.0]), [1]);
        // -0.0 and 0.0 differ in bits, and the comparator compares bits.
        assert_eq!(differing_rows(&anchor, &[2], &[-0.0, 1.0]), [0]);
        // An id the anchor never saw, or a short call, differs.
        assert_eq!(differing_rows(&anchor, &[9], &[0.0, 0.0]), [0]);
        assert_eq!(differing_rows(&anchor, &[1, 2], &[4.0, 5.0]), [1]);
    }

    #[test]
    fn planted_row_is_reported_exactly() {
        let data: Vec<f32> = (0..64 * 3).map(|i| i as f32).collect();
        let anchor = Anchor::new((0..64).rev().collect(), data, 3);
        let mut rng = Rng::new(3);
        for _ in 0..20 {
            let (row, found) = plant_row(&anchor, &mut rng);
            assert_eq!(found, [row]);
        }
    }
}
