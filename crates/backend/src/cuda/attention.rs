//! The paged KV pool on the GPU: `kv_store`, `attention`, `read_kv` (`kernels/kv.cu`,
//! `kernels/attention.cu`).
//!
//! Attention runs on tensor cores (design and exactness argument in attention.cu): a CTA per
//! (row tile of one sequence, kv head), the GQA group's query heads packed on the mma's M
//! side, KV tiles of 64 and splits of 128 positions at absolute boundaries, splits merged
//! sequentially. Two modes give the same bits per row: calls of at most `split_rows` rows
//! (decode) run one CTA per split (`attention_dec_hd*`) plus `attention_combine`; larger
//! calls (prefill) let each CTA walk every split itself (`attention_hd*`), so they need no
//! partial buffer. A decode CTA whose row tile has at most 16 M-rows (every decode row)
//! spreads the general kernel's warp-0 arithmetic over its 4 warps: warp w scores KV tile w
//! of the split and computes its softmax weights, then every warp runs the P V chains of a
//! quarter of the output dims, with the same operands in the same order per element (larger
//! row tiles run the general code in the same entry). head_dim 256 has no decode entry (a
//! split's KV does not fit in shared memory): split mode runs `attention_hd256`.
//! `TENSORFOLD_DECODE_ATTN=0` runs split mode on the general entry (an A/B switch; same bits).
//! The decode CTA's shared memory: the split's K tiles and V tiles (with splits of 256, the
//! `TF_SPLIT=256` knob, V takes K's buffers after the scores so that 99,088 B at head_dim 128
//! stay under sm_89's 101,376 B opt-in limit) and the weights' bf16 pieces. On sm_90 it loads
//! K and V rows with bulk copies (the TMA unit, `TF_DEC_TMA`, attention_dec.cu).
//! Measured on an H200 (tests/cuda_attention.rs, llama3-8b heads, one row, in a graph),
//! 2026-12-01: 8.85 / 8.79 / 10.12 / 16.68 us a call at 128 / 384 / 1,024 / 4,096 positions;
//! 11.9 / 18.1 / 18.8 / 23.2 with splits of 256 and cp.async loads (session 7's kernel); 19.1 /
//! 28.2 / 29.0 / 33.3 with the general entry (session 5).
//! Rejected: the merge done by the last split CTA to finish (an atomic counter per row tile,
//! no combine launch): 11.4 / 20.5 / 22.0 / 27.1 us, slower past one split, as its serial
//! partial reads from L2 cost more than the launch they save (session 20 again, on the
//! decode CTA, four merges a thread at once, the o product triggered at the grid's end:
//! exact, but bench decode -3.6%, -10% at 2,000 positions); splits of 64 positions (faster
//! to 1,024 positions, 25.5 us at 4,096: two waves of CTAs); 8-warp decode CTAs (the general
//! path they also run for larger row tiles is written for 4); a layer-major pool
//! (`TENSORFOLD_KV_LAYOUT=layer`: same decode speed, so a split's blocks lying 2 MB apart was
//! not what slowed the loads).
//!
//! Graph safety: every launch's grid, arguments and shared memory are a function of the row
//! count, the pool geometry, the head shape and fixed buffers, never of positions. The split
//! grid is sized for the most splits the pool can hold (CTAs without work exit), and the
//! partial buffer is allocated once at its full size (`split_plan`) on the first split-mode
//! call. Rejected: sizing by the batch's largest position (changes every few steps).
//! head_dim 256 is tensor-core too but spills registers (slower); 64, 96, 128 do not spill
//! much (see the NVRTC log with `--ptxas-options=-v`).

use cudarc::driver::LaunchConfig;

use super::tensor::{dptr, CudaBatch, CudaKv, CudaTensor};
use super::{drv, CudaBackend, KArg, KvWrite};
use crate::batch::KvGeometry;
use crate::error::{BackendError, Result};
use crate::{ActDType, AttnArgs};

