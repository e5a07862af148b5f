// linear_bf16_ws: the prefill linear product on sm_90a with a copy warp, bulk copies and
// wgmma with the weights in registers; the same arithmetic per element as linear_bf16
// (linear.cu's header defines it; gemm90.cu's header says why a wgmma k16 step can give an
// mma.sync step's bits). Compiled in one unit after gemm90.cu, whose helpers it uses.
//
// Why this layout: linear_bf16's k16 steps are not 16 consecutive k. Step e of the super-step
// at k0 takes {k0 + 8c + 4e + 0..3 : c = 0..3}, lane (g, c) feeding k0 + 8c + 4e + {0, 1} as
// the mma's k pair 2c and k0 + 8c + 4e + {2, 3} as pair 2c + 8. A shared-memory wgmma operand
// reads 16-byte runs of 8 consecutive k, so it cannot hold such a step without 8-byte copies
// (linear_bf16_wg: 8-byte cp.async). Here the two operands take different roads:
// - weights (the M side) go to the wgmma as registers: each lane reads its 16 bytes (rows
//   g, g + 8; k0 + 8c .. + 7) from a natural-layout tile with one ld.shared.v4, exactly
//   linear_bf16's lane load, and feeds elements 0..3 to step 0, 4..7 to step 1, in
//   linear_bf16's register order. So each step holds linear_bf16's products in linear_bf16's
//   order, and the tile arrives by one 2-D tensor copy (TMA, the host's map of the weight;
//   zeros past n and K), no regrouping;
// - activations (the N side) are first packed by pack_act_ws into the image the wgmma reads:
//   for each 128-token x 64-k tile, 128-byte rows in the 128-byte swizzle, each 32-k block's
//   16 4-byte k pairs transposed 4 x 4 (logical 16-byte chunk m holds pair m of the block's
//   four source chunks), which puts step e's pairs in the mma's pair order. One bulk copy
//   moves a whole tile.
// Per element, as linear_bf16: super-steps of 32 k from k = 0, k >= K zeros (the image is
// zero there; weight registers past K are zeroed), super-steps wholly past K not run; the
// chain restarts from +0 at each slice start; `tot = acc` or `tot += acc` at a slice end; each
// empty trailing slice adds +0.0; bias; one rounding. tests/cuda_wgmma.rs compares it with
// linear_bf16 bit for bit (13 shapes, 1..2,048 rows; H200 2026-12-02: 0 of 419,926,752
// elements differ at either TF_WS_DEPTH).
//
// Launch (persistent): one CTA an SM walks tiles blockIdx.x, + gridDim.x, ... of 128 features
// x 128 tokens (TF_WS_GROUP feature tiles at a time). Warpgroup 0 is the copy warpgroup
// (registers given up with setmaxnreg; one thread issues): for each 64-k tile it waits for a
// free stage, arms the stage's `full` mbarrier with the bytes to come and issues the weight
// tile's tensor copy and the packed activation tile's bulk copy. Warpgroups 1 and 2 each own
// 64 features of the tile: wait for `full`, load their weight registers, issue 4 wgmma
// m64n128k16 (RS), commit, and once the group has completed (TF_WS_DEPTH) release the stage on
// `empty`. A CTA's next tile's copies run while its consumers store the last one. Branches
// between wgmmas are warp-uniform by construction (role from a shuffle, arrivals predicated
// inside the asm): ptxas serializes the wgmmas otherwise.
//
// H200, 2026-12-02 (docs/bench/2026-12-02-h200.md): with the packing, 230-451 TFLOP/s at
// 2,048 rows on the llama3-8b shapes, against linear_bf16_wg's 283-355 in the same run; served
// prefill 2,048 18.4k-19.5k tok/s (linear_bf16_wg 16.7k-17.9k). Measured and dropped, same
// bits: the weight tile by one 1-D bulk copy a 128-byte row (50-66 TFLOP/s: small copies
// queue on the copy unit) and by 16-byte cp.async from the copy warpgroup's 128 threads
// (131-310, 8-13% under the tensor copy); a packing thread a (row, 32-k block) with 16-byte
// scattered stores (ncu: 55 us for 2,048 x 4,096, 32 MB moved; now a block a tile through
// shared memory, not timed alone: the figures above include it).
//
// Everything here compiles to nothing below sm_90a (the host never picks it there).

