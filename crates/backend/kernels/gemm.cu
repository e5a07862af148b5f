// linear_bf16_tiled: the prefill kernel of the linear product, the same arithmetic per element
// as linear_bf16 in linear.cu (read that file's header first: the K mapping and slice order
// defined there are what this kernel reproduces bit for bit).
//
// A CTA computes TM features x TN tokens from shared-memory tiles of TK k, filled by cp.async
// STAGES - 1 tiles ahead; WM x WN warps, a warp owning MT x NT mma tiles (16 features x 8
// tokens each). Per element the arithmetic is linear_bf16's:
// - super-steps of 32 k from k = 0, each two k16 steps of 16 consecutive k; lane (g, c) feeds
//   step e the k0 + 16e + 4c .. + 3 of feature rows g and g + 8 and of token g, as
//   linear_bf16's lanes do after their regroup (the token row by two 8-byte ld.shared, the
//   feature rows from the interleaved tile below), same register order;
// - k >= K reads zeros (cp.async src-size 0), exactly the lanes linear_bf16 zeroes (K and the
//   slice ends are multiples of 8, so a lane's 8 elements are all in or all out);
// - the accumulator restarts from zero at each slice start s * slice_len; at a slice's end
//   `tot = acc` (slice 0) or `tot += acc`; each empty trailing slice adds +0.0 (as the +0.0
//   partial of linear_bf16's idle warp); then the bias, then one rounding.
// The order in which a warp issues its mmas across different accumulators is free (it changes
// no chain); only each accumulator's own sequence is fixed.
//
// The running total `tot` lives in registers (TOT_SMEM false: 2 x MT x NT x 4 floats a thread,
// which caps a warp at 64 x 32) or in shared memory (TOT_SMEM true: a [MT*NT*4][THREADS] f32
// array after the stages, each thread touching only its own column, so the fold needs no
// barrier; that frees the registers for 64 x 64 warp tiles, halving shared-memory reads per
// mma). Tiles are [row][TK] bf16; with TK = 64 (128-byte rows) 16-byte chunk j of row r is
// stored at chunk j ^ 4 (r & 1) so a quarter-warp's v4 reads (rows r, r + 1, chunks 4h ..
// 4h + 3) cover all 32 banks once; with TK = 32 (64-byte rows) rows r, r + 1 are already the
// 128 contiguous bytes a quarter-warp reads, no swizzle.
//
// H200, 2026-11-30, at 2,048 rows on the llama3-8b shapes: before this rewrite (64 x 32 warp
// tiles, tot in registers, plain tiles) 210-247 TFLOP/s; 64 x 64 warp tiles with tot in shared
// memory alone changed nothing (212-238: the register moves below dominated); with the
// interleaved feature tile 231-262 (1024 x 4096: 183 through linear_bf16_tiled_r). cuBLAS in the
// same run: 683-794. Not yet known what bounds it now (no profiler run): candidates are the
// L2 -> SM traffic of 128 x 128 tiles (~4 TB/s at this rate) and mma.sync issue on sm_90.

__device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool pred) {
    const int n = pred ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
}
// Feature tiles walked per token tile (L2 reuse; changes no element's arithmetic).
#define TL_GROUP 8

// Launch shape and shared memory of one configuration.
template <int MT, int NT, int WM, int WN, int TK, int STAGES, bool TOT_SMEM>
struct TlCfg {
    static constexpr u32 TM = WM * MT * 16;           // features per CTA
    static constexpr u32 TN = WN * NT * 8;            // tokens per CTA
    static constexpr u32 THREADS = 32 * WM * WN;
    static constexpr u32 CPR = TK / 8;                // 16-byte chunks per token row
    static constexpr u32 STAGE = (TM + TN) * TK * 2;  // bytes of one stage
    static constexpr u32 BLOADS = TN * CPR / THREADS;  // token chunks a thread copies a stage
    static constexpr u32 BRS = THREADS / CPR;         // token rows between a thread's chunks
    static constexpr u32 WPR = TK / 2;                // 4-byte words per feature row
    static constexpr u32 ALOADS = TM * WPR / THREADS;  // feature words a thread copies a stage
    static constexpr u32 ARS = THREADS / WPR;         // feature rows between a thread's words
    static constexpr u32 ACC = MT * NT * 4;           // accumulators a thread
    static constexpr u32 SMEM = STAGES * STAGE + (TOT_SMEM ? ACC * THREADS * 4 : 0);
    static_assert(TK == 32 || TK == 64, "TK is 32 or 64");
    static_assert(TN % BRS == 0 && THREADS % CPR == 0, "token chunks divide among threads");
    static_assert(ARS % 8 == 0 && TM % ARS == 0, "feature words divide among threads");
};

