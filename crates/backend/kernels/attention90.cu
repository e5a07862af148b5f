// Attention, part 3 (one unit after attention.cu and attention_dec.cu): the prefill CTA on
// Hopper's warpgroup tensor-core instruction (wgmma.mma_async, sm_90a), head_dim 128. Per
// M-row it computes attention.cu's definition, operation for operation; only who issues the
// products and how many rows share a KV tile change.
//
// Why the bits are the general CTA's (attend): a wgmma k16 step gives the accumulator bits of
// an mma.sync m16n8k16 step fed the same 16 products from the same value (gemm90.cu's header;
// tests/cuda_wgmma.rs's probe), and a wgmma accumulator holds, per warp, the rows and columns
// of mma.sync's fragments in the same registers (warp w of a warpgroup: M-rows 16w..16w+15).
// - scores: one m64n64k16 step per 16 head dims in increasing order from +0 (qk_tile's
//   chain), Q (the CTA's M-rows) and K (the tile's 64 positions) both from shared memory,
//   K-major, in the 128-byte swizzle;
// - softmax_tile (attention.cu) on the accumulators as they are;
// - P V: for each 16-position step kk in order, the pieces b0, b1, b2 (split3) in order, one
//   m64n128k16 step each with the pieces as the A operand from registers (mma.sync's A
//   fragment layout) and V from shared memory, N-major ([position][dim] as stored: the
//   transposed-B form), each accumulator rescaled by alpha before the tile, as attend();
// - splits of SPLIT positions merged sequentially (merge_ml, merge_o), out = finish(O / L).
// tests/cuda_attention.rs compares this CTA's rows with the decode CTAs' bit for bit.
//
// Launch: a CTA of AW_WGS warpgroups (AW_MROWS = 64 AW_WGS M-rows, so row tiles of
// RPC = AW_MROWS / G rows share each K and V tile: twice attend()'s), one kv head g. The grid
// has a CTA per (window of RPC rows, kv head), windows from the last (the heaviest causal
// rows) to the first; a CTA runs, one after another, the row tiles (attention.cu's row_tile
// with this RPC) that start in its window: one for a single sequence, several where short
// sequences meet. The grid is a function of the row count and the geometry (attention.rs),
// which takes this CTA only where the rows fill its windows on average: many sequences' short
// tiles (a 64-stream decode step) run in parallel on the general CTA instead (session 14).
// K and V tiles: 16-byte cp.async from every thread into two buffers each, zero-filled past
// the tile's last valid position as attend(). One CTA barrier a tile. Within a warpgroup
// the work is pipelined (as FlashAttention-3's intra-warpgroup overlap): iteration t issues
// the loads of K(t + 2) and V(t + 1), splits p(t), issues the scores of tile t + 1 and then
// P(t) V(t), and runs the softmax of t + 1 while P V is on the tensor cores; o then takes
// alpha(t + 1). Every operation on o and on (m, l) is attend()'s, in attend()'s order.
// Measured and dropped (session 14, H200, bit-equal): three K/V buffers with the loads issued
// behind the products, 298 vs 293 us at 2,048 rows. ncu: issue slots 40% busy, 0.58 of 2
// warps a scheduler eligible; the instruction stream, not the loads, bounds this CTA.
// Session 18: the row tile's block ids staged in shared memory once (AwTable) and a position's
// block by shifts: each tile's copies no longer wait on a global load of the table right after
// the CTA barrier, nor on a division (the loop's SASS 2,306 -> 1,910 instructions). H200, same
// bits (tests/cuda_attention.rs, check exact): 2,048 rows 298 -> 233 us a call, 8,192 rows
// 3.9 -> 3.0 ms; served prefill 8,192 / 32,768 23.9k / 11.7k -> 26.2k / 13.9k tok/s. Also
// measured then: skipping the causal compare on tiles wholly below the row (232 vs 233 us,
// 2,978 vs 2,994 at 8,192; served 2,048 no faster): dropped. Then a thread's four block ids
// read before its first copy (aw_load_kv; the compiler kept each read behind the previous
// copy, which writes shared memory where the ids are): 2,048 rows 233 -> 227 us, 8,192 rows
// 2,990 -> 2,923 us, served 32,768 13.8k -> 14.1k tok/s, same bits.
//
// Everything here compiles to nothing below sm_90a (the host never picks it there).

