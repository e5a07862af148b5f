//! Float64 host references of the contract, with each output's gate-2 bound (`bound`).
//!
//! Each reference is the op's textbook formula in f64 on the exact bf16 inputs, with no
//! intermediate rounding (the rounding points of the fast path are what the bound allows
//! for, not what the reference imitates): `linear = sum_k x w (+ b)`, `rms_norm =
//! w x / sqrt(mean(x^2) + eps)`, RoPE from the bf16 table's cos/sin, softmax attention,
//! `silu(g) u`, `a + b`. Sums run in f64 over at most ~10^5 terms of bf16 products, whose
//! own rounding (below 2^-53 relative per step) is negligible against every bound here.
//! They are plain functions over slices, unit-tested below on hand-checkable cases.

use rayon::prelude::*;
use tf_checkpoint::spec::RopeStyle;

use super::bound::{self, AttnTerms};
use super::data::Bf16Mat;

/// Exact values of some outputs and the bound each must be within.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Expect {
    pub value: Vec<f64>,
    pub bound: Vec<f64>,
}

impl Expect {
    /// Outputs that must equal `value` exactly (copies of bf16 values).
    pub fn exact(value: Vec<f64>) -> Expect {
        let bound = vec![0.0; value.len()];
        Expect { value, bound }
    }

    pub fn append(&mut self, mut other: Expect) {
        self.value.append(&mut other.value);
        self.bound.append(&mut other.bound);
    }

    /// Each value with its bound from `f(value, magnitude)`.
    fn from_pairs(pairs: impl Iterator<Item = (f64, f64)>) -> Expect {
        let (value, bound) = pairs.unzip();
        Expect { value, bound }
    }
}

/// `out[r][j] = sum_k x[r][k] w[j][k] (+ bias[j])` for each row `x[r]` of `w.cols` values.
pub fn linear(x: &[Vec<f64>], w: &Bf16Mat<'_>, bias: Option<&[f64]>) -> Expect {
    let (rows, n, k) = (x.len(), w.rows, w.cols);
    // Column-major results (value, |products| sum), parallel over weight rows.
    let mut cols = vec![(0.0, 0.0); n * rows];
    cols.par_chunks_mut(rows.max(1)).enumerate().for_each_init(
        || vec![0.0; k],
        |wrow, (j, out)| {
            w.row_into(j, wrow);
            let b = bias.map_or(0.0, |b| b[j]);
            for (o, xr) in out.iter_mut().zip(x) {
                let (mut s, mut a) = (b, b.abs());
                for (xv, wv) in xr.iter().zip(wrow.iter()) {
                    s += xv * wv;
                    a += (xv * wv).abs();
                }
                *o = (s, a);
            }
        },
    );
    let terms = k + usize::from(bias.is_some());
    Expect::from_pairs((0..rows * n).map(|i| {
        let (v, a) = cols[(i % n) * rows + i / n];
        (v, bound::dot(v, terms, a))
    }))
}

/// RMSNorm of one row over groups of `w.len()` columns.
pub fn rms_norm(x: &[f64], w: &[f64], eps: f32) -> Expect {
    let g = w.len();
    Expect::from_pairs(x.chunks(g).flat_map(|grp| {
        let r = 1.0 / (grp.iter().map(|v| v * v).sum::<f64>() / g as f64 + eps as f64).sqrt();
        grp.iter().zip(w).map(move |(xv, wv)| {
            let v = wv * xv * r;
            (v, bound::rms_norm(v, g))
        })
    }))
}

/// RoPE of one row `(heads * head_dim)` with the table row's `cos` and `sin` (head_dim/2
/// each), pairs as `style` says: `y1 = x1 c - x2 s`, `y2 = x2 c + x1 s`.
pub fn rope(x: &[f64], cos: &[f64], sin: &[f64], head_dim: usize, style: RopeStyle) -> Expect {
    let half = head_dim / 2;
    let mut value = vec![0.0; x.len()];
    let mut bnd = vec![0.0; x.len()];
    for base in (0..x.len()).step_by(head_dim) {
        for i in 0..half {
            let (i1, i2) = match style {
                RopeStyle::Neox => (base + i, base + half + i),
                RopeStyle::Interleaved => (base + 2 * i, base + 2 * i + 1),
            };
            let (x1, x2, c, s) = (x[i1], x[i2], cos[i], sin[i]);
            for (at, a, b) in [(i1, x1 * c, -x2 * s), (i2, x2 * c, x1 * s)] {
                value[at] = a + b;
                bnd[at] = bound::rope(a + b, a, b);
            }
        }
    }
    Expect { value, bound: bnd }
}

