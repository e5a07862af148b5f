//! rms_norm over groups of `group` columns: bf16(w * bf16(x * rsqrt(mean(x^2) + eps))).
//! grid: rows * (cols / group), one block per group; block: a power of two chosen from `group`
//! alone (never from the row count). Thread t sums x^2 of elements t, t+T, ... by fma in
//! increasing order; lanes combine by the xor butterfly, warps in increasing order. So a row's
//! bits depend on its values and `group` only. r = 1 / sqrt(mean + eps), IEEE div and sqrt.
//!
//! 16-byte path (since 2026-12-02; bf16 activations, group % 8 == 0, group <= NORM_STAGE_MAX,
//! 16-byte aligned buffers): the block moves the group in 16-byte chunks (chunk c = elements
//! 8c..8c+7, thread t takes chunks t, t+T, ...) and stages it in shared memory (group * 2
//! bytes, dynamic: the host passes them), from which each thread reads back exactly its old
//! elements t, t+T, ... in their old order for the sum of squares. The add and the output are
//! per element, so any thread may compute them: they go chunk by chunk from the staged row,
//! with the weight's 32 bytes a chunk loaded before the reduction. Every thread then sums the
//! warp partials itself, in increasing order (thread 0's old sum, one barrier fewer).
//! Measured (H200, llama3-8b, 2,048 rows, tests/cuda_norm_rope.rs, same run): add_rms_norm
//! 36.4 us (was 37.8, 1.8 TB/s), rms_norm 29.8 us (was 29.1): the width was not the limit.
//! Since 2026-12-03 the 16-byte path's block may have fewer real threads R than T (`vt` = T is
//! a parameter; the host takes R = min(T, 256) in calls of 256 groups or more, R = T below):
//! real warp w runs the sums of virtual warps w, w + R/32, ... (virtual thread 32 v + lane
//! sums elements 32 v + lane, + T, ... in increasing order, then the same butterfly), and the
//! warp partials are added in virtual-warp order: T's arithmetic exactly, with up to 8 CTAs
//! an SM instead of 2 at T = 1,024 (one row a CTA, load / reduce / store). H200, 2,048 rows
//! of 4,096: add_rms_norm 36.4 -> 25.1 us, rms_norm 29.8 -> 17.6 us (tests/cuda_norm_rope.rs,
//! whose host emulation of T threads they equal bit for bit).
//! The host picks the path (`ops::norm_launch`: bf16 everywhere, group % 8 == 0, group <=
//! NORM_STAGE_MAX, 16-byte aligned buffers, `TF_VEC16` not 0) and passes it as `vec`; other
//! calls (f32 activations, larger groups) take the element path with T real threads.
//! Rejected: deriving T from anything but `group` (the sum order is part of the definition),
//! and 8-byte chunks (one a thread at T = group / 4: more instructions, same bytes in flight).

// Largest group the 16-byte path stages (32 KiB; `cuda/ops.rs` NORM_STAGE_MAX).
#define NORM_STAGE_MAX 16384

// The rest of rms_norm once thread t holds `sq`, the fma sum of squares of its elements t,
// t+T, ... of the group at `base` of `src`: lanes by the xor butterfly, warps in increasing
// order, r = 1 / sqrt(mean + eps), out = bf16(w * bf16(src * r)). The element path of both
// kernels below, so a fused add_rms_norm computes rms_norm's bits.
__device__ __forceinline__ void rms_norm_finish(float sq, const void* src, int src_f32,
                                                const float* __restrict__ w, void* out,
                                                int out_f32, u64 base, u32 group, float eps) {
    __shared__ float warp_part[32];
    __shared__ float total;
    sq = warp_sum(sq);
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) warp_part[warp] = sq;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = warp_part[0];
        for (u32 i = 1; i < warps; i++) s += warp_part[i];
        total = s;
    }
    __syncthreads();
    const float mean = total / (float)group;
    const float r = 1.0f / sqrtf(mean + eps);
    for (u32 i = threadIdx.x; i < group; i += blockDim.x) {
        float h = rbf(ld_act(src, base + i, src_f32) * r);
        st_act(out, base + i, out_f32, w[i] * h);
    }
}

// ---- 16-byte path ----

// bf8_at, pack8, staged_r and norm_chunk (the 16-byte path's arithmetic) are in common.cuh:
// the fused decode products (linear.cu) run the same add and norm in their prologue.

// Thread t's first chunk of weights (zeros when it has none): `w0`, `w1`.
__device__ __forceinline__ void first_weights(const float4* __restrict__ w, u32 t, u32 chunks,
                                              float4& w0, float4& w1) {
    w0 = w1 = make_float4(0, 0, 0, 0);
    if (t < chunks) w0 = w[2 * t], w1 = w[2 * t + 1];
}