// Byte offset of chunk j (16 bytes) of token row r in a [rows][TK] tile.
template <int TK>
__device__ __forceinline__ u32 tl_off(u32 r, u32 j) {
    if (TK == 64) return r * 128 + ((j ^ ((r & 1) << 2)) << 4);
    return r * (TK * 2) + (j << 4);
}

// The feature (weight) tile is stored interleaved, so that one ld.shared.v4 gives a lane the
// four A registers of an mma in order (a0..a3 = rows g, g + 8, g, g + 8 at k-pairs 0, 0, 1, 1):
// 16-byte entry (super-step h, step q, pair p, lane c) holds the 4-byte words 8q + 2c and
// 8q + 2c + 1 of super-step h (k 16q + 4c .. + 3) of feature rows r and r + 8
// (p = r / 16 * 8 + r % 8) as [r.w, (r+8).w, r.w+1, (r+8).w+1].
// Filled by 4-byte cp.async. (With plain [row][TK] tiles ptxas spent about four register moves
// per mma assembling those quads: 2026-11-30, SASS of the first version.) A quarter-warp reads
// 8 consecutive entries: no bank conflict.
template <int TM>
__device__ __forceinline__ u32 tl_aoff(u32 h, u32 q, u32 p, u32 c) {
    return (((h * 2 + q) * (TM / 2) + p) * 4 + c) * 16;
}

// The CTA's (feature tile, token tile) from a 1-D grid: TL_GROUP feature tiles at a time, the
// token tile advancing after each group's feature tiles, so the CTAs in flight share few weight
// and activation tiles.
__device__ __forceinline__ void tl_tile(u32 n, u32 rows, u32 tm, u32 tn, u32& fi, u32& ti) {
    tile_raster(n, rows, tm, tn, TL_GROUP, fi, ti);
}

// One super-step (32 k at half h of the tile) of a warp's MT x NT mma tiles: each accumulator
// takes its first mma (step 0: k 4c .. + 3 of the super-step), then its second (step 1:
// k 16 + 4c .. + 3), as in linear_bf16.
template <int MT, int NT, int TK, int TM>
__device__ __forceinline__ void tl_step(float (&acc)[MT][NT][4], const unsigned char* As,
                                        const unsigned char* Bs, u32 wm, u32 wn, u32 g, u32 c,
                                        u32 h) {
    uint4 a1[MT], a2[MT];  // a1 = (a.x, a8.x, a.y, a8.y), a2 = (a.z, a8.z, a.w, a8.w)
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const u32 p = (wm * MT + m) * 8 + g;
        a1[m] = *(const uint4*)(As + tl_aoff<TM>(h, 0, p, c));
        a2[m] = *(const uint4*)(As + tl_aoff<TM>(h, 1, p, c));
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const u32 row = wn * NT * 8 + t * 8 + g, half = (c & 1) * 8;
        const uint2 b0 = *(const uint2*)(Bs + tl_off<TK>(row, 4 * h + (c >> 1)) + half);
        const uint2 b1 = *(const uint2*)(Bs + tl_off<TK>(row, 4 * h + 2 + (c >> 1)) + half);
#pragma unroll
        for (int m = 0; m < MT; m++) {
            mma16816(acc[m][t], a1[m].x, a1[m].y, a1[m].z, a1[m].w, b0.x, b0.y);
            mma16816(acc[m][t], a2[m].x, a2[m].y, a2[m].z, a2[m].w, b1.x, b1.y);
        }
    }
}

