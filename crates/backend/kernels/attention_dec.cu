// Attention, part 2 (compiled as one unit after attention.cu, which holds the definition, the
// shared helpers and the general CTA `attend`): the decode CTA `attend_dec`, every entry
// point of the family and `attention_combine`.

// Decode CTAs (split mode, one split, a row tile of at most 16 M-rows: every decode row with
// G <= 16): the same arithmetic as attend() for warp 0's M-rows, spread over the 4 warps.
// QK and the softmax of KV tile t0 + w run in warp w (its scores, tile max, weights and their
// row sums exactly as attend() computes them for that tile); the running max, the rescale
// factors alpha and l are the same sequential chains over the split's tiles (a few scalars,
// recomputed by every thread that needs them); P V keeps each output element's mma chain
// (tiles, then 16-position steps, then pieces b0, b1, b2, from +0 and rescaled by alpha at
// each tile) but warp w runs it for the 8-wide dim blocks 2w, 2w + 1, 2w + 8, 2w + 9 (HD 128)
// only, reading the weights' bf16 pieces that the softmax warps left in shared memory.
// Per element every operation and operand is attend()'s, so the bits are the same; only
// which warp issues it changes. Shared memory: DT tiles of K, then (after QK) the same
// buffers hold V; q (16 rows); the weight pieces in mma A-fragment order; tile maxima, sums.
// With at most 2 tiles a split (TF_SPLIT <= 128) V has buffers of its own and is loaded with
// K, one load latency instead of two (the same values in the same places).
#define DT (SPLIT / TK)
#define DEC_VSEP (DT <= 2)
#define DEC_KVT (DEC_VSEP ? 2 * DT : DT)
#define DROWS 16
// TF_DEC_SPREAD (1, the default; a knob through TENSORFOLD_KERNEL_DEFINES): the decode CTA's
// WARPS warps share the split's DT tiles for QK and the softmax, WPT = WARPS / DT warps a tile,
// each scoring NB / WPT of its 8-position blocks; 0: a warp a tile (warps past DT wait for P V).
// Per element the same operations in the same order: a tile's maximum is a maximum (any
// order), each weight and piece elementwise, and a row's sum the same chain over the lane's
// columns, handed from part to part. H200 (session 19, llama3-8b decode, split 128: 2 warps a
// tile): the split-0 CTA's QK 2.1-3.5k -> 1.0-1.3k cycles, softmax 3.8-6.5k -> 3.2-4.1k;
// bench decode 201.0 vs 199.7 tok/s (mean of 3 alternated pairs). ncu of this CTA (one call):
// 16 stall cycles an issued instruction, 6.4 of them waiting for instructions (its ~2,700-
// instruction path is fetched as it runs); the k steps of QK and P V as loops (a third less
// code) measured equal.
#ifndef TF_DEC_SPREAD
#define TF_DEC_SPREAD 1
#endif
#define WPT ((TF_DEC_SPREAD && DT < WARPS) ? WARPS / DT : 1)
// TF_ATTN_TRACE=1 (a measurement build only, through TENSORFOLD_KERNEL_DEFINES): thread 0 of
// the CTA of kv head 0, split 0, row tile 0 prints the SM clock between the phases of its
// calls with loff 3 (layer 3 in the block-major pool): `attn-trace` lines of pdl wait, row
// tile, K issue, V prefetch + q, K wait, QK, V issue, softmax, V wait, P V, write. Off, the
// code is compiled out.
#ifndef TF_ATTN_TRACE
#define TF_ATTN_TRACE 0
#endif
#define TRACE_AT(I) \
    if (TF_ATTN_TRACE) tr[I] = clock64()

// TF_DEC_TMA (a knob through TENSORFOLD_KERNEL_DEFINES; 1, the default, takes effect on sm_90+):
// the decode CTA loads K and V rows with bulk copies (cp.async.bulk, the TMA unit: one 2 HD-byte
// copy a valid row, completing on an mbarrier of the CTA) instead of 16-byte cp.async per
// thread (TF_DEC_TMA=0, and before sm_90); rows past the tile's last valid position are zeroed
// by plain stores, as cp.async's zero-fill did. The same values land in the same places (check
// exact's fingerprints unchanged). H200, splits of 256, one decode row of llama3-8b's heads:
// 9.12 / 12.74 / 12.90 / 17.18 us a call at 128 / 384 / 1,024 / 4,096 positions, against 11.89
// / 18.10 / 18.75 / 23.23 with cp.async (a CTA's cp.async loads ran at ~5 bytes a cycle).
#ifndef TF_DEC_TMA
#define TF_DEC_TMA 1
#endif
#if TF_DEC_TMA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DEC_TMA 1
#else
#define DEC_TMA 0
#endif

