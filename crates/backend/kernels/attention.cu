// Causal attention over the paged pool (layout in kv.cu) on tensor cores (mma.sync m16n8k16,
// bf16 in, f32 accumulate): one kernel family for prefill chunks and decode rows.
//
// Row tiles. A CTA (x, z) owns kv head g = x % kvh and the row tile that starts at row
// b = rows - 1 - x / kvh (heavy, late tiles are scheduled first), if row b starts one: a tile is a
// run of rows of one sequence (same row_table entry) at consecutive positions inside one
// block of RPC = 64 / G aligned positions (G = query heads per kv head); otherwise the CTA
// exits. Its 64 M-rows are (row i / G, head g * G + i % G); warp w takes M-rows 16w..16w+15.
// Unused M-rows are zero q and fully masked.
//
// Per M-row (query row at position p), the arithmetic is fixed by p and HD alone:
// - scores: s_j = bf16-q . bf16-k_j by mma over HD in 16-wide k steps in increasing order
//   (acc starts at +0), then * scale; positions j > p are -inf (a select, so K past p is
//   never used);
// - KV tiles of TK = 64 positions at absolute multiples of 64, in increasing order, grouped in
//   splits of S = 128 positions (absolute; TF_SPLIT below). Per split an online softmax from (m, l, o) =
//   (-inf, 0, 0): tile max by fmaxf (order-free), m' = max(m, tmax), alpha = exp(m - m'),
//   p_j = exp(s_j - m') (m' = -inf is taken as 0, so a fully masked split stays (-inf, 0, 0)),
//   l = l * alpha + rowsum (each thread sums its 16 columns in column order, then a quad
//   xor butterfly), o = o * alpha + P V;
// - P V on tensor cores without losing fp32 p: p = b0 + b1 + b2 exactly (b0 = bf16(p),
//   b1 = bf16(p - b0), b2 = bf16(p - b0 - b1)), three mmas per 16 positions (b0, b1, b2 in
//   that order), so every product is exact and only the f32 accumulation rounds;
// - splits merged SEQUENTIALLY: (M, L, O) = split 0 verbatim, then for z = 1, 2, ...:
//   M' = max(M, m_z), a = exp(M - M'), c = exp(m_z - M'), L = L a + l_z c, O = O a + o_z c;
//   out = bf16(O / L) with -0 canonicalized to +0. A prefill CTA (mode 0) merges in registers
//   as it walks; a decode CTA (mode 1, one split per CTA) writes its split's (m, l, o) and
//   attention_combine merges them with the same formula (explicit _rn intrinsics, so no FMA
//   contraction can differ).
// Decode CTAs (attention_dec_hd*, a row tile of <= 16 M-rows): the arithmetic above for warp
// 0's M-rows, issued by 4 warps (see attend_dec): the definition does not change with it.
// A row beside others that reach further sees extra tiles and splits that are fully masked
// for it: there m' = m, alpha = exp(0) = 1, p = 0, l * 1 + 0 = l, o * 1 + (0 * v) = o (up to
// the sign of a zero, canonicalized at the output), and a merged masked split has
// c = exp(-inf) = 0. V (and K) rows past the tile's last valid position are loaded as ZERO
// (cp.async zero-fill, no pool read), so stale or NaN pool memory never meets a 0 weight.
// Rows of the same call at positions <= the tile's last one are written KV (finite in any sane
// model; a non-finite V value written in this call would reach earlier rows as 0 * inf).
// TF_SPLIT (a measurement knob through TENSORFOLD_KERNEL_DEFINES, which the host reads too):
// positions a split, 64, 128 (the default) or 256. It is part of the definition above (where
// the online softmax restarts and the merge happens), so another value gives other bits, the
// same for every path (prefill, decode, alone or batched) since every path uses it. 128 since
// 2026-12-01: H200, one decode row of llama3-8b's heads (tests/cuda_attention.rs, bulk-copy
// loads), 8.85 / 8.79 / 10.12 / 16.68 us a call at 128 / 384 / 1,024 / 4,096 positions against
// 9.12 / 12.74 / 12.90 / 17.18 with 256 (more CTAs share a row's KV loads); 64 was faster to
// 1,024 (8.00 / 9.04 / 10.95) but slower at 4,096 (25.53: two waves of CTAs).
#ifndef TF_SPLIT
#define TF_SPLIT 128
#endif
// TF_ATTN_PART: which entry points a translation unit defines. cuda/compile.rs compiles this
// family as several units (`UNITS` there), so a cold start compiles them on parallel threads
// instead of one ~8 s unit: a head dim (64, 96, 128, 256) its general and decode entries, 1
// attention_combine, 2 attention_ws_hd128, 3 attention_wg_hd128. Unset (as
// tools/kernel_regs.py compiles the files): every entry. A part changes no entry's machine
// code (nvdisasm, session 36: every entry's instructions equal the whole family's).
#ifdef TF_ATTN_PART
#define ATTN_PART(p) (TF_ATTN_PART == (p))
#else
#define ATTN_PART(p) 1
#endif
#define TK 64
#define SPLIT TF_SPLIT
#define WARPS 4
#define MROWS 64

