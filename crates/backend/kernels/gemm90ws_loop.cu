// linear_bf16_ws, part 2 (one unit after gemm90ws.cu): the consumers' k loops (one
// accumulator, and two with TF_WS_ACC2), the CTA body, the entry points and the row gather.
// gemm90ws.cu's header says what the kernel computes and why it is built this way.

#if WG_ENABLED
// Waits for stage ring position `it` to be full and issues its wgmmas on acc (this consumer's
// 64 weight rows from byte `aoff` of each sub-tile), as one committed group, with no branch
// between them. Returns the stage.
__device__ __forceinline__ u32 ws_stage_issue(const WsGrid& G, float* acc, u32 it, u32 aoff) {
    const u32 s = it % WS_STAGES, ph = (it / WS_STAGES) & 1;
    mbar_wait_parity(G.full + 8 * s, ph);
    const u32 sa = G.sbase + s * WS_STAGE + aoff, sb = G.sbase + s * WS_STAGE + WS_A_BYTES;
    wg_fence();
#pragma unroll
    for (u32 h = 0; h < TF_WS_KT / 32; h++) {
        const u32 o = (h >> 1) * WS_SUB + 64 * (h & 1);
        wgmma_n128(acc, wg_desc(sa + o), wg_desc(sb + o));
        wgmma_n128(acc, wg_desc(sa + o + 32), wg_desc(sb + o + 32));
    }
    wg_commit();
    return s;
}

// ws_tile_k for K and slice_len multiples of TF_WS_KT (and TF_WS_DEPTH 1): the stage's
// wgmmas without a branch, the wait, the stage released, then the fold when the stage ends a
// slice (or K).
__device__ __forceinline__ void ws_tile_k_even(const WsGrid& G, WsChain& ch, u32 it, u32 kt,
                                               u32 aoff, u32 slice_len) {
    const u32 s = ws_stage_issue(G, ch.acc, it, aoff);
    wg_wait<0>();
    ws_mbar_arrive_if(G.empty + 8 * s, (threadIdx.x & 31) == 0);
    if ((kt + 1) * TF_WS_KT == ch.next_end || (kt + 1) * TF_WS_KT == G.k) {
        wg_fold<64>(ch.acc, ch.tot, ch.first);
        ch.first = false;
        ch.next_end += slice_len;
    }
}

// ws_tile_k_even with two accumulators (TF_WS_ACC2): the stage's wgmmas on accumulator A (this
// slice's; acc for even slices, acc2 for odd), then, while they run, the fold of the other
// when its slice ended at the stage before (`due`), then the wait and the stage released.
template <int A>
__device__ __forceinline__ void ws_stage_acc2(const WsGrid& G, WsChain& ch, u32 it, u32 aoff) {
    float* done = A ? ch.acc : ch.acc2;
    const u32 s = ws_stage_issue(G, A ? ch.acc2 : ch.acc, it, aoff);
    if (ch.due) {
        wg_fold<64>(done, ch.tot, ch.first);
        ch.first = false;
        ch.due = false;
    }
    wg_wait<0>();
    ws_mbar_arrive_if(G.empty + 8 * s, (threadIdx.x & 31) == 0);
}

// A tile's k tiles on the two-accumulator path; ring position `it` advances by G.ktiles.
__device__ __forceinline__ void ws_tile_acc2(const WsGrid& G, WsChain& ch, u32 it, u32 aoff,
                                             u32 slice_len) {
    u32 odd = 0;  // the current slice's accumulator: acc (0) or acc2 (1)
    ch.due = false;
#pragma unroll
    for (int i = 0; i < 64; i++) ch.acc2[i] = 0.0f;
    for (u32 kt = 0; kt < G.ktiles; kt++) {
        if (odd) ws_stage_acc2<1>(G, ch, it + kt, aoff);
        else ws_stage_acc2<0>(G, ch, it + kt, aoff);
        if ((kt + 1) * TF_WS_KT == ch.next_end || (kt + 1) * TF_WS_KT == G.k) {
            ch.due = true;
            odd ^= 1;
            ch.next_end += slice_len;
        }
    }
    // The last slice ended at K; its accumulator is the one before the last toggle.
    if (odd) wg_fold<64>(ch.acc, ch.tot, ch.first);
    else wg_fold<64>(ch.acc2, ch.tot, ch.first);
}