// TF_WS_DEPTH (a measurement knob): wgmma groups a consumer warpgroup keeps in flight. 1
// (default): each tile's group completes before the next tile's registers load (one register
// set; the other warpgroup's group keeps the tensor cores busy meanwhile); 2: the next tile's
// group is issued before the previous one completes, the weight registers alternating between
// two sets (the tile loop unrolled twice, so twice the loop's code). H200, 2026-12-02, TFLOP/s
// at 2,048 rows with the packing (tests/cuda_wgmma.rs `wg_linear_speed`): depth 1 331 / 230 /
// 328 / 346 / 451 on 4096x4096 / 1024x4096 / 6144x4096 / 14336x4096 / 4096x14336, depth 2
// 310 / 221 / 309 / 321 / 432 (ncu at depth 2: 9.2 cycles a warp between issues, a third of
// them waiting for instruction fetch: the loop's code did not fit the instruction cache).
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
#define WS_STAGES 6
#define WS_A_BYTES (WS_BM * 128)
#define WS_B_BYTES (WS_BN * 128)
#define WS_STAGE (WS_A_BYTES + WS_B_BYTES)
// Stages, their mbarriers (full[s], empty[s]) and 1 KiB of slack to align the tiles to the
// 1,024-byte swizzle atom. cuda/wgmma.rs `LINEAR_WS` mirrors it.
#define WS_SMEM (WS_STAGES * WS_STAGE + 2 * WS_STAGES * 8 + 1024)

#if WG_ENABLED
// Arrives on bar when `pred` (a predicate inside the asm, not a branch: a lane-dependent
// branch between wgmmas makes ptxas serialize them).
__device__ __forceinline__ void ws_mbar_arrive_if(u32 bar, bool pred) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %1, 0;\n\t@p mbarrier.arrive.shared::cta.b64 _, [%0];\n\t}" ::"r"(bar),
                 "r"((u32)pred)
                 : "memory");
}
__device__ __forceinline__ uint4 ws_lds(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
// Keeps a register operand of an in-flight wgmma live and unchanged until this point.
__device__ __forceinline__ void ws_keep(uint4& v) {
    asm volatile("" : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)::"memory");
}

// wgmma m64n128k16, bf16 x bf16 -> f32, A (64 x 16) from registers in mma.sync's m16n8k16 A
// fragment layout (warp w of the warpgroup: rows 16w ..), B from shared memory: D += A B^T.
__device__ __forceinline__ void wgmma_rs_n128(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        WG_D128_REGS
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : WG_D128_OPS
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

// What a CTA walks: its tiles, the k tiles of each, the stage ring position.
struct WsGrid {
    u32 n, k, rows, tf, tt, ktiles;
    u32 full, empty, sbase;  // shared addresses: full[s] = full + 8 s, likewise empty
};

// The copy warp (its thread 0 issues): for every 64-k tile of this CTA's tiles, a free stage,
// armed with the bytes to come (the 16 KiB weight tile, zero-filled by the tensor copy past n
// and K, and the 16 KiB packed activation tile), then the two copies.
__device__ __forceinline__ void ws_copy(const WsGrid& G, const bf16* __restrict__ w,
                                        const WsMap& amap, const bf16* __restrict__ img) {
    const u32 t = threadIdx.x;
    u32 it = 0;
    for (u32 tile = blockIdx.x; tile < G.tf * G.tt; tile += gridDim.x) {
        u32 fi, ti;
        tile_raster_at(tile, G.n, G.rows, WS_BM, WS_BN, TF_WS_GROUP, fi, ti);
        const u32 n0 = fi * WS_BM;
        for (u32 kt = 0; kt < G.ktiles; kt++, it++) {
            const u32 s = it % WS_STAGES, ph = (it / WS_STAGES) & 1;
            mbar_wait_parity(G.empty + 8 * s, ph ^ 1);
            const u32 full = G.full + 8 * s, sa = G.sbase + s * WS_STAGE;
            const bf16* bsrc = img + ((u64)ti * G.ktiles + kt) * (WS_BN * 64);
            if (t == 0) {
                mbar_expect_at(full, WS_A_BYTES + WS_B_BYTES);
                asm volatile(
                    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
                        sa),
                    "l"((u64)&amap), "r"(kt * 64), "r"(n0), "r"(full)
                    : "memory");
                bulk_copy_at(sa + WS_A_BYTES, bsrc, WS_B_BYTES, full);
            }
        }
    }
}