__device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm_x4(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldsm_x4_t(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// 16 bytes global -> shared; src_bytes 0 writes zeros without reading src.
__device__ __forceinline__ void cp16(void* dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;"); }
__device__ __forceinline__ void cp_wait0() { asm volatile("cp.async.wait_group 0;"); }

// bf16x2 of (lo, hi), round to nearest even.
__device__ __forceinline__ u32 pack_bf2(float lo, float hi) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
__device__ __forceinline__ float lo_f(u32 x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float hi_f(u32 x) { return __uint_as_float(x & 0xffff0000u); }

// The exact three-piece split of two f32 weights (lo, hi) into bf16x2 pieces.
__device__ __forceinline__ void split3(float lo, float hi, u32* b) {
    b[0] = pack_bf2(lo, hi);
    const float lo1 = __fsub_rn(lo, lo_f(b[0])), hi1 = __fsub_rn(hi, hi_f(b[0]));
    b[1] = pack_bf2(lo1, hi1);
    b[2] = pack_bf2(__fsub_rn(lo1, lo_f(b[1])), __fsub_rn(hi1, hi_f(b[1])));
}

// The A registers of P for 16-position step kk (m16n8k16 layout: register r from the pairs
// s[2kk][0..1], s[2kk][2..3], s[2kk+1][0..1], s[2kk+1][2..3]), each split: a[r][piece].
template <int NB>
__device__ __forceinline__ void split_step(const float (&s)[NB][4], int kk, u32 (&a)[4][3]) {
    split3(s[2 * kk][0], s[2 * kk][1], a[0]);
    split3(s[2 * kk][2], s[2 * kk][3], a[1]);
    split3(s[2 * kk + 1][0], s[2 * kk + 1][1], a[2]);
    split3(s[2 * kk + 1][2], s[2 * kk + 1][3], a[3]);
}

// exp(x) as 2^(x log2 e): ex2.approx.f32 (not .ftz: subnormal results kept) is within 2 ulp
// (under the contract's 2^-20), and the rounding of the scaled argument is the contract's
// "exp2 argument scaling" term (2u |x|). exp(-inf) = +0, exp(0) = 1 exactly.
__device__ __forceinline__ float fexp(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, 1.4426950408889634f)));
    return y;
}

// The sequential split merge (shared with attention_combine): (M, L) <- merge with (m, l);
// returns the factors (a, c) that O = O a + o c uses.
__device__ __forceinline__ void merge_ml(float& M, float& L, float m, float l, float& a,
                                        float& c) {
    const float mn = fmaxf(M, m);
    a = fexp(__fsub_rn(M, mn));
    c = fexp(__fsub_rn(m, mn));
    L = __fadd_rn(__fmul_rn(L, a), __fmul_rn(l, c));
    M = mn;
}
__device__ __forceinline__ float merge_o(float O, float o, float a, float c) {
    return __fadd_rn(__fmul_rn(O, a), __fmul_rn(o, c));
}
__device__ __forceinline__ float finish(float O, float L) {
    const float x = __fdiv_rn(O, L);
    return x == 0.0f ? 0.0f : x;
}

struct Tile {
    u32 b, nr, n;  // first row, rows, positions of the furthest row (its p + 1)
};

// The row tile starting at row b, or nr = 0 if row b does not start one.
__device__ __forceinline__ Tile row_tile(const u32* positions, const u32* row_table, u32 b,
                                         u32 rows, u32 rpc) {
    Tile t = {b, 0, 0};
    const u32 rt = row_table[b], p = positions[b];
    if (b > 0 && row_table[b - 1] == rt && positions[b - 1] + 1 == p && p % rpc != 0) return t;
    u32 e = b + 1;
    while (e < rows && row_table[e] == rt && positions[e] == positions[e - 1] + 1 &&
           positions[e] % rpc != 0)
        e++;
    t.nr = e - b;
    t.n = positions[e - 1] + 1;
    return t;
}

// Loads tile t's K (or V, off = plane) rows into smem (row stride HD + 8); positions >= n zero.
template <int HD>
__device__ __forceinline__ void load_kv(bf16* dst, const bf16* pool, const u32* table, u32 t,
                                        u32 n, u64 base, u64 gofs, u32 bs) {
    constexpr int C = HD / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < TK * C; i += 32 * WARPS) {
        const int r = i / C, c = i % C;
        const u32 j = t * TK + r;
        const bf16* src = pool;
        u32 bytes = 0;
        if (j < n) {
            const u64 blk = table[j / bs];
            src = pool + blk * base + gofs + (u64)(j % bs) * HD + c * 8;
            bytes = 16;
        }
        cp16(dst + r * (HD + 8) + c * 8, src, bytes);
    }
}