// A consumer warpgroup (cw = 0, 1: features 64 cw .. of each tile).
template <int NP>
__device__ __forceinline__ void ws_consume(const WsGrid& G, const WsParts<NP>& P, u32 cw,
                                           int out_mode) {
    const u32 warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const u32 row = 64 * cw + 16 * warp + g;
    WsChain ch;
    u32 it = 0;
    if (TF_WS_STAGGER && cw == 1) __nanosleep(TF_WS_STAGGER);
    for (u32 tile = blockIdx.x; tile < G.tiles; tile += gridDim.x) {
        const WsAt at = P.at(tile, G.rows);
        const u32 fi = at.fi, ti = at.ti, n = at.n, slice_len = at.slice_len, slices = at.slices;
        const float* __restrict__ bias = at.bias;
        void* out = at.out;
        // bf16 outputs leave through the staging (whole 16-byte chunks); others element by
        // element.
        const bool staged = out_mode == 0 && n % 8 == 0 && ((u64)out & 15) == 0;
#pragma unroll
        for (int i = 0; i < 64; i++) ch.acc[i] = ch.tot[i] = 0.0f;
        ch.first = true;
        ch.next_end = slice_len;
        ch.pending = -1;
        const bool even =
            TF_WS_FOLD && TF_WS_DEPTH == 1 && G.k % TF_WS_KT == 0 && slice_len % TF_WS_KT == 0;
        if (TF_WS_ACC2 && even) {
            ws_tile_acc2(G, ch, it, cw * 64 * 128, slice_len);
            it += G.ktiles;
        } else if (even) {
            for (u32 kt = 0; kt < G.ktiles; kt++)
                ws_tile_k_even(G, ch, it++, kt, cw * 64 * 128, slice_len);
        } else {
            for (u32 kt = 0; kt < G.ktiles; kt++)
                ws_tile_k(G, ch, it++, kt, cw * 64 * 128, slice_len);
        }
        wg_wait<0>();
        ws_mbar_arrive_if(G.empty + 8 * ch.pending, ch.pending >= 0 && lane == 0);
        // Empty trailing slices: linear_bf16 adds their +0.0 partials (turns a -0.0 into +0.0).
        const u32 used = slice_len ? (G.k + slice_len - 1) / slice_len : 0;
        const u32 empty = slices > used ? slices - used : 0;
        const u32 n0 = fi * WS_BM, t0 = ti * WS_BN;
        if (staged) {
            ws_store_staged(G, n, cw, G.stage_out + cw * WS_EPI_BYTES, ch.tot, empty, bias,
                            (bf16*)out, n0, t0, *at.omap);
            continue;
        }
#pragma unroll
        for (int i = 0; i < WS_BN / 8; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 f = n0 + row + (j >= 2 ? 8 : 0);
                const u32 tok = t0 + 8 * i + 2 * c + (j & 1);
                if (f >= n || tok >= G.rows) continue;
                float total = ch.tot[4 * i + j];
                for (u32 s = 0; s < empty; s++) total += 0.0f;
                store_linear(out, out_mode, (u64)tok * n + f, total, bias, f);
            }
    }
    // The last tensor stores complete (and their shared memory read) before the CTA exits.
    if (TF_WS_TMA_STORE && (threadIdx.x & 127) == 0) ws_store_wait<false>();
}

template <int NP>
__device__ __forceinline__ void ws_body(const WsParts<NP>& P, const WsMap& xmap, int out_mode,
                                        u32 k, u32 rows) {
    extern __shared__ unsigned char ws_raw[];
    const u32 raw = (u32)__cvta_generic_to_shared(ws_raw);
    WsGrid G;
    G.k = k;
    G.rows = rows;
    // One product: the tile count from n and rows (its `end` is not filled in). The single
    // launch measured as before WsParts with this form (session 18, ncu), whose SASS differs.
    G.tiles = NP == 1 ? ((P.n[0] + WS_BM - 1) / WS_BM) * ((rows + WS_BN - 1) / WS_BN) : P.end[NP - 1];
    G.ktiles = (k + TF_WS_KT - 1) / TF_WS_KT;
    G.sbase = (raw + 1023) & ~1023u;
    G.stage_out = G.sbase + WS_STAGES * WS_STAGE;
    G.full = G.stage_out + 2 * WS_EPI_BYTES;
    G.empty = G.full + 8 * WS_STAGES;
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < WS_STAGES; s++) {
            mbar_init_at(G.full + 8 * s, 1);
            mbar_init_at(G.empty + 8 * s, 8);  // one arrival from each consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        fence_proxy_async();
    }
    __syncthreads();
    // The role from a shuffle: ptxas then knows it is warp-uniform (a branch it cannot prove
    // uniform before the wgmmas makes it serialize them).
    const u32 wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        if (threadIdx.x < 32) ws_copy<NP>(G, P, xmap);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    ws_consume<NP>(G, P, wg - 1, out_mode);
}
#endif  // WG_ENABLED

