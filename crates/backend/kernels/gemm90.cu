// linear_bf16_wg: the prefill linear product on Hopper's warpgroup tensor-core instruction
// (wgmma.mma_async, sm_90a only), the same arithmetic per element as linear_bf16 in linear.cu
// (read that file's header first: the K mapping and slice order defined there are what this
// kernel reproduces bit for bit).
//
// Why the bits can be equal: a wgmma m64nNk16 step gives the accumulator bits of an mma.sync
// m16n8k16 step fed the same 16 products from the same starting value (tests/cuda_wgmma.rs,
// H200, 2026-11-30: 0 of 64 x N elements differ for N = 8/64/128/256 after 256 chained steps,
// from +0 and from non-zero starts, on spread, wide-exponent, subnormal-product and cancelling
// data; feeding other 16-element sets differs in ~90% of the elements). The order of the 16
// products inside a step made no difference in that probe; which 16 share a step does. So
// each mma.sync of linear_bf16's chain becomes one wgmma k16 step over the same set: 16
// consecutive k, so a natural [row][64 k] tile (128-byte swizzle) feeds wgmma as it is; the
// copies here are 8-byte cp.async (a 16-byte one would do; kept as the A/B alternative to
// gemm90ws.cu's tensor copies).
// Per element, as linear_bf16 and linear_bf16_tiled (gemm.cu): super-steps of 32 k from k = 0;
// k >= K reads zeros (cp.async src-size 0; K and slice ends are multiples of 8, so a unit of 4
// is all in or all out) and super-steps wholly past K are not run; the accumulator restarts
// from +0 at each slice start s * slice_len; at a slice end `tot = acc` (first slice) or
// `tot += acc`; each empty trailing slice adds +0.0; then the bias, then one rounding.
//
// Launch: a CTA of WGS warpgroups computes 64 WGS features x BN tokens; warpgroup i owns
// features 64i .. 64i + 63 and every token (one wgmma m64nBNk16 per k16 step, accumulator
// and running total in registers: 2 x BN / 2 floats a thread). Tiles of 64 k (128-byte rows,
// the 128-byte swizzle wgmma reads) are filled by 8-byte cp.async from every thread, STAGES
// buffers, STAGES - 2 tiles ahead, so a warpgroup's wgmma group of the previous tile may still
// run while the next is issued (wgmma.wait_group 1 before each barrier).
//
// H200, 2026-11-30, TFLOP/s at 2,048 / 8,192 rows (tests/cuda_wgmma.rs `wg_linear_speed`;
// linear_bf16_tiled in the same run; cuBLAS reaches 610-809 on these shapes):
//   linear_bf16_wg (2 warpgroups, 128 x 128, 5 stages): 4096x4096 310/317 (tiled 233/233),
//   1024x4096 284/296 (143/215; tiled_r 185/190), 6144x4096 312/315 (236/235), 14336x4096
//   324/331 (247/247), 4096x14336 355/355 (267/265);
//   linear_bf16_wg_m192 (3 warpgroups, 192 x 128, 4 stages): 289/318, 202/273, 324/327,
//   315/339, 321/349.
// Measured and dropped (all bit-equal to linear_bf16 on the GPU): 128 x 192 tiles of 2
// warpgroups (254 registers; 200-329 at 2,048 rows); issuing the next tile's copies after the
// tile's wgmmas instead of before (284-324: -6 to -10%); on that loop, tiles through
// registers (16-byte loads, 8-byte shared stores: -14 to -18% more) and one-warpgroup CTAs of
// 64 x 128, two an SM (-9 to -13% more).
// Not yet known what bounds it (no profiler run). Not tried: a producer warp with mbarriers
// instead of the CTA barrier each tile, 2-CTA clusters sharing tiles by multicast.
//
// Everything in this file compiles to nothing below sm_90a (the host never picks it there).

// TF_GEMM90_PART: which entry points a translation unit defines. cuda/compile.rs compiles
// this family as two units (`UNITS` there), so a cold start compiles them on parallel threads
// instead of one ~10 s unit: 1 linear_bf16_ws, linear_bf16_ws3 and gather_rows, 2
// linear_bf16_wg and linear_bf16_wg_m192. Unset (as tools/kernel_regs.py compiles the files):
// every entry. A part changes no entry's machine code (nvdisasm, session 36), but only with
// ws and ws3 in one unit: linear_bf16_ws3 alone came out as other code (15,232 instructions
// against 9,272).
#ifdef TF_GEMM90_PART
#define GEMM90_PART(p) (TF_GEMM90_PART == (p))
#else
#define GEMM90_PART(p) 1
#endif

#if WG_ENABLED

