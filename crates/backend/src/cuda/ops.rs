//! Row-local ops on the GPU: weight upload, embed, rms_norm, rope, swiglu, add, read_f32.
//!
//! Shapes are checked here, once, before any launch (kernels trust their arguments). Launch
//! shapes come from the tensor widths only; rows map to blocks (or a flat grid-stride range),
//! so no row's arithmetic depends on how many rows the call has. Rounding points are the CPU
//! backend's (see `kernels/*.cu`): rope, add and embed give its bits exactly; rms_norm and
//! swiglu sum or exponentiate in another order / with another `exp`, within a bf16 step.

use cudarc::driver::LaunchConfig;
use tf_checkpoint::spec::RopeStyle;
use tf_checkpoint::TensorView;

use super::tensor::{dptr, plan_weight, CudaBatch, CudaTensor, CudaWeight, WeightKind};
use super::{drv, CudaBackend, KArg};
use crate::error::{BackendError, Result};
use crate::{ActDType, NormArgs, RopeArgs};

pub(crate) fn cfg(grid: (u32, u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: grid, block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

pub(crate) fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| BackendError::shape(op, format!("{what} {v} exceeds u32")))
}

pub(crate) fn load_weight(be: &CudaBackend, view: &TensorView) -> Result<CudaWeight> {
    let (kind, vector) = plan_weight(view)?;
    let (n, k) = view.rows_cols();
    let what = format!("weight `{}`", view.name);
    let buf = match vector {
        Some(vals) => {
            let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut buf = be.raw::<u8>(bytes.len(), &what)?;
            be.stream.memcpy_htod(&bytes, &mut buf).map_err(drv(&what))?;
            buf
        }
        None => {
            // From the mapped file through pinned staging buffers (`staging.rs`): no host
            // copy of the whole matrix.
            let bytes = view.bytes();
            let mut buf = be.raw::<u8>(bytes.len(), &what)?;
            super::staging::upload(be, bytes, &mut buf, &what)?;
            buf
        }
    };
    let (n, k) = if kind == WeightKind::F32Vector { (1, n * k) } else { (n, k) };
    Ok(CudaWeight { name: view.name.clone(), kind, buf, n, k })
}

pub(crate) fn embed(
    be: &CudaBackend,
    table: &CudaWeight,
    batch: &CudaBatch,
    out: &mut CudaTensor,
) -> Result<()> {
    table.check_matrix("embed")?;
    let (vocab, k) = (table.n, table.k);
    let tokens = &batch.meta.tokens;
    out.check_out("embed", tokens.len(), k)?;
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(BackendError::shape(
            "embed",
            format!("token {t} of a {vocab}-row table `{}`", table.name),
        ));
    }
    let rows = tokens.len();
    if rows > 0 {
        let s = &be.stream;
        let (tp, tok, op, of) =
            (dptr(&table.buf, s), batch.ptr(s, batch.at.tokens), dptr(&out.buf, s), out.is_f32());
        let k32 = to_u32("embed", "width", k)?;
        be.launch(
            "embed",
            cfg((rows as u32, 1, 1), 256),
            &[tp.into(), tok.into(), op.into(), of.into(), k32.into()],
        )?;
    }
    out.rows = rows;
    Ok(())
}

/// Threads per block for a group of `group` columns: a power of two from the group alone.
pub(crate) fn norm_threads(group: usize) -> u32 {
    (group / 4).next_power_of_two().clamp(32, 1024) as u32
}

/// Largest group norm.cu's 16-byte path stages in shared memory (its `NORM_STAGE_MAX`).
const NORM_STAGE_MAX: usize = 16384;
/// Most real threads of the 16-byte path's block in calls of at least NORM_MANY_GROUPS
/// groups: it runs `norm_threads(group)` virtual ones (norm.cu `staged_r`), so more rows are
/// in flight an SM at the same arithmetic (H200, 2,048 rows of 4,096: add_rms_norm 36.4 ->
/// 25.1 us, rms_norm 29.8 -> 17.6). Smaller calls (decode steps, whose one row is a chain of
/// dependent loads and sums) keep one real thread a virtual one. 128 and 64 real threads
/// measured no different at 2,048 prefill rows (session 22, docs/bench/2026-12-04-h200.md).
const NORM_VEC_THREADS: u32 = 256;
const NORM_MANY_GROUPS: u32 = 256;

