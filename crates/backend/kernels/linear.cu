// linear / logits: out[t][f] = sum_k x[t][k] * w[f][k] (+ bias[f]), bf16 inputs, fp32 sums.
//
// Tensor cores, weights on the M side and tokens on the N side (DESIGN.md §4): each warp
// computes a 16-feature x 8-token tile with mma.sync m16n8k16 (bf16 in, f32 accumulate),
// which runs on sm_80 .. sm_90a. A block covers 16 features and up to 8 * NT tokens; its S
// warps are the K split: warp s sums k in [s * slice_len, (s + 1) * slice_len) with its own
// accumulator chain from zero, and the S partials are added in order 0..S-1 (then the bias,
// then one rounding). S and slice_len come from the weight shape alone (the host's
// `linear::k_split`), so every element's arithmetic is the same whether the call has 1 row
// or 2,048: a decode row is one 8-token tile with 7 padding columns that read zeros.
//
// K order inside a slice: super-steps of 32 k (super-steps wholly past the slice end are not
// run; k >= K reads zeros), each two mma k16 steps of 16 consecutive k: step e of the
// super-step at k0 sums the set {k0 + 16e + 0..15}, lane (g = lane / 4, c = lane % 4) feeding
// k0 + 16e + 4c + {0, 1} as the mma's k pair 2c and k0 + 16e + 4c + {2, 3} as pair 2c + 8, for
// weight rows g and g + 8 and token g alike. (Which lane feeds which k inside a step changes no
// bit, tests/cuda_wgmma.rs's probe; which 16 k share a step does.) Consecutive k per step is
// what lets the Hopper prefill kernel (gemm90ws.cu) read both operands as natural tiles
// brought by tensor copies. Weight loads stay 16 bytes: lane c loads the 8 consecutive k of
// chunk j(c) = 0, 2, 1, 3 (c = 0..3) of the super-step, so lanes c and c ^ 1 hold, between
// them, both lanes' 4-k runs of both steps; one shuffle of 8 bytes each way gives each lane its
// own (`regroup`). Activations (cached, few) load as the lane's two 8-byte runs (TF_X_DIRECT).
// Session 6 (2026-12-01) measured this definition with 8-byte weight loads and dropped it
// (every decode product 17-23% slower: twice the load requests). With the shuffle (session 11,
// H200, same call): decode 192 vs 200 tok/s under the earlier definition, whose step e took
// {k0 + 8c + 4e + 0..3 : c} and needed no shuffle (q/k/v 17.7 vs 14.4 us, o 10.6 vs 9.8, down
// 31.9 vs 30.9, gate/up + SwiGLU 63.7 vs 64.3), for a prefill GEMM 15-60% faster.
// Weights stream through two register buffers of U super-steps a warp: the next buffer's loads
// are in flight while the mma steps of the current one run, and a kernel's first buffer is
// issued before pdl_wait(), overlapping the kernel before it (weights are immutable). H200,
// 2026-12-01, tests/cuda_fused.rs profile (llama3-8b shapes, one row, back to back): gate/up +
// SwiGLU 61.7 -> 63.9 us, down 32.0 -> 30.6, o 9.5 -> 9.8, q/k/v 16.7 -> 14.4, the graphed
// 32-layer step 5.70 -> 5.68 ms, against the single buffer of 8 super-steps with the same early
// issue; without the early issue the single buffer took 5.79 ms.
// Tried and dropped (H200, 2026-11-30, same bits): the decode entries' weights through a
// per-warp cp.async ring of 4 stages x 2 super-steps. Isolated (ncu, cold L2) it was faster at
// one row (gate/up + swiglu 79 -> 67 us, down 45 -> 39 us), but served, against the register
// path in otherwise the same build: decode 167.7 vs 182.5 tok/s, 16 / 64 streams 1,264 / 2,059
// vs 1,645 / 3,148, the 33B geometry 46.4 vs 49.8 (docs/bench/2026-11-30-h200.md). An L2 bulk
// prefetch of each CTA's weight rows before pdl_wait() lost 2-12% (149-164 vs 171 tok/s).
// Also dropped (H200, 2026-12-02, bench decode, same call; baseline 195-203 tok/s): bringing the
// o weight into L2 while attention runs, which reads little. From rope_kv_store by bulk
// prefetch (8 CTAs): 135 tok/s at 32 MiB, 103 at 48 (those SMs' TMA units moved ~60 GB/s
// each and the chain waited). From every decode product before pdl_wait() by
// prefetch.global.L2 of its rows past the first buffer: 165; attention_combine letting the o
// product launch before its own wait, so o's CTAs and first loads overlap attention: 193 (vs
// 202.6). Attention is latency-bound on its KV loads, and any traffic beside it slows it more
// than o gains. Session 19: both register buffers of the first job issued before pdl_wait()
// (16 of o's 33.5 MB, not 8): 195.5 vs 199.7 tok/s (3 alternated pairs). Session 31 (H100,
// same bits; commits 0f8b4ae-922460d): o, down, the head and gate/up + SwiGLU through a
// 3-stage shared-memory ring (8 consumer warps on ldmatrix, a producer warp, CTAs of half an
// SM so the next launch's CTA could stream beside): by 256-byte bulk copies served decode
// 106-108 vs 165-169 tok/s (the copies' issue, a lane at a time, bound it), by 2-D tensor
// copies 145-147 (an o -> gate -> down chain 1,008 vs 937 us: 96 KB in flight an SM is less
// than these entries' 2 CTAs x 64 KB).
//
// Several entry points compute it: linear_bf16 (here: operands straight from global memory, K
// slices on warps; for decode and small batches) and, for prefill, linear_bf16_tiled
// (gemm.cu: shared-memory tiles, a cp.async pipeline, one CTA walking every slice in order)
// or on sm_90a linear_bf16_ws (gemm90ws.cu: wgmma on tiles brought by tensor copies) and
// linear_bf16_wg (gemm90.cu). Same k16 sets, same slices, same zero padding, same combine
// order: the same bits for every element (the contract's row gate, tests/cuda_linear.rs and
// tests/cuda_wgmma.rs check it). The grouped decode entries
// at the end (linear_bf16_group: q, k, v in one launch; linear_bf16_swiglu: gate and up with
// the SwiGLU epilogue) run the same slice chains and combine, so they give linear_bf16's bits
// (tests/cuda_fused.rs compares them with the separate launches bit for bit); linear_norm.cu's
// entries run the same bodies after an add + RMSNorm prologue (tests/cuda_fused_norm.rs).