// Bytes of the decode CTA's shared memory before its two mbarriers (16 bytes after it; the
// host reserves them in every build).
template <int HD>
__host__ __device__ constexpr u32 dec_smem() {
    return (DEC_KVT * TK + DROWS) * (HD + 8) * 2 + DT * (TK / 16) * 3 * 4 * 32 * 4 +
           DT * DROWS * (WPT + 1) * 4 + DT * 2 * 32 * 4;
}

#if DEC_TMA
__device__ __forceinline__ void mbar_init(u64* bar) { mbar_init_at(smem_u32(bar), 1); }
__device__ __forceinline__ void mbar_expect(u64* bar, u32 bytes) { mbar_expect_at(smem_u32(bar), bytes); }
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) { mbar_wait_parity(smem_u32(bar), parity); }
// Rows [t0 TK, t1 TK) of the tile's K (or V, gofs + plane) into dst (row stride HD + 8) by bulk
// copies completing on `bar`: the valid rows (< n) at positions [lo, hi). The first pass
// (`first`) also zeroes rows >= n and has thread 0 arm `bar` with every valid row's bytes, so
// the rows may arrive in two passes (see TF_DEC_EARLY).
template <int HD>
__device__ __forceinline__ void load_kv_bulk(bf16* dst, const bf16* pool, const u32* table, u32 t0,
                                             u32 t1, u32 n, u64 base, u64 gofs, u32 bs, u64* bar,
                                             u32 lo, u32 hi, bool first) {
    fence_proxy_async();
    if (first && threadIdx.x == 0) mbar_expect(bar, (min(t1 * TK, n) - t0 * TK) * HD * 2);
    for (u32 i = threadIdx.x; i < (t1 - t0) * TK; i += 32 * WARPS) {
        const u32 j = t0 * TK + i;
        bf16* row = dst + i * (HD + 8);
        if (j < n) {
            if (j < lo || j >= hi) continue;
            const bf16* src = pool + (u64)table[j / bs] * base + gofs + (u64)(j % bs) * HD;
            bulk_copy_at(smem_u32(row), src, HD * 2, smem_u32(bar));
        } else if (first) {
#pragma unroll
            for (int c = 0; c < HD / 8; c++) *(uint4*)(row + c * 8) = make_uint4(0, 0, 0, 0);
        }
    }
}
#endif

// TF_DEC_EARLY (default 1; with TF_DEC_TMA on sm_90, not with TF_SPLIT_LOOP): a decode CTA
// issues the bulk copies of KV rows written by earlier calls BEFORE pdl_wait(), so they overlap
// the kernel before it, when the host says (mode bit 1) that this kernel was rope_kv_store or
// kv_store of this call's rows and layer (`CudaBackend::kv_written`). Safe because the rows
// below the smallest position this call has for the sequence (`call_first`) are final before
// the step's first kernel: (1) only this layer's KV store writes this layer's rows, and it
// writes only this call's rows' positions (those at or past call_first, copied after the
// wait); (2) the previous step has completed when any kernel of this one runs past its own
// launch (the step's first kernels wait before they let the next launch). rope_kv_store lets
// this kernel launch before its own wait when it takes these copies (rope.cu's
// `trigger_first`), so they may start while the q/k/v product still runs; kv_store triggers
// after its wait.
// The metadata read before the wait (positions, row and block tables) is written by the host
// before the step. The same rows land in the same places, so no value changes.
#ifndef TF_DEC_EARLY
#define TF_DEC_EARLY 1
#endif
#define DEC_EARLY (DEC_TMA && TF_DEC_EARLY && !TF_SPLIT_LOOP)

// The smallest position this call's rows have in the sequence of row table entry rt.
__device__ __forceinline__ u32 call_first(const u32* positions, const u32* row_table, u32 rows,
                                          u32 rt) {
    u32 m = 0xffffffffu;
    for (u32 r = 0; r < rows; r++)
        if (row_table[r] == rt) m = min(m, positions[r]);
    return m;
}

