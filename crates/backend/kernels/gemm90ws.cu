// linear_bf16_ws: the prefill linear product on sm_90a, both operands brought by tensor copies
// (TMA) and read by wgmma from shared memory; the same arithmetic per element as linear_bf16
// (linear.cu's header defines it; gemm90.cu's header says why a wgmma k16 step can give an
// mma.sync step's bits). Compiled in one unit after gemm90.cu, whose helpers it uses.
//
// linear_bf16's k16 steps are 16 consecutive k, so natural [row][64 k] tiles in the 128-byte
// swizzle are wgmma's operands as they are: the weight tile (the M side) and the token tile (the N
// side) each arrive by one 2-D tensor copy of the host's maps (the weight's, made per call from
// its address; the input's, made per call too), zeros past n, past the call's rows and past K.
// Each wgmma k16 step reads one step's 16 k of both. Per element, as linear_bf16: super-steps of
// 32 k from k = 0, k >= K zeros, super-steps wholly past K not run; the chain restarts from +0 at
// each slice start; `tot = acc` or `tot += acc` at a slice end; each empty trailing slice adds
// +0.0; bias; one rounding. tests/cuda_wgmma.rs compares it with linear_bf16 bit for bit.
//
// Launch (persistent): one CTA an SM walks tiles blockIdx.x, + gridDim.x, ... of 128 features x
// 128 tokens (TF_WS_GROUP feature tiles at a time). Warpgroup 0 is the copy warpgroup (registers
// given up with setmaxnreg; one thread issues): for each stage's k tile (TF_WS_KT, 128) it waits
// for a free stage, arms the stage's `full` mbarrier with the bytes to come and issues the tensor
// copies (two a 64-k sub-tile). Warpgroups 1 and 2 each own 64 features of the tile: wait for
// `full`, issue TF_WS_KT / 16 wgmma m64n128k16 (SS), commit, and once the tile's group before has
// completed (TF_WS_DEPTH groups in flight) release that stage on `empty`. A CTA's next tile's
// copies run while its consumers store the last one: bf16 outputs by stmatrix into a staging area
// and then one tensor store of the staged tile (`ws_store_staged`, TF_WS_TMA_STORE), f32 outputs
// element by element. The staged epilogue (session 12, H200, same call; its chunks then left by
// per-thread 16-byte stores): 392 -> 568 TFLOP/s at 4096 x 4096 and 2,048 rows, 337 -> 452 at
// 1024 x 4096, 430 -> 600 at 14336 x 4096, 530 -> 659 at 4096 x 14336; served prefill 2,048 /
// 8,192: 22,547 / 15,335 -> 25,916-26,557 / 16,695 tok/s. ncu before it (q shape): tensor pipe
// active 38% of the time, the top stalls instruction fetch and barrier waits; its 64 element
// stores a thread (half of each 32-byte sector used) held both consumers
// away from the next tile. Branches between wgmmas are warp-uniform by construction (role from a
// shuffle, arrivals predicated inside the asm): ptxas serializes the wgmmas otherwise.
//
// History (H200, docs/bench/2026-12-02-h200.md): under the earlier definition (step e of a
// super-step took {k0 + 8c + 4e + 0..3 : c}) this kernel took the weights as the wgmma's register
// operand (each lane's ld.shared.v4 was linear_bf16's lane load) and the activations from an image
// packed by an extra kernel: 230-451 TFLOP/s at 2,048 rows, packing included, ncu showing a third
// of the issue stalls on instruction fetch. Dropped then, same bits: the weight tile by one 1-D
// bulk copy a 128-byte row (50-66 TFLOP/s) and by 16-byte cp.async from the copy warpgroup
// (131-310). Session 14 (bit-equal, dropped, commit 5ad7563): clusters of two CTAs over pairs of
// token tiles, each copying half of the shared weight tile to both by a multicast tensor copy and
// releasing stages on both CTAs' mbarriers: 228-260 TFLOP/s against this kernel's 476-558 in the
// same call, though ncu had shown its L2 throughput at 62-71%. Session 15 (5ad7563 restored with
// knobs, measured, not landed): the half speed was the consumers'
// `mbarrier.arrive.release.cluster` on the peer's `empty` (TFLOP/s at 2,048 rows on five shapes:
// with the instruction's default semantics the pair ran 404-556, without multicast too 405-507,
// independent CTAs launched as pairs 389-501, that build's single CTA 414-560). Multicast gained
// nothing, so L2 bandwidth is not this kernel's wall. That build's single CTA (the same loop,
// templated on the cluster size) ran 15-18% below HEAD's (564-659, same call), its SASS different
// throughout the k loop (the tile walk's values in regular rather than uniform registers, among
// others). Compare the SASS of a change here with the previous build's (tools/kernel_regs.py
// --sass) before timing it. Also session 15, measured and dropped: gate, up and their SwiGLU in
// one launch (tiles of 64 features of both weights, warpgroup 0 gate, 1 up, act from the staged
// gate and up read back): bit-equal to the three launches (tests/cuda_fused.rs at 128 and 2,048
// rows) but served prefill 2,048 29.2k / 29.1k tok/s against 30.3k / 30.6k unfused (8,192: 22.1k /
// 21.7k vs 22.9k / 22.2k): the longer epilogue cost more than the `swiglu` kernel it saved.
//
// Session 18: `linear_bf16_ws3` runs q, k and v (or gate and up) in one launch, each product's
// tiles on its own raster and K split (WsParts), so each element is the single launch's
// (tests/cuda_fused.rs at 2,048 rows, bit for bit). H200, ncu, 2,048 rows of llama3-8b: q/k/v
// 176.7 us against 119.4 + 39.8 + 40.9 as three launches, gate/up 738.2 against 374.4 +
// 368.7 (the 128-tile k and v launches each left 4 SMs idle and ended in their own tail).
// `TENSORFOLD_WS_GROUP=0` launches them one by one.
//
// Session 22 (H200, docs/bench/2026-12-04-h200.md), both bit-equal to linear_bf16 (0 of 840M
// elements differ; cuda_fused at 2,048 rows; check exact fingerprints unchanged):
// - 128 x 192 token tiles (`linear_bf16_ws_t192`: wgmma m64n192k16, acc + tot = 192
//   registers after setmaxnreg, no spills; 4 stages of 64 k + 48 KiB of staging): 17% fewer
//   operand bytes a FLOP, yet slower on every llama3-8b shape but one (TFLOP/s at 2,048 rows,
//   128 -> 192: 4096 x 4096 627 -> 584, 1024 x 4096 545 -> 388, 6144 x 4096 633 -> 620,
//   14336 x 4096 648 -> 653, 4096 x 14336 715 -> 584) and served prefill 2,048 ~2% slower
//   (medians of 3 warm reps, 3 rounds: 32.9-33.3k vs 33.6-34.0k tok/s). With session 15's
//   multicast result, operand traffic is not what bounds this kernel. Not landed.
// - The staged tile leaving by one tensor store (TF_WS_TMA_STORE): neutral (prefill 2,048
//   34.1-34.2k vs 34.0-34.2k tok/s, same measure; TFLOP/s within 1%, but 4096 x 14336 at
//   8,192 rows 679 vs 699); kept: the consumers no longer issue the tile's global stores,
//   the ground a longer epilogue (session 15's fused SwiGLU) would need.
// - Gate, up and SwiGLU in one launch again (`linear_bf16_ws_swiglu`, built, not landed): tiles
//   of 64 features of both weights (gate's rows 0-63 of the weight sub-tile by a 64-row tensor
//   map, up's 64-127), consumer 0 gate's chains, 1 up's, this loop unchanged; each stages its
//   tile and stores it by a tensor copy, then both compute act from the two stagings. Bit-equal
//   (cuda_fused at 128 and 2,048 rows, check exact, contract 62/62). With act through warpgroup
//   0's staging and a third tensor copy (4 barriers a tile, a wait for the first copies' reads):
//   ncu 781 us a 2,048-row call against 725 + 54 (gate/up + swiglu), served 2,048 -0.3%; with
//   act stored from registers (2 barriers): 776 against 728 + 54, served 2,048 33.4-33.5k vs
//   33.5-33.7k, 8,192 25.7k vs 25.5k: neutral both ways; the epilogue costs what the launch
//   saved.
// - nvidia-smi during back-to-back 2,048 prefills: the SM clock falls from 1,980 to 1,545-1,800
//   MHz with the software power cap as the throttle reason (~600-700 W): prefill here is
//   power-bound, so energy a FLOP, not only issue, sets the rate.
//
// Everything here compiles to nothing below sm_90a (the host never picks it there).

