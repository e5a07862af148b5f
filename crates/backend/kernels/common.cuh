// Prelude prepended to every kernel family by the CUDA backend (and by the NVRTC CI test), so
// no source needs an include path at run time: bf16 is handled as raw u16 bit patterns.
//
// Rounding: f2bf is round-to-nearest-even on the f32 bits, NaN kept quiet with its sign (the
// CPU backend's `math::f32_to_bf16`, PyTorch's rounding); bf2f widens exactly.
// Activations of either dtype go through ld_act/st_act: an f32 activation written by a
// bf16-rounding op holds the rounded value (as the CPU backend's `Dst`).

typedef unsigned short bf16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ bf16 f2bf(float x) {
    u32 b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (bf16)((b >> 16) | 0x40u);
    return (bf16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float rbf(float x) { return bf2f(f2bf(x)); }

// SwiGLU before its one rounding: bf16(silu(g)) * u, silu(g) = g / (1 + expf(-g)), for the
// bf16 values g and u (the `swiglu` kernel and linear_bf16_swiglu's epilogue both use it).
__device__ __forceinline__ float swiglu_f(float g, float u) {
    return rbf(g / (1.0f + expf(-g))) * u;
}

// rope's pair formula on bf16 values: (y1, y2) of (x1, x2) with cos c and sin s (rope.cu's
// kernels and linear_rope.cu's q/k/v epilogue both use it).
__device__ __forceinline__ void rope_pair(float x1, float x2, float c, float s, bf16& y1,
                                          bf16& y2) {
    y1 = f2bf(rbf(rbf(x1 * c) + rbf(-x2 * s)));
    y2 = f2bf(rbf(rbf(x2 * c) + rbf(x1 * s)));
}

// Element i of an activation buffer of bf16 (is_f32 == 0) or f32.
__device__ __forceinline__ float ld_act(const void* p, u64 i, int is_f32) {
    return is_f32 ? ((const float*)p)[i] : bf2f(((const bf16*)p)[i]);
}

// Stores bf16(v): as bf16 bits, or as the rounded value in an f32 buffer.
__device__ __forceinline__ void st_act(void* p, u64 i, int is_f32, float v) {
    if (is_f32) ((float*)p)[i] = rbf(v);
    else ((bf16*)p)[i] = f2bf(v);
}

// Fixed-order warp reductions (xor butterfly): every lane ends with the same bits, since each
// step adds the same two values in either order.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Tensor-core product m16n8k16: bf16 A (16 x 16) and B (16 x 8), fp32 accumulate in place.
__device__ __forceinline__ void mma16816(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Programmatic dependent launch (sm_90+; no-ops before). The host launches every kernel of a
// step with programmatic stream serialization (`cuda/graph.rs`), so a kernel may START while
// the one before it still runs. Every entry point therefore calls pdl_wait() before its first
// global memory access other than reading immutable weights (and host-written step metadata;
// the decode attention CTA's TF_DEC_EARLY copies are the one documented exception: rows the
// KV write before it cannot touch, by attention_dec.cu's argument): griddepcontrol.wait returns once the previous kernel has completed and its writes
// are visible, so what a kernel reads and writes is exactly what it would be without overlap
// (no bit can change). pdl_launch() lets the next kernel start its own pre-wait part (launch,
// weight prefetch) early.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// cp.async (sm_80+): 16 bytes global -> shared, bypassing L1; pred false writes zeros and reads
// nothing. Completion per thread by commit/wait groups.
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

// mbarrier and bulk-copy helpers on shared-memory addresses (sm_90+: the decode attention
// CTA's and the prefill GEMM's bulk copies complete on them). mbar_init_at sets the arrivals a
// phase expects; mbar_expect_at arms `bar` for `bytes` more transaction bytes and arrives;
// mbar_wait_parity spins until the phase of `parity` completed; bulk_copy_at moves `bytes` (a
// multiple of 16) from global src (16-byte aligned) to shared dst, completing on `bar`;
// fence_proxy_async orders this thread's earlier generic-proxy shared-memory accesses (st.shared,
// cp.async, an mbarrier's initialization) before later async-proxy ones (bulk copies, wgmma).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init_at(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void bulk_copy_at(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void mbar_expect_at(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait_parity(u32 bar, u32 parity) {
    u32 done = 0;
    while (!done)
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
}
#endif

// Asks L2 to fetch [p, p + bytes) (16-byte aligned, bytes % 16 == 0; sm_90+): a hint, no
// value changes (attention.cu asks for V while it scores K).
__device__ __forceinline__ void prefetch_l2(const void* p, u32 bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (bytes) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// A 1-D grid's CTA -> (feature tile fi, token tile ti) of the GEMMs: `group` feature tiles at a
// time, the token tile advancing after each group's feature tiles, so the CTAs in flight share
// few weight and activation tiles. Speed only: no element's arithmetic depends on it.
// tile_raster_at: the same for tile index `idx` (persistent CTAs walking several tiles).
__device__ __forceinline__ void tile_raster_at(u32 idx, u32 n, u32 rows, u32 tm, u32 tn, u32 group,
                                               u32& fi, u32& ti) {
    const u32 tf = (n + tm - 1) / tm, tt = (rows + tn - 1) / tn;
    const u32 per = group * tt, first = (idx / per) * group, in = idx % per;
    const u32 size = min(group, tf - first);
    fi = first + in % size;
    ti = in / size;
}
__device__ __forceinline__ void tile_raster(u32 n, u32 rows, u32 tm, u32 tn, u32 group, u32& fi,
                                            u32& ti) {
    tile_raster_at(blockIdx.x, n, rows, tm, tn, group, fi, ti);
}

// The end of every linear element (linear.cu, gemm.cu, gemm90.cu): its slices' total plus the
// bias, one rounding; out_mode 0 bf16, 1 f32, 2 f32 holding the bf16-rounded value.
__device__ __forceinline__ void store_linear(void* out, int out_mode, u64 at, float total,
                                             const float* bias, u32 f) {
    if (bias) total += bias[f];
    if (out_mode == 0) ((bf16*)out)[at] = f2bf(total);
    else if (out_mode == 1) ((float*)out)[at] = total;
    else ((float*)out)[at] = rbf(total);
}

// Hopper's warpgroup tensor-core instruction (wgmma.mma_async, sm_90a only; the prefill GEMMs
// in gemm90*.cu and the prefill attention CTA in attention90.cu). WG_ENABLED is 0 elsewhere,
// where those files compile to empty entry points that the host never launches.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ENABLED 1
#else
#define WG_ENABLED 0
#endif

#if WG_ENABLED
// Byte offset of logical 16-byte chunk j of row r in a [rows][64 bf16] tile stored with the
// 128-byte swizzle (the tile 1024-byte aligned): chunk j of row r lives at chunk j ^ (r % 8).
__device__ __forceinline__ u32 wg_sw(u32 r, u32 j) { return r * 128 + ((j ^ (r & 7)) << 4); }

// Shared-memory matrix descriptor with the 128-byte swizzle (mode 1): start address, leading
// byte offset `lbo`, stride byte offset `sbo`. K-major operands ([rows][64 k] tiles, wg_sw):
// lbo unused (16), sbo 1024 (8 rows of 128 bytes). MN-major operands ([k][64 of M or N]
// tiles, wg_sw with k as the row): lbo = the bytes from one 64-wide M/N chunk to the next,
// sbo 1024 (8 k rows).
__device__ __forceinline__ u64 wg_desc_at(u32 saddr, u32 lbo, u32 sbo) {
    return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) |
           ((u64)1 << 62);
}
__device__ __forceinline__ u64 wg_desc(u32 saddr) { return wg_desc_at(saddr, 16, 1024); }

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// The 64 f32 accumulators of an m64n128 wgmma as asm operands %0..%63 (a thread's d[0..63]),
// shared by the wgmma wrappers (gemm90.cu, attention90.cu).
#define WG_D128_REGS                                                                      \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "              \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "    \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "    \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_D128_OPS                                                                                \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),         \
    "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),       \
    "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),       \
    "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),       \
    "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),       \
    "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),       \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),       \
    "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#endif