// A slice ends: tot = acc (the first slice) or tot += acc, and acc restarts from zero. `tot`
// is either `totr` (registers) or column `tid` of `tots` (shared memory, [ACC][THREADS]).
template <int MT, int NT, bool TOT_SMEM, u32 THREADS>
__device__ __forceinline__ void tl_fold(float (&acc)[MT][NT][4], float (&totr)[MT][NT][4],
                                        float* tots, u32 tid, bool first) {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (TOT_SMEM) {
                    float* p = tots + ((m * NT + t) * 4 + i) * THREADS + tid;
                    *p = first ? acc[m][t][i] : *p + acc[m][t][i];
                } else {
                    totr[m][t][i] = first ? acc[m][t][i] : totr[m][t][i] + acc[m][t][i];
                }
                acc[m][t][i] = 0.0f;
            }
}

// grid: ceil(n / TM) * ceil(rows / TN) CTAs (1-D); block: THREADS; dynamic shared memory
// TlCfg::SMEM. Arguments as linear_bf16, plus `slices` (the K split's count).
template <int MT, int NT, int WM, int WN, int TK, int STAGES, bool TOT_SMEM>
__device__ __forceinline__ void tl_body(const bf16* __restrict__ w, const bf16* __restrict__ x,
                                        const u32* __restrict__ row_idx,
                                        const float* __restrict__ bias, void* out, int out_mode,
                                        u32 n, u32 k, u32 rows, u32 slice_len, u32 slices) {
    typedef TlCfg<MT, NT, WM, WN, TK, STAGES, TOT_SMEM> C;
    extern __shared__ __align__(128) unsigned char tl_smem[];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 g = lane >> 2, c = lane & 3;
    const u32 wm = warp % WM, wn = warp / WM;
    u32 fi, ti;
    tl_tile(n, rows, C::TM, C::TN, fi, ti);
    const u32 n0 = fi * C::TM, t0 = ti * C::TN;
    const u32 sbase = (u32)__cvta_generic_to_shared(tl_smem);
    float* tots = (float*)(tl_smem + STAGES * C::STAGE);

    // Loader. Features: thread copies word kw of rows ar + ARS i (4-byte cp.async into the
    // interleaved layout); tokens: chunk lc of rows lr + BRS i (16-byte cp.async).
    const u32 kw = tid % C::WPR, ar = tid / C::WPR;
    const u32 adst = tl_aoff<C::TM>(kw / 16, (kw % 16) / 8, ar % 8, (kw % 8) / 2) + (kw % 2) * 8;
    const bf16* wa = w + (u64)(n0 + ar < n ? n0 + ar : 0) * k + 2 * kw;
    const u64 astride = (u64)C::ARS * k;
    const u32 lc = tid % C::CPR, lr = tid / C::CPR;
    const bf16* gp[C::BLOADS];
#pragma unroll
    for (int i = 0; i < (int)C::BLOADS; i++) {
        const u32 t = t0 + lr + C::BRS * i;
        const u32 src = t < rows ? (row_idx ? row_idx[t] : t) : 0;
        gp[i] = t < rows ? x + (u64)src * k + 8 * lc : nullptr;
    }
    const u32 ktiles = (k + TK - 1) / TK;
    auto load_tile = [&](u32 kt, u32 stage) {
        const u32 st = sbase + stage * C::STAGE;
        const bool ain = kt * TK + 2 * kw < k;
#pragma unroll
        for (int i = 0; i < (int)C::ALOADS; i++) {
            const u32 o = ar / 8 + (C::ARS / 8) * i;  // octet of rows: pair block o / 2, half o % 2
            const bool p = ain && n0 + ar + C::ARS * i < n;
            const void* src = p ? (const void*)(wa + astride * i + kt * TK) : (const void*)w;
            cp_async4(st + adst + (o / 2) * 512 + (o % 2) * 4, src, p);
        }
        const bool bin = kt * TK + 8 * lc < k;
        const u32 sb = st + C::TM * TK * 2;
#pragma unroll
        for (int i = 0; i < (int)C::BLOADS; i++) {
            const bool p = bin && gp[i];
            const u32 dst = sb + tl_off<TK>(lr + C::BRS * i, lc);
            cp_async16(dst, p ? (const void*)(gp[i] + kt * TK) : (const void*)x, p);
        }
    };

    float acc[MT][NT][4], totr[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][t][i] = totr[m][t][i] = 0.0f;
    bool first = true;
    u32 next_end = slice_len;  // k where the current slice ends (a multiple of 32)

#pragma unroll
    for (u32 s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) load_tile(s, s);
        cp_async_commit();
    }
    for (u32 kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES - 1 < ktiles) load_tile(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        cp_async_commit();
        const unsigned char* As = tl_smem + (kt % STAGES) * C::STAGE;
        const unsigned char* Bs = As + C::TM * TK * 2;
#pragma unroll
        for (u32 h = 0; h < TK / 32; h++) {
            const u32 k0 = kt * TK + 32 * h;
            if (k0 >= k) break;
            tl_step<MT, NT, TK, C::TM>(acc, As, Bs, wm, wn, g, c, h);
            if (k0 + 32 == next_end || k0 + 32 >= k) {  // a slice ends: fold its partial in
                tl_fold<MT, NT, TOT_SMEM, C::THREADS>(acc, totr, tots, tid, first);
                first = false;
                next_end += slice_len;
            }
        }
    }
    cp_async_wait_all();
    // Empty trailing slices: linear_bf16 adds their +0.0 partials (turns a -0.0 into +0.0).
    const u32 used = slice_len ? (k + slice_len - 1) / slice_len : 0;
    const u32 empty = slices > used ? slices - used : 0;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const u32 f = n0 + wm * MT * 16 + m * 16 + g + (i >= 2 ? 8 : 0);
                const u32 tok = t0 + wn * NT * 8 + t * 8 + 2 * c + (i & 1);
                if (f >= n || tok >= rows) continue;
                float total = TOT_SMEM ? tots[((m * NT + t) * 4 + i) * C::THREADS + tid]
                                       : totr[m][t][i];
                for (u32 s = 0; s < empty; s++) total += 0.0f;
                store_linear(out, out_mode, (u64)tok * n + f, total, bias, f);
            }
}