// Asks L2 for V rows [t0 TK, min(t1 TK, n)) of the tile's sequence (a hint; sm_90+).
template <int HD>
__device__ __forceinline__ void prefetch_v(const bf16* pool, const u32* table, u32 t0, u32 t1,
                                           u32 n, u64 base, u64 vofs, u32 bs) {
    const u32 end = min(t1 * TK, n);
    for (u32 j = t0 * TK + threadIdx.x; j < end; j += 32 * WARPS) {
        if (j % bs != 0 && j != t0 * TK) continue;  // j starts a contiguous run of one block
        const u32 run = min(bs - j % bs, end - j);
        const bf16* src = pool + (u64)table[j / bs] * base + vofs + (u64)(j % bs) * HD;
        prefetch_l2(src, run * HD * 2);
    }
}

// The decode CTA's P V 16-position step kk of one tile: the weight pieces' A registers (pr, as
// the softmax warps left them) times V (vs) for this warp's dim pairs, pieces b0, b1, b2 in order.
template <int HD, int MYP>
__device__ __forceinline__ void pv_step(float (&o)[MYP][2][4], const u32* pr, const bf16* vs, int kk,
                                        u32 warp, u32 lane) {
    constexpr int LD = HD + 8, NP = HD / 16;
    u32 a[3][4];
#pragma unroll
    for (int piece = 0; piece < 3; piece++)
#pragma unroll
        for (int r = 0; r < 4; r++) a[piece][r] = pr[((kk * 3 + piece) * 4 + r) * 32 + lane];
#pragma unroll
    for (int i = 0; i < MYP; i++) {
        const int dp = (int)warp + i * WARPS;
        if (dp >= NP) continue;
        u32 vb[4];
        ldsm_x4_t(vb, vs + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp * 16 + (lane / 16) * 8);
#pragma unroll
        for (int piece = 0; piece < 3; piece++) {
            mma16816(o[i][0], a[piece][0], a[piece][1], a[piece][2], a[piece][3], vb[0], vb[1]);
            mma16816(o[i][1], a[piece][0], a[piece][1], a[piece][2], a[piece][3], vb[2], vb[3]);
        }
    }
}

// `sum` continued over row half k of a lane's weights (positions in order).
template <int NB>
__device__ __forceinline__ float chain_sum(const float (&s)[NB][4], int k, float sum) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int e = 0; e < 2; e++) sum = __fadd_rn(sum, s[nb][2 * k + e]);
    return sum;
}