// grid: min(tiles, SMs) CTAs (1-D); block 384; dynamic shared memory WS_SMEM. `wmap`: the
// weight's tensor map (bf16 [n][k], box 64 k x 128 rows, 128-byte swizzle, zeros outside);
// `xmap`: the input's (bf16 [rows][k], the same box and swizzle); `omap`: the output's (bf16
// [rows][n], box 64 features x 128 tokens, the same swizzle), read only for bf16 outputs with
// n % 8 == 0 at a 16-byte aligned address (the others' is all zeros).
#if GEMM90_PART(1)
extern "C" __global__ void __launch_bounds__(384, 1)
    linear_bf16_ws(const __grid_constant__ WsMap wmap, const __grid_constant__ WsMap xmap,
                   const __grid_constant__ WsMap omap, const float* __restrict__ bias, void* out,
                   int out_mode, u32 n, u32 k, u32 rows, u32 slice_len, u32 slices) {
    pdl_wait();
    pdl_launch();
#if WG_ENABLED
    const WsParts<1> P = {{&wmap, &wmap, &wmap}, {&omap, &omap, &omap}, {bias, bias, bias},
                          {out, out, out},       {n, n, n},          {slice_len, 0, 0},
                          {slices, 0, 0},        {0, 0, 0}};  // end: unused
    ws_body<1>(P, xmap, out_mode, k, rows);
#endif
}
#endif

// Three products of one input in one launch (q, k and v; gate and up with w2 = w1 and no
// tiles of their own: n2 = 0), each product's elements as linear_bf16_ws computes them alone
// (its own raster, K split, bias and output). One tail instead of three, and the short
// products (k and v: 128 tiles at 2,048 rows, a wave of 132 SMs) fill the long one's last
// wave. grid: min(all tiles, SMs); block 384; WS_SMEM; om0..om2 the parts' output maps
// (bf16 outputs only).
#if GEMM90_PART(1)
extern "C" __global__ void __launch_bounds__(384, 1)
    linear_bf16_ws3(const __grid_constant__ WsMap w0, const __grid_constant__ WsMap w1,
                    const __grid_constant__ WsMap w2, const __grid_constant__ WsMap xmap,
                    const __grid_constant__ WsMap om0, const __grid_constant__ WsMap om1,
                    const __grid_constant__ WsMap om2, const float* __restrict__ b0,
                    const float* __restrict__ b1,
                    const float* __restrict__ b2, void* o0, void* o1, void* o2, int out_mode,
                    u32 n0, u32 n1, u32 n2, u32 len0, u32 len1, u32 len2, u32 sl0, u32 sl1,
                    u32 sl2, u32 k, u32 rows) {
    pdl_wait();
    pdl_launch();
#if WG_ENABLED
    const u32 tt = (rows + WS_BN - 1) / WS_BN;
    const u32 e0 = ((n0 + WS_BM - 1) / WS_BM) * tt, e1 = e0 + ((n1 + WS_BM - 1) / WS_BM) * tt;
    const u32 e2 = e1 + ((n2 + WS_BM - 1) / WS_BM) * tt;
    const WsParts<3> P = {{&w0, &w1, &w2},    {&om0, &om1, &om2}, {b0, b1, b2},
                          {o0, o1, o2},       {n0, n1, n2},       {len0, len1, len2},
                          {sl0, sl1, sl2},    {e0, e1, e2}};
    ws_body<3>(P, xmap, out_mode, k, rows);
#endif
}
#endif

// The rows a product reads, gathered into a contiguous [rows][k] buffer for the input's tensor
// map when the call maps output rows to input rows (`row_idx`, logits) or the input is not
// 16-byte aligned: dst row r = x row row_idx[r] (or r). grid: (ceil(k / 2048), rows), block
// 256, 16 bytes a thread.
#if GEMM90_PART(1)
extern "C" __global__ void __launch_bounds__(256)
    gather_rows(const bf16* __restrict__ x, const u32* __restrict__ row_idx, bf16* __restrict__ dst,
                u32 k) {
    pdl_wait();
    const u32 r = blockIdx.y, kc = (blockIdx.x * 256 + threadIdx.x) * 8;
    if (kc < k) {
        const bf16* src = x + (u64)(row_idx ? row_idx[r] : r) * k + kc;
        bf16* d = dst + (u64)r * k + kc;
#pragma unroll
        for (u32 i = 0; i < 8; i++) d[i] = src[i];
    }
    pdl_launch();
}
#endif