pub(crate) fn kv_store(
    be: &CudaBackend,
    kv: &mut CudaKv,
    layer: usize,
    (k, v): (&CudaTensor, &CudaTensor),
    batch: &CudaBatch,
) -> Result<()> {
    kv.check_batch("kv_store", layer, batch)?;
    let g = kv.geom;
    let rows = batch.rows();
    for t in [k, v] {
        if t.cols != g.kv_heads * g.head_dim || t.rows != rows {
            return Err(BackendError::shape(
                "kv_store",
                format!(
                    "k/v are ({}, {}), expected ({rows}, {})",
                    t.rows,
                    t.cols,
                    g.kv_heads * g.head_dim
                ),
            ));
        }
    }
    if rows == 0 {
        return Ok(());
    }
    let s = &be.stream;
    let (pool, kp, kf, vp, vf) =
        (dptr(&kv.buf, s), dptr(&k.buf, s), k.is_f32(), dptr(&v.buf, s), v.is_f32());
    let (pos, rt, tab) = (
        batch.ptr(s, batch.at.positions),
        batch.ptr(s, batch.at.row_table),
        batch.ptr(s, batch.at.tables),
    );
    let (bstride, loff) = kv.region("kv_store", layer)?;
    let dims = [bstride, loff, g.kv_heads as u32, g.head_dim as u32, g.block_size as u32];
    let cfg =
        LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut args: Vec<KArg> = vec![pool.into(), kp.into(), kf.into(), vp.into(), vf.into()];
    args.extend([pos, rt, tab].map(KArg::U64));
    args.extend(dims.map(KArg::U32));
    be.launch("kv_store", cfg, &args)?;
    be.wrote_kv(KvWrite { pool, positions: pos, region: (bstride, loff) });
    Ok(())
}

/// Positions per KV split by default, per KV tile, query M-rows per CTA (`SPLIT`, `TK`,
/// `MROWS` in attention.cu).
const SPLIT: usize = 128;
/// The longest split `TF_SPLIT` may ask for (the registry's shared memory is sized for it).
pub(crate) const MAX_SPLIT: usize = 256;
const TK: usize = 64;
const MROWS: usize = 64;
/// Most rows a call may have to run in split mode (one CTA per split, then the combine).
const SPLIT_MODE_MAX_ROWS: usize = 32;
/// Most bytes of split partials; a pool so large that one row's partials exceed it runs every
/// call in the CTA-walks-all-splits mode (same bits, less parallel for decode).
const PARTIAL_BUDGET: usize = 256 << 20;

/// Query M-rows of a decode CTA (`DROWS` in attention.cu).
const DROWS: usize = 16;
/// Warps of a decode CTA (`WARPS`), the most that share a KV tile (`WPT` in attention_dec.cu).
const DEC_WARPS: usize = 4;

/// Dynamic shared memory of the attention kernel for `head_dim`: q, then K and V tiles of
/// `head_dim + 8` bf16 per row, two of each up to head_dim 128 (`TF_ATTN_DB` in attention.cu;
/// with it off the kernel uses one of each of this room).
pub(crate) const fn attention_smem(head_dim: usize) -> u32 {
    let bufs = if head_dim <= 128 { 2 } else { 1 };
    ((MROWS + 2 * bufs * TK) * (head_dim + 8) * 2) as u32
}

/// Dynamic shared memory of the split-mode entries (`attention_dec_hd*`) for splits of
/// `split` positions: the larger of the decode CTA's (every KV tile of a split, twice when
/// V has buffers of its own (at most 2 tiles), 16 q rows, the weights' bf16 pieces in fragment
/// order, tile maxima and sums: `dec_smem` in attention.cu, then two mbarriers for the
/// `TF_DEC_TMA` build) and `attention_smem`'s. Largest at `MAX_SPLIT` (the registry's figure).
pub(crate) const fn attention_dec_smem(head_dim: usize, split: usize) -> u32 {
    let tiles = split / TK;
    let buffers = if tiles <= 2 { 2 * tiles } else { tiles };
    let dec = (buffers * TK + DROWS) * (head_dim + 8) * 2
        + tiles * (TK / 16) * 3 * 4 * 32 * 4
        + tiles * DROWS * (DEC_WARPS + 1) * 4
        + tiles * 2 * 32 * 4
        + 16;
    let all = attention_smem(head_dim) as usize;
    (if dec > all { dec } else { all }) as u32
}

/// The wgmma prefill entry (`attention90.cu`, sm_90a, head_dim 128): walk mode's CTA with
/// `WG_MROWS` M-rows, `WG_THREADS` threads and `attention_wg_smem()` bytes.
pub(crate) const WG_ENTRY: &str = "attention_wg_hd128";
pub(crate) const WG_THREADS: u32 = 256;
const WG_MROWS: usize = 128;
const WG_TABLE: usize = 4096;