// TF_L2_128 (1, the default; a knob through TENSORFOLD_KERNEL_DEFINES): the weight loads ask
// L2 to fetch the whole 128-byte line (`.L2::128B`). A warp's load covers 64 bytes of each of
// 8 rows; the other half of each line is the next super-step's load, which then finds it in
// L2. Only the timing of the same loads changes. H200, session 20, tools/gpu/loadbw.py (this
// load pattern alone, register buffers of 4 super-steps, 256-thread CTAs): llama3-8b gate/up
// (235 MB, 4 slices) 3.91 -> 4.23 TB/s, with one slice 3.32 -> 4.13, the 33B geometry's
// gate/up (631 MB) 3.85 -> 4.33; `.L2::256B` 4.11 / 3.95 / 4.23; loads of 4 rows x 128 bytes
// (which would need shuffles to the mma layout) 4.30 / 4.22 / 4.50; a copy's flat reads 4.35 /
// 4.15 / 4.55. Served (bench decode, 3 alternated pairs): llama3-8b 211.2 / 209.5 / 213.1
// against 203.8 / 204.3 / 204.8 tok/s; the 33B geometry 56.9 / 57.0 against 53.5 / 53.5.
// Measured and removed (session 21): also marking the lines evict-first (a
// `createpolicy.fractional.L2::evict_first` policy on the same loads), so that what a step
// re-reads (its KV, the residual) might stay in L2 between steps: bench decode 206.1 / 206.2,
// 208.3 / 209.7 against 206.5 / 207.0, 210.9 / 210.1 tok/s; the 33B geometry 56.3 / 56.5
// against 56.9 / 56.9.
#ifndef TF_L2_128
#define TF_L2_128 1
#endif
// 16 bytes of weights at p: streamed once, not kept in L1.
__device__ __forceinline__ uint4 ld_stream16(const bf16* p) {
    uint4 v;
#if TF_L2_128
    asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
    return v;
}
// Whether a lane loads its activations as its two 4-k runs (two 8-byte loads, no shuffle; 1,
// the default) or as the 16-byte chunk it loads of the weights plus a regroup (0). Speed only;
// H200, 2026-12-02, bench decode with TF_GROUP_MINB=3: 193.1 / 192.9 tok/s against 191.0 /
// 190.0 with 0.
#ifndef TF_X_DIRECT
#define TF_X_DIRECT 1
#endif
// Whether the general entries (several token tiles a CTA) regroup a buffer's weights once for
// all its token tiles (1) or once a token tile (0, the default: fewer registers). Speed only;
// not yet measured (session 11 measured 16 / 64 streams at 0: 1,558 / 2,627 tok/s, against
// 1,651 / 3,082 before the regroup).
#ifndef TF_REGROUP_ONCE
#define TF_REGROUP_ONCE 0
#endif
// 8 bytes of activations at p (cached, as ld_act16).
__device__ __forceinline__ uint2 ld_act8(const bf16* p) {
    uint2 v;
    asm("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
// 8 bytes of activations at p: from global memory (ld_act8) or, SX, from shared memory.
template <bool SX>
__device__ __forceinline__ uint2 ld_x8(const bf16* p) {
    if (SX) return *(const uint2*)p;
    return ld_act8(p);
}
// 16 bytes of activations at p (read by every warp of the CTA: cached).
__device__ __forceinline__ uint4 ld_act16(const bf16* p) {
    uint4 v;
    asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
// Row pointers of token g of each of a CTA's NT token tiles (tiles start at t0); padding
// tokens (past `rows`) read row 0 but are masked to zero.
template <int NT>
__device__ __forceinline__ void token_rows(
    const bf16* __restrict__ x, const u32* __restrict__ row_idx, u32 k, u32 rows, u32 t0, u32 g,
    const bf16* xr[NT], bool vx[NT]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const u32 tok = t0 + 8 * t + g;
        vx[t] = tok < rows;
        const u32 src = vx[t] ? (row_idx ? row_idx[tok] : tok) : 0;
        xr[t] = x + (u64)src * k;
    }
}

// One K slice [k_begin, k_end) of features n0 .. n0 + 15 of a weight: the lane's two weight
// rows (g and g + 8; rows past n read as zeros).
struct Slice {
    const bf16* wa;
    const bf16* wb;
    bool va, vb;
    u32 k_begin, k_end;
};
// The slice whose lane rows g and g + 8 are features fa and fb (linear_rope.cu pairs rope's
// features on them; each element's chain is its own, whichever rows share the tile).
__device__ __forceinline__ Slice make_slice_rows(const bf16* __restrict__ w, u32 n, u32 k, u32 fa,
                                                 u32 fb, u32 k_begin, u32 slice_len) {
    Slice s;
    s.va = fa < n;
    s.vb = fb < n;
    s.wa = w + (u64)(s.va ? fa : 0) * k;
    s.wb = w + (u64)(s.vb ? fb : 0) * k;
    s.k_begin = k_begin;
    s.k_end = min(k, k_begin + slice_len);
    return s;
}
__device__ __forceinline__ Slice make_slice(const bf16* __restrict__ w, u32 n, u32 k, u32 n0,
                                            u32 k_begin, u32 slice_len) {
    const u32 g = (threadIdx.x & 31) >> 2;
    return make_slice_rows(w, n, k, n0 + g, n0 + g + 8, k_begin, slice_len);
}

// The 16-byte chunk (8 consecutive k) of a super-step that lane (g, c) loads: 0, 2, 1, 3 for
// c = 0..3, so an even lane holds its own run of step 0 (low half) and its partner c + 1's
// (high half), an odd lane both runs of step 1.
__device__ __forceinline__ u32 lane_chunk() {
    const u32 c = threadIdx.x & 3;
    return (c >> 1) | ((c & 1) << 1);
}

// The lane's two k16-step operands from its loaded chunk v (lane_chunk()): step 0 gets
// k0 + 4c .. + 3, step 1 k0 + 16 + 4c .. + 3. Even lanes keep their low half for step 0 and
// pass the high half to lane c + 1; odd lanes keep their high half for step 1 and pass the low
// half to lane c - 1. Every lane of the warp must call it (uniform control flow).
__device__ __forceinline__ void regroup(const uint4 v, uint2& s0, uint2& s1) {
    const bool even = (threadIdx.x & 1) == 0;
    const u32 x = even ? v.z : v.x, y = even ? v.w : v.y;
    const u32 rx = __shfl_xor_sync(0xffffffffu, x, 1), ry = __shfl_xor_sync(0xffffffffu, y, 1);
    s0 = even ? make_uint2(v.x, v.y) : make_uint2(rx, ry);
    s1 = even ? make_uint2(rx, ry) : make_uint2(v.z, v.w);
}

// The A operands of a super-step's two mma steps from the lane's loaded chunks of weight rows
// g (a) and g + 8 (b): q_e = (a.lo, b.lo, a.hi, b.hi) of step e, the mma's a0..a3.
__device__ __forceinline__ void regroup_w(const uint4 a, const uint4 b, uint4& q0, uint4& q1) {
    uint2 a0, a1, b0, b1;
    regroup(a, a0, a1);
    regroup(b, b0, b1);
    q0 = make_uint4(a0.x, b0.x, a0.y, b0.y);
    q1 = make_uint4(a1.x, b1.x, a1.y, b1.y);
}

// Issues the weight loads of U super-steps from kk (the lane's two rows).
template <int U>
__device__ __forceinline__ void issue_w(const Slice& s, u32 kk, uint4 (&a)[U], uint4 (&b)[U]) {
    const u32 j = lane_chunk();
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const u32 kc = kk + 32 * u + 8 * j;
        a[u] = (s.va && kc < s.k_end) ? ld_stream16(s.wa + kc) : zero;
        b[u] = (s.vb && kc < s.k_end) ? ld_stream16(s.wb + kc) : zero;
    }
}

// The mma steps of U super-steps from kk on loaded weights, for the NT token tiles. A
// super-step wholly past the slice end is not run.
// SX: the activations are a shared-memory stage (the fused norm's rows), read by plain loads.
template <int NT, int U, bool SX = false>
__device__ __forceinline__ void run_steps(const Slice& s, u32 kk, const uint4 (&a)[U],
                                          const uint4 (&b)[U], float (&acc)[NT][4],
                                          const bf16* const xr[NT], const bool vx[NT], u32 t0,
                                          u32 rows) {
    const u32 j = lane_chunk(), c = threadIdx.x & 3;
    constexpr bool ONCE = TF_REGROUP_ONCE && NT > 1;
    uint4 w0[U], w1[U];  // regroup_w of each super-step, when ONCE
    if (ONCE) {
#pragma unroll
        for (int u = 0; u < U; u++) regroup_w(a[u], b[u], w0[u], w1[u]);
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t0 + 8 * t >= rows) break;
        uint4 xv[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const u32 kb = kk + 32 * u;
            if (TF_X_DIRECT) {  // the lane's two 4-k runs, loaded where they are
                const u32 k0 = kb + 4 * c, k1 = k0 + 16;
                const uint2 z = make_uint2(0, 0);
                const uint2 p = (vx[t] && k0 < s.k_end) ? ld_x8<SX>(xr[t] + k0) : z;
                const uint2 q = (vx[t] && k1 < s.k_end) ? ld_x8<SX>(xr[t] + k1) : z;
                xv[u] = make_uint4(p.x, p.y, q.x, q.y);
            } else {
                const u32 kc = kb + 8 * j;
                xv[u] = (vx[t] && kc < s.k_end) ? ld_act16(xr[t] + kc) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kk + 32 * u >= s.k_end) break;
            // Unless TF_REGROUP_ONCE, each token tile regroups the weights again (after its
            // activation loads are issued: the regroup waits for the weights), which keeps
            // one copy of them in registers; decode calls run one token tile.
            uint4 q0, q1;
            if (ONCE) q0 = w0[u], q1 = w1[u];
            else regroup_w(a[u], b[u], q0, q1);
            uint2 x0, x1;
            if (TF_X_DIRECT) {
                x0 = make_uint2(xv[u].x, xv[u].y);
                x1 = make_uint2(xv[u].z, xv[u].w);
            } else {
                regroup(xv[u], x0, x1);
            }
            mma16816(acc[t], q0.x, q0.y, q0.z, q0.w, x0.x, x0.y);
            mma16816(acc[t], q1.x, q1.y, q1.z, q1.w, x1.x, x1.y);
        }
    }
}