#define AW_WGS 2
#define AW_MROWS (64 * AW_WGS)
#define AW_THREADS (128 * AW_WGS)
// Shared memory (bytes from a 1,024-aligned base): q as two 64-dim halves of [AW_MROWS][128 B];
// two K and two V tiles, each two 64-dim halves of [TK positions][128 B]; then the running
// totals O of finished splits, elements 4q..4q + 3 of thread i at float4 q * AW_THREADS + i
// (aw_close_split). The host's
// `attention_wg_smem` mirrors AW_SMEM.
#define AW_QHALF (AW_MROWS * 128)
#define AW_KHALF (TK * 128)
#define AW_TILE (2 * AW_KHALF)
#define AW_K (2 * AW_QHALF)
#define AW_V (AW_K + 2 * AW_TILE)
#define AW_O (AW_V + 2 * AW_TILE)
// Then the row tile's block table (AW_TBL entries; longer tables are read from global memory).
#define AW_TBL 4096
#define AW_T (AW_O + 64 * AW_THREADS * 4)
#define AW_SMEM (AW_T + AW_TBL * 4 + 1024)

// V as the N-major (transposed) B of P.V: 16 positions x 64 dims a 2,048-byte step; the
// leading offset steps across the two 64-dim halves, the stride across 8-position groups
// (H200: bitwise equal to the decode rows with these, session 13).
#define AW_V_LBO AW_KHALF
#define AW_V_SBO 1024
#if WG_ENABLED
#define AW_S_REGS                                                                             \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define AW_S_OPS                                                                              \
    "+f"(s[0][0]), "+f"(s[0][1]), "+f"(s[0][2]), "+f"(s[0][3]), "+f"(s[1][0]), "+f"(s[1][1]), \
        "+f"(s[1][2]), "+f"(s[1][3]), "+f"(s[2][0]), "+f"(s[2][1]), "+f"(s[2][2]),            \
        "+f"(s[2][3]), "+f"(s[3][0]), "+f"(s[3][1]), "+f"(s[3][2]), "+f"(s[3][3]),            \
        "+f"(s[4][0]), "+f"(s[4][1]), "+f"(s[4][2]), "+f"(s[4][3]), "+f"(s[5][0]),            \
        "+f"(s[5][1]), "+f"(s[5][2]), "+f"(s[5][3]), "+f"(s[6][0]), "+f"(s[6][1]),            \
        "+f"(s[6][2]), "+f"(s[6][3]), "+f"(s[7][0]), "+f"(s[7][1]), "+f"(s[7][2]), "+f"(s[7][3])

// s (m64n64, f32) += Q K^T over one 16-dim step; both operands K-major in shared memory.
__device__ __forceinline__ void aw_qk(float (&s)[8][4], u64 dq, u64 dk) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" AW_S_REGS
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : AW_S_OPS
        : "l"(dq), "l"(dk), "r"(1));
}

// d (m64n128, f32) += P V over one 16-position step: P's bf16 pieces from registers (a),
// V N-major in shared memory (imm-trans-b 1).
__device__ __forceinline__ void aw_pv(float* d, const u32 (&a)[4], u64 dv) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_D128_REGS
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : WG_D128_OPS
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(dv), "r"(1));
}

// s = Q K^T of the warpgroup's 64 M-rows (q at qb) and the K tile at kb: zeroed, then one
// m64n64k16 step per 16 dims in increasing order, committed as one group (not waited for).
// Every warpgroup issues it (one with no used M-row scores zero q rows): ptxas serializes
// wgmma whose waits sit in divergent paths.
__device__ __forceinline__ void aw_scores(float (&s)[8][4], u32 qb, u32 kb) {
#pragma unroll
    for (int nb = 0; nb < 8; nb++) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
    wg_fence();
#pragma unroll
    for (int st = 0; st < 8; st++) {
        const u32 h = st / 4, kk = st % 4;
        aw_qk(s, wg_desc(qb + h * AW_QHALF + kk * 32), wg_desc(kb + h * AW_KHALF + kk * 32));
    }
    wg_commit();
}

