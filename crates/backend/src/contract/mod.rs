//! The kernel contract (DESIGN.md §1, §4; issue 5 item 4): drives every op of [`Backend`] at
//! each served geometry through the trait alone, so the same harness judges the CPU backend
//! here and in CI and the CUDA backend on the GPU machine, with no change.
//!
//! **Units.** A unit is one op at one geometry and variant, e.g. `linear [576 x 1536] +bias`
//! at `smollm2` (see `geometry::units`): embed; rms_norm over the hidden state and per head
//! (q and k widths); linear for every distinct weight shape (N, K) of the geometry (q/k/v/o,
//! gate/up/down with and without bias; lm_head without, as no family has an lm_head bias);
//! rope in both [`RopeStyle`](tf_checkpoint::spec::RopeStyle)s at q and k widths; kv_store and
//! attention (prefill chunks and decode rows of several sequences, GQA); swiglu; add; logits;
//! argmax (`sample.rs`: greedy sampling on the device, on logits known exactly); the fused
//! decode ops (`fused.rs`: add_rms_norm, q/k/v as one `linear_group` with and without bias,
//! gate/up `linear_swiglu`, `rope_kv_store` in both styles; `fused_norm.rs`:
//! `add_norm_linear_group` and `add_norm_linear_swiglu`, whose decode-sized calls a GPU runs
//! with the norm in the products' prologue; `fused_rope.rs`: `qkv_rope_kv_store` with and
//! without the norm, rope and the KV write in the products' epilogue on a GPU), each judged
//! on every value its unfused composition writes.
//! On the CPU the SUMMARY's "kernels" are these units; on CUDA also every
//! [`Backend::kernels`] entry that no unit claims (a failure: nothing drives it).
//!
//! **Gates**, each a verdict per unit:
//! 1. compiles: every `kernels()` entry of the unit's kernel sources has `compiled: Ok`
//!    (vacuous on a backend that reports none, e.g. the CPU, and the output says so);
//! 2. float64 bound: on seeded bf16 inputs, each output element lies within the bound below
//!    of a float64 host reference (`reference`), on a fixed sample of rows (`rows::SAMPLE`;
//!    attention: the last position of every sequence and two early ones; kv_store: all rows);
//! 3. row invariance: each row's bits are equal in calls of 1, 2, 3, 8, 16, 17, 128 and 2,048
//!    rows (`rows::ROW_COUNTS`): row i of any call equals the same input row in the 2,048-row
//!    call. Attention: 2,048 query rows of seven sequences over a paged pool, scheduled for
//!    each call size as mixed prefill chunks and decode rows with freshly shuffled block
//!    tables; every query row (and stored KV row) must have the same bits in every schedule;
//! 4. limits: every `kernels()` entry of the unit has `limits: Ok` (vacuous likewise).
//!
//! Gates 1 and 4 read `kernels()` after every op ran, so kernels compiled at first use count.
//!
//! **Planted controls** (DESIGN.md §1: a checker that cannot fail is a defect), per unit, both
//! must come out red: the reference scaled by 1.01 (its bound scaled with it; every bound
//! below is homogeneous of degree one in the data) must exceed the bound somewhere; a copy of
//! the 2,048-row output with one low bf16 bit flipped in one row must be reported by the
//! row comparator as exactly that row.
//!
//! **Bounds** (`bound`). u = 2^-23 (twice fp32's unit roundoff, to cover tensor cores that
//! truncate while aligning addends), gamma(n) = n u / (1 - n u), u_b = 2^-8 (bf16: half an
//! ulp of x is at most 2^-8 |x|), and the final rounding of a value v computed with error e
//! costs at most u_b (|v| + e) + 2^-134 (half the least bf16 subnormal). With v the exact
//! float64 value and E the error before the final bf16 rounding, the gate is
//! `|out - v| <= E + u_b (|v| + E) + 2^-134`:
//! - embed, kv_store: exact copies of bf16 values, E = 0 and no rounding (bound 0);
//! - linear, logits: E = gamma(K+1) (sum_k |x_k w_k| + |b|), the classical bound of a dot
//!   product in any order (Higham, Accuracy and Stability, §3.1), bias as one more term;
//! - add: both inputs are bf16, their f32 sum rounds once: E = u |v|;
//! - rms_norm: r = 1/sqrt(mean(x^2) + eps) with a relative error of at most gamma(G + 6) (a
//!   sum of G squares, the mean, eps, sqrt and reciprocal, each within 2u, so an approximate
//!   rsqrt of 2 ulps is covered); then `bf16(x r)`, `w h` in f32 and the final rounding:
//!   bound = |v| ((1 + gamma(G+6)) (1 + u)^2 (1 + u_b)^2 - 1) + 2^-134;
//! - rope: a = x cos, b = partner sin (exact bf16 products, allowed one f32 rounding each),
//!   each rounded to bf16, summed in f32: E = (u_b + 2u)(1 + u_b)(|a| + |b|);
//! - swiglu: silu(g) within eps_s = 2^-20 + 4u relative (exp within 2^-20, an assumption
//!   stated for the device's exp, then 1 + e, the division or a reciprocal and product), then
//!   bf16, `* up` in f32 and the final rounding: bound = |v| ((1 + eps_s)(1 + u_b)^2 (1 + u)
//!   - 1) + 2^-134;
//! - attention (per row, head h, dim d; P positions): score errors delta_j =
//!   gamma(D+2) scale sum_d |q_d k_jd| (the dot, the scale, or a scale folded into q); the
//!   exponent of each weight is then off by at most theta = max_j delta_j + 2u R (R = range of
//!   the scores plus 2 max delta: the subtraction of the max and an exp2 argument scaling);
//!   an online softmax or split-KV adds one rescale factor per event, each off by eps_exp +
//!   2u R, for at most N_r = ceil(P/16) + 8 events. So every weight exp(s_j - m) is computed
//!   within a relative rho = exp(theta + N_r (eps_exp + 2u R)) (1 + eps_exp) - 1, and the
//!   normalized weights within kappa = 2 rho / (1 - rho) of the exact ones (relatively). The
//!   sums l = sum e_j and o_d = sum e_j v_jd (any order, including the rescale products) are
//!   within g = gamma(P') (1 + 2^-6) with P' = 3P + 2 N_r + 8, and the final division costs
//!   2u. The 3P: a tensor-core kernel may split each fp32 e_j exactly into three bf16 pieces
//!   (b0 = bf16(e), b1 = bf16(e - b0), b2 = e - b0 - b1), so o_d is a sum of 3P exact
//!   products whose magnitudes add up to at most (1 + 2^-6) e_j |v_jd| per position. With
//!   A_d = sum_j p_j |v_jd| (exact probabilities p_j, so |o_d| <= A_d):
//!   E = A_d (2u + g + kappa + g (1 + kappa)) (1 + 2u) / (1 - g).
//!   The bound assumes fp32 probabilities in the PV product, as the trait documents; a kernel
//!   that rounds them to one bf16 (as some flash kernels do) would fail gate 2, correctly.
//!
//! Data (`data`): weights and the input rows of every call go through
//! [`Backend::load_weight`] from a small safetensors file written with
//! `tf_checkpoint::write` into a scratch directory and mapped back; inputs reach the op via
//! [`Backend::embed`] of such a table (the trait has no other way to put values on a device),
//! and each call checks that the embedded rows are the table's bits before the op runs.
//! Values are bf16 of seeded approximately normal draws; odd input rows and odd weight rows
//! (and odd value dims in attention) carry a mean offset, so that some dot products do not
//! cancel and a 1% error is visible against the bound (in a fully cancelling product the
//! bound is a large multiple of |v| and no gate could see a 1% error).
//!
//! Alternatives rejected: comparing against the CPU backend (a reference must be independent
//! and exact; two fast backends can share a bug); a tolerance in ulps (not derived from the
//! arithmetic, so either loose or flaky); hard-coded expected outputs (computed by the code
//! under test).