// The chain of one slice for the NT token tiles, from +0, its partials stored to
// part[(job * NT + t) * 128 + lane * 4 + i]. `a0`, `b0` hold the weights of the slice's first
// U super-steps, already issued (issue_w(s, s.k_begin, ...)), possibly before pdl_wait().
// Two register buffers: the loads of the next U super-steps are in flight while the mma
// steps of these run. Every entry point below runs exactly this chain for each (feature
// tile, slice), whichever warp runs it.
template <int NT, int U, bool SX = false>
__device__ __forceinline__ void slice_chain(const Slice& s, uint4 (&a0)[U], uint4 (&b0)[U],
                                            const bf16* const xr[NT], const bool vx[NT], u32 t0,
                                            u32 rows, float* part, u32 job) {
    const u32 lane = threadIdx.x & 31;
    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
    uint4 a1[U], b1[U];
    for (u32 kk = s.k_begin; kk < s.k_end; kk += 64 * U) {
        const u32 k1 = kk + 32 * U;
        if (k1 < s.k_end) issue_w<U>(s, k1, a1, b1);
        run_steps<NT, U, SX>(s, kk, a0, b0, acc, xr, vx, t0, rows);
        if (k1 + 32 * U < s.k_end) issue_w<U>(s, k1 + 32 * U, a0, b0);
        if (k1 < s.k_end) run_steps<NT, U, SX>(s, k1, a1, b1, acc, xr, vx, t0, rows);
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) part[((job * NT + t) * 32 + lane) * 4 + i] = acc[t][i];
}