/// rope of values known only to within their bounds (`x`: a product's expectation, one row),
/// the bound carried through the rotation (`bound::rope_of`).
pub fn rope_of(x: &Expect, cos: &[f64], sin: &[f64], head_dim: usize, style: RopeStyle) -> Expect {
    let half = head_dim / 2;
    let n = x.value.len();
    let (mut value, mut bnd) = (vec![0.0; n], vec![0.0; n]);
    for base in (0..n).step_by(head_dim) {
        for i in 0..half {
            let (i1, i2) = match style {
                RopeStyle::Neox => (base + i, base + half + i),
                RopeStyle::Interleaved => (base + 2 * i, base + 2 * i + 1),
            };
            let (x1, x2, e1, e2) = (x.value[i1], x.value[i2], x.bound[i1], x.bound[i2]);
            let (c, s) = (cos[i].abs(), sin[i].abs());
            // y1 = x1 c - x2 s, y2 = x2 c + x1 s: (output, value, |c|-side, |s|-side).
            let ys = [
                (i1, x1 * cos[i] - x2 * sin[i], (x1, e1), (x2, e2)),
                (i2, x2 * cos[i] + x1 * sin[i], (x2, e2), (x1, e1)),
            ];
            for (at, v, (xc, ec), (xs, es)) in ys {
                value[at] = v;
                let terms = (xc.abs() + ec) * c + (xs.abs() + es) * s;
                bnd[at] = bound::rope_of(v, terms, c * ec + s * es);
            }
        }
    }
    Expect { value, bound: bnd }
}

/// `silu(g) * u` element-wise.
pub fn swiglu(g: &[f64], u: &[f64]) -> Expect {
    Expect::from_pairs(g.iter().zip(u).map(|(g, u)| {
        let v = g / (1.0 + (-g).exp()) * u;
        (v, bound::swiglu(v))
    }))
}

/// `a + b` element-wise.
pub fn add(a: &[f64], b: &[f64]) -> Expect {
    Expect::from_pairs(a.iter().zip(b).map(|(a, b)| (a + b, bound::add(a + b))))
}

/// Attention shape: query heads over kv heads of `head_dim`, and the softmax scale.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f64,
}