/// The launch of a norm kernel over `blocks` groups, and its last two arguments (`vt`, `vec`).
/// The 16-byte path (`vec`) takes calls whose tensors are all bf16 (`bf16_only`) and whose
/// buffers `ptrs` are 16-byte aligned, with group % 8 == 0 and group <= NORM_STAGE_MAX, unless
/// `TF_VEC16=0` (TENSORFOLD_KERNEL_DEFINES, an A/B switch): the group's bf16 stage, and at
/// most NORM_VEC_THREADS threads when the call has many groups. Otherwise
/// `norm_threads(group)` threads, no stage. Either way the sum order is that of
/// `norm_threads(group)` threads: the choice changes no value.
pub(crate) fn norm_launch(
    blocks: u32,
    group: usize,
    bf16_only: bool,
    ptrs: &[u64],
) -> (LaunchConfig, [KArg; 2]) {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off =
        *OFF.get_or_init(|| super::compile::kernel_define("TF_VEC16").as_deref() == Some("0"));
    let vt = norm_threads(group);
    let vec = !off
        && bf16_only
        && group.is_multiple_of(8)
        && group <= NORM_STAGE_MAX
        && ptrs.iter().all(|p| p % 16 == 0);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (
            if vec && blocks >= NORM_MANY_GROUPS { vt.min(NORM_VEC_THREADS) } else { vt },
            1,
            1,
        ),
        shared_mem_bytes: if vec { 2 * group as u32 } else { 0 },
    };
    (cfg, [vt.into(), (vec as i32).into()])
}

pub(crate) fn rms_norm(be: &CudaBackend, a: NormArgs<'_, CudaBackend>) -> Result<()> {
    let (rows, cols, group) = (a.x.rows, a.x.cols, a.group);
    if group == 0 || cols % group != 0 {
        return Err(BackendError::shape(
            "rms_norm",
            format!("group {group} does not divide {cols} columns"),
        ));
    }
    a.weight.check_vector("rms_norm", group)?;
    a.out.check_out("rms_norm", rows, cols)?;
    let blocks = rows * (cols / group);
    if blocks > 0 {
        let s = &be.stream;
        let (xp, xf, wp, op, of) = (
            dptr(&a.x.buf, s),
            a.x.is_f32(),
            dptr(&a.weight.buf, s),
            dptr(&a.out.buf, s),
            a.out.is_f32(),
        );
        let (g32, eps) = (to_u32("rms_norm", "group", group)?, a.eps);
        let grid = to_u32("rms_norm", "groups", blocks)?;
        let (cfg, [vt, vec]) = norm_launch(grid, group, xf + of == 0, &[xp, wp, op]);
        let (x, w, o) = (xp.into(), wp.into(), op.into());
        be.launch(
            "rms_norm",
            cfg,
            &[x, xf.into(), w, o, of.into(), g32.into(), eps.into(), vt, vec],
        )?;
    }
    a.out.rows = rows;
    Ok(())
}

/// Checks a rope call's shapes: `x` is `(batch rows, heads * hd)`, the table bf16
/// `[positions, hd]` and covers every row's position.
pub(crate) fn check_rope(a: &RopeArgs<'_, CudaBackend>) -> Result<()> {
    let (rows, cols, hd) = (a.x.rows, a.x.cols, a.head_dim);
    if rows != a.batch.rows() {
        return Err(BackendError::shape(
            "rope",
            format!("{rows} rows but the batch has {}", a.batch.rows()),
        ));
    }
    if hd == 0 || !hd.is_multiple_of(2) || a.heads * hd != cols {
        return Err(BackendError::shape(
            "rope",
            format!("({rows}, {cols}) as {} heads of {hd}", a.heads),
        ));
    }
    if a.table.kind != WeightKind::Bf16Matrix || a.table.k != hd {
        return Err(BackendError::shape(
            "rope",
            format!("table `{}` must be bf16 [positions, {hd}]", a.table.name),
        ));
    }
    if let Some(&p) = a.batch.meta.positions.iter().find(|&&p| p as usize >= a.table.n) {
        return Err(BackendError::shape(
            "rope",
            format!("position {p} beyond the table's {}", a.table.n),
        ));
    }
    Ok(())
}

pub(crate) fn rope(be: &CudaBackend, a: RopeArgs<'_, CudaBackend>) -> Result<()> {
    check_rope(&a)?;
    let (rows, hd) = (a.x.rows, a.head_dim);
    if rows == 0 {
        return Ok(());
    }
    let s = &be.stream;
    let (xp, xf, tp, pp) = (
        dptr(&a.x.buf, s),
        a.x.is_f32(),
        dptr(&a.table.buf, s),
        a.batch.ptr(s, a.batch.at.positions),
    );
    let (heads, hd32) = (to_u32("rope", "heads", a.heads)?, to_u32("rope", "head_dim", hd)?);
    let inter = (a.style == RopeStyle::Interleaved) as i32;
    be.launch(
        "rope",
        cfg((rows as u32, 1, 1), 256),
        &[xp.into(), xf.into(), tp.into(), pp.into(), heads.into(), hd32.into(), inter.into()],
    )
}