// Whether a kernel issues its first weight loads before pdl_wait() (weights are immutable).
#ifndef TF_PREWAIT
#define TF_PREWAIT 1
#endif
// Measured and removed (session 21): the norm-fused entries (linear_norm.cu; in isolation, ncu,
// session 20, q/k/v with the norm read 50 MB at 2.2 TB/s against 3.2-3.8 for the other
// products) issuing both register buffers of a CTA's first job before pdl_wait()
// (`TF_NORM_PREWAIT`): same bits; H200 bench decode, 5 alternated rounds, 213.2 / 213.5, 206.6 /
// 206.5, 215.7 / 215.9, 215.8 / 215.9, 209.2 / 210.1 against 206.5 / 207.0, 210.9 / 210.1,
// 211.4 / 214.4, 216.3 / 216.7, 216.2 / 216.5 tok/s; the 33B geometry 56.8 / 57.0 against 56.9
// / 56.9: neutral. Also session 21, built and dropped: the persistent norm entries issuing a warp's next job's
// first buffer (its next slice, or its job of the CTA's next tile) while the current chain's
// last buffer ran (`TF_CHAIN_NEXT`): same bits, decode 207-213 against 210-213 tok/s, and ~1%
// slower with gate/up's norm fused (ptxas wanted 150 registers there; held to 128).
// Session 25 (H200, docs/bench/2026-12-04-h200.md; each the same bits, check exact's
// fingerprints unchanged), on slice_chain's one-token-tile loop. nvdisasm's control bits show
// ptxas tracking every weight and activation load of the loop on one scoreboard, so the first
// read of a loaded register waits for all loads in flight: after "issue the next buffer, run
// this one", this buffer's steps wait for the next buffer too. Three orders, measured
// against the default in one binary (bench decode, 4 alternated rounds, tok/s; ncu us of
// linear_bf16_swiglu_d8 at one row):
// - each super-step's registers refilled right after its regroup read them: every step then
//   waited for the refill just issued: 191-193 vs 208-213, 73.1 vs 64.0 us;
// - this buffer's activations loaded first, the next buffer issued at an address made to
//   depend on them (so after they and this buffer landed), then this buffer's steps with the
//   next in flight (SASS checked: no wait on the next buffer before the steps): 209.5-213.0
//   vs 208.6-213.0, 63.7 vs 63.9 us (neutral);
// - both buffers issued together after both ran (two in flight a latency, as loadbw.cu's loop):
//   207.6-214.1 vs 212.4-215.8, 64.0 vs 63.3 us (slightly slower).
// The steps between the loads are not what bounds these entries. Also session 25: in SM
// cycles gate/up + SwiGLU equals tools/gpu/loadbw.cu's bare load pattern (114.9k vs
// 109.8-113.8k elapsed, ncu); ncu's durations differ (63.9 vs 56.8 us) because the SM clock
// under ncu was 1.80 GHz in the engine's process and 1.97 in loadbw's (nvidia-smi during
// bench decode: 1,980 MHz, ~575 W, no throttle reason).
// Super-steps a register buffer holds in the one-token-tile (_d8) entries and in the others.
#ifndef TF_D8_U
#define TF_D8_U 4
#endif
#ifndef TF_NT_U
#define TF_NT_U 2
#endif
// CTAs an SM the grouped general entries (linear_bf16_group, linear_bf16_swiglu: 256 threads)
// ask ptxas to fit (__launch_bounds__'s minimum): 1 leaves it the registers it wants (~100
// with the regroup, so 2 CTAs an SM), 3 (the default) caps them at 80 (3 CTAs, as before the
// regroup, at a few spilled words). Speed only; H200, 2026-12-02, bench decode with
// TF_X_DIRECT=1: 193.1 / 192.9 tok/s against 188.1 / 190.3 with 1.
#ifndef TF_GROUP_MINB
#define TF_GROUP_MINB 3
#endif
// Registers a thread of the one-token-tile (_d8: decode) entries may use, 0 (the default: as
// many as ptxas wants, ~120, so 2 CTAs of 256 threads an SM); 80 or 64 give 3 or 4 such CTAs an
// SM (more weight loads in flight, shorter tails) at the price of spills. Speed only.
#ifndef TF_D8_MAXREG
#define TF_D8_MAXREG 0
#endif
#if TF_D8_MAXREG > 0
#define D8_BOUNDS(T) __maxnreg__(TF_D8_MAXREG)
#else
#define D8_BOUNDS(T) __launch_bounds__(T)
#endif
// Whether a product lets the next kernel launch (griddepcontrol.launch_dependents) before its
// own pdl_wait(): the next kernel's CTAs may then be resident and issue their own early weight
// loads while this one still waits. Every kernel still waits for the one before it, and that
// one for its predecessor, so what each reads and writes is unchanged. H200, 2026-12-01,
// bench decode A B A B: 191.5 / 192.1, 192.6 / 192.4, 191.9 / 192.2, 193.2 / 193.4 tok/s (B on;
// contract 58/58 and check exact PASS with it on).
#ifndef TF_EARLY_TRIGGER
#define TF_EARLY_TRIGGER 1
#endif