/// Causal attention of one query row `q (heads * head_dim)` over the KV rows of positions
/// `0..=p` (`k`, `v`: one `(kv_heads * head_dim)` row per position). `None` when a head's
/// scores are too large for the bound to hold (see `bound::attention_factor`).
pub fn attention(q: &[f64], k: &[Vec<f64>], v: &[Vec<f64>], sh: AttnShape) -> Option<Expect> {
    let (hd, group) = (sh.head_dim, sh.heads / sh.kv_heads);
    let mut out = Expect::default();
    for h in 0..sh.heads {
        let (qh, kvo) = (&q[h * hd..(h + 1) * hd], (h / group) * hd);
        let mut scores = Vec::with_capacity(k.len());
        let mut max_abs: f64 = 0.0;
        for kj in k {
            let kh = &kj[kvo..kvo + hd];
            let s: f64 = qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() * sh.scale;
            let a: f64 = qh.iter().zip(kh).map(|(a, b)| (a * b).abs()).sum::<f64>() * sh.scale;
            scores.push(s);
            max_abs = max_abs.max(a);
        }
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lo = scores.iter().copied().fold(f64::INFINITY, f64::min);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let l: f64 = e.iter().sum();
        let terms = AttnTerms {
            positions: k.len(),
            head_dim: hd,
            max_abs_score: max_abs,
            score_range: m - lo,
        };
        let factor = bound::attention_factor(terms)?;
        for d in 0..hd {
            let (mut o, mut a) = (0.0, 0.0);
            for (ej, vj) in e.iter().zip(v) {
                o += ej / l * vj[kvo + d];
                a += ej / l * vj[kvo + d].abs();
            }
            out.value.push(o);
            out.bound.push(bound::attention(o, a, factor));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mat(rows: usize, cols: usize, v: &[f32]) -> Vec<u8> {
        assert_eq!(v.len(), rows * cols);
        v.iter().flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes()).collect()
    }

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn linear_by_hand() {
        let bytes = mat(2, 2, &[3.0, 4.0, -1.0, 0.5]);
        let w = Bf16Mat { bytes: &bytes, rows: 2, cols: 2 };
        let x = vec![vec![1.0, 2.0], vec![0.0, -2.0]];
        let e = linear(&x, &w, Some(&[0.5, -1.0]));
        close(&e.value, &[11.5, -1.0, -7.5, -2.0]);
        // Row 0, column 0: gamma(3) * (3 + 8 + 0.5), then the bf16 rounding of 11.5.
        let g = bound::gamma(3) * 11.5;
        assert_eq!(e.bound[0], g + bound::U_BF16 * (11.5 + g) + bound::TINY);
        let nb = linear(&x, &w, None);
        close(&nb.value, &[11.0, 0.0, -8.0, -1.0]);
    }

    #[test]
    fn rms_norm_by_hand() {
        // mean(9, 16) = 12.5; groups of 2 normalise each pair on its own.
        let e = rms_norm(&[3.0, 4.0, 0.0, 2.0], &[1.0, 2.0], 0.0);
        let r = 1.0 / 12.5f64.sqrt();
        close(&e.value, &[3.0 * r, 8.0 * r, 0.0, 2.0 * 2.0 / 2f64.sqrt()]);
        assert!(e.bound[0] > 3.0 * r * 2.0 * bound::U_BF16 && e.bound[0] < 3.0 * r * 0.008);
    }

    #[test]
    fn rope_by_hand() {
        // Frequency 0 at a quarter turn (cos 0, sin 1), frequency 1 at rest.
        let (cos, sin) = ([0.0, 1.0], [1.0, 0.0]);
        let x = [1.0, 2.0, 3.0, 4.0];
        // Neox pairs (0, 2) and (1, 3).
        close(&rope(&x, &cos, &sin, 4, RopeStyle::Neox).value, &[-3.0, 2.0, 1.0, 4.0]);
        // Interleaved pairs (0, 1) and (2, 3).
        close(&rope(&x, &cos, &sin, 4, RopeStyle::Interleaved).value, &[-2.0, 1.0, 3.0, 4.0]);
        // Two heads rotate alike.
        let two = rope(&[1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0], &cos, &sin, 4, RopeStyle::Neox);
        close(&two.value[4..], &[-3.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn swiglu_and_add_by_hand() {
        // silu(ln 3) = ln 3 / (1 + 1/3).
        let l3 = 3f64.ln();
        close(&swiglu(&[0.0, l3], &[5.0, 2.0]).value, &[0.0, 2.0 * 0.75 * l3]);
        let e = add(&[1.5, -2.0], &[0.25, 2.0]);
        close(&e.value, &[1.75, 0.0]);
        assert_eq!(e.bound[1], bound::TINY);
    }

    #[test]
    fn attention_by_hand() {
        let sh = AttnShape { heads: 2, kv_heads: 1, head_dim: 1, scale: 1.0 };
        // One position: every head returns v0.
        let one = attention(&[5.0, -5.0], &[vec![1.0]], &[vec![7.0]], sh).unwrap();
        close(&one.value, &[7.0, 7.0]);
        // Scores 0 and ln 3 (head 0) give weights 1/4, 3/4; head 1 (q = 0) averages.
        let k = [vec![0.0], vec![3f64.ln()]];
        let v = [vec![4.0], vec![8.0]];
        let e = attention(&[1.0, 0.0], &k, &v, sh).unwrap();
        close(&e.value, &[1.0 + 6.0, 6.0]);
        // GQA: with two kv heads, head 1 reads kv head 1.
        let sh2 = AttnShape { heads: 2, kv_heads: 2, head_dim: 1, scale: 0.5 };
        let e2 = attention(&[0.0, 0.0], &[vec![1.0, 1.0]], &[vec![1.0, -3.0]], sh2).unwrap();
        close(&e2.value, &[1.0, -3.0]);
        // The bound is relative to sum p |v|, not |o|: a cancelling mix keeps a bound.
        let c = attention(&[0.0, 0.0], &k, &[vec![1.0], vec![-1.0]], sh).unwrap();
        assert!(c.value[0].abs() < 1e-15 && c.bound[0] > bound::gamma(2));
    }
}