// `it`: how many splits this CTA computed before (TF_SPLIT_LOOP), the mbarriers' phase.
// `early`: the caller has not waited for the previous kernel yet (DEC_EARLY): the rows written
// by earlier calls are issued first, then this waits (pdl_wait, pdl_launch) and issues the rest.
template <int HD>
__device__ void attend_dec(const Args& A, const Tile& tile, u32 g, u32 z0, u32 it, long long* tr,
                           bool early = false) {
    constexpr int NB = TK / 8;
    constexpr int NBW = NB / WPT;  // 8-position blocks a warp scores
    constexpr int LD = HD + 8;
    constexpr int NP = HD / 16;  // 16-wide dim pairs of the output
    constexpr int PF = (TK / 16) * 3 * 4 * 32;  // weight-piece words per tile
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* kv = (bf16*)smem_raw;   // DT tiles x TK rows x LD: K, then V (DEC_VSEP: V after K)
    bf16* vbuf = kv + (DEC_VSEP ? DT * TK * LD : 0);
    bf16* qs = kv + DEC_KVT * TK * LD;  // DROWS x LD
    u32* pf = (u32*)(qs + DROWS * LD);  // [tile][kk][piece][reg][lane]
    float* tmx = (float*)(pf + DT * PF);  // [tile][part][M-row]
    float* tsm = tmx + DT * WPT * DROWS;  // [tile][M-row]
    float* chn = tsm + DT * DROWS;        // [tile][row half][lane]: a part's row-sum chain
#if DEC_TMA
    u64* bars = (u64*)(smem_raw + dec_smem<HD>());  // K, V
    if (it == 0) {
        if (threadIdx.x == 0) {
            mbar_init(bars);
            mbar_init(bars + 1);
            fence_proxy_async();
        }
        __syncthreads();
    }
#endif
    const u32 G = A.heads / A.kvh;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const KvAt at = kv_at<HD>(A, tile, g);
    const u32* table = at.table;
    const u64 plane = at.plane, base = at.base, gofs = at.gofs;
    const u32 t0 = z0 * DT, t1 = min(t0 + DT, (tile.n + TK - 1) / TK), nt = t1 - t0;
#if DEC_TMA
    const u32 old = early ? call_first(A.positions, A.row_table, A.rows, A.row_table[tile.b]) : 0;
    load_kv_bulk<HD>(kv, A.pool, table, t0, t1, tile.n, base, gofs, A.bs, bars, 0, early ? old : ~0u, true);
    if (DEC_VSEP)
        load_kv_bulk<HD>(vbuf, A.pool, table, t0, t1, tile.n, base, gofs + plane, A.bs, bars + 1, 0,
                         early ? old : ~0u, true);
    if (early) {
        pdl_wait();
        pdl_launch();
        load_kv_bulk<HD>(kv, A.pool, table, t0, t1, tile.n, base, gofs, A.bs, bars, old, ~0u, false);
        if (DEC_VSEP)
            load_kv_bulk<HD>(vbuf, A.pool, table, t0, t1, tile.n, base, gofs + plane, A.bs, bars + 1, old,
                             ~0u, false);
    }
    TRACE_AT(3);
    if (!DEC_VSEP) prefetch_v<HD>(A.pool, table, t0, t1, tile.n, base, gofs + plane, A.bs);
#else
    for (u32 t = t0; t < t1; t++) load_kv<HD>(kv + (t - t0) * TK * LD, A.pool, table, t, tile.n, base, gofs, A.bs);
    cp_commit();
    TRACE_AT(3);
    if (DEC_VSEP) {
        for (u32 u = t0; u < t1; u++)
            load_kv<HD>(vbuf + (u - t0) * TK * LD, A.pool, table, u, tile.n, base, gofs + plane, A.bs);
        cp_commit();
    } else {
        prefetch_v<HD>(A.pool, table, t0, t1, tile.n, base, gofs + plane, A.bs);
    }
#endif
    load_q<HD>(qs, A, tile, g, G, DROWS);
    int prow[2];
    row_positions(prow, A, tile, G, 0, lane);
    const float NEG = -__int_as_float(0x7f800000);
    TRACE_AT(4);
#if DEC_TMA
    mbar_wait(bars, it & 1);
#else
    if (DEC_VSEP) cp_wait1();
    else cp_wait0();
#endif
    __syncthreads();
    TRACE_AT(5);
    // Scores of tile t0 + tw in warp part pw (its NBW 8-position blocks from pw NBW), masked
    // and scaled; the parts' maxima to shared memory.
    float s[NBW][4];
    const u32 tw = warp / WPT, pw = warp % WPT, t = t0 + tw;
    if (tw < nt) {
        const bf16* ks = kv + (tw * TK + pw * NBW * 8) * LD;
#pragma unroll
        for (int nb = 0; nb < NBW; nb++) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
        qk_tile<HD, NBW>(s, qs, 0, ks, lane);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const float tmax = mask_max<NBW>(s, k, t, prow[k], A.scale, lane, NEG, pw * NBW);
            if (lane % 4 == 0) tmx[warp * DROWS + lane / 4 + 8 * k] = tmax;
        }
    }
    __syncthreads();  // K is consumed: its buffers take V; the parts' maxima are written
    // Tile u's maximum of M-row mr: the maximum of its parts' (a maximum, so any order).
    auto tile_max = [&](u32 u, u32 mr) {
        float x = tmx[u * WPT * DROWS + mr];
#pragma unroll
        for (int q = 1; q < WPT; q++) x = fmaxf(x, tmx[(u * WPT + q) * DROWS + mr]);
        return x;
    };
    TRACE_AT(6);
    if (!DEC_VSEP) {
#if DEC_TMA
        load_kv_bulk<HD>(kv, A.pool, table, t0, t1, tile.n, base, gofs + plane, A.bs, bars + 1, 0, ~0u, true);
#else
        for (u32 u = t0; u < t1; u++)
            load_kv<HD>(kv + (u - t0) * TK * LD, A.pool, table, u, tile.n, base, gofs + plane, A.bs);
        cp_commit();
#endif
    }
    TRACE_AT(7);
    // Weights of tile t0 + tw: the running max (attend()'s chain up to this tile), p of this
    // part's blocks and their bf16 pieces (16-position steps pw NBW / 2 ..). A row's sum is
    // exp_sum's chain: the lane's columns in order across the parts (part q continues part
    // q - 1's partial, handed over in shared memory), then the quad butterfly in the last.
    float psum[2];
    if (tw < nt) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const u32 mr = lane / 4 + 8 * k;
            float m = NEG, mn = NEG;
            for (u32 w = 0; w <= tw; w++) {
                mn = fmaxf(m, tile_max(w, mr));
                if (w < tw) m = mn;
            }
            const float mu = mn == NEG ? 0.0f : mn;
            psum[k] = exp_chain<NBW>(s, k, mu, 0.0f, pw == 0);
        }
        u32* pp = pf + tw * PF;