// A consumer's weight registers of one 64-k tile: rows g and g + 8 of its warp's 16, the
// 16 bytes at k 32h + 8c for h = 0, 1 (zero past K). Lanes of odd g load h = 1 first, so the
// 8 lanes of each shared-memory phase read 8 different bank groups of the unswizzled rows.
__device__ __forceinline__ void ws_load_w(u32 sa, u32 row, u32 kt, u32 k, uint4 (&ra)[2], uint4 (&rb)[2]) {
    const u32 lane = threadIdx.x & 31, c = lane & 3, odd = (lane >> 2) & 1;
    const u32 first = 4 * odd + c, second = 4 * (odd ^ 1) + c;
    const uint4 a0 = ws_lds(sa + row * 128 + first * 16), a1 = ws_lds(sa + row * 128 + second * 16);
    const uint4 b0 = ws_lds(sa + (row + 8) * 128 + first * 16);
    const uint4 b1 = ws_lds(sa + (row + 8) * 128 + second * 16);
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (u32 h = 0; h < 2; h++) {
        const bool in = kt * 64 + 32 * h + 8 * c < k;
        ra[h] = in ? ((h == odd) ? a0 : a1) : zero;
        rb[h] = in ? ((h == odd) ? b0 : b1) : zero;
    }
}

// A consumer's running state over one tile's K.
struct WsChain {
    float acc[64], tot[64];
    bool first;
    u32 next_end;  // k where the current slice ends
    int pending;   // the stage whose wgmmas may still run, -1 for none
};

// One 64-k tile (ring position `it`) of a consumer warpgroup: weights into `cur` (the other
// set, `prev`, fed the previous tile's wgmmas), 2 super-steps of 2 wgmma each, folds at slice
// ends, then the previous tile's stage released once its group has completed.
__device__ __forceinline__ void ws_tile_k(const WsGrid& G, WsChain& ch, u32 it, u32 kt, u32 row,
                                          u32 slice_len, uint4 (&ca)[2], uint4 (&cb)[2],
                                          uint4 (&pa)[2], uint4 (&pb)[2]) {
    const u32 s = it % WS_STAGES, ph = (it / WS_STAGES) & 1;
    mbar_wait_parity(G.full + 8 * s, ph);
    const u32 sa = G.sbase + s * WS_STAGE, sb = sa + WS_A_BYTES;
    ws_load_w(sa, row, kt, G.k, ca, cb);
#pragma unroll
    for (u32 h = 0; h < 2; h++) {
        const u32 k0 = kt * 64 + 32 * h;
        if (k0 >= G.k) break;
        wg_fence();
        wgmma_rs_n128(ch.acc, ca[h].x, cb[h].x, ca[h].y, cb[h].y, wg_desc(sb + 64 * h));
        wgmma_rs_n128(ch.acc, ca[h].z, cb[h].z, ca[h].w, cb[h].w, wg_desc(sb + 64 * h + 32));
        if (k0 + 32 == ch.next_end || k0 + 32 >= G.k) {  // a slice ends: fold its partial in
            wg_commit();
            wg_wait<0>();
            wg_fold<64>(ch.acc, ch.tot, ch.first);
            ch.first = false;
            ch.next_end += slice_len;
        }
    }
    wg_commit();
    wg_wait<TF_WS_DEPTH - 1>();  // the previous tile's group is complete: its registers and stage are free
#pragma unroll
    for (u32 h = 0; h < 2; h++) {
        ws_keep(pa[h]);
        ws_keep(pb[h]);
    }
    ws_mbar_arrive_if(G.empty + 8 * ch.pending, ch.pending >= 0 && (threadIdx.x & 31) == 0);
    ch.pending = (int)s;
}

