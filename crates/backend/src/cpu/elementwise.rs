//! Row-local ops: `swiglu`, `add`, `rms_norm`, `rope`, `embed`.
//!
//! Each output element depends on its own row only, with rounding points of HF
//! modeling_llama at bf16 (products of two bf16 values are exact in f32, then rounded):
//! - swiglu: `bf16(bf16(silu(g)) * u)`, silu = `g / (1 + exp(-g))` with our `exp`;
//! - add: `bf16(a + b)` (f32 sum, then bf16: the double rounding torch's bf16 add does);
//! - rms_norm: sum of squares in 16 lanes (lane l takes elements ≡ l mod 16 of the group) and
//!   the fixed tree, `r = 1/sqrt(sum/n + eps)`, `bf16(w * bf16(x * r))`;
//! - rope: `bf16(bf16(x*cos) + bf16(rot(x)*sin))` with the bf16 table row of the position;
//! - embed: the token's row decoded exactly, rounded to bf16.
//!
//! Large ops are split over the pool by rows (or element ranges); the split changes nothing.

use std::ops::Range;

use super::act::{Dst, Src};
use super::linear::formats;
use super::simd::{math, Kernel, Simd};
use super::tensor::CpuTensor;
use super::weight::CpuWeight;
use super::CpuBackend;
use crate::error::{BackendError, Result};
use tf_checkpoint::spec::RopeStyle;

/// Element-wise binary ops over flat ranges.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Binary {
    Swiglu,
    Add,
}

struct BinaryRange {
    op: Binary,
    a: Src,
    b: Src,
    out: Dst,
    range: Range<usize>,
}

impl BinaryRange {
    #[inline(always)]
    fn apply<S: Simd>(&self, s: S, a: S::V, b: S::V) -> S::V {
        match self.op {
            Binary::Swiglu => s.mul(math::round_bf16_v(s, math::silu(s, a)), b),
            Binary::Add => s.add(a, b),
        }
    }
}

impl Kernel for BinaryRange {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let Range { start, end } = self.range;
        let mut i = start;
        while i + 16 <= end {
            // SAFETY: the op checked both inputs and the output hold `end` elements; this
            // thread owns `start..end` of the output.
            unsafe {
                let v = self.apply(s, self.a.load(s, i), self.b.load(s, i));
                self.out.store(s, i, v);
            }
            i += 16;
        }
        if i < end {
            let n = end - i;
            // SAFETY: see above.
            unsafe {
                let v = self.apply(s, self.a.load_n(s, i, n), self.b.load_n(s, i, n));
                self.out.store_n(s, i, v, n);
            }
        }
    }
}

/// `out = op(a, b)` over the valid rows of `a` (`out` may be `a` itself for `add`).
pub(crate) fn binary(
    be: &CpuBackend,
    op: Binary,
    name: &'static str,
    a: Src,
    a_shape: (usize, usize),
    b: &CpuTensor,
    out: Dst,
) -> Result<usize> {
    let (rows, cols) = a_shape;
    if b.cols != cols || b.rows != rows {
        return Err(BackendError::shape(
            name,
            format!("operands are ({rows}, {cols}) and ({}, {})", b.rows, b.cols),
        ));
    }
    let bsrc = Src::of(b);
    let total = rows * cols;
    be.for_ranges(total, 4096, total >= 1 << 16, &|range| {
        be.level.dispatch(BinaryRange { op, a, b: bsrc, out, range })
    });
    Ok(rows)
}

struct NormRows<'a> {
    x: Src,
    w: &'a [f32],
    cols: usize,
    group: usize,
    eps: f32,
    out: Dst,
    rows: Range<usize>,
}

impl Kernel for NormRows<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let g = self.group;
        let full = g / 16 * 16;
        for r in self.rows.clone() {
            for base in (r * self.cols..(r + 1) * self.cols).step_by(g) {
                // SAFETY: the op checked x and out hold the row, w holds `group` values, and
                // this thread owns the rows.
                unsafe {
                    let mut acc = s.zero();
                    for i in (0..full).step_by(16) {
                        let v = self.x.load(s, base + i);
                        acc = s.fma(v, v, acc);
                    }
                    if full < g {
                        let v = self.x.load_n(s, base + full, g - full);
                        acc = s.fma(v, v, acc);
                    }
                    let mean = s.reduce(acc) / g as f32;
                    let rs = s.splat(1.0 / (mean + self.eps).sqrt());
                    for i in (0..full).step_by(16) {
                        let h = math::round_bf16_v(s, s.mul(self.x.load(s, base + i), rs));
                        self.out.store(s, base + i, s.mul(s.load(self.w.as_ptr().add(i)), h));
                    }
                    if full < g {
                        let n = g - full;
                        let h = math::round_bf16_v(s, s.mul(self.x.load_n(s, base + full, n), rs));
                        let w = s.load_n(self.w.as_ptr().add(full), n);
                        self.out.store_n(s, base + full, s.mul(w, h), n);
                    }
                }
            }
        }
    }
}