// A CTA's slice jobs j = warp, warp + W, ... < J (W warps), job j's slice `slice_of(j)`, each
// through slice_chain into part. The first job's first weights are issued before pdl_wait()
// (TF_PREWAIT): weights are immutable, so only their timing changes; everything else (the
// activations, row_idx, every write) follows it.
// A prologue runs `pre()` before pdl_wait() (immutable data only) and `main()` after it, in a
// CTA's first tile. None: the activations are in global memory.
struct NoPrologue {
    __device__ __forceinline__ void pre() const {}
    __device__ __forceinline__ void main() const {}
};

// A product's start: the next kernel may launch (TF_EARLY_TRIGGER), the first job's first
// weights (`s`, if `has_job`) are issued before pdl_wait() (TF_PREWAIT), and the prologue runs
// around the wait. Returns whether those weights were issued.
template <int U, class P>
__device__ __forceinline__ bool product_start(const Slice& s, bool has_job, uint4 (&a)[U],
                                              uint4 (&b)[U], const P& prologue) {
    if (TF_EARLY_TRIGGER) pdl_launch();
    if (TF_PREWAIT && has_job) issue_w<U>(s, s.k_begin, a, b);
    prologue.pre();
    pdl_wait();
    if (!TF_EARLY_TRIGGER) pdl_launch();
    prologue.main();
    return TF_PREWAIT && has_job;
}