mod attention;
mod bound;
mod compare;
mod data;
mod fused;
mod fused_norm;
mod fused_rope;
mod geometry;
mod ops;
pub mod reference;
mod report;
mod rows;
mod sample;

use std::path::PathBuf;

pub use geometry::{Family, Geometry, LLAMA3_8B, SMOLLM2};
pub use report::Summary;

use crate::error::BackendError;
use crate::Backend;

/// Errors that stop a unit before its gates can be judged (they fail the unit, not the run).
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Checkpoint(#[from] tf_checkpoint::CheckpointError),
    #[error("contract scratch directory {}: {source}", path.display())]
    Scratch { path: PathBuf, source: std::io::Error },
    /// The harness's own preconditions (e.g. embed did not reproduce an input table).
    #[error("{0}")]
    Setup(String),
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ContractConfig {
    pub geometries: Vec<Geometry>,
    /// Run only this op family (all when `None`).
    pub only: Option<Family>,
    /// Seed of every input; each unit derives its own from it and its label, so `--only`
    /// sees the same data as a full run.
    pub seed: u64,
    /// Where the scratch safetensors files go (a fresh subdirectory, removed afterwards).
    pub scratch: PathBuf,
}

/// Runs the contract on `be`, passing each printed line to `out` as it is decided, and
/// returns the counts of the final `SUMMARY` line (also passed to `out`, last).
pub fn run<B: Backend>(be: &B, cfg: &ContractConfig, out: &mut dyn FnMut(&str)) -> Summary {
    out(&format!(
        "contract: backend {}; geometries {}; seed {}",
        be.name(),
        cfg.geometries.iter().map(|g| g.name).collect::<Vec<_>>().join(", "),
        cfg.seed
    ));
    let mut results = Vec::new();
    for g in &cfg.geometries {
        for unit in geometry::units(g) {
            if cfg.only.is_some_and(|f| f != unit.family()) {
                continue;
            }
            results.extend(report::run_unit(be, g, &unit, cfg, out));
        }
    }
    let kernels = be.kernels();
    let summary = report::finish(&results, kernels, out);
    out(&summary.line());
    summary
}