/// RMSNorm over groups of `group` columns.
pub(crate) fn rms_norm(
    be: &CpuBackend,
    x: &CpuTensor,
    weight: &CpuWeight,
    eps: f32,
    group: usize,
    out: &mut CpuTensor,
) -> Result<()> {
    let (rows, cols) = (x.rows, x.cols);
    if group == 0 || cols % group != 0 {
        return Err(BackendError::shape(
            "rms_norm",
            format!("group {group} does not divide {cols} columns"),
        ));
    }
    let w = weight.vector("rms_norm", group)?;
    out.check_out("rms_norm", rows, cols)?;
    let (src, dst) = (Src::of(x), Dst::of(out));
    be.for_ranges(rows, 4, rows * cols >= 1 << 15, &|r| {
        be.level.dispatch(NormRows { x: src, w, cols, group, eps, out: dst, rows: r })
    });
    out.rows = rows;
    Ok(())
}

/// Rotary embedding in place. See the module doc for the rounding; `table` is bf16
/// `(max_positions, head_dim)`: cos of the head_dim/2 frequencies, then their sin.
#[allow(clippy::too_many_arguments)] // the RopeArgs fields, unpacked by the trait impl
pub(crate) fn rope(
    be: &CpuBackend,
    x: &mut CpuTensor,
    heads: usize,
    head_dim: usize,
    style: RopeStyle,
    table: &CpuWeight,
    positions: &[u32],
) -> Result<()> {
    let (rows, cols) = (x.rows, x.cols);
    if head_dim == 0
        || !head_dim.is_multiple_of(2)
        || heads * head_dim != cols
        || positions.len() != rows
    {
        return Err(BackendError::shape(
            "rope",
            format!(
                "({rows}, {cols}) as {heads} heads of {head_dim} for {} positions",
                positions.len()
            ),
        ));
    }
    if table.format != super::weight::WeightFormat::Bf16
        || table.k != head_dim
        || table.vector.is_some()
    {
        return Err(BackendError::shape(
            "rope",
            format!("table `{}` must be bf16 [positions, {head_dim}]", table.name()),
        ));
    }
    if let Some(&p) = positions.iter().find(|&&p| p as usize >= table.n) {
        return Err(BackendError::shape(
            "rope",
            format!("position {p} beyond the table's {}", table.n),
        ));
    }
    let (src, dst) = (Src::of(x), Dst::of(x));
    let tab = table.view.bytes();
    be.for_ranges(rows, 8, rows * cols >= 1 << 14, &|range| {
        ROPE.with(|cs| {
            let mut cs = cs.borrow_mut();
            cs.resize(2 * head_dim, 0.0);
            for r in range {
                let off = positions[r] as usize * head_dim * 2;
                let trow = &tab[off..off + head_dim * 2];
                expand_cos_sin(trow, style, &mut cs);
                let (base, x) = (r * cols, (src, dst));
                be.level.dispatch(RopeRow { x, base, heads, head_dim, style, trow, cs: &cs });
            }
        })
    });
    Ok(())
}

thread_local! {
    /// One position's cos/sin expanded to the lanes they multiply (reused across rows).
    static ROPE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `cs[..hd]` = the cos multiplying each lane, `cs[hd..]` = the signed sin multiplying each
/// lane's partner: a pair (i1, i2) gets `x1*cos - x2*sin` and `x2*cos + x1*sin`.
fn expand_cos_sin(trow: &[u8], style: RopeStyle, cs: &mut [f32]) {
    let hd = trow.len() / 2;
    let half = hd / 2;
    let tv = |j: usize| math::bf16_to_f32(u16::from_le_bytes([trow[2 * j], trow[2 * j + 1]]));
    let (cos, sin) = cs.split_at_mut(hd);
    for i in 0..half {
        let (c, s) = (tv(i), tv(half + i));
        let (i1, i2) = match style {
            RopeStyle::Neox => (i, half + i),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        };
        (cos[i1], cos[i2], sin[i1], sin[i2]) = (c, c, -s, s);
    }
}

/// One row's heads: `bf16(bf16(x*cos) + bf16(partner*sin))` per lane, the partner of a lane
/// being its pair neighbour (Interleaved: a lane swap) or the lane head_dim/2 away (Neox: a
/// second load). `-x2*s` and `x2*(-s)` are the same product, so this is the formula of the
/// module doc exactly. Head sizes the vectors do not tile take the scalar `rope_head`.
struct RopeRow<'a> {
    x: (Src, Dst),
    base: usize,
    heads: usize,
    head_dim: usize,
    style: RopeStyle,
    trow: &'a [u8],
    cs: &'a [f32],
}