#pragma unroll
        for (int kl = 0; kl < NBW / 2; kl++) {
            const int kk = (int)pw * (NBW / 2) + kl;
            u32 a[4][3];
            split_step<NBW>(s, kl, a);
#pragma unroll
            for (int piece = 0; piece < 3; piece++)
#pragma unroll
                for (int r = 0; r < 4; r++) pp[((kk * 3 + piece) * 4 + r) * 32 + lane] = a[r][piece];
        }
    }
#pragma unroll
    for (int q = 1; q < WPT; q++) {
        if (tw < nt && pw == q - 1) {
#pragma unroll
            for (int k = 0; k < 2; k++) chn[(tw * 2 + k) * 32 + lane] = psum[k];
        }
        __syncthreads();
        if (tw < nt && pw == q) {
#pragma unroll
            for (int k = 0; k < 2; k++) psum[k] = chain_sum<NBW>(s, k, chn[(tw * 2 + k) * 32 + lane]);
        }
    }
    if (tw < nt && pw == WPT - 1) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float sum = __fadd_rn(psum[k], __shfl_xor_sync(0xffffffffu, psum[k], 1));
            sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
            if (lane % 4 == 0) tsm[tw * DROWS + lane / 4 + 8 * k] = sum;
        }
    }
    TRACE_AT(8);
#if DEC_TMA
    mbar_wait(bars + 1, it & 1);
#else
    cp_wait0();
#endif
    __syncthreads();
    TRACE_AT(9);
    // P V for this warp's dim pairs; (m, l) chains and alpha per tile as attend().
    constexpr int MYP = (NP + WARPS - 1) / WARPS;
    float o[MYP][2][4];
#pragma unroll
    for (int i = 0; i < MYP; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) o[i][h][0] = o[i][h][1] = o[i][h][2] = o[i][h][3] = 0.0f;
    float m[2] = {NEG, NEG}, l[2] = {0.0f, 0.0f};
    for (u32 u = 0; u < nt; u++) {
        float alpha[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const u32 mr = lane / 4 + 8 * k;
            const float mn = fmaxf(m[k], tile_max(u, mr));
            const float mu = mn == NEG ? 0.0f : mn;
            alpha[k] = fexp(__fsub_rn(m[k], mu));
            l[k] = __fadd_rn(__fmul_rn(l[k], alpha[k]), tsm[u * DROWS + mr]);
            m[k] = mn;
        }
#pragma unroll
        for (int i = 0; i < MYP; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                o[i][h][0] = __fmul_rn(o[i][h][0], alpha[0]);
                o[i][h][1] = __fmul_rn(o[i][h][1], alpha[0]);
                o[i][h][2] = __fmul_rn(o[i][h][2], alpha[1]);
                o[i][h][3] = __fmul_rn(o[i][h][3], alpha[1]);
            }
        const bf16* vs = vbuf + u * TK * LD;
        const u32* pr = pf + u * PF;
#pragma unroll
        for (int kk = 0; kk < TK / 16; kk++) pv_step<HD, MYP>(o, pr, vs, kk, warp, lane);
    }
    TRACE_AT(10);
    // Write: the output (a row needing one split) or the split's partial, as attend().
    for (int k = 0; k < 2; k++) {
        if (prow[k] < 0) continue;
        const u32 mr = lane / 4 + 8 * k;
        const u32 r = tile.b + mr / G, h = g * G + mr % G;
        const u32 rz = (u32)prow[k] / SPLIT + 1;
        if (rz == 1 && z0 == 0) {
#pragma unroll
            for (int i = 0; i < MYP; i++) {
                const int dp = (int)warp + i * WARPS;
                if (dp >= NP) continue;
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const u32 v = pack_bf2(finish(o[i][hh][2 * k], l[k]), finish(o[i][hh][2 * k + 1], l[k]));
                    *(u32*)(A.out + ((u64)r * A.heads + h) * HD + (2 * dp + hh) * 8 + (lane % 4) * 2) = v;
                }
            }
        } else if (rz > 1 && z0 < rz) {
            float* part = A.partial + (((u64)r * A.heads + h) * A.nsplit + z0) * (HD + 2);
            if (warp == 0 && lane % 4 == 0) { part[0] = m[k]; part[1] = l[k]; }
#pragma unroll
            for (int i = 0; i < MYP; i++) {
                const int dp = (int)warp + i * WARPS;
                if (dp >= NP) continue;
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    part[2 + (2 * dp + hh) * 8 + (lane % 4) * 2] = o[i][hh][2 * k];
                    part[2 + (2 * dp + hh) * 8 + (lane % 4) * 2 + 1] = o[i][hh][2 * k + 1];
                }
            }
        }
    }
}