struct Args {
    const bf16* q;
    const bf16* pool;
    bf16* out;
    float* partial;
    const u32* positions;
    const u32* row_table;
    const u32* tables;
    u32 rows, bstride, loff, heads, kvh, bs, mode, nsplit;  // bstride, loff: kv.cu's layout
    float scale;
};

// Shared by the general CTA (attend) and the decode CTA (attend_dec, attention_dec.cu).

// q of `mrows` M-rows into qs ([mrows][LD]): M-row mr is row mr / G of the tile at head
// g G + mr % G; zero where the row is unused.
template <int HD>
__device__ __forceinline__ void load_q(bf16* qs, const Args& A, const Tile& tile, u32 g, u32 G,
                                       u32 mrows) {
    constexpr int LD = HD + 8;
    for (u32 i = threadIdx.x; i < mrows * (HD / 8); i += 32 * WARPS) {
        const u32 mr = i / (HD / 8), c = i % (HD / 8);
        const u32 ri = mr / G;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (ri < tile.nr)
            v = *(const uint4*)(A.q + ((u64)(tile.b + ri) * A.heads + g * G + mr % G) * HD + c * 8);
        *(uint4*)(qs + mr * LD + c * 8) = v;
    }
}

// Positions of this thread's two M-rows mr0 + lane / 4 (+ 8) (-1: unused).
__device__ __forceinline__ void row_positions(int (&prow)[2], const Args& A, const Tile& tile,
                                              u32 G, u32 mr0, u32 lane) {
    for (int k = 0; k < 2; k++) {
        const u32 mr = mr0 + lane / 4 + 8 * k, ri = mr / G;
        prow[k] = ri < tile.nr ? (int)A.positions[tile.b + ri] : -1;
    }
}

// Where kv head g of the call's layer lies in the pool (region b * bstride + loff of block b,
// kv.cu's layout), for load_kv: the sequence's block table, a K/V plane, a block's stride and
// the head's K offset in a block (V: + plane).
struct KvAt {
    const u32* table;
    u64 plane, base, gofs;
};
template <int HD>
__device__ __forceinline__ KvAt kv_at(const Args& A, const Tile& tile, u32 g) {
    KvAt at;
    at.table = A.tables + A.row_table[tile.b];
    at.plane = (u64)A.kvh * A.bs * HD;
    at.base = (u64)A.bstride * 2 * at.plane;
    at.gofs = (u64)A.loff * 2 * at.plane + (u64)g * A.bs * HD;
    return at;
}

// s += Q K^T of the 16 M-rows from m0 of qs and the TK positions of a K tile (ks).
template <int HD, int NB>
__device__ __forceinline__ void qk_tile(float (&s)[NB][4], const bf16* qs, u32 m0, const bf16* ks,
                                        u32 lane) {
    constexpr int LD = HD + 8;
#pragma unroll
    for (int k0 = 0; k0 < HD; k0 += 32) {
        u32 qa[4], qb[4];
        const bf16* qrow = qs + (m0 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + k0 + (lane / 16) * 8;
        ldsm_x4(qa, qrow);
        ldsm_x4(qb, qrow + 16);
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            u32 kb[4];
            ldsm_x4(kb, ks + (nb * 8 + lane % 8) * LD + k0 + (lane / 8) * 8);
            mma16816(s[nb], qa[0], qa[1], qa[2], qa[3], kb[0], kb[1]);
            mma16816(s[nb], qb[0], qb[1], qb[2], qb[3], kb[2], kb[3]);
        }
    }
}