#define TL_ENTRY(NAME, MT, NT, WM, WN, TK, STAGES, TOT_SMEM, MINB)                              \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, MINB) NAME(                     \
        const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx, \
        const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,       \
        u32 slice_len, u32 slices) {                                                           \
        pdl_wait();                                                                            \
        pdl_launch();                                                                          \
        tl_body<MT, NT, WM, WN, TK, STAGES, TOT_SMEM>(w, x, row_idx, bias, out, out_mode, n, k, \
                                                      rows, slice_len, slices);                \
    }

// Configurations (the host's `TiledShape`s in cuda/kernels.rs mirror them; both fit the 99 KiB
// of sm_89). H200, 2026-11-30, TFLOP/s at 2,048 rows (tests/cuda_linear.rs `tiled_linear_speed`):
// served: 128 x 128, 4 warps of 64 x 64, TK 32, 2 stages, tot in shared memory (32 + 64 KiB,
//   two CTAs an SM): 231 (4096 x 4096), 232 (6144 x 4096), 131 (1024 x 4096), 244 (14336 x
//   4096), 262 (4096 x 14336).
TL_ENTRY(linear_bf16_tiled, 4, 8, 2, 2, 32, 2, true, 2)
// r: 128 x 128, 8 warps of 64 x 32, TK 64, 3 stages, tot in registers (96 KiB, one CTA an SM):
//   191, 193, 183, 195, 201; faster where the grid has at most one CTA an SM (the host's
//   `tiled_config`: 1,024-feature weights, calls under ~1,024 rows).
TL_ENTRY(linear_bf16_tiled_r, 4, 4, 2, 4, 64, 3, false, 1)
// Measured and dropped (same arithmetic, all bit-equal on the GPU): the served shape with 3
// stages (112 KiB: 232, 233, 149, 245, 263; too big for sm_89), 128 x 256 and 256 x 128 CTAs of
// 8 warps of 64 x 64 with 4 stages (224 KiB: 221-242 and 180-193), 128 x 64 CTAs (172-189).