// TF_WS_DEPTH (a measurement knob): wgmma groups a consumer warpgroup keeps in flight, 1
// (default: each tile's group completes before its stage is released; the other warpgroup's
// group keeps the tensor cores busy) or 2 (a tile's stage is released once the next tile's
// group is issued and the tile's own has completed). Speed only. H200, 2026-12-02, served
// prefill 2,048 / 8,192: 22,592 / 15,360 tok/s at 1, 22,270 / 15,224 at 2 (same call).
// Depth 2 runs ws_tile_k, not the fold-after-wait loop (TF_WS_FOLD). Session 21 built depth 2
// into that loop too (a stage ending no slice waited for the previous stage's group only;
// the 8 HGMMAs stayed unbroken): same bits, but 4-9% slower on every llama3-8b shape (2,048
// rows, 4096 x 4096: 594-597 vs 637 TFLOP/s) and prefill 2,048 31.5-31.7k vs 32.3-34.0k
// (rep 0), so it was not landed (docs/bench/2026-12-04-h200.md).
#ifndef TF_WS_DEPTH
#define TF_WS_DEPTH 1
#endif

// TF_WS_GROUP (a measurement knob): feature tiles walked together before the token tile
// advances (L2 reuse; no element's arithmetic).
#ifndef TF_WS_GROUP
#define TF_WS_GROUP 8
#endif

