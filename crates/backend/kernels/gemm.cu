// linear_bf16_tiled: the prefill kernel of the linear product, the same arithmetic per element
// as linear_bf16 in linear.cu (read that file's header first: the K mapping and slice order
// defined there are what this kernel reproduces bit for bit).

// linear_bf16_tiled: a CTA computes TM features x TN tokens from shared-memory tiles of TK k,
// filled by cp.async TL_STAGES tiles ahead. 8 warps as 2 (features) x 4 (tokens); a warp owns
// 64 features x 32 tokens = 4 x 4 mma tiles. Per element the arithmetic is linear_bf16's:
// - super-steps of 32 k from k = 0; lane (g, c) reads the 16 bytes at k0 + 8c of feature rows
//   g and g + 8 and of token g (ld.shared.v4: the same bytes linear_bf16 loads from global
//   memory), first mma on elements 0..3, second on 4..7, same register order;
// - k >= K reads zeros (cp.async src-size 0), exactly the lanes linear_bf16 zeroes (K and the
//   slice ends are multiples of 8, so a lane's 8 elements are all in or all out);
// - the accumulator restarts from zero at each slice start s * slice_len; at a slice's end
//   `tot = acc` (slice 0) or `tot += acc`; each empty trailing slice adds +0.0 (as the +0.0
//   partial of linear_bf16's idle warp); then the bias, then one rounding.
// Shared tiles are [row][TK] bf16, 128 bytes a row; 16-byte chunk j of row r is stored at
// chunk j ^ 4 (r & 1): a quarter-warp's v4 reads (rows r, r + 1, chunks 4h .. 4h + 3) then
// cover all 32 banks once, and the loader's 8 threads of a row write 8 distinct chunks.
// Registers: 128 floats of accumulators (acc and tot) a thread, ~207 in all, so one CTA an SM
// and a 64 x 32 warp tile at most. H200, 2026-11-30: 210-247 TFLOP/s at 2,048 rows on the
// llama3-8b shapes (linear_bf16: 67-81).
#define TL_TM 128
#define TL_TN 128
#define TL_TK 64
#define TL_THREADS 256
#define TL_STAGES 3
#define TL_GROUP 8
#define TL_STAGE_BYTES ((TL_TM + TL_TN) * TL_TK * 2)

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool pred) {
    const int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Byte offset of chunk j (16 bytes) of row r in a [rows][TL_TK] tile.
__device__ __forceinline__ u32 tl_off(u32 r, u32 j) { return r * (TL_TK * 2) + ((j ^ ((r & 1) << 2)) << 4); }

// The CTA's (feature tile, token tile) from a 1-D grid: TL_GROUP feature tiles at a time, the
// token tile advancing after each group's feature tiles, so the CTAs in flight share few weight
// and activation tiles (L2 reuse; measured no different from plain row-major order on an H200
// at 2,048 rows, kept for weights larger than L2). Changes no element's arithmetic.
__device__ __forceinline__ void tl_tile(u32 n, u32 rows, u32& fi, u32& ti) {
    const u32 tf = (n + TL_TM - 1) / TL_TM, tt = (rows + TL_TN - 1) / TL_TN;
    const u32 per = TL_GROUP * tt, first = (blockIdx.x / per) * TL_GROUP, in = blockIdx.x % per;
    const u32 size = min((u32)TL_GROUP, tf - first);
    fi = first + in % size;
    ti = in / size;
}

// One super-step (32 k at half h of the tile) of a warp's 4 x 4 mma tiles: each accumulator
// takes its first mma (elements 0..3 of the lane's 8), then its second (4..7), as in
// linear_bf16. (Issuing all 16 first mmas before the 16 second ones, with a non-volatile
// mma, measured no faster on an H200 and slower at 256-512 rows: 2026-11-30.)
__device__ __forceinline__ void tl_step(float (&acc)[4][4][4], const unsigned char* As,
                                        const unsigned char* Bs, u32 wm, u32 wn, u32 g, u32 c,
                                        u32 h) {
    uint4 b[4], a[4], a8[4];
#pragma unroll
    for (int t = 0; t < 4; t++) b[t] = *(const uint4*)(Bs + tl_off(wn * 32 + t * 8 + g, 4 * h + c));
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const u32 r = wm * 64 + m * 16 + g;
        a[m] = *(const uint4*)(As + tl_off(r, 4 * h + c));
        a8[m] = *(const uint4*)(As + tl_off(r + 8, 4 * h + c));
    }
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int t = 0; t < 4; t++) {
            mma16816(acc[m][t], a[m].x, a8[m].x, a[m].y, a8[m].y, b[t].x, b[t].y);
            mma16816(acc[m][t], a[m].z, a8[m].z, a[m].w, a8[m].w, b[t].z, b[t].w);
        }
}