// `first`: the CTA's first tile (the persistent norm entries run several; later tiles neither
// wait nor run the prologue again, and issue their first weights after the previous tile).
template <int NT, int U, class F, bool SX = false, class P = NoPrologue>
__device__ __forceinline__ void run_jobs(F slice_of, u32 J, const bf16* __restrict__ x,
                                         const u32* __restrict__ row_idx, u32 k, u32 rows, u32 t0,
                                         float* part, P prologue = P(), bool first = true) {
    const u32 warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    uint4 a[U], b[U];
    Slice s = slice_of(warp < J ? warp : 0);
    if (first) product_start<U>(s, warp < J, a, b, prologue);
    const bf16* xr[NT];
    bool vx[NT];
    token_rows<NT>(x, row_idx, k, rows, t0, (threadIdx.x & 31) >> 2, xr, vx);
    for (u32 j = warp; j < J; j += W) {
        if (j != warp) s = slice_of(j);
        if (j != warp || !TF_PREWAIT || !first) issue_w<U>(s, s.k_begin, a, b);
        slice_chain<NT, U, SX>(s, a, b, xr, vx, t0, rows, part, j);
    }
}

// The dynamic shared memory of an entry point, as floats (declared once, in C++ linkage).
__device__ __forceinline__ float* dyn_floats() {
    extern __shared__ float dyn_smem[];
    return dyn_smem;
}