// A consumer warpgroup (cw = 0, 1: features 64 cw .. of each tile).
__device__ __forceinline__ void ws_consume(const WsGrid& G, u32 cw, const float* __restrict__ bias,
                                           void* out, int out_mode, u32 slice_len, u32 slices) {
    const u32 warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const u32 row = 64 * cw + 16 * warp + g;
    WsChain ch;
    uint4 ra0[2], rb0[2], ra1[2], rb1[2];
    u32 it = 0;
    for (u32 tile = blockIdx.x; tile < G.tf * G.tt; tile += gridDim.x) {
        u32 fi, ti;
        tile_raster_at(tile, G.n, G.rows, WS_BM, WS_BN, TF_WS_GROUP, fi, ti);
#pragma unroll
        for (int i = 0; i < 64; i++) ch.acc[i] = ch.tot[i] = 0.0f;
        ch.first = true;
        ch.next_end = slice_len;
        ch.pending = -1;
#if TF_WS_DEPTH == 1
        for (u32 kt = 0; kt < G.ktiles; kt++) ws_tile_k(G, ch, it++, kt, row, slice_len, ra0, rb0, ra0, rb0);
#else
        for (u32 kt = 0; kt < G.ktiles; kt += 2) {
            ws_tile_k(G, ch, it++, kt, row, slice_len, ra0, rb0, ra1, rb1);
            if (kt + 1 < G.ktiles) ws_tile_k(G, ch, it++, kt + 1, row, slice_len, ra1, rb1, ra0, rb0);
        }
#endif
        wg_wait<0>();
        ws_mbar_arrive_if(G.empty + 8 * ch.pending, ch.pending >= 0 && lane == 0);
        // Empty trailing slices: linear_bf16 adds their +0.0 partials (turns a -0.0 into +0.0).
        const u32 used = slice_len ? (G.k + slice_len - 1) / slice_len : 0;
        const u32 empty = slices > used ? slices - used : 0;
        const u32 n0 = fi * WS_BM, t0 = ti * WS_BN;
#pragma unroll
        for (int i = 0; i < WS_BN / 8; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 f = n0 + row + (j >= 2 ? 8 : 0);
                const u32 tok = t0 + 8 * i + 2 * c + (j & 1);
                if (f >= G.n || tok >= G.rows) continue;
                float total = ch.tot[4 * i + j];
                for (u32 s = 0; s < empty; s++) total += 0.0f;
                store_linear(out, out_mode, (u64)tok * G.n + f, total, bias, f);
            }
    }
}

__device__ __forceinline__ void ws_body(const bf16* __restrict__ w, const WsMap& amap,
                                        const bf16* __restrict__ img,
                                        const float* __restrict__ bias, void* out, int out_mode,
                                        u32 n, u32 k, u32 rows, u32 slice_len, u32 slices) {
    extern __shared__ unsigned char ws_raw[];
    const u32 raw = (u32)__cvta_generic_to_shared(ws_raw);
    WsGrid G;
    G.n = n;
    G.k = k;
    G.rows = rows;
    G.tf = (n + WS_BM - 1) / WS_BM;
    G.tt = (rows + WS_BN - 1) / WS_BN;
    G.ktiles = (k + 63) / 64;
    G.sbase = (raw + 1023) & ~1023u;
    G.full = G.sbase + WS_STAGES * WS_STAGE;
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
        if (threadIdx.x < 32) ws_copy(G, w, amap, img);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    ws_consume(G, wg - 1, bias, out, out_mode, slice_len, slices);
}
#endif  // WG_ENABLED