/// Dynamic shared memory of `attention_wg_hd128` (`AW_SMEM` in attention90.cu): q (128 M-rows
/// of 128 bf16), two K and two V tiles of 64 positions, the split totals (64 floats a thread),
/// the row tile's block table (`WG_TABLE` ids, `AW_TBL`), 1 KiB to align the swizzled tiles.
pub(crate) const fn attention_wg_smem() -> u32 {
    (WG_MROWS * 128 * 2 + 4 * TK * 128 * 2 + 64 * WG_THREADS as usize * 4 + WG_TABLE * 4 + 1024)
        as u32
}

/// The same CTA with a copy warpgroup (`attention90ws.cu`): `WS_THREADS` threads, the
/// shared memory of `attention_wg_hd128`, its eight mbarriers and 8 bytes a consumer thread
/// (`AWS_SMEM`). `TENSORFOLD_ATTN_WS=0` (an A/B switch, read once: the same bits either way)
/// takes `attention_wg_hd128` instead.
pub(crate) const WS_ENTRY: &str = "attention_ws_hd128";
pub(crate) const WS_THREADS: u32 = 384;
pub(crate) const fn attention_ws_smem() -> u32 {
    attention_wg_smem() + 64 + 8 * WG_THREADS
}
fn ws_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TENSORFOLD_ATTN_WS").map_or(true, |v| v != "0"))
}

/// Whether walk mode takes the wgmma CTA for `rows` rows of `seqs` sequences: head_dim 128
/// on sm_90a, unless `TENSORFOLD_ATTN_WG=0` (an A/B switch, read once: the same bits either
/// way). A group of more than `WG_MROWS` query heads (no such model) takes the mma.sync CTA.
/// The wgmma CTA runs the row tiles of its window (`WG_MROWS / group` rows) one after
/// another: it pays where the rows fill windows on average (prefill chunks), not for many
/// sequences' short tiles (a 64-stream decode step), which the general CTA, one a row, runs
/// in parallel (session 14: 16 / 64 streams 1,085 / 1,959 -> 1,566 / 2,627 tok/s).
fn wg_walk(be: &CudaBackend, head_dim: usize, group: usize, rows: usize, seqs: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    head_dim == 128
        && group <= WG_MROWS
        && rows >= (WG_MROWS / group) * seqs
        && super::wgmma::runs_on(be.arch())
        && *ON.get_or_init(|| std::env::var("TENSORFOLD_ATTN_WG").map_or(true, |v| v != "0"))
}

/// Whether an attention call of `rows` rows over `g` with `heads` query heads runs the decode
/// entries in split mode on an sm_90 GPU, whose CTAs copy older KV rows before their wait
/// (`TF_DEC_EARLY`): then rope_kv_store lets it launch before its own wait (rope.cu).
pub(crate) fn copies_early(be: &CudaBackend, g: &KvGeometry, heads: usize, rows: usize) -> bool {
    let dec = entry_for(g.head_dim).and_then(|e| Ok(Plan::of(g, heads, rows, e)?.dec));
    dec.unwrap_or(false) && !split_loop() && super::wgmma::runs_on(be.arch())
}

/// How a call of `rows` rows runs: in split mode (one CTA per split, then the combine) when
/// its partials fit (`split_rows`, of `nsplit` splits a row), and then on the decode entries
/// (`dec`) unless `TENSORFOLD_DECODE_ATTN=0` or the head shape has none.
struct Plan {
    split: usize,
    split_rows: usize,
    nsplit: usize,
    split_mode: bool,
    dec: bool,
}

impl Plan {
    fn of(
        g: &KvGeometry,
        heads: usize,
        rows: usize,
        (walk_entry, split_entry): (&str, &str),
    ) -> Result<Plan> {
        let split = split_len()?;
        let (split_rows, nsplit) = split_plan(g, heads, split);
        let split_mode = rows <= split_rows && nsplit > 1;
        let dec = split_mode && decode_entries_enabled() && split_entry != walk_entry;
        Ok(Plan { split, split_rows, nsplit, split_mode, dec })
    }
}

