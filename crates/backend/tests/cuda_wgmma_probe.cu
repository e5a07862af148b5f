// Probe of tests/cuda_wgmma.rs (appended to kernels/gemm90.cu, whose wgmma helpers it uses):
// does a chain of wgmma m64nNk16 steps give the accumulator bits of linear_bf16's chain of
// mma.sync m16n8k16 steps over the same values?
//
// probe_mma: D[64][nb] = C0 + A (64 x k) . B (nb x k)^T by linear_bf16's chain: per 32-k
// super-step two mma steps, step e fed by lane (g, c) with k0 + 16e + 4c .. + 3 of rows g, g + 8
// and of token g (linear.cu's positions and register order after its regroup).
// probe_wg_nN: the same with one warpgroup, a wgmma m64nNk16 per k16 step; the logical k
// position L of each 64-k tile holds the value at probe_k(L, mode):
//   0: natural order, k16 step s takes k 16s .. 16s + 15: linear_bf16's sets (the hypothesis:
//      equal bits; the prefill kernels read natural tiles),
//   1: the same 16-element sets, another order inside each set (p ^ 5),
//   2: the earlier definition's sets, {k0 + 8c + 4e + 0..3 : c} (other sets, a control that
//      must differ),
//   3: linear_bf16's sets, the order inside each set reversed.

// The narrower and wider wgmma shapes the probe also tries (gemm90.cu keeps only n128).
__device__ __forceinline__ void wgmma_n8(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3"
        "}, %4, %5, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(da), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_n64(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_n256(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1));
}

__device__ __forceinline__ u32 probe_k(u32 L, int mode) {
    const u32 base = L & ~31u, q = (L >> 4) & 1, p = L & 15;
    if (mode == 0) return L;
    if (mode == 1) return base + 16 * q + (p ^ 5);
    if (mode == 2) return base + 8 * (p >> 2) + (p & 3) + 4 * q;
    return base + 16 * q + 15 - p;
}

extern "C" __global__ void probe_mma(const bf16* a, const bf16* b, const float* c0, float* d,
                                     u32 k, u32 nb) {
    const u32 lane = threadIdx.x, g = lane >> 2, c = lane & 3;
    const u32 f0 = blockIdx.y * 16, t0 = blockIdx.x * 8;
    float acc[4];
    for (int i = 0; i < 4; i++) {
        const u32 r = f0 + g + (i >= 2 ? 8 : 0), col = t0 + 2 * c + (i & 1);
        acc[i] = c0[r * nb + col];
    }
    for (u32 k0 = 0; k0 < k; k0 += 32) {
#pragma unroll
        for (u32 e = 0; e < 2; e++) {
            const u32 kc = k0 + 16 * e + 4 * c;
            const uint2 av = *(const uint2*)(a + (u64)(f0 + g) * k + kc);
            const uint2 bv = *(const uint2*)(a + (u64)(f0 + g + 8) * k + kc);
            const uint2 xv = *(const uint2*)(b + (u64)(t0 + g) * k + kc);
            mma16816(acc, av.x, bv.x, av.y, bv.y, xv.x, xv.y);
        }
    }
    for (int i = 0; i < 4; i++) {
        const u32 r = f0 + g + (i >= 2 ? 8 : 0), col = t0 + 2 * c + (i & 1);
        d[r * nb + col] = acc[i];
    }
}

#if WG_ENABLED
template <int N>
__device__ __forceinline__ void probe_step(float* acc, u64 da, u64 db) {
    if (N == 8) wgmma_n8(acc, da, db);
    if (N == 64) wgmma_n64(acc, da, db);
    if (N == 128) wgmma_n128(acc, da, db);
    if (N == 256) wgmma_n256(acc, da, db);
}

// One warpgroup (128 threads), one CTA; dynamic shared memory (64 + N) * 128 + 1024 bytes.
template <int N>
__device__ __forceinline__ void probe_wg(const bf16* a, const bf16* b, const float* c0, float* d,
                                         u32 k, u32 nb, int mode) {
    extern __shared__ unsigned char probe_raw[];
    const u32 raw = (u32)__cvta_generic_to_shared(probe_raw);
    const u32 base = (raw + 1023) & ~1023u;
    unsigned char* sm = probe_raw + (base - raw);
    const u32 tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 r = 16 * w + g + (j >= 2 ? 8 : 0), col = 8 * i + 2 * c + (j & 1);
            acc[4 * i + j] = c0[r * nb + col];
        }
    for (u32 kt = 0; kt < k; kt += 64) {
        for (u32 e = tid; e < (64 + N) * 64; e += 128) {
            const u32 r = e / 64, L = e % 64;
            const bool isa = r < 64;
            const u32 rr = isa ? r : r - 64;
            const bf16* src = isa ? a + (u64)rr * k : b + (u64)rr * k;
            unsigned char* tile = isa ? sm : sm + 64 * 128;
            *(bf16*)(tile + wg_sw(rr, L / 8) + (L % 8) * 2) = src[kt + probe_k(L, mode)];
        }
        fence_proxy_async();
        __syncthreads();
        wg_fence();
#pragma unroll
        for (u32 s = 0; s < 4; s++) probe_step<N>(acc, wg_desc(base + 32 * s), wg_desc(base + 64 * 128 + 32 * s));
        wg_commit();
        wg_wait<0>();
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < N / 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 r = 16 * w + g + (j >= 2 ? 8 : 0), col = 8 * i + 2 * c + (j & 1);
            d[r * nb + col] = acc[4 * i + j];
        }
}
#endif

#if WG_ENABLED
#define PROBE_BODY(N) probe_wg<N>(a, b, c0, d, k, nb, mode);
#else
#define PROBE_BODY(N)
#endif
#define PROBE_ENTRY(N)                                                                          \
    extern "C" __global__ void __launch_bounds__(128) probe_wg_n##N(                            \
        const bf16* a, const bf16* b, const float* c0, float* d, u32 k, u32 nb, int mode) {     \
        PROBE_BODY(N)                                                                           \
    }
PROBE_ENTRY(8)
PROBE_ENTRY(64)
PROBE_ENTRY(128)
PROBE_ENTRY(256)