// ---- RMSNorm's 16-byte path (norm.cu; also the fused decode products' prologue, linear.cu) ----

// Element j of 8 packed bf16.
__device__ __forceinline__ float bf8_at(const uint4& v, int j) {
    const u32 w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
    return bf2f((bf16)((j & 1) ? w >> 16 : w & 0xffffu));
}
__device__ __forceinline__ uint4 pack8(const float* f) {
    u32 w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) w[j] = (u32)f2bf(f[2 * j]) | ((u32)f2bf(f[2 * j + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// r of the staged group for T = vt virtual threads (vt a multiple of 32, at most 1,024, of
// blockDim.x): virtual thread t sums x^2 of stage[t], stage[t+T], ... by fma in increasing
// order (rms_norm_finish's `sq`), the butterfly over its virtual warp (real warp w runs
// virtual warps w, w + blockDim.x / 32, ...), then every thread sums the warp partials in
// increasing order (the same adds thread 0 makes there). The caller's barrier made the stage
// visible; warp_part is written once a launch, so no barrier follows the read.
__device__ __forceinline__ float staged_r(const bf16* stage, u32 group, float eps, u32 vt) {
    __shared__ float warp_part[32];
    const u32 lane = threadIdx.x & 31;
    for (u32 vw = threadIdx.x >> 5; vw < (vt >> 5); vw += blockDim.x >> 5) {
        float sq = 0.0f;
        for (u32 i = 32 * vw + lane; i < group; i += vt) {
            const float v = bf2f(stage[i]);
            sq = fmaf(v, v, sq);
        }
        sq = warp_sum(sq);
        if (lane == 0) warp_part[vw] = sq;
    }
    __syncthreads();
    float s = warp_part[0];
    for (u32 i = 1; i < (vt >> 5); i++) s += warp_part[i];
    const float mean = s / (float)group;
    return 1.0f / sqrtf(mean + eps);
}

// out chunk c = bf16(w * bf16(x * r)) of the staged chunk, with its weights `w0`, `w1`.
__device__ __forceinline__ uint4 norm_chunk(uint4 x, float4 w0, float4 w1, float r) {
    const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; j++) o[j] = w[j] * rbf(bf8_at(x, j) * r);
    return pack8(o);
}