// Where a row tile's KV rows are: its block table (in shared memory when it fits: a
// generic pointer either way) and the block size's shift (a power of two, the host checks:
// a position's block and slot without a division).
struct AwTable {
    const u32* ids;
    u32 shift;
    __device__ __forceinline__ u32 block(u32 j) const { return ids[j >> shift]; }
    __device__ __forceinline__ u32 slot(u32 j) const { return j & ((1u << shift) - 1); }
};

// K (or V: gofs + plane) rows of KV tile t into a tile at shared address dst: position r's
// 16-byte chunk c at half c / 8, swizzled row r; positions >= n zero (no pool read). The N
// copying threads (p: this one's index among them) take TK * 16 / N rows each. IDS_FIRST: a
// thread's block ids are all read before its first copy (a copy writes shared memory, where
// the ids may be, so the compiler keeps every read before it in program order); without, each
// id is read just before its copy (the copy warpgroup, attention90ws.cu: its copies run ahead
// of their use, and its 56 registers hold no array of ids without spilling).
template <u32 N, bool IDS_FIRST>
__device__ __forceinline__ void aw_load_kv(u32 dst, const bf16* pool, const AwTable& table, u32 t,
                                           u32 n, u64 base, u64 gofs, u32 p) {
    constexpr u32 ROWS = TK * 16 / N;
    const u32 c = p % 16;
    u32 blk[ROWS];
#pragma unroll
    for (u32 q = 0; q < ROWS && IDS_FIRST; q++) {
        const u32 j = t * TK + (p + q * N) / 16;
        blk[q] = j < n ? table.block(j) : 0;
    }
#pragma unroll
    for (u32 q = 0; q < ROWS; q++) {
        const u32 r = (p + q * N) / 16, j = t * TK + r;
        const bf16* src = pool;
        if (j < n) {
            const u32 id = IDS_FIRST ? blk[q] : table.block(j);
            src = pool + (u64)id * base + gofs + (u64)table.slot(j) * 128 + c * 8;
        }
        cp_async16(dst + (c / 8) * AW_KHALF + wg_sw(r, c % 8), src, j < n);
    }
}

// q of the M-rows [i0 / 16, end / 16) into the swizzled q halves at sbase (16-byte chunk i
// % 16 of M-row i / 16, for i = i0, i0 + step, ... below end): M-row mr is row mr / G of the
// tile at head g G + mr % G, zero where the row is unused.
__device__ __forceinline__ void aw_store_q(u32 sbase, const Args& A, const Tile& tile, u32 g,
                                           u32 G, u32 i0, u32 step, u32 end) {
    for (u32 i = i0; i < end; i += step) {
        const u32 mr = i / 16, c = i % 16, ri = mr / G;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (ri < tile.nr)
            v = *(const uint4*)(A.q + ((u64)(tile.b + ri) * A.heads + g * G + mr % G) * 128 + c * 8);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(
                         sbase + (c / 8) * AW_QHALF + wg_sw(mr, c % 8)),
                     "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
    }
}

// p(t)'s pieces as wgmma A registers: a[16-position step][piece][register] (split_step).
__device__ __forceinline__ void aw_split_all(const float (&s)[8][4], u32 (&a)[4][3][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        u32 x[4][3];
        split_step<8>(s, kk, x);
#pragma unroll
        for (int p = 0; p < 3; p++)
#pragma unroll
            for (int r = 0; r < 4; r++) a[kk][p][r] = x[r][p];
    }
}

// o += P(t) V(t) (the V tile at vb): per 16-position step in order, the pieces in order;
// committed as one group (not waited for).
__device__ __forceinline__ void aw_pv_all(float* o, const u32 (&a)[4][3][4], u32 vb) {
    wg_fence();  // o and a were written by this thread
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int p = 0; p < 3; p++) aw_pv(o, a[kk][p], wg_desc_at(vb + kk * 2048, AW_V_LBO, AW_V_SBO));
    wg_commit();
}

