// linear / logits: out[t][f] = sum_k x[t][k] * w[f][k] (+ bias[f]), bf16 inputs, fp32 sums.
//
// Tensor cores, weights on the M side and tokens on the N side (DESIGN.md §4): each warp
// computes a 16-feature x 8-token tile with mma.sync m16n8k16 (bf16 in, f32 accumulate),
// which runs on sm_80 .. sm_90a. A block covers 16 features and up to 8 * NT tokens; its S
// warps are the K split: warp s sums k in [s * slice_len, (s + 1) * slice_len) with its own
// accumulator chain from zero, and the S partials are added in order 0..S-1 (then the bias,
// then one rounding). S and slice_len come from the weight shape alone (the host's
// `linear::k_split`), so every element's arithmetic is the same whether the call has 1 row
// or 2,048: a decode row is one 8-token tile with 7 padding columns that read zeros.
//
// K order inside a slice: super-steps of 32 k. Lane (g = lane / 4, c = lane % 4) loads 16
// bytes (8 bf16) of weight rows g and g + 8 and of token g's row, all at k0 + 8c; the first
// mma takes elements 0..3 of each load, the second elements 4..7. A and B use the same
// mapping, so each mma sums matching products; the mapping is fixed, so the chain is too.
// Loads are 16 bytes wide, UNROLL super-steps in flight per warp.
//
// Two entry points compute it: linear_bf16 (here: operands straight from global memory, K
// slices on warps; for decode and small batches) and linear_bf16_tiled (gemm.cu: shared-memory
// tiles, a cp.async pipeline, one CTA walking every slice in order; for prefill). Same mma, same K
// mapping, same slices, same zero padding, same combine order: the same bits for every
// element (the contract's row gate and tests/cuda_ops.rs check it).

__device__ __forceinline__ uint4 ld_stream(const bf16* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ uint4 ld_act16(const bf16* p) {
    uint4 v;
    asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// grid: (ceil(n / 16), ceil(rows / (8 * NT))); block: 32 * S threads; dynamic shared memory
// S * NT * 32 * 4 floats. `row_idx` (nullable) maps output row i to input row row_idx[i]
// (logits); out_mode: 0 bf16, 1 f32, 2 f32 holding bf16-rounded values. k % 8 == 0 and
// slice_len % 32 == 0 (checked by the host).
template <int NT, int UNROLL>
__device__ __forceinline__ void linear_body(
    const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx,
    const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,
    u32 slice_len) {
    extern __shared__ float part[];  // [S][NT][32 lanes][4]
    const u32 lane = threadIdx.x & 31, s = threadIdx.x >> 5, S = blockDim.x >> 5;
    const u32 g = lane >> 2, c = lane & 3;
    const u32 n0 = blockIdx.x * 16, t0 = blockIdx.y * 8 * NT;
    const bool va = n0 + g < n, vb = n0 + g + 8 < n;
    const bf16* wa = w + (u64)(va ? n0 + g : 0) * k;
    const bf16* wb = w + (u64)(vb ? n0 + g + 8 : 0) * k;
    const bf16* xr[NT];
    bool vx[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const u32 tok = t0 + 8 * t + g;
        vx[t] = tok < rows;
        const u32 src = vx[t] ? (row_idx ? row_idx[tok] : tok) : 0;
        xr[t] = x + (u64)src * k;
    }
    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
    const u32 k_begin = s * slice_len;
    const u32 k_end = min(k, k_begin + slice_len);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (u32 kk = k_begin; kk < k_end; kk += 32 * UNROLL) {
        uint4 a[UNROLL], b[UNROLL];
        bool in[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const u32 kc = kk + 32 * u + 8 * c;
            in[u] = kc < k_end;
            a[u] = (va && in[u]) ? ld_stream(wa + kc) : zero;
            b[u] = (vb && in[u]) ? ld_stream(wb + kc) : zero;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t0 + 8 * t >= rows) break;
            uint4 xv[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                xv[u] = (vx[t] && in[u]) ? ld_act16(xr[t] + kk + 32 * u + 8 * c) : zero;
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                mma16816(acc[t], a[u].x, b[u].x, a[u].y, b[u].y, xv[u].x, xv[u].y);
                mma16816(acc[t], a[u].z, b[u].z, a[u].w, b[u].w, xv[u].z, xv[u].w);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) part[((s * NT + t) * 32 + lane) * 4 + i] = acc[t][i];
    __syncthreads();
    for (u32 e = threadIdx.x; e < NT * 32 * 4; e += blockDim.x) {
        const u32 t = e / 128, ln = (e / 4) % 32, i = e % 4;
        const u32 f = n0 + (ln >> 2) + (i >= 2 ? 8 : 0);
        const u32 tok = t0 + 8 * t + (ln & 3) * 2 + (i & 1);
        if (f >= n || tok >= rows) continue;
        float total = part[e];
        for (u32 s2 = 1; s2 < S; s2++) total += part[s2 * NT * 128 + e];
        if (bias) total += bias[f];
        const u64 at = (u64)tok * n + f;
        if (out_mode == 0) ((bf16*)out)[at] = f2bf(total);
        else if (out_mode == 1) ((float*)out)[at] = total;
        else ((float*)out)[at] = rbf(total);
    }
}

#define LINEAR_ENTRY(NAME, NT, UNROLL)                                                        \
    extern "C" __global__ void __launch_bounds__(512) NAME(                                  \
        const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx, \
        const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,     \
        u32 slice_len) {                                                                     \
        linear_body<NT, UNROLL>(w, x, row_idx, bias, out, out_mode, n, k, rows, slice_len);  \
    }
LINEAR_ENTRY(linear_bf16, 4, 4)