// Dynamic shared memory: (MROWS + 2 TK) rows of HD + 8 bf16.
// The entry points' parameters (the host's argument order) and their Args, with `MODE`.
#define ATTN_PARAMS                                                                           \
    const bf16 *q, const bf16 *pool, bf16 *out, float *partial, const u32 *positions,         \
        const u32 *row_table, const u32 *tables, u32 rows, u32 bstride, u32 loff, u32 heads,   \
        u32 kvh, u32 bs, u32 mode, u32 nsplit, float scale
#define ATTN_ARGS(MODE)                                                                       \
    const Args a = {q,      pool,  out,   partial, positions, row_table, tables, rows,        \
                    bstride, loff, heads, kvh,     bs,        MODE,      nsplit, scale}
#define ATTN_ENTRY(NAME, HD)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) NAME(ATTN_PARAMS) {             \
        pdl_wait();                                                                          \
        pdl_launch();                                                                        \
        ATTN_ARGS(mode);                                                                     \
        attend<HD>(a);                                                                       \
    }
#if ATTN_PART(64)
ATTN_ENTRY(attention_hd64, 64)
#endif
#if ATTN_PART(96)
ATTN_ENTRY(attention_hd96, 96)
#endif
#if ATTN_PART(128)
ATTN_ENTRY(attention_hd128, 128)
#endif
#if ATTN_PART(256)
ATTN_ENTRY(attention_hd256, 256)
#endif

// TF_ATTN_TRACE: the phase lengths in SM cycles (see TRACE_AT).
__device__ __forceinline__ void trace_print(const long long* tr, u32 loff) {
    if (loff != 3 || blockIdx.x != 0 || blockIdx.z != 0 || threadIdx.x != 0) return;
    printf("attn-trace %d %d %d %d %d %d %d %d %d %d %d\n", (int)(tr[1] - tr[0]), (int)(tr[2] - tr[1]),
           (int)(tr[3] - tr[2]), (int)(tr[4] - tr[3]), (int)(tr[5] - tr[4]), (int)(tr[6] - tr[5]),
           (int)(tr[7] - tr[6]), (int)(tr[8] - tr[7]), (int)(tr[9] - tr[8]), (int)(tr[10] - tr[9]),
           (int)(tr[11] - tr[10]));
}

// The splits a split-mode CTA computes. By default the grid's z extent is the pool's split
// count and CTA z computes split z. With TF_SPLIT_LOOP=1 (through TENSORFOLD_KERNEL_DEFINES,
// which the host reads too: `attention::split_grid`) the host bounds the z extent by the row
// count and the SM count, and CTA z computes splits z, z + gridDim.z, ... below the tile's
// split count, one after another: the same arithmetic per split, fewer CTAs that find no work.
#ifndef TF_SPLIT_LOOP
#define TF_SPLIT_LOOP 0
#endif
#if TF_SPLIT_LOOP
#define DEC_SPLITS(HD)                                                                       \
    for (u32 z = blockIdx.z, it = 0; z < (tile.n + SPLIT - 1) / SPLIT; z += gridDim.z, it++) { \
        if (z != blockIdx.z) __syncthreads(); /* the last split is done with shared memory */ \
        if (tile.nr * G <= DROWS) attend_dec<HD>(a, tile, g, z, it, tr);                     \
        else attend<HD>(a, z);                                                               \
    }