impl Kernel for RopeRow<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (hd, (src, dst)) = (self.head_dim, self.x);
        let half = hd / 2;
        let vector = hd <= 256
            && match self.style {
                RopeStyle::Neox => half % 16 == 0,
                RopeStyle::Interleaved => hd % 16 == 0,
            };
        let (cos, sin) = self.cs.split_at(hd);
        for h in 0..self.heads {
            let b = self.base + h * hd;
            if !vector {
                // SAFETY: b..b+hd is row r's head h, checked and owned by the caller.
                unsafe { rope_head(src, dst, (b, hd), self.style, self.trow) };
                continue;
            }
            // All of a head is computed before any of it is stored: a Neox partner chunk
            // must be read before it is overwritten.
            let mut y = [s.zero(); 16];
            for (c, yc) in y.iter_mut().enumerate().take(hd / 16) {
                let i = 16 * c;
                // SAFETY: chunks i and its partner lie inside the head; cos/sin hold hd.
                unsafe {
                    let x = src.load(s, b + i);
                    let xp = match self.style {
                        RopeStyle::Neox => src.load(s, b + (i + half) % hd),
                        RopeStyle::Interleaved => s.swap_pairs(x),
                    };
                    let a = math::round_bf16_v(s, s.mul(x, s.load(cos.as_ptr().add(i))));
                    let p = math::round_bf16_v(s, s.mul(xp, s.load(sin.as_ptr().add(i))));
                    *yc = s.add(a, p);
                }
            }
            for (c, yc) in y.iter().enumerate().take(hd / 16) {
                // SAFETY: inside the head; this thread owns the row.
                unsafe { dst.store(s, b + 16 * c, *yc) };
            }
        }
    }
}

/// # Safety
/// `at.0 .. at.0 + at.1` is inside the tensor and owned by this thread.
unsafe fn rope_head(src: Src, dst: Dst, at: (usize, usize), style: RopeStyle, trow: &[u8]) {
    let (base, hd) = at;
    let half = hd / 2;
    let tv = |j: usize| math::bf16_to_f32(u16::from_le_bytes([trow[2 * j], trow[2 * j + 1]]));
    let rb = math::round_bf16;
    for i in 0..half {
        let (c, s) = (tv(i), tv(half + i));
        let (i1, i2) = match style {
            RopeStyle::Neox => (base + i, base + half + i),
            RopeStyle::Interleaved => (base + 2 * i, base + 2 * i + 1),
        };
        // SAFETY: i1, i2 < base + hd, inside the caller's range.
        unsafe {
            let (x1, x2) = (src.get(i1), src.get(i2));
            let y1 = rb(rb(x1 * c) + rb(-x2 * s));
            let y2 = rb(rb(x2 * c) + rb(x1 * s));
            put(dst, i1, y1);
            put(dst, i2, y2);
        }
    }
}

/// # Safety
/// Element `i` exists and is owned by this thread.
#[inline(always)]
unsafe fn put(dst: Dst, i: usize, v: f32) {
    // SAFETY: forwarded from the caller; v is already a bf16 value.
    unsafe {
        match dst {
            Dst::Bf16(p) => *p.add(i) = math::f32_to_bf16(v),
            Dst::F32(p) => *p.add(i) = v,
        }
    }
}

/// `out[r] = bf16(table[tokens[r]])`.
pub(crate) fn embed(
    be: &CpuBackend,
    table: &CpuWeight,
    tokens: &[u32],
    out: &mut CpuTensor,
) -> Result<()> {
    let (vocab, k) = (table.n, table.k);
    if table.vector.is_some() {
        return Err(BackendError::shape("embed", format!("`{}` is not a matrix", table.name())));
    }
    out.check_out("embed", tokens.len(), k)?;
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(BackendError::shape(
            "embed",
            format!("token {t} of a {vocab}-row table `{}`", table.name()),
        ));
    }
    let mut buf = vec![0f32; k.div_ceil(16) * 16];
    let dst = Dst::of(out);
    for (r, &t) in tokens.iter().enumerate() {
        formats::decode_row(be.level, table.format, table.row(t as usize), k, &mut buf);
        for (c, &v) in buf[..k].iter().enumerate() {
            // SAFETY: (r, c) is inside the checked output; this thread is the only writer.
            unsafe { put(dst, r * k + c, math::round_bf16(v)) };
        }
    }
    out.rows = tokens.len();
    Ok(())
}