// Row k (0: M-row lane / 4, 1: + 8) of tile t's scores: scaled, positions past prow masked to
// NEG, in place; returns the row's maximum (over the quad of lanes that hold it). Session 24
// measured and dropped (same bits, tests/cuda_attention.rs, check exact fingerprints unchanged)
// the lane's maximum as four running maxima instead of one chain of 2 NB, with both rows'
// maxima before their weights in softmax_tile (the chain drew ~3% of the wgmma CTA's ncu stall
// samples): attention_ws_hd128 200.1 / 200.2 us a call at 2,048 rows against 198.3 / 197.5,
// 2,544 against 2,504 at 8,192 (H200, alternated): ptxas's schedule of the rest moved more.
// `nb0`: the first of the tile's 8-position blocks that s holds (the decode CTA's spread).
// FULL: the caller knows every position of the tile is <= prow (no compare: the same values).
template <int NB, bool FULL = false>
__device__ __forceinline__ float mask_max(float (&s)[NB][4], int k, u32 t, int prow, float scale,
                                          u32 lane, float NEG, int nb0 = 0) {
    float tmax = NEG;
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int j = (int)(t * TK) + (nb0 + nb) * 8 + (lane % 4) * 2 + e;
            const float v = (FULL || j <= prow) ? __fmul_rn(s[nb][2 * k + e], scale) : NEG;
            s[nb][2 * k + e] = v;
            tmax = fmaxf(tmax, v);
        }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    return fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
}

// p = exp(s - mu) in place for row half k of a lane's S fragments (positions in order); with
// `chain`, the lane's sum continued from `sum` over them in that order (else `sum` back).
template <int NB>
__device__ __forceinline__ float exp_chain(float (&s)[NB][4], int k, float mu, float sum, bool chain) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float p = fexp(__fsub_rn(s[nb][2 * k + e], mu));
            s[nb][2 * k + e] = p;
            if (chain) sum = __fadd_rn(sum, p);
        }
    return sum;
}

// p = exp(s - mu) in place for row half k of a lane's S fragments, and the row's sum: the
// lane's in order from +0, then over its quad (xor 1, then xor 2).
template <int NB>
__device__ __forceinline__ float exp_sum(float (&s)[NB][4], int k, float mu) {
    float sum = exp_chain<NB>(s, k, mu, 0.0f, true);
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
    return __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
}

// The online softmax of KV tile t, per M-row (k = 0: row lane / 4, k = 1: row lane / 4 + 8):
// scores scaled and masked (mask_max), m' = max(m, tile max), alpha = exp(m - m'), the
// weights p = exp(s - m') in place of the scores (m' = -inf taken as 0), l = l alpha + the
// row's sum (this thread's 16 columns in column order, then the quad butterfly), m = m'.
// Shared by the general CTA and the wgmma CTA (attention90.cu), whose accumulators hold the
// same rows and columns in the same registers. FULL: as mask_max.
template <int NB, bool FULL = false>
__device__ __forceinline__ void softmax_tile(float (&s)[NB][4], u32 t, const int (&prow)[2],
                                             float scale, u32 lane, float NEG, float (&m)[2],
                                             float (&l)[2], float (&alpha)[2]) {
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const float tmax = mask_max<NB, FULL>(s, k, t, prow[k], scale, lane, NEG);
        const float mn = fmaxf(m[k], tmax);
        const float mu = mn == NEG ? 0.0f : mn;
        alpha[k] = fexp(__fsub_rn(m[k], mu));
        const float sum = exp_sum<NB>(s, k, mu);
        l[k] = __fadd_rn(__fmul_rn(l[k], alpha[k]), sum);
        m[k] = mn;
    }
}

