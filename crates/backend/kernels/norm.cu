// rms_norm over groups of `group` columns: bf16(w * bf16(x * rsqrt(mean(x^2) + eps))).
// grid: rows * (cols / group), one block per group; block: a power of two chosen from `group`
// alone (never from the row count). Thread t sums x^2 of elements t, t+T, ... by fma in
// increasing order; lanes combine by the xor butterfly, warps in increasing order. So a row's
// bits depend on its values and `group` only. r = 1 / sqrt(mean + eps), IEEE div and sqrt.

// The rest of rms_norm once thread t holds `sq`, the fma sum of squares of its elements t,
// t+T, ... of the group at `base` of `src`: lanes by the xor butterfly, warps in increasing
// order, r = 1 / sqrt(mean + eps), out = bf16(w * bf16(src * r)). Shared by both kernels below,
// so a fused add_rms_norm computes rms_norm's bits.
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

extern "C" __global__ void __launch_bounds__(1024) rms_norm(
    const void* x, int x_f32, const float* __restrict__ w, void* out, int out_f32, u32 group,
    float eps) {
    pdl_wait();
    pdl_launch();
    const u64 base = (u64)blockIdx.x * group;
    float acc = 0.0f;
    for (u32 i = threadIdx.x; i < group; i += blockDim.x) {
        float v = ld_act(x, base + i, x_f32);
        acc = fmaf(v, v, acc);
    }
    rms_norm_finish(acc, x, x_f32, w, out, out_f32, base, group, eps);
}

// add_rms_norm: acc = bf16(acc + x) in place (the `add` kernel's formula), then rms_norm of
// the sum into `out`, exactly as the kernel above (same block size from `group`, same sum
// order). Thread t writes the sums of its elements t, t+T, ... and later reads back only
// those same elements, so the in-place update needs no barrier of its own. (Before
// 2026-12-01 each element was stored and read back before the next was loaded: a chain of
// dependent global round trips, ~5 us a 4,096 row on the H200.)
extern "C" __global__ void __launch_bounds__(1024) add_rms_norm(
    void* acc, int acc_f32, const void* x, int x_f32, const float* __restrict__ w, void* out,
    int out_f32, u32 group, float eps) {
    pdl_wait();
    pdl_launch();
    const u64 base = (u64)blockIdx.x * group;
    const u32 T = blockDim.x;
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