// A CUtensorMap as the driver encodes it (opaque; 64-byte aligned kernel parameter).
struct __align__(64) WsMap {
    u64 v[16];
};

#define WS_BM 128
#define WS_BN 128
// TF_WS_KT: k a stage, 128 (default: 3 stages of two 64-k sub-tiles an operand, each its own
// tensor copy, so a consumer's wgmma group covers 128 k and the wait that ends each group,
// ncu's top stall at 64 (31% of the samples, session 15), comes half as often) or 64 (a
// measurement knob: 6 stages). Speed only: the same k16 steps in the same order, folds where
// the slices end. H200, session 15, same call, TFLOP/s at 2,048 rows 64 -> 128: 4096 x 4096
// 570 -> 585, 1024 x 4096 450 -> 481, 6144 x 4096 573 -> 586, 14336 x 4096 602 -> 622,
// 4096 x 14336 665 -> 695; `TF_WS_DEPTH=2` at 64: 578 / 486 / 581 / 611 / 678.
#ifndef TF_WS_KT
#define TF_WS_KT 128
#endif
#if TF_WS_KT == 128
#define WS_STAGES 3
#else
#define WS_STAGES 6
#endif
// A stage's 64-k sub-tile of an operand (128 rows x 128 bytes), and its whole tiles.
#define WS_SUB (WS_BM * 128)
#define WS_A_BYTES (WS_SUB * (TF_WS_KT / 64))
#define WS_B_BYTES (WS_SUB * (TF_WS_KT / 64))
#define WS_STAGE (WS_A_BYTES + WS_B_BYTES)
// The bf16 epilogue's staging: a consumer warpgroup's 128 tokens x 64 features, 128-byte rows.
#define WS_EPI_BYTES (WS_BN * 128)
// Stages (weight tile, then token tile: 1,024-byte multiples), the two consumers' staging
// (1,024-byte aligned: the output's tensor copies read it in the 128-byte swizzle), their
// mbarriers (full[s], empty[s]) and 1 KiB of slack to align the tiles to the 1,024-byte
// swizzle atom. cuda/wgmma.rs `LINEAR_WS` mirrors it.
#define WS_SMEM (WS_STAGES * WS_STAGE + 2 * WS_STAGES * 8 + 2 * WS_EPI_BYTES + 1024)

// TF_WS_TMA_STORE: 1 (default) a consumer's staged bf16 tile leaves by one tensor copy to
// global memory (the output's map, box 64 features x 128 tokens, the staging's own swizzle;
// rows past the call's and features past n are not written), issued by the warpgroup's thread
// 0, so the consumers go on to the next tile while it drains; before the staging is written
// again that thread waits for the copy's reads. 0 (a measurement knob): every thread stores
// its 16-byte chunks. Same values, same bytes written.
#ifndef TF_WS_TMA_STORE
#define TF_WS_TMA_STORE 1
#endif