// A slice ends: tot = acc (the first slice) or tot += acc, and acc restarts from zero.
__device__ __forceinline__ void tl_fold(float (&acc)[4][4][4], float (&tot)[4][4][4], bool& first) {
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                tot[m][t][i] = first ? acc[m][t][i] : tot[m][t][i] + acc[m][t][i];
                acc[m][t][i] = 0.0f;
            }
    first = false;
}

// grid: ceil(n / TL_TM) * ceil(rows / TL_TN) CTAs (1-D); block: TL_THREADS; dynamic shared
// memory TL_STAGES * TL_STAGE_BYTES (96 KiB: fits sm_80 .. sm_90a). Arguments as linear_bf16,
// plus `slices` (the K split's count). 3 stages measured as fast as 4 on an H200.
extern "C" __global__ void __launch_bounds__(TL_THREADS, 1) linear_bf16_tiled(
    const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx,
    const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,
    u32 slice_len, u32 slices) {
    extern __shared__ __align__(128) unsigned char tl_smem[];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 g = lane >> 2, c = lane & 3;
    const u32 wm = warp & 1, wn = warp >> 1;
    u32 fi, ti;
    tl_tile(n, rows, fi, ti);
    const u32 n0 = fi * TL_TM, t0 = ti * TL_TN;
    const u32 sbase = (u32)__cvta_generic_to_shared(tl_smem);

    // Loader: thread copies chunk lc of rows lr + 32 i (i = 0..3) of both tiles.
    const u32 lc = tid & 7, lr = tid >> 3;
    const bf16* ga[4];
    const bf16* gb[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 f = n0 + lr + 32 * i, t = t0 + lr + 32 * i;
        ga[i] = f < n ? w + (u64)f * k + 8 * lc : nullptr;
        const u32 src = t < rows ? (row_idx ? row_idx[t] : t) : 0;
        gb[i] = t < rows ? x + (u64)src * k + 8 * lc : nullptr;
    }
    const u32 ktiles = (k + TL_TK - 1) / TL_TK;
    auto load_tile = [&](u32 kt, u32 stage) {
        const u32 kc = kt * TL_TK + 8 * lc;
        const bool in = kc < k;
        const u32 sa = sbase + stage * TL_STAGE_BYTES, sb = sa + TL_TM * TL_TK * 2;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 off = tl_off(lr + 32 * i, lc);
            const bool pa = in && ga[i], pb = in && gb[i];
            cp_async16(sa + off, pa ? (const void*)(ga[i] + kt * TL_TK) : (const void*)w, pa);
            cp_async16(sb + off, pb ? (const void*)(gb[i] + kt * TL_TK) : (const void*)x, pb);
        }
    };

    float acc[4][4][4], tot[4][4][4];
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][t][i] = tot[m][t][i] = 0.0f;
    bool first = true;
    u32 next_end = slice_len;  // k where the current slice ends (a multiple of 32)

#pragma unroll
    for (u32 s = 0; s < TL_STAGES - 1; s++) {
        if (s < ktiles) load_tile(s, s);
        cp_async_commit();
    }
    for (u32 kt = 0; kt < ktiles; kt++) {
        cp_async_wait<TL_STAGES - 2>();
        __syncthreads();
        if (kt + TL_STAGES - 1 < ktiles) load_tile(kt + TL_STAGES - 1, (kt + TL_STAGES - 1) % TL_STAGES);
        cp_async_commit();
        const unsigned char* As = tl_smem + (kt % TL_STAGES) * TL_STAGE_BYTES;
        const unsigned char* Bs = As + TL_TM * TL_TK * 2;
#pragma unroll
        for (u32 h = 0; h < TL_TK / 32; h++) {
            const u32 k0 = kt * TL_TK + 32 * h;
            if (k0 >= k) break;
            tl_step(acc, As, Bs, wm, wn, g, c, h);
            if (k0 + 32 == next_end || k0 + 32 >= k) {  // a slice ends: fold its partial in
                tl_fold(acc, tot, first);
                next_end += slice_len;
            }
        }
    }
    cp_async_wait_all();
    // Empty trailing slices: linear_bf16 adds their +0.0 partials (turns a -0.0 into +0.0).
    const u32 used = slice_len ? (k + slice_len - 1) / slice_len : 0;
    for (u32 s = used; s < slices; s++)
#pragma unroll
        for (int m = 0; m < 4; m++)
#pragma unroll
            for (int t = 0; t < 4; t++)
#pragma unroll
                for (int i = 0; i < 4; i++) tot[m][t][i] += 0.0f;
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const u32 f = n0 + wm * 64 + m * 16 + g + (i >= 2 ? 8 : 0);
                const u32 tok = t0 + wn * 32 + t * 8 + 2 * c + (i & 1);
                if (f >= n || tok >= rows) continue;
                float total = tot[m][t][i];
                if (bias) total += bias[f];
                const u64 at = (u64)tok * n + f;
                if (out_mode == 0) ((bf16*)out)[at] = f2bf(total);
                else if (out_mode == 1) ((float*)out)[at] = total;
                else ((float*)out)[at] = rbf(total);
            }
}