/// The entry points for `head_dim`: (one CTA walks every split, split mode). head_dim 256
/// has no decode entry (its KV tiles of a split do not fit in shared memory): split mode
/// runs the general kernel, one split per CTA.
fn entry_for(head_dim: usize) -> Result<(&'static str, &'static str)> {
    Ok(match head_dim {
        64 => ("attention_hd64", "attention_dec_hd64"),
        96 => ("attention_hd96", "attention_dec_hd96"),
        128 => ("attention_hd128", "attention_dec_hd128"),
        256 => ("attention_hd256", "attention_hd256"),
        _ => {
            return Err(BackendError::Device(format!(
                "attention: head_dim {head_dim} is not implemented on the CUDA backend (64, 96, 128, 256 are)"
            )))
        }
    })
}

/// `TENSORFOLD_DECODE_ATTN=0` runs split mode on the general entry (the kernel before the
/// decode entries; the same bits, slower): an A/B switch for measurements, read once.
fn decode_entries_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TENSORFOLD_DECODE_ATTN").map_or(true, |v| v != "0"))
}

/// Positions a KV split: `SPLIT`, or `TF_SPLIT` of `TENSORFOLD_KERNEL_DEFINES` (64, 128 or
/// `MAX_SPLIT`; NVRTC compiles the kernels with the same define). A measurement knob: the split is
/// part of the kernel's arithmetic definition, so another value gives other bits (the same
/// for every path). Read once; a value the kernels cannot take is an error at launch.
fn split_len() -> Result<usize> {
    static LEN: std::sync::OnceLock<std::result::Result<usize, String>> =
        std::sync::OnceLock::new();
    let len = LEN.get_or_init(|| match super::compile::kernel_define("TF_SPLIT").as_deref() {
        None => Ok(SPLIT),
        Some("256") => Ok(MAX_SPLIT),
        Some("128") => Ok(128),
        Some("64") => Ok(64),
        Some(v) => Err(format!("TF_SPLIT={v}: the attention kernels take 64, 128 or 256")),
    });
    len.clone().map_err(BackendError::Device)
}

/// Whether the decode entries loop over splits (`TF_SPLIT_LOOP=1` in
/// `TENSORFOLD_KERNEL_DEFINES`, which NVRTC gets too): then the split grid may be bounded.
/// An A/B switch, read once.
fn split_loop() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| super::compile::kernel_define("TF_SPLIT_LOOP").is_some_and(|v| v != "0"))
}

/// The z extent of a split-mode grid of the decode entries: one CTA per split of the pool, or,
/// when those CTAs loop over splits (`looped`), two CTAs an SM over the call's (row tile, kv
/// head) pairs, at least one and at most every split. The pool's split count is the most a
/// row may need; a CTA that finds no split of its row exits. A function of the row count and
/// the geometry only (graph capture).
pub(crate) fn split_grid(
    rows: usize,
    kv_heads: usize,
    nsplit: usize,
    sms: usize,
    looped: bool,
) -> usize {
    if !looped {
        return nsplit;
    }
    (2 * sms).div_ceil((rows * kv_heads).max(1)).clamp(1, nsplit.max(1))
}

/// The split-partial layout of a pool: (rows that may run in split mode, splits per row).
/// A function of the pool geometry, the head count and the split length only, so the partial
/// buffer is sized once and every launch's grid is fixed by the row count (CUDA graph capture).
fn split_plan(g: &KvGeometry, heads: usize, split: usize) -> (usize, usize) {
    let nsplit = (g.num_blocks * g.block_size).div_ceil(split).max(1);
    let per_row = heads * nsplit * (g.head_dim + 2) * 4;
    // A grid's z extent is at most 65,535.
    let rows = if nsplit > 65_535 { 0 } else { PARTIAL_BUDGET / per_row.max(1) };
    (SPLIT_MODE_MAX_ROWS.min(rows), nsplit)
}

/// The split partial buffer of at least `len` floats, allocated once at its full size.
fn partials(be: &CudaBackend, len: usize) -> Result<u64> {
    let mut scratch = be.scratch.lock().unwrap_or_else(|e| e.into_inner());
    if scratch.as_ref().is_none_or(|b| b.len() < len) {
        *scratch = Some(be.raw::<f32>(len, "attention split partials")?);
    }
    Ok(scratch.as_ref().map_or(0u64, |b| dptr(b, &be.stream)))
}