#if WG_ENABLED
// The staged tile at shared `src` to box (x, y) of `map` (a bulk-group tensor copy).
__device__ __forceinline__ void ws_tensor_store(const WsMap& map, u32 x, u32 y, u32 src) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n\t"
        "cp.async.bulk.commit_group;" ::"l"((u64)&map),
        "r"(x), "r"(y), "r"(src)
        : "memory");
}
// Waits until this thread's tensor stores have read their shared memory (`Read`) or are
// complete and visible.
template <bool Read>
__device__ __forceinline__ void ws_store_wait() {
    if (Read) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    else asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// Arrives on bar when `pred` (a predicate inside the asm, not a branch: a lane-dependent
// branch between wgmmas makes ptxas serialize them).
__device__ __forceinline__ void ws_mbar_arrive_if(u32 bar, bool pred) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %1, 0;\n\t@p mbarrier.arrive.shared::cta.b64 _, [%0];\n\t}" ::"r"(bar),
                 "r"((u32)pred)
                 : "memory");
}
// One 2-D tensor copy of box (x, y) of `map` to shared dst, completing on bar.
__device__ __forceinline__ void ws_tensor_copy(u32 dst, const WsMap& map, u32 x, u32 y, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"((u64)&map), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

// What a CTA walks: its tiles, the k tiles of each, the stage ring position.
struct WsGrid {
    u32 k, rows, tiles, ktiles;
    u32 full, empty, sbase;  // shared addresses: full[s] = full + 8 s, likewise empty
    u32 stage_out;           // the consumers' epilogue staging (WS_EPI_BYTES each)
};

// A tile of a launch: its product's weight map, bias, output, features and K split, and the
// tile's feature and token indices within that product.
struct WsAt {
    const WsMap* wmap;
    const WsMap* omap;
    const float* bias;
    void* out;
    u32 n, slice_len, slices, fi, ti;
};

// A launch's products, 1 to NP (3: q, k, v; 2: gate, up), all reading the same input: tiles
// are numbered product after product, product j's ending at end[j]. Each product's tiles
// walk its own raster and K split, so every element is the one-product launch's.
template <int NP>
struct WsParts {
    const WsMap* w[3];
    const WsMap* o[3];  // the outputs' maps (read only for staged bf16 outputs)
    const float* bias[3];
    void* out[3];
    u32 n[3], slice_len[3], slices[3], end[3];
    // Selects with constant indices only (an array indexed at run time would live in local
    // memory).
    template <typename T>
    __device__ __forceinline__ static T pick(u32 j, const T (&v)[3]) {
        return NP == 1 || j == 0 ? v[0] : (j == 1 ? v[1] : v[2]);
    }
    __device__ __forceinline__ WsAt at(u32 tile, u32 rows) const {
        const u32 j = NP == 1 ? 0 : (tile < end[0] ? 0 : (tile < end[1] ? 1 : 2));
        const u32 start = NP == 1 || j == 0 ? 0 : (j == 1 ? end[0] : end[1]);
        WsAt a = {pick(j, w),         pick(j, o),      pick(j, bias), pick(j, out), pick(j, n),
                  pick(j, slice_len), pick(j, slices), 0,             0};
        tile_raster_at(tile - start, a.n, rows, WS_BM, WS_BN, TF_WS_GROUP, a.fi, a.ti);
        return a;
    }
};

// The copy warp (its thread 0 issues): for every stage's k tile of this CTA's tiles, a free
// stage, armed with the bytes to come (the 16 KiB sub-tiles of both operands, zero-filled by
// the tensor copies past n, rows and K), then the copies.
template <int NP>
__device__ __forceinline__ void ws_copy(const WsGrid& G, const WsParts<NP>& P, const WsMap& xmap) {
    const u32 t = threadIdx.x;
    u32 it = 0;
    for (u32 tile = blockIdx.x; tile < G.tiles; tile += gridDim.x) {
        const WsAt at = P.at(tile, G.rows);
        const u32 fi = at.fi, ti = at.ti;
        const WsMap& wmap = *at.wmap;
        for (u32 kt = 0; kt < G.ktiles; kt++, it++) {
            const u32 s = it % WS_STAGES, ph = (it / WS_STAGES) & 1;
            mbar_wait_parity(G.empty + 8 * s, ph ^ 1);
            const u32 full = G.full + 8 * s, sa = G.sbase + s * WS_STAGE;
            if (t == 0) {
                mbar_expect_at(full, WS_A_BYTES + WS_B_BYTES);
#pragma unroll
                for (u32 j = 0; j < TF_WS_KT / 64; j++) {
                    const u32 kx = kt * TF_WS_KT + 64 * j;
                    ws_tensor_copy(sa + j * WS_SUB, wmap, kx, fi * WS_BM, full);
                    ws_tensor_copy(sa + WS_A_BYTES + j * WS_SUB, xmap, kx, ti * WS_BN, full);
                }
            }
        }
    }
}

// TF_WS_FOLD: 1 (default) folds a slice's partial after the wait that ends a stage, outside
// the stage's wgmma loop, for calls whose K and slice length are multiples of TF_WS_KT (every
// llama-family shape; others, and TF_WS_DEPTH=2, take ws_tile_k): the stage's 8 wgmmas then follow one
// wgmma.fence with no branch between them. With the fold inside the loop (0, a measurement
// knob) ptxas closes a wgmma group after every pair and puts a WARPGROUP.ARRIVE before the
// next (SASS, session 16). The same adds on the same values in the same order.
#ifndef TF_WS_FOLD
#define TF_WS_FOLD 1
#endif

// TF_WS_ACC2 (1, the default since session 31; a knob through TENSORFOLD_KERNEL_DEFINES):
// on the fold-after-wait path (TF_WS_FOLD), a consumer's slices
// alternate between two accumulators, so a slice's fold (tot = acc or tot += acc, then acc =
// +0) runs after the next stage's wgmmas are issued, beside them, instead of between two
// stages with this warpgroup's wgmmas stopped (both consumers reach a slice end at the same
// stage, so the tensor pipe waits for the fold). Each accumulator's chain is the same wgmmas
// in the same order from +0, and the folds add the slices' partials in slice order: the same
// bits. Why: the fold shows in the slice count (H200, session 16, 2,048 rows, TFLOP/s by
// TENSORFOLD_LINEAR_WARPS: 4096 x 4096 605 at 8 slices, 628 at 4, 517 at 16; 1024 x 4096,
// llama3-8b's k and v, 480 at 16 slices, 569 at 8). Registers: acc, acc2 and tot are 192 of
// the consumers' 232 (session 22's 192-token tiles held as many without spills).
// H100, session 31 (tests/cuda_wgmma.rs, the 5 llama3-8b shapes, 2,048 rows, TFLOP/s; bitwise:
// wg_linear_equals 419,926,752 elements, 0 failing calls; check exact's fingerprints equal):
// default 555 / 520 / 563 / 605 / 591, ACC2 580 / 531 / 582 / 602 / 609, STAGGER=400 610 / 551
// / 620 / 608 / 632, both 628 / 595 / 631 / 633 / 662 (4096x4096, 1024x4096, 6144x4096,
// 14336x4096, 4096x14336); both with STAGGER 200 / 800 within 1% of 400. Served prefill
// (bench, 3 alternated rounds, best rep): 2,048 34,479 / 33,892 / 33,977 -> 35,253 / 35,294
// / 34,877 tok/s, 8,192 26,960 / 26,981 / 26,986 -> 27,195 / 27,202 / 27,243.
#ifndef TF_WS_ACC2
#define TF_WS_ACC2 1
#endif

// TF_WS_STAGGER (400, nanoseconds, since session 31): consumer warpgroup 1 sleeps this long
// before its first tile, so the two consumers' stage ends (each a wait for its own wgmmas)
// fall at different moments and the other's wgmmas keep the tensor pipe busy through them.
// Timing only.
#ifndef TF_WS_STAGGER
#define TF_WS_STAGGER 400
#endif

// A consumer's running state over one tile's K.
struct WsChain {
    float acc[64], tot[64];
    float acc2[64];  // the odd slices' chains (TF_WS_ACC2; unused, so dropped, without it)
    bool due;        // TF_WS_ACC2: the slice before this one is still to be folded
    bool first;
    u32 next_end;  // k where the current slice ends
    int pending;   // the stage whose wgmmas may still run, -1 for none
};

// One stage's k tile (ring position `it`) of a consumer warpgroup whose 64 weight rows start
// at byte `aoff` of each sub-tile: TF_WS_KT / 32 super-steps of 2 wgmma each, folds at slice
// ends, then the stage whose group has completed released.
__device__ __forceinline__ void ws_tile_k(const WsGrid& G, WsChain& ch, u32 it, u32 kt, u32 aoff,
                                          u32 slice_len) {
    const u32 s = it % WS_STAGES, ph = (it / WS_STAGES) & 1;
    mbar_wait_parity(G.full + 8 * s, ph);
    const u32 sa = G.sbase + s * WS_STAGE + aoff, sb = G.sbase + s * WS_STAGE + WS_A_BYTES;
#pragma unroll
    for (u32 h = 0; h < TF_WS_KT / 32; h++) {
        const u32 k0 = kt * TF_WS_KT + 32 * h;
        if (k0 >= G.k) break;
        wg_fence();
        const u32 o = (h >> 1) * WS_SUB + 64 * (h & 1);
        wgmma_n128(ch.acc, wg_desc(sa + o), wg_desc(sb + o));
        wgmma_n128(ch.acc, wg_desc(sa + o + 32), wg_desc(sb + o + 32));
        if (k0 + 32 == ch.next_end || k0 + 32 >= G.k) {  // a slice ends: fold its partial in
            wg_commit();
            wg_wait<0>();
            wg_fold<64>(ch.acc, ch.tot, ch.first);
            ch.first = false;
            ch.next_end += slice_len;
        }
    }
    wg_commit();
    const bool lead = (threadIdx.x & 31) == 0;
    if (TF_WS_DEPTH >= 2) {
        wg_wait<1>();  // the previous tile's group is complete: its stage is free
        ws_mbar_arrive_if(G.empty + 8 * ch.pending, ch.pending >= 0 && lead);
        ch.pending = (int)s;
    } else {
        wg_wait<0>();
        ws_mbar_arrive_if(G.empty + 8 * s, lead);
    }
}

// Four 8x8 bf16 matrices from the mma fragment layout (lane: row lane / 4, columns 2 (lane % 4)
// and + 1 of each r_m), stored transposed: lane 8m + j gives the shared address of row j of
// matrix m, which receives column j.
__device__ __forceinline__ void stmatrix_t4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
// Named barrier `id` over the 128 threads of one consumer warpgroup.
__device__ __forceinline__ void ws_wg_bar(u32 id) {
    asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

// The bf16 epilogue of a consumer warpgroup's 64 features x 128 tokens: each element's
// value exactly as store_linear forms it (the total, + bias, one rounding), written by
// stmatrix into the warpgroup's staging as [token][64 features] (16-byte chunk j of token
// row r at chunk j ^ (r % 8)), then stored as whole 16-byte chunks of a token's features.
// Needs n % 8 == 0 and a 16-byte aligned out (the caller checks): a chunk is all in or all
// out of range. Same values as the direct stores; only the path to memory differs.
__device__ __forceinline__ void ws_store_staged(const WsGrid& G, u32 n, u32 cw, u32 stg,
                                                const float* tot, u32 empty,
                                                const float* __restrict__ bias, bf16* out, u32 n0,
                                                u32 t0, const WsMap& omap) {
    const u32 t = threadIdx.x & 127, warp = t >> 5, lane = t & 31, g = lane >> 2;
    float b[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const u32 f = n0 + 64 * cw + 16 * warp + g + 8 * h;
        if (bias && f < n) b[h] = bias[f];
    }
    u32 r[16][2];  // (token group i, half h): this lane's two tokens as bf16x2
#pragma unroll
    for (int i = 0; i < WS_BN / 8; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float v0 = tot[4 * i + 2 * h], v1 = tot[4 * i + 2 * h + 1];
            for (u32 s = 0; s < empty; s++) v0 += 0.0f, v1 += 0.0f;
            if (bias) v0 += b[h], v1 += b[h];
            r[i][h] = (u32)f2bf(v0) | ((u32)f2bf(v1) << 16);
        }
    if (TF_WS_TMA_STORE && t == 0) ws_store_wait<true>();  // the previous tile's copy read it
    ws_wg_bar(1 + cw);  // the staging's previous tile has been read (every lane, or the copy)
    const u32 m = lane >> 3, j = lane & 7;
#pragma unroll
    for (int i = 0; i < WS_BN / 8; i += 2) {
        const u32 tok = 8 * (i + (m >> 1)) + j, chunk = 2 * warp + (m & 1);
        stmatrix_t4(stg + tok * 128 + ((chunk ^ j) << 4), r[i][0], r[i][1], r[i + 1][0],
                    r[i + 1][1]);
    }
    if (TF_WS_TMA_STORE) {
        fence_proxy_async();  // the staging's writes, visible to the tensor copy
        ws_wg_bar(1 + cw);
        if (t == 0) ws_tensor_store(omap, n0 + 64 * cw, t0, stg);
        return;
    }
    ws_wg_bar(1 + cw);
#pragma unroll
    for (int p = 0; p < WS_BN * 8 / 128; p++) {
        const u32 q = t + 128 * p, tok = q >> 3, ch = q & 7;
        const u32 f = n0 + 64 * cw + 8 * ch;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(stg + tok * 128 + ((ch ^ (tok & 7)) << 4)));
        if (t0 + tok < G.rows && f < n) *(uint4*)(out + (u64)(t0 + tok) * n + f) = v;
    }
}
#endif  // WG_ENABLED