// A split ends with state (mf, lf, o): O = o (the first split) or the sequential merge into
// (M, L, O); o starts again at 0. Ot: this thread's totals, elements 4q..4q + 3 at Ot[q
// AW_THREADS] (a warp's 16-byte accesses then meet no bank twice).
__device__ __forceinline__ void aw_close_split(bool first, float (&M)[2], float (&L)[2],
                                               const float (&mf)[2], const float (&lf)[2],
                                               float (&o)[64], float4* Ot) {
    if (first) {
        for (int k = 0; k < 2; k++) { M[k] = mf[k]; L[k] = lf[k]; }
#pragma unroll
        for (int q = 0; q < 16; q++)
            Ot[q * AW_THREADS] = make_float4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
    } else {
        float ma[2], mc[2];
        for (int k = 0; k < 2; k++) merge_ml(M[k], L[k], mf[k], lf[k], ma[k], mc[k]);
#pragma unroll
        for (int q = 0; q < 16; q++) {
            float4 v = Ot[q * AW_THREADS];
            v.x = merge_o(v.x, o[4 * q], ma[0], mc[0]);
            v.y = merge_o(v.y, o[4 * q + 1], ma[0], mc[0]);
            v.z = merge_o(v.z, o[4 * q + 2], ma[1], mc[1]);
            v.w = merge_o(v.w, o[4 * q + 3], ma[1], mc[1]);
            Ot[q * AW_THREADS] = v;
        }
    }
#pragma unroll
    for (int e = 0; e < 64; e++) o[e] = 0.0f;
}

// o *= alpha of its row (accumulator columns 0, 1: row lane / 4; 2, 3: + 8).
__device__ __forceinline__ void aw_rescale(float (&o)[64], const float (&alpha)[2]) {
#pragma unroll
    for (int d = 0; d < 16; d++) {
        o[4 * d] = __fmul_rn(o[4 * d], alpha[0]);
        o[4 * d + 1] = __fmul_rn(o[4 * d + 1], alpha[0]);
        o[4 * d + 2] = __fmul_rn(o[4 * d + 2], alpha[1]);
        o[4 * d + 3] = __fmul_rn(o[4 * d + 3], alpha[1]);
    }
}

// out = finish(O / L) of this thread's two M-rows (mr0 + lane / 4, + 8; Ot as above:
// accumulator columns 0, 1 of a chunk are row lane / 4's, 2, 3 row lane / 4 + 8's).
__device__ __forceinline__ void aw_write_out(const Args& A, const Tile& tile, u32 g, u32 G,
                                             const int (&prow)[2], const float (&L)[2],
                                             const float4* Ot, u32 mr0, u32 lane) {
#pragma unroll
    for (int k = 0; k < 2; k++) {
        if (prow[k] < 0) continue;
        const u32 mr = mr0 + lane / 4 + 8 * k;
        const u32 r = tile.b + mr / G, h = g * G + mr % G;
#pragma unroll
        for (int d = 0; d < 16; d++) {
            const float4 O = Ot[d * AW_THREADS];
            const u32 v = k == 0 ? pack_bf2(finish(O.x, L[0]), finish(O.y, L[0]))
                                 : pack_bf2(finish(O.z, L[1]), finish(O.w, L[1]));
            *(u32*)(A.out + ((u64)r * A.heads + h) * 128 + d * 8 + (lane % 4) * 2) = v;
        }
    }
}