pub(crate) fn attention(be: &CudaBackend, a: AttnArgs<'_, CudaBackend>) -> Result<()> {
    let (kv, batch) = (a.kv, a.batch);
    kv.check_batch("attention", a.layer, batch)?;
    let g = &kv.geom;
    let rows = batch.rows();
    g.check_attention(a.heads, a.kv_heads, a.head_dim, (a.q.rows, a.q.cols), rows)?;
    a.out.check_out("attention", rows, a.q.cols)?;
    if a.q.dtype != ActDType::Bf16 || a.out.dtype != ActDType::Bf16 {
        return Err(BackendError::shape("attention", "q and out must be bf16 on the CUDA backend"));
    }
    let group = a.heads / a.kv_heads;
    if group > MROWS {
        return Err(BackendError::Device(format!(
            "attention: {group} query heads per kv head; the CUDA kernel packs at most {MROWS}"
        )));
    }
    let entries = entry_for(a.head_dim)?;
    if rows * a.kv_heads > i32::MAX as usize {
        return Err(BackendError::shape(
            "attention",
            format!("{rows} rows x {} kv heads", a.kv_heads),
        ));
    }
    if rows > 0 {
        launch(be, &a, rows, entries)?;
    }
    a.out.rows = rows;
    Ok(())
}