// grid: min(tiles, SMs) CTAs (1-D); block 384; dynamic shared memory WS_SMEM. `amap`: the
// weight's tensor map (bf16 [n][k], box 64 k x 128 rows, no swizzle); `img`: the activations
// packed by pack_act_ws for this call's rows and K.
extern "C" __global__ void __launch_bounds__(384, 1)
    linear_bf16_ws(const bf16* __restrict__ w, const __grid_constant__ WsMap amap,
                   const bf16* __restrict__ img,
                   const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,
                   u32 slice_len, u32 slices) {
    pdl_wait();
    pdl_launch();
#if WG_ENABLED
    ws_body(w, amap, img, bias, out, out_mode, n, k, rows, slice_len, slices);
#endif
}

// The packed activation image linear_bf16_ws reads: for token tile T (128 rows) and k tile
// kt (64 k), WS_BN x 128 bytes at ((T * ktiles + kt) * 128) * 64 bf16; row r's logical 16-byte
// chunk j (4 h + m: 32-k block h of the tile) at physical chunk j ^ (r % 8) (the 128-byte
// swizzle); chunk 4 h + m holds 4-byte pair m of each of the block's four source chunks, in
// source-chunk order (so wgmma k16 step 2 h + e reads pairs 2e, 2e + 1 of each source chunk:
// linear_bf16's step e set, in its pair order). Rows past `rows` and k past K are zero.
// Token row t reads x row row_idx[t] (or t). grid: (ktiles, token tiles), block 256: a block
// packs one image tile through shared memory (8 lanes a 128-byte row on both sides: both the
// loads and the stores are whole lines; 144-byte rows keep the transposed 4-byte reads of a
// warp on 32 different banks).
#define PACK_ROW 144
extern "C" __global__ void __launch_bounds__(256)
    pack_act_ws(const bf16* __restrict__ x, const u32* __restrict__ row_idx, bf16* __restrict__ img,
                u32 k, u32 rows) {
    __shared__ __align__(16) unsigned char tile[WS_BN * PACK_ROW];
    pdl_wait();
    const u32 kt = blockIdx.x, T = blockIdx.y, ktiles = gridDim.x;
    const u32 t = threadIdx.x, j = t & 7;
#pragma unroll
    for (u32 i = 0; i < WS_BN / 32; i++) {
        const u32 rr = t / 8 + 32 * i, r = T * WS_BN + rr, kc = kt * 64 + 8 * j;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows && kc < k) v = *(const uint4*)(x + (u64)(row_idx ? row_idx[r] : r) * k + kc);
        *(uint4*)(tile + rr * PACK_ROW + 16 * j) = v;
    }
    __syncthreads();
    const u32 h = j / 4, m = j % 4;
    bf16* dst = img + ((u64)T * ktiles + kt) * (WS_BN * 64);
#pragma unroll
    for (u32 i = 0; i < WS_BN / 32; i++) {
        const u32 rr = t / 8 + 32 * i;
        const u32* row = (const u32*)(tile + rr * PACK_ROW + 64 * h) + m;
        *(uint4*)(dst + rr * 64 + 8 * (j ^ (rr & 7))) = make_uint4(row[0], row[4], row[8], row[12]);
    }
    // The product may launch once every block has stored (it needs every SM's whole register
    // file, so its CTAs would otherwise sit on SMs the remaining blocks could use).
    pdl_launch();
}