// wgmma m64nNk16, bf16 x bf16 -> f32, A and B from shared memory (descriptors), D += A B^T.
__device__ __forceinline__ void wgmma_n128(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        WG_D128_REGS
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : WG_D128_OPS
        : "l"(da), "l"(db), "r"(1));
}


// 8-byte async copy into shared memory; `pred` false writes zeros (src-size 0).
__device__ __forceinline__ void wg_cp8(u32 dst, const void* src, bool pred) {
    const int n = pred ? 8 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
}

template <int BN>
__device__ __forceinline__ void wg_mma(float* acc, u64 da, u64 db) {
    static_assert(BN == 128, "BN is 128 (the configurations kept; wider ones were slower)");
    wgmma_n128(acc, da, db);
}

// Launch shape and shared memory of one configuration.
template <int WGS, int BN, int STAGES>
struct WgCfg {
    static constexpr u32 BM = 64 * WGS;               // features per CTA
    static constexpr u32 THREADS = 128 * WGS;
    static constexpr u32 A_BYTES = BM * 128;          // a stage's weight tile (64 k a row)
    static constexpr u32 STAGE = (BM + BN) * 128;     // a multiple of 1024 (swizzle atoms)
    static constexpr u32 SMEM = STAGES * STAGE + 1024;  // + slack to align the base to 1024
    static constexpr u32 RS = THREADS / 16;           // rows between a thread's copies
    static constexpr u32 ALOADS = (BM + RS - 1) / RS;
    static constexpr u32 BLOADS = (BN + RS - 1) / RS;
    static constexpr u32 ACC = BN / 2;                // accumulators a thread
    static_assert(RS % 8 == 0, "a thread's rows share their swizzle phase");
    static_assert(STAGES >= 3, "two tiles in use while the next loads");
};

// The CTA's (feature tile, token tile) from a 1-D grid: WG_GROUP feature tiles at a time, the
// token tile advancing after each group's feature tiles (L2 reuse; no element's arithmetic).
#define WG_GROUP 8
__device__ __forceinline__ void wg_tile(u32 n, u32 rows, u32 tm, u32 tn, u32& fi, u32& ti) {
    tile_raster(n, rows, tm, tn, WG_GROUP, fi, ti);
}

// A slice ends: tot = acc (the first slice) or tot += acc, and acc restarts from +0.
template <int ACC>
__device__ __forceinline__ void wg_fold(float* acc, float* tot, bool first) {
#pragma unroll
    for (int i = 0; i < ACC; i++) {
        tot[i] = first ? acc[i] : tot[i] + acc[i];
        acc[i] = 0.0f;
    }
}