/// The launches of one attention call of `rows` rows: a function of the row count, the pool
/// geometry, the head shape and fixed buffers only (graph capture).
fn launch(
    be: &CudaBackend,
    a: &AttnArgs<'_, CudaBackend>,
    rows: usize,
    (walk_entry, split_entry): (&'static str, &'static str),
) -> Result<()> {
    let g = &a.kv.geom;
    let Plan { split, split_rows, nsplit, split_mode, dec } =
        Plan::of(g, a.heads, rows, (walk_entry, split_entry))?;
    let part = if split_mode {
        partials(be, split_rows * a.heads * nsplit * (a.head_dim + 2))?
    } else {
        0
    };
    let s = &be.stream;
    let (q, pool, out) = (dptr(&a.q.buf, s), dptr(&a.kv.buf, s), dptr(&a.out.buf, s));
    let batch = a.batch;
    let (pos, rt, tab) = (
        batch.ptr(s, batch.at.positions),
        batch.ptr(s, batch.at.row_table),
        batch.ptr(s, batch.at.tables),
    );
    let (bstride, loff) = a.kv.region("attention", a.layer)?;
    // Mode bit 1 (decode entries): the previous launch wrote exactly this call's rows of this
    // layer, so the CTAs may copy older rows before waiting for it (`TF_DEC_EARLY`).
    let wrote = KvWrite { pool, positions: pos, region: (bstride, loff) };
    let early =
        dec && be.kv_written.lock().unwrap_or_else(|e| e.into_inner()).as_ref() == Some(&wrote);
    let dims = [
        rows as u32,
        bstride,
        loff,
        a.heads as u32,
        a.kv_heads as u32,
        g.block_size as u32,
        split_mode as u32 | (early as u32) << 1,
        nsplit as u32,
    ];
    let group = a.heads / a.kv_heads;
    // The wgmma CTA finds a position's block by shifts: power-of-two blocks only (the pool's 16).
    let wg = !split_mode
        && g.block_size.is_power_of_two()
        && wg_walk(be, a.head_dim, group, rows, batch.meta.seqs.len());
    let (name, smem, threads) = if dec {
        (split_entry, attention_dec_smem(a.head_dim, split), 128)
    } else if wg && ws_on() {
        (WS_ENTRY, attention_ws_smem(), WS_THREADS)
    } else if wg {
        (WG_ENTRY, attention_wg_smem(), WG_THREADS)
    } else {
        (walk_entry, attention_smem(a.head_dim), 128)
    };
    let looped = dec && split_loop();
    let z = if split_mode { split_grid(rows, a.kv_heads, nsplit, be.sms, looped) } else { 1 };
    // The wgmma CTAs take a window of WG_MROWS / group rows (the row tiles starting in it).
    let ctas = if wg { rows.div_ceil(WG_MROWS / group) } else { rows };
    let cfg = LaunchConfig {
        grid_dim: ((ctas * a.kv_heads) as u32, 1, z as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem,
    };
    let mut args: Vec<KArg> = [q, pool, out, part, pos, rt, tab].map(KArg::U64).to_vec();
    args.extend(dims.map(KArg::U32));
    args.push(a.scale.into());
    be.launch(name, cfg, &args)?;
    if split_mode {
        let (heads, hd, ns) = (a.heads as u32, a.head_dim as u32, nsplit as u32);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, heads, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [out.into(), part.into(), pos.into(), heads.into(), hd.into(), ns.into()];
        be.launch("attention_combine", cfg, &args)?;
    }
    Ok(())
}

pub(crate) fn read_kv(
    be: &CudaBackend,
    kv: &CudaKv,
    layer: usize,
    block_table: &[u32],
    len: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let g = &kv.geom;
    let (kvh, hd, bs) = (g.kv_heads, g.head_dim, g.block_size);
    if layer >= g.layers || block_table.len() < len.div_ceil(bs) {
        return Err(BackendError::shape(
            "read_kv",
            format!("layer {layer}, {len} positions in {} blocks of {bs}", block_table.len()),
        ));
    }
    if let Some(b) = block_table.iter().find(|&&b| b as usize >= g.num_blocks) {
        return Err(BackendError::shape("read_kv", format!("block {b} of {}", g.num_blocks)));
    }
    let (mut k, mut v) = (vec![0f32; len * kvh * hd], vec![0f32; len * kvh * hd]);
    let mut planes = vec![0u16; 2 * kv.plane];
    let (bstride, loff) = kv.layout.region(g, layer);
    for (bi, &blk) in block_table[..len.div_ceil(bs)].iter().enumerate() {
        let off = (blk as usize * bstride + loff) * 2 * kv.plane;
        let view = kv.buf.slice(off..off + 2 * kv.plane);
        be.stream.memcpy_dtoh(&view, &mut planes).map_err(drv("read_kv"))?;
        be.stream.synchronize().map_err(drv("read_kv"))?;
        for slot in 0..bs.min(len - bi * bs) {
            let pos = bi * bs + slot;
            for h in 0..kvh {
                for d in 0..hd {
                    let at = (h * bs + slot) * hd + d;
                    let i = pos * kvh * hd + h * hd + d;
                    k[i] = f32::from_bits((planes[at] as u32) << 16);
                    v[i] = f32::from_bits((planes[kv.plane + at] as u32) << 16);
                }
            }
        }
    }
    Ok((k, v))
}

#[cfg(test)]
mod tests {
    use super::{split_grid, DEC_WARPS, DROWS, WG_TABLE};

    #[test]
    fn the_wg_table_mirrors_the_kernel_source() {
        let src = include_str!("../../kernels/attention90.cu");
        assert!(src.contains(&format!("#define AW_TBL {WG_TABLE}\n")), "AW_TBL is not {WG_TABLE}");
        // attention_ws_smem: AW_SMEM + the mbarriers + 8 bytes a consumer thread.
        let ws = include_str!("../../kernels/attention90ws.cu");
        let smem = "#define AWS_SMEM (AWS_BAR + 64 + 8 * AW_THREADS + 1024)\n";
        assert!(ws.contains(smem) && src.contains("#define AW_SMEM (AW_T + AW_TBL * 4 + 1024)\n"));
        assert!(ws.contains("#define AWS_BAR (AW_T + AW_TBL * 4)\n"));
    }

    /// `attention_dec_smem` sizes the decode CTA's tile maxima for `DEC_WARPS` parts a tile
    /// and its q for `DROWS` rows: the kernel's WARPS and DROWS.
    #[test]
    fn the_decode_cta_shape_mirrors_the_kernel_source() {
        let src = include_str!("../../kernels/attention.cu");
        assert!(src.contains(&format!("#define WARPS {DEC_WARPS}\n")), "WARPS is not {DEC_WARPS}");
        let dec = include_str!("../../kernels/attention_dec.cu");
        assert!(dec.contains(&format!("#define DROWS {DROWS}\n")), "DROWS is not {DROWS}");
    }

    /// The bounded grid: two CTAs an SM over the call's (row, kv head) pairs, within
    /// 1..=nsplit; unbounded, one CTA per split of the pool.
    #[test]
    fn split_grid_bounds_the_z_extent_by_rows_and_sms() {
        assert_eq!(split_grid(1, 8, 160, 132, true), 33);
        assert_eq!(split_grid(16, 8, 160, 132, true), 3);
        assert_eq!(split_grid(32, 8, 160, 132, true), 2);
        assert_eq!(split_grid(1, 8, 2, 132, true), 2);
        assert_eq!(split_grid(64, 64, 160, 132, true), 1);
        assert_eq!(split_grid(1, 8, 160, 132, false), 160);
    }
}