// The output of a staged group: chunks t, t+T, ... from the stage, weights from `w`. The
// first chunk's weights come in `w0`, `w1` (loaded before the reduction).
__device__ __forceinline__ void staged_out(const uint4* stage, const float4* __restrict__ w,
                                           uint4* out, u32 chunks, float r, float4 w0,
                                           float4 w1) {
    for (u32 c = threadIdx.x; c < chunks; c += blockDim.x) {
        if (c != threadIdx.x) w0 = w[2 * c], w1 = w[2 * c + 1];
        out[c] = norm_chunk(stage[c], w0, w1, r);
    }
}

// `vec`: the host's choice of the 16-byte path (blockDim.x <= vt threads); otherwise
// blockDim.x == vt.
extern "C" __global__ void __launch_bounds__(1024) rms_norm(
    const void* x, int x_f32, const float* __restrict__ w, void* out, int out_f32, u32 group,
    float eps, u32 vt, int vec) {
    const u64 base = (u64)blockIdx.x * group;
    if (vec) {
        extern __shared__ uint4 stage[];
        const u32 chunks = group / 8, t = threadIdx.x;
        const float4* w4 = (const float4*)w;
        // Weights are immutable: their first chunk loads before the wait.
        float4 w0, w1;
        first_weights(w4, t, chunks, w0, w1);
        pdl_wait();
        pdl_launch();
        const uint4* src = (const uint4*)((const bf16*)x + base);
        for (u32 c = t; c < chunks; c += blockDim.x) stage[c] = src[c];
        __syncthreads();
        const float r = staged_r((const bf16*)stage, group, eps, vt);
        staged_out(stage, w4, (uint4*)((bf16*)out + base), chunks, r, w0, w1);
        return;
    }
    pdl_wait();
    pdl_launch();
    float acc = 0.0f;
    for (u32 i = threadIdx.x; i < group; i += blockDim.x) {
        float v = ld_act(x, base + i, x_f32);
        acc = fmaf(v, v, acc);
    }
    rms_norm_finish(acc, x, x_f32, w, out, out_f32, base, group, eps);
}

// add_rms_norm: acc = bf16(acc + x) in place (the `add` kernel's formula), then rms_norm of
// the sum into `out`, exactly as the kernel above (same block size from `group`, same sum
// order). 16-byte path: thread t adds, stores and stages its chunks t, t+R, ... (R = blockDim.x); only it ever
// touches those chunks of `acc`, so the in-place update is race-free; the sums of squares and
// the output read the stage. Element path: thread t writes the sums of its elements t, t+T,
// ... and later reads back only those same elements, so the in-place update needs no barrier
// of its own. (Before 2026-12-01 each element was stored and read back before the next was
// loaded: a chain of dependent global round trips, ~5 us a 4,096 row on the H200.)
extern "C" __global__ void __launch_bounds__(1024) add_rms_norm(
    void* acc, int acc_f32, const void* x, int x_f32, const float* __restrict__ w, void* out,
    int out_f32, u32 group, float eps, u32 vt, int vec) {
    const u64 base = (u64)blockIdx.x * group;
    const u32 T = blockDim.x;
    if (vec) {
        extern __shared__ uint4 stage[];
        const u32 chunks = group / 8, t = threadIdx.x;
        const float4* w4 = (const float4*)w;
        // Weights are immutable: their first chunk loads before the wait.
        float4 w0, w1;
        first_weights(w4, t, chunks, w0, w1);
        pdl_wait();
        pdl_launch();
        uint4* a = (uint4*)((bf16*)acc + base);
        const uint4* b = (const uint4*)((const bf16*)x + base);
        for (u32 c = t; c < chunks; c += T) {
            const uint4 av = a[c], bv = b[c];
            float s[8];
#pragma unroll
            for (int j = 0; j < 8; j++) s[j] = bf8_at(av, j) + bf8_at(bv, j);
            const uint4 sv = pack8(s);
            a[c] = sv;
            stage[c] = sv;
        }
        __syncthreads();
        const float r = staged_r((const bf16*)stage, group, eps, vt);
        staged_out(stage, w4, (uint4*)((bf16*)out + base), chunks, r, w0, w1);
        return;
    }
    pdl_wait();
    pdl_launch();
    float sq = 0.0f;
    // Stores bf16(a + b) at element e and adds its square; the stored value is kept in a
    // register (st_act stores rbf(v)), not read back.
    auto add_one = [&](u32 e, float a, float b) {
        st_act(acc, base + e, acc_f32, a + b);
        const float v = rbf(a + b);
        sq = fmaf(v, v, sq);
    };
    u32 i = threadIdx.x;
    // Four elements a pass with every load issued before the first store.
    for (; i + 3 * T < group; i += 4 * T) {
        float a[4], b[4];
#pragma unroll
        for (u32 j = 0; j < 4; j++) {
            a[j] = ld_act(acc, base + i + j * T, acc_f32);
            b[j] = ld_act(x, base + i + j * T, x_f32);
        }
#pragma unroll
        for (u32 j = 0; j < 4; j++) add_one(i + j * T, a[j], b[j]);
    }
    for (; i < group; i += T) add_one(i, ld_act(acc, base + i, acc_f32), ld_act(x, base + i, x_f32));
    rms_norm_finish(sq, acc, acc_f32, w, out, out_f32, base, group, eps);
}