// One row tile of kv head g: attention.cu's definition for its M-rows (header above).
__device__ void attend_wg(const Args& A, const Tile& tile, u32 g, u32 G, u32 sbase, float4* Os,
                          u32* tbl) {
    const u32 wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x & 31;
    __syncthreads();  // the previous row tile is done with shared memory
    aw_store_q(sbase, A, tile, g, G, threadIdx.x, AW_THREADS, AW_MROWS * 16);
    fence_proxy_async();  // q is read by wgmma (the async proxy) after the first barrier
    int prow[2];
    row_positions(prow, A, tile, G, 64 * wg + 16 * warp, lane);
    const KvAt at = kv_at<128>(A, tile, g);
    // The block ids once a row tile (not a global load on every tile's copies).
    AwTable tb = {at.table, (u32)__ffs(A.bs) - 1};
    const u32 nblk = (tile.n + A.bs - 1) >> tb.shift;
    if (nblk <= AW_TBL) {
        for (u32 i = threadIdx.x; i < nblk; i += AW_THREADS) tbl[i] = at.table[i];
        tb.ids = tbl;
    }
    __syncthreads();
    const float NEG = -__int_as_float(0x7f800000);
    float M[2] = {NEG, NEG}, L[2] = {0.0f, 0.0f};
    float m[2] = {NEG, NEG}, l[2] = {0.0f, 0.0f}, o[64];
#pragma unroll
    for (int e = 0; e < 64; e++) o[e] = 0.0f;
    const u32 nt = (tile.n + TK - 1) / TK;
    const u32 qb = sbase + wg * 64 * 128;
    // Loads in flight at the top of iteration t: K(t + 1), V(t) (K(0) is waited for first).
    aw_load_kv<AW_THREADS, true>(sbase + AW_K, A.pool, tb, 0, tile.n, at.base, at.gofs, threadIdx.x);
    cp_async_commit();
    if (nt > 1)
        aw_load_kv<AW_THREADS, true>(sbase + AW_K + AW_TILE, A.pool, tb, 1, tile.n, at.base, at.gofs, threadIdx.x);
    cp_async_commit();
    aw_load_kv<AW_THREADS, true>(sbase + AW_V, A.pool, tb, 0, tile.n, at.base, at.gofs + at.plane, threadIdx.x);
    cp_async_commit();
    cp_async_wait<2>();   // K(0) has arrived
    fence_proxy_async();  // ... visible to wgmma
    __syncthreads();
    float s[8][4], alpha[2];
    aw_scores(s, qb, sbase + AW_K);
    wg_wait<0>();
    // Tile 0 starts the first split: o = 0 stays 0 under its alpha (+0, as o * 0).
    softmax_tile<8>(s, 0, prow, A.scale, lane, NEG, m, l, alpha);
    // Tile t; NEXT: a tile t + 1 exists (a constant at both calls, so after inlining every
    // wgmma and its wait sit on one path).
    auto step = [&](u32 t, const bool NEXT) {
        cp_async_wait<0>();  // K(t + 1), V(t) have arrived
        fence_proxy_async();
        // ... for every thread, and every warpgroup is done with K(t) and V(t - 1):
        __syncthreads();
        if (t + 2 < nt)
            aw_load_kv<AW_THREADS, true>(sbase + AW_K + (t % 2) * AW_TILE, A.pool, tb, t + 2, tile.n, at.base,
                       at.gofs, threadIdx.x);
        cp_async_commit();
        if (NEXT)
            aw_load_kv<AW_THREADS, true>(sbase + AW_V + ((t + 1) % 2) * AW_TILE, A.pool, tb, t + 1, tile.n,
                       at.base, at.gofs + at.plane, threadIdx.x);
        cp_async_commit();
        const bool fresh = NEXT && ((t + 1) * TK) % SPLIT == 0;
        u32 a[4][3][4];  // p(t)'s pieces: [16-position step][piece][A register]
        aw_split_all(s, a);
        // Scores of tile t + 1 go to the tensor cores first, then P(t) V(t); the softmax of
        // t + 1 runs while P V does. o's operations stay in attend()'s order: ... + P(t) V(t),
        // then * alpha(t + 1), then + P(t + 1) V(t + 1).
        if (NEXT) aw_scores(s, qb, sbase + AW_K + ((t + 1) % 2) * AW_TILE);
        const u32 vb = sbase + AW_V + (t % 2) * AW_TILE;
        aw_pv_all(o, a, vb);
        const float mf[2] = {m[0], m[1]}, lf[2] = {l[0], l[1]};  // split state through t
        if (NEXT) {
            wg_wait<1>();  // the scores of t + 1
            if (fresh)
                for (int k = 0; k < 2; k++) { m[k] = NEG; l[k] = 0.0f; }
            softmax_tile<8>(s, t + 1, prow, A.scale, lane, NEG, m, l, alpha);
        }
        wg_wait<0>();  // o holds P(t) V(t)
        if (!NEXT || fresh) aw_close_split((t * TK) / SPLIT == 0, M, L, mf, lf, o, Os + threadIdx.x);
        if (NEXT) aw_rescale(o, alpha);
    };
    for (u32 t = 0; t + 1 < nt; t++) step(t, true);
    step(nt - 1, false);
    aw_write_out(A, tile, g, G, prow, L, Os + threadIdx.x, 64 * wg + 16 * warp, lane);
}
#endif  // WG_ENABLED