// Element e (of NT * 128) of a CTA's tile: its feature and token.
template <int NT>
__device__ __forceinline__ void tile_elem(u32 e, u32 n0, u32 t0, u32* f, u32* tok) {
    const u32 t = e / 128, ln = (e / 4) % 32, i = e % 4;
    *f = n0 + (ln >> 2) + (i >= 2 ? 8 : 0);
    *tok = t0 + 8 * t + (ln & 3) * 2 + (i & 1);
}

// The slices' partials of element e, added in slice order: part0, += part1, ...
template <int NT>
__device__ __forceinline__ float slice_total(const float* part, u32 e, u32 first, u32 S) {
    float total = part[first * NT * 128 + e];
    for (u32 s2 = 1; s2 < S; s2++) total += part[(first + s2) * NT * 128 + e];
    return total;
}

// grid: (ceil(n / 16), ceil(rows / (8 * NT))); block: 32 * S threads; dynamic shared memory
// S * NT * 32 * 4 floats. `row_idx` (nullable) maps output row i to input row row_idx[i]
// (logits); out_mode: 0 bf16, 1 f32, 2 f32 holding bf16-rounded values. k % 8 == 0 and
// slice_len % 32 == 0 (checked by the host).
template <int NT, int U>
__device__ __forceinline__ void linear_body(
    const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx,
    const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,
    u32 slice_len) {
    extern __shared__ float part[];  // [S][NT][32 lanes][4]
    const u32 S = blockDim.x >> 5;
    const u32 n0 = blockIdx.x * 16, t0 = blockIdx.y * 8 * NT;
    auto slice_of = [&](u32 j) { return make_slice(w, n, k, n0, j * slice_len, slice_len); };
    run_jobs<NT, U>(slice_of, S, x, row_idx, k, rows, t0, part);
    __syncthreads();
    for (u32 e = threadIdx.x; e < NT * 32 * 4; e += blockDim.x) {
        u32 f, tok;
        tile_elem<NT>(e, n0, t0, &f, &tok);
        if (f >= n || tok >= rows) continue;
        float total = slice_total<NT>(part, e, 0, S);
        store_linear(out, out_mode, (u64)tok * n + f, total, bias, f);
    }
}

#define LINEAR_ENTRY(NAME, NT, U, BOUNDS)                                                     \
    extern "C" __global__ void BOUNDS NAME(                                                  \
        const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx, \
        const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,     \
        u32 slice_len) {                                                                     \
        linear_body<NT, U>(w, x, row_idx, bias, out, out_mode, n, k, rows, slice_len);       \
    }
LINEAR_ENTRY(linear_bf16, 4, TF_NT_U, __launch_bounds__(512))
// Decode rows (at most 8: one token tile): fewer registers per warp, more loads in flight.
// U only groups super-steps for loading (the mma chain is the same sequence), and NT only
// how many token tiles a CTA covers: the same bits for every element.
LINEAR_ENTRY(linear_bf16_d8, 1, TF_D8_U, D8_BOUNDS(512))