/// Blocks of 256 threads for a flat range of `n` elements (grid-stride beyond).
fn flat_grid(n: usize) -> (u32, u32, u32) {
    (n.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1)
}

pub(crate) fn check_same(op: &'static str, a: &CudaTensor, b: &CudaTensor) -> Result<()> {
    if a.rows != b.rows || a.cols != b.cols {
        return Err(BackendError::shape(
            op,
            format!("operands are ({}, {}) and ({}, {})", a.rows, a.cols, b.rows, b.cols),
        ));
    }
    Ok(())
}

pub(crate) fn swiglu(
    be: &CudaBackend,
    g: &CudaTensor,
    u: &CudaTensor,
    out: &mut CudaTensor,
) -> Result<()> {
    check_same("swiglu", g, u)?;
    out.check_out("swiglu", g.rows, g.cols)?;
    let n = (g.rows * g.cols) as u64;
    if n > 0 {
        let s = &be.stream;
        let (gp, gf, up, uf, op, of) = (
            dptr(&g.buf, s),
            g.is_f32(),
            dptr(&u.buf, s),
            u.is_f32(),
            dptr(&out.buf, s),
            out.is_f32(),
        );
        // All-bf16 operands of n % 8 == 0 go 8 elements a thread (elementwise.cu).
        let vec = gf == 0 && uf == 0 && of == 0 && n.is_multiple_of(8);
        let threads = if vec { n / 8 } else { n };
        be.launch(
            "swiglu",
            cfg(flat_grid(threads as usize), 256),
            &[gp.into(), gf.into(), up.into(), uf.into(), op.into(), of.into(), n.into()],
        )?;
    }
    out.rows = g.rows;
    Ok(())
}

pub(crate) fn add(be: &CudaBackend, acc: &mut CudaTensor, x: &CudaTensor) -> Result<()> {
    check_same("add", acc, x)?;
    let n = (acc.rows * acc.cols) as u64;
    if n > 0 {
        let s = &be.stream;
        let (ap, af, xp, xf) = (dptr(&acc.buf, s), acc.is_f32(), dptr(&x.buf, s), x.is_f32());
        be.launch(
            "add",
            cfg(flat_grid(n as usize), 256),
            &[ap.into(), af.into(), xp.into(), xf.into(), n.into()],
        )?;
    }
    Ok(())
}

pub(crate) fn read_f32(be: &CudaBackend, t: &CudaTensor, rows: usize) -> Result<Vec<f32>> {
    be.graph_step_end()?;
    if rows > t.rows {
        return Err(BackendError::shape("read_f32", format!("{rows} rows of {} valid", t.rows)));
    }
    let n = rows * t.cols;
    let mut host = vec![0u8; n * t.elem_bytes()];
    if n > 0 {
        let view = t.buf.slice(0..host.len());
        be.stream.memcpy_dtoh(&view, &mut host).map_err(drv("read_f32"))?;
    }
    be.stream.synchronize().map_err(drv("read_f32"))?;
    Ok(match t.dtype {
        ActDType::Bf16 => host
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect(),
        ActDType::F32 => {
            host.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (threads, shared bytes, vt, vec) of a norm launch.
    fn shape(blocks: u32, group: usize, bf16: bool, ptrs: &[u64]) -> (u32, u32, u32, i32) {
        let (cfg, [vt, vec]) = norm_launch(blocks, group, bf16, ptrs);
        let (KArg::U32(vt), KArg::I32(vec)) = (vt, vec) else { panic!("vt u32, vec i32") };
        (cfg.block_dim.0, cfg.shared_mem_bytes, vt, vec)
    }

    #[test]
    fn norm_launch_keeps_the_definitions_threads_and_picks_the_path() {
        let al = [0x1000u64, 0x2010, 0x3020];
        // Many groups: 256 real threads run the definition's 1,024 (vt), with the stage.
        assert_eq!(shape(2048, 4096, true, &al), (256, 8192, 1024, 1));
        // A decode row: one real thread a virtual one.
        assert_eq!(shape(1, 4096, true, &al), (1024, 8192, 1024, 1));
        // T below 256 is never split; vt is always norm_threads(group).
        assert_eq!(shape(4096, 576, true, &al), (256, 1152, 256, 1));
        assert_eq!(shape(4096, 128, true, &al), (32, 256, 32, 1));
        // The element path (f32, misaligned, group % 8 != 0) launches T threads, no stage.
        assert_eq!(shape(2048, 4096, false, &al), (1024, 0, 1024, 0));
        assert_eq!(shape(2048, 4096, true, &[0x1000, 0x2008]), (1024, 0, 1024, 0));
        assert_eq!(shape(2048, 4100, true, &al), (1024, 0, 1024, 0));
    }
}