#elif DEC_EARLY
#define DEC_SPLITS(HD)                                                                       \
    if (tile.nr * G <= DROWS) {                                                              \
        attend_dec<HD>(a, tile, g, blockIdx.z, 0, tr, early);                                \
    } else {                                                                                 \
        if (early) {                                                                         \
            pdl_wait();                                                                      \
            pdl_launch();                                                                    \
        }                                                                                    \
        attend<HD>(a);                                                                       \
    }
#else
#define DEC_SPLITS(HD)                                                                       \
    if (tile.nr * G <= DROWS) attend_dec<HD>(a, tile, g, blockIdx.z, 0, tr);                 \
    else attend<HD>(a);
#endif

// Split mode (decode): row tiles of at most DROWS M-rows take attend_dec, larger ones attend()
// with mode 1; the same bits either way; attention_combine merges the splits after. Dynamic
// shared memory: max(dec_smem, attend()'s). `mode` bit 1 (the host's: the previous launch was
// the KV store of this call's rows and layer) allows DEC_EARLY: the wait for the previous
// kernel then comes after the row tile (host metadata) and, in attend_dec, after the early
// copies; a CTA without work exits without waiting (it touches nothing the previous kernel
// writes).
#define DEC_ENTRY(NAME, HD)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) NAME(ATTN_PARAMS) {             \
        long long tr[12];                                                                    \
        TRACE_AT(0);                                                                         \
        const bool early = DEC_EARLY && (mode & 2u);                                         \
        if (!early) {                                                                        \
            pdl_wait();                                                                      \
            pdl_launch();                                                                    \
        }                                                                                    \
        TRACE_AT(1);                                                                         \
        ATTN_ARGS(1);                                                                        \
        const u32 G = heads / kvh, b = rows - 1 - blockIdx.x / kvh, g = blockIdx.x % kvh;    \
        const Tile tile = row_tile(positions, row_table, b, rows, MROWS / G);                 \
        if (tile.nr == 0 || blockIdx.z >= (tile.n + SPLIT - 1) / SPLIT) return;               \
        TRACE_AT(2);                                                                         \
        DEC_SPLITS(HD)                                                                       \
        TRACE_AT(11);                                                                        \
        if (TF_ATTN_TRACE) trace_print(tr, loff);                                            \
    }
#if ATTN_PART(64)
DEC_ENTRY(attention_dec_hd64, 64)
#endif
#if ATTN_PART(96)
DEC_ENTRY(attention_dec_hd96, 96)
#endif
#if ATTN_PART(128)
DEC_ENTRY(attention_dec_hd128, 128)
#endif

// Merges the split partials of rows needing more than one split (decode mode), in split
// order 0, 1, 2, ... with the kernel's sequential merge; out = bf16(O / L), -0 -> +0.
// grid: (rows, heads); block: 128. `nsplit` is the partial buffer's split stride.
#if ATTN_PART(1)
extern "C" __global__ void __launch_bounds__(128) attention_combine(
    bf16* __restrict__ out, const float* __restrict__ partial, const u32* __restrict__ positions,
    u32 heads, u32 hd, u32 nsplit) {
    pdl_wait();
    pdl_launch();
    const u32 r = blockIdx.x, h = blockIdx.y;
    const u32 nz = positions[r] / SPLIT + 1;
    if (nz == 1) return;
    const float* part = partial + ((u64)r * heads + h) * nsplit * (hd + 2);
    for (u32 d = threadIdx.x; d < hd; d += blockDim.x) {
        float M = part[0], L = part[1], O = part[2 + d];
        // Unrolled so that the loads of several splits are in flight before their merges
        // (the merges stay one sequential chain in split order).
#pragma unroll 8
        for (u32 z = 1; z < nz; z++) {
            const float* pz = part + z * (hd + 2);
            float a, c;
            merge_ml(M, L, pz[0], pz[1], a, c);
            O = merge_o(O, pz[2 + d], a, c);
        }
        out[((u64)r * heads + h) * hd + d] = f2bf(finish(O, L));
    }
}
#endif