// Which rows of the window from b0 start a row tile (row_tile's test, one row a thread of the
// first AW_MROWS): bit j of starts[i] for row b0 + 32 i + j. The caller's barrier publishes it.
__device__ __forceinline__ void aw_window_starts(u32* starts, const u32* positions,
                                                 const u32* row_table, u32 rows, u32 rpc, u32 b0) {
    if (threadIdx.x < AW_MROWS) {
        const u32 b = b0 + threadIdx.x;
        bool start = b < rows && threadIdx.x < rpc;
        if (start && b > 0) {
            const u32 p = positions[b];
            start = !(row_table[b - 1] == row_table[b] && positions[b - 1] + 1 == p && p % rpc != 0);
        }
        const u32 bits = __ballot_sync(0xffffffffu, start);
        if ((threadIdx.x & 31) == 0) starts[threadIdx.x / 32] = bits;
    }
}

#if WG_ENABLED
// A prefill CTA's place: its shared memory (the 1,024-aligned base, the split totals, the block
// table), kv head g, the window's first row b0 and its rows RPC = AW_MROWS / G; `starts`
// filled by aw_window_starts (published by the caller's barrier).
struct AwCta {
    u32 sbase;
    float4* Os;
    u32* tbl;
    u32 G, rpc, g, b0;
};
__device__ __forceinline__ AwCta aw_cta(unsigned char* smem, const Args& A, u32* starts) {
    AwCta c;
    const u32 raw = smem_u32(smem);
    c.sbase = (raw + 1023) & ~1023u;
    c.Os = (float4*)(smem + (c.sbase - raw) + AW_O);
    c.tbl = (u32*)(smem + (c.sbase - raw) + AW_T);
    c.G = A.heads / A.kvh;
    c.rpc = AW_MROWS / c.G;
    const u32 nwin = (A.rows + c.rpc - 1) / c.rpc;
    c.g = blockIdx.x % A.kvh;
    c.b0 = (nwin - 1 - blockIdx.x / A.kvh) * c.rpc;
    aw_window_starts(starts, A.positions, A.row_table, A.rows, c.rpc, c.b0);
    return c;
}

// f(tile) for each row tile that starts in the CTA's window (`starts`, published by a barrier
// after aw_cta), in row order.
template <class F>
__device__ __forceinline__ void aw_each_tile(const Args& A, const AwCta& c, const u32* starts, F f) {
    for (u32 i = 0; i < AW_MROWS / 32; i++)
        for (u32 bits = starts[i]; bits; bits &= bits - 1)
            f(row_tile(A.positions, A.row_table, c.b0 + 32 * i + __ffs(bits) - 1, A.rows, c.rpc));
}
#endif

// The prefill entry (walk mode: every split, no partials), head_dim 128, sm_90a. grid:
// (windows of RPC rows) x kv heads; block AW_THREADS; dynamic shared memory AW_SMEM.
#if ATTN_PART(3)
extern "C" __global__ void __launch_bounds__(AW_THREADS, 1) attention_wg_hd128(ATTN_PARAMS) {
    pdl_wait();
    pdl_launch();
#if WG_ENABLED
    ATTN_ARGS(0);
    extern __shared__ __align__(16) unsigned char aw_smem[];
    __shared__ u32 starts[AW_MROWS / 32];
    const AwCta c = aw_cta(aw_smem, a, starts);
    __syncthreads();
    aw_each_tile(a, c, starts,
                 [&](const Tile& tile) { attend_wg(a, tile, c.g, c.G, c.sbase, c.Os, c.tbl); });
#endif
}
#endif