// TF_ATTN_DB (default 1): the general CTA keeps two buffers of K and of V for head_dim <= 128
// (the host's `attention_smem` sizes them), so tile t + 1's loads are issued when tile t starts
// and have a whole tile's work to arrive in; 0 (and head_dim 256): one buffer each, tile t +
// 1's K issued after tile t's scores and its V after tile t's P V. Only when bytes arrive
// changes: the same tiles meet the same arithmetic.
#ifndef TF_ATTN_DB
#define TF_ATTN_DB 1
#endif

template <int HD>
__device__ void attend(const Args& A, u32 zs = 0xffffffffu) {  // zs: mode 1's split (~0: blockIdx.z)
    constexpr int ND = HD / 8;  // 8-wide dim blocks of the output
    constexpr int NB = TK / 8;  // 8-wide position blocks of a score tile
    constexpr int LD = HD + 8;
    constexpr int BUFS = (TF_ATTN_DB && HD <= 128) ? 2 : 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* qs = (bf16*)smem_raw;
    bf16* kbase = qs + MROWS * LD;         // BUFS K tiles
    bf16* vbase = kbase + BUFS * TK * LD;  // BUFS V tiles
    const u32 G = A.heads / A.kvh, rpc = MROWS / G;
    const u32 b = A.rows - 1 - blockIdx.x / A.kvh, g = blockIdx.x % A.kvh;
    const Tile tile = row_tile(A.positions, A.row_table, b, A.rows, rpc);
    if (tile.nr == 0) return;
    const u32 nz = (tile.n + SPLIT - 1) / SPLIT;
    u32 z0 = 0, z1 = nz;
    if (A.mode == 1) {
        z0 = zs == 0xffffffffu ? blockIdx.z : zs;
        z1 = z0 + 1;
        if (z0 >= nz) return;
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    load_q<HD>(qs, A, tile, g, G, MROWS);
    // This thread's two M-rows: 16 warp + lane / 4 (+ 8).
    int prow[2];
    row_positions(prow, A, tile, G, 16 * warp, lane);
    const bool active = (16 * warp) / G < tile.nr;  // the warp holds a used M-row
    const KvAt at = kv_at<HD>(A, tile, g);
    const u32* table = at.table;
    const u64 plane = at.plane, base = at.base, gofs = at.gofs;
    const float NEG = -__int_as_float(0x7f800000);
    float M[2] = {NEG, NEG}, L[2] = {0.0f, 0.0f}, O[ND][4];
    float m[2], l[2], o[ND][4];
    const u32 t0 = z0 * (SPLIT / TK), t1 = min(z1 * (SPLIT / TK), (tile.n + TK - 1) / TK);
    load_kv<HD>(kbase, A.pool, table, t0, tile.n, base, gofs, A.bs);
    cp_commit();
    load_kv<HD>(vbase, A.pool, table, t0, tile.n, base, gofs + plane, A.bs);
    cp_commit();
    for (u32 t = t0; t < t1; t++) {
        if ((t * TK) % SPLIT == 0) {  // a split starts: fresh state
            for (int k = 0; k < 2; k++) { m[k] = NEG; l[k] = 0.0f; }
#pragma unroll
            for (int d = 0; d < ND; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
        }
        bf16* ks = kbase + ((t - t0) % BUFS) * TK * LD;
        bf16* vs = vbase + ((t - t0) % BUFS) * TK * LD;
        if (BUFS == 2) {
            // Tile t + 1 into the buffers tile t - 1 used (every warp passed the barrier after
            // its P V): pending groups are then K(t), V(t), K(t + 1), V(t + 1).
            bf16* kn = kbase + ((t - t0 + 1) % 2) * TK * LD;
            bf16* vn = vbase + ((t - t0 + 1) % 2) * TK * LD;
            if (t + 1 < t1) load_kv<HD>(kn, A.pool, table, t + 1, tile.n, base, gofs, A.bs);
            cp_commit();
            if (t + 1 < t1) load_kv<HD>(vn, A.pool, table, t + 1, tile.n, base, gofs + plane, A.bs);
            cp_commit();
        }
        cp_async_wait<2 * BUFS - 1>();  // K(t) has arrived
        __syncthreads();
        float s[NB][4];
#pragma unroll
        for (int nb = 0; nb < NB; nb++) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
        if (active) qk_tile<HD, NB>(s, qs, 16 * warp, ks, lane);
        if (BUFS == 1) {
            __syncthreads();  // every warp is done with K
            if (t + 1 < t1) load_kv<HD>(ks, A.pool, table, t + 1, tile.n, base, gofs, A.bs);
            cp_commit();
        }
        float alpha[2];
        softmax_tile<NB>(s, t, prow, A.scale, lane, NEG, m, l, alpha);
#pragma unroll
        for (int d = 0; d < ND; d++) {
            o[d][0] = __fmul_rn(o[d][0], alpha[0]);
            o[d][1] = __fmul_rn(o[d][1], alpha[0]);
            o[d][2] = __fmul_rn(o[d][2], alpha[1]);
            o[d][3] = __fmul_rn(o[d][3], alpha[1]);
        }
        cp_async_wait<BUFS>();  // V(t) has arrived
        __syncthreads();
        if (active) {
#pragma unroll
            for (int kk = 0; kk < TK / 16; kk++) {
                u32 a[4][3];
                split_step<NB>(s, kk, a);
#pragma unroll
                for (int d = 0; d < ND; d += 2) {
                    u32 vb[4];
                    ldsm_x4_t(vb, vs + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + d * 8 + (lane / 16) * 8);
#pragma unroll
                    for (int piece = 0; piece < 3; piece++) {
                        mma16816(o[d], a[0][piece], a[1][piece], a[2][piece], a[3][piece], vb[0], vb[1]);
                        mma16816(o[d + 1], a[0][piece], a[1][piece], a[2][piece], a[3][piece], vb[2], vb[3]);
                    }
                }
            }
        }
        __syncthreads();  // every warp is done with V
        if (BUFS == 1) {
            if (t + 1 < t1) load_kv<HD>(vs, A.pool, table, t + 1, tile.n, base, gofs + plane, A.bs);
            cp_commit();
        }
        if (((t + 1) * TK) % SPLIT != 0 && t + 1 < t1) continue;
        // The split ends here.
        const u32 z = (t * TK) / SPLIT;
        if (A.mode == 1) {
            for (int k = 0; k < 2; k++) { M[k] = m[k]; L[k] = l[k]; }
#pragma unroll
            for (int d = 0; d < ND; d++)
#pragma unroll
                for (int e = 0; e < 4; e++) O[d][e] = o[d][e];
        } else if (z == 0) {
            for (int k = 0; k < 2; k++) { M[k] = m[k]; L[k] = l[k]; }
#pragma unroll
            for (int d = 0; d < ND; d++)
#pragma unroll
                for (int e = 0; e < 4; e++) O[d][e] = o[d][e];
        } else {
            float a[2], c[2];
            for (int k = 0; k < 2; k++) merge_ml(M[k], L[k], m[k], l[k], a[k], c[k]);
#pragma unroll
            for (int d = 0; d < ND; d++)
#pragma unroll
                for (int e = 0; e < 4; e++) O[d][e] = merge_o(O[d][e], o[d][e], a[e / 2], c[e / 2]);
        }
    }
    // Write: the output (prefill, or a decode row needing one split) or the split's partial.
    for (int k = 0; k < 2; k++) {
        if (prow[k] < 0) continue;
        const u32 mr = 16 * warp + lane / 4 + 8 * k;
        const u32 r = tile.b + mr / G, h = g * G + mr % G;
        const u32 rz = (u32)prow[k] / SPLIT + 1;  // the row's own splits
        if (A.mode == 0 || (rz == 1 && z0 == 0)) {
#pragma unroll
            for (int d = 0; d < ND; d++) {
                const u32 v = pack_bf2(finish(O[d][2 * k], L[k]), finish(O[d][2 * k + 1], L[k]));
                *(u32*)(A.out + ((u64)r * A.heads + h) * HD + d * 8 + (lane % 4) * 2) = v;
            }
        } else if (A.mode == 1 && rz > 1 && z0 < rz) {
            float* part = A.partial + (((u64)r * A.heads + h) * A.nsplit + z0) * (HD + 2);
            if (lane % 4 == 0) { part[0] = M[k]; part[1] = L[k]; }
#pragma unroll
            for (int d = 0; d < ND; d++) {
                part[2 + d * 8 + (lane % 4) * 2] = O[d][2 * k];
                part[2 + d * 8 + (lane % 4) * 2 + 1] = O[d][2 * k + 1];
            }
        }
    }
}