// grid: ceil(n / BM) * ceil(rows / BN) CTAs (1-D); block: THREADS; dynamic shared memory
// WgCfg::SMEM. Arguments as linear_bf16_tiled.
template <int WGS, int BN, int STAGES>
__device__ __forceinline__ void wg_body(const bf16* __restrict__ w, const bf16* __restrict__ x,
                                        const u32* __restrict__ row_idx,
                                        const float* __restrict__ bias, void* out, int out_mode,
                                        u32 n, u32 k, u32 rows, u32 slice_len, u32 slices) {
    typedef WgCfg<WGS, BN, STAGES> C;
    extern __shared__ unsigned char wg_raw[];
    const u32 raw = (u32)__cvta_generic_to_shared(wg_raw);
    const u32 sbase = (raw + 1023) & ~1023u;
    const u32 tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const u32 g = lane >> 2, c = lane & 3;
    u32 fi, ti;
    wg_tile(n, rows, C::BM, BN, fi, ti);
    const u32 n0 = fi * C::BM, t0 = ti * BN;

    // Loader: thread copies 8-byte unit u (k 4u .. 4u + 3 of the tile) of rows r0 + RS i to
    // its natural place (16-byte chunk u / 2, swizzled).
    const u32 u = tid & 15, r0 = tid >> 4;
    const u32 doff = r0 * 128 + (((u >> 1) ^ (r0 & 7)) << 4) + (u & 1) * 8;
    const bf16* wa = w + (u64)(n0 + r0) * k + 4 * u;
    u32 bsrc[C::BLOADS];  // each token copy's source row, ~0 for padding
#pragma unroll
    for (int i = 0; i < (int)C::BLOADS; i++) {
        const u32 rr = r0 + C::RS * i, t = t0 + rr;
        bsrc[i] = (rr < BN && t < rows) ? (row_idx ? row_idx[t] : t) : ~0u;
    }
    const u32 ktiles = (k + 63) / 64;
    auto load_tile = [&](u32 kt, u32 stage) {
        const u32 st = sbase + stage * C::STAGE + doff;
        const bool kin = kt * 64 + 4 * u < k;
#pragma unroll
        for (int i = 0; i < (int)C::ALOADS; i++) {
            const u32 rr = r0 + C::RS * i;
            if (C::BM % C::RS != 0 && rr >= C::BM) break;
            const bool p = kin && n0 + rr < n;
            const void* src = p ? (const void*)(wa + (u64)(C::RS * i) * k + kt * 64) : (const void*)w;
            wg_cp8(st + C::RS * i * 128, src, p);
        }
#pragma unroll
        for (int i = 0; i < (int)C::BLOADS; i++) {
            const u32 rr = r0 + C::RS * i;
            if (BN % C::RS != 0 && rr >= BN) break;
            const bool p = kin && bsrc[i] != ~0u;
            const void* src =
                p ? (const void*)(x + (u64)bsrc[i] * k + kt * 64 + 4 * u) : (const void*)x;
            wg_cp8(st + C::A_BYTES + C::RS * i * 128, src, p);
        }
    };

    float acc[C::ACC], tot[C::ACC];
#pragma unroll
    for (int i = 0; i < (int)C::ACC; i++) acc[i] = tot[i] = 0.0f;
    bool first = true;
    u32 next_end = slice_len;  // k where the current slice ends (a multiple of 32)
    constexpr u32 D = STAGES - 2;  // tiles loaded ahead

#pragma unroll
    for (u32 s = 0; s < D; s++) {
        if (s < ktiles) load_tile(s, s);
        cp_async_commit();
    }
    for (u32 kt = 0; kt < ktiles; kt++) {
        wg_wait<1>();         // this warpgroup's wgmmas of tile kt - 2 are done
        cp_async_wait<D - 1>();  // this thread's copies of tile kt have landed
        fence_proxy_async();  // ... and are visible to wgmma's (async) proxy
        __syncthreads();      // everyone's: tile kt in place, stage of tile kt - 2 free
        if (kt + D < ktiles) load_tile(kt + D, (kt + D) % STAGES);
        cp_async_commit();
        const u32 st = sbase + (kt % STAGES) * C::STAGE;
        const u32 sa = st + wg * 64 * 128, sb = st + C::A_BYTES;
#pragma unroll
        for (u32 hh = 0; hh < 2; hh++) {
            const u32 k0 = kt * 64 + 32 * hh;
            if (k0 >= k) break;
            wg_fence();
            wg_mma<BN>(acc, wg_desc(sa + 64 * hh), wg_desc(sb + 64 * hh));
            wg_mma<BN>(acc, wg_desc(sa + 64 * hh + 32), wg_desc(sb + 64 * hh + 32));
            if (k0 + 32 == next_end || k0 + 32 >= k) {  // a slice ends: fold its partial in
                wg_commit();
                wg_wait<0>();
                wg_fold<C::ACC>(acc, tot, first);
                first = false;
                next_end += slice_len;
            }
        }
        wg_commit();
    }
    wg_wait<0>();
    cp_async_wait<0>();
    // Empty trailing slices: linear_bf16 adds their +0.0 partials (turns a -0.0 into +0.0).
    const u32 used = slice_len ? (k + slice_len - 1) / slice_len : 0;
    const u32 empty = slices > used ? slices - used : 0;
#pragma unroll
    for (int i = 0; i < (int)BN / 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 f = n0 + 64 * wg + 16 * warp + g + (j >= 2 ? 8 : 0);
            const u32 tok = t0 + 8 * i + 2 * c + (j & 1);
            if (f >= n || tok >= rows) continue;
            float total = tot[4 * i + j];
            for (u32 s = 0; s < empty; s++) total += 0.0f;
            store_linear(out, out_mode, (u64)tok * n + f, total, bias, f);
        }
}
#endif  // WG_ENABLED

#if WG_ENABLED
#define WG_CALL(WGS, BN, STAGES) \
    wg_body<WGS, BN, STAGES>(w, x, row_idx, bias, out, out_mode, n, k, rows, slice_len, slices);
#else
#define WG_CALL(WGS, BN, STAGES)
#endif
#define WG_ENTRY(NAME, WGS, BN, STAGES)                                                        \
    extern "C" __global__ void __launch_bounds__(128 * WGS, 1) NAME(                           \
        const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx, \
        const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,       \
        u32 slice_len, u32 slices) {                                                           \
        pdl_wait();                                                                            \
        pdl_launch();                                                                          \
        WG_CALL(WGS, BN, STAGES)                                                               \
    }

// Configurations (the host's shapes in cuda/wgmma.rs mirror them; one CTA an SM).
#if GEMM90_PART(2)
// 128 features x 128 tokens, 2 warpgroups, 5 stages (161 KiB).
WG_ENTRY(linear_bf16_wg, 2, 128, 5)
// 192 x 128, 3 warpgroups, 4 stages (161 KiB; 168 registers, the most 384 threads allow).
WG_ENTRY(linear_bf16_wg_m192, 3, 128, 4)
#endif
