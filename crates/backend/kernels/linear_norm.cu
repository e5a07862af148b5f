// The residual add and RMSNorm as the prologue of the grouped decode products (compiled in one unit
// after linear.cu and linear_group.cu, whose group and swiglu bodies it reuses):
// `add_norm_linear_group` (q, k, v) and `add_norm_linear_swiglu` (gate, up) of cuda/fused_norm.rs,
// for calls of at most 8 rows. Each CTA computes the call's normed rows itself into shared memory,
// with add_rms_norm's 16-byte path (norm.cu: the sums bf16(acc + add) chunk by chunk, the sum of
// squares by vt = norm_threads(k) virtual threads in their order, r = 1 / sqrt(mean + eps), bf16(w
// * bf16(x * r)); the helpers are common.cuh's), so its slices read the bits the separate
// add_rms_norm would have written, and then runs the same slice chains and combine as
// linear_bf16_group / linear_bf16_swiglu_d8. The CTAs are persistent (the host launches as many as
// the GPU holds, each walking tiles blockIdx.x, + gridDim.x, ...), so each computes the norm once.
// H200, session 17, one row: norm + q/k/v 22.8 -> 19.7 us; norm + gate/up 65.7 -> 69.4 us (896
// tiles over 264 CTAs: the prologue sits in front of each CTA's stream), so the host fuses q/k/v
// only by default (TENSORFOLD_NORM_FUSE). One CTA a tile, each with the prologue, was slower for
// both (decode 192-195 vs 202 tok/s). Session 24 (H200, same bits: the fused test with
// TENSORFOLD_NORM_FUSE=all, check exact fingerprints unchanged) measured and dropped persistent
// CTAs that take their tiles after the first from a counter (the CTA given the last value resets
// it): one row, norm + gate/up fused 66.9 us either way (unfused 65.9), norm + q/k/v 19.6 (21.2);
// bench decode, 3 alternated rounds, 209.7-211.9 / 207.3-208.0 / 209.4-210.1 tok/s against
// 210.6-211.1 / 208.0-208.3 / 206.6-206.9 without; with gate/up fused too 203.0-207.7 (either way).
// So gate/up's loss is not its 896 tiles over 264 CTAs. Also session 24: the q/k/v entry with 4
// super-steps a buffer (TF_NT_U=4) and 2 CTAs an SM (TF_GROUP_MINB=2) 205.9-211.0 tok/s, with 3
// super-steps 206.5-208.8, 2 CTAs an SM alone 201.6-207.8, 4 super-steps at 3 CTAs an SM (120 bytes
// spilled) 193.9-198.8, against the default's 210.9-212.7 in the same call.
//
// add_rms_norm also writes the sums back to `acc` (in place) and the normed rows to `nout`:
// here the last CTA of the grid to have staged its sums does both, once every CTA has read
// `acc` (each counts itself on `counter` after its reads; the last one resets the counter for
// the next launch, which cannot touch it before this grid completes: every kernel waits for
// its predecessor). So the call leaves acc and nout as add_rms_norm + the product would.

#define NORM_PARAMS                                                                            \
    bf16 *acc, const bf16 *__restrict__ add, const float *__restrict__ nw, bf16 *nout,          \
        u32 *counter, float eps, u32 vt
#define NORM_ARGS acc, add, nw, nout, counter, eps, vt

// The prologue of `rows` rows of k (k % 8 == 0) in shared memory: the norm weights (k floats,
// `wsm`, brought by cp.async before pdl_wait: immutable), the sums bf16(acc + add) (`sums`) and
// the normed rows (`stage`, what the slices read). Every thread of the CTA runs it.
struct NormPrologue {
    bf16 *acc;
    const bf16* add;
    const float* nw;
    bf16* nout;
    u32* counter;
    float eps;
    u32 vt, rows, k;
    float* wsm;
    bf16 *sums, *stage;

    __device__ __forceinline__ void pre() const {
        for (u32 c = threadIdx.x; c < k / 4; c += blockDim.x)
            cp_async16((u32)__cvta_generic_to_shared(wsm + 4 * c), nw + 4 * c, true);
        cp_async_commit();
    }

    __device__ __forceinline__ void main() const {
        __shared__ u32 last;
        const u32 chunks = k / 8, all = rows * chunks, T = blockDim.x;
        uint4 *su = (uint4*)sums, *st = (uint4*)stage;
        for (u32 c = threadIdx.x; c < all; c += T) {
            const uint4 av = ((const uint4*)acc)[c], bv = ((const uint4*)add)[c];
            float s[8];
#pragma unroll
            for (int j = 0; j < 8; j++) s[j] = bf8_at(av, j) + bf8_at(bv, j);
            su[c] = pack8(s);
        }
        cp_async_wait_all();
        __syncthreads();  // this CTA's reads of acc are done; the sums and weights are staged
        // Counted now, the count read at the end: its round trip overlaps the norm.
        u32 seen = 0;
        if (threadIdx.x == 0) seen = atomicAdd(counter, 1u);
        const float4* w4 = (const float4*)wsm;
        for (u32 r = 0; r < rows; r++) {
            const float rr = staged_r(sums + (u64)r * k, k, eps, vt);
            for (u32 c = threadIdx.x; c < chunks; c += T)
                st[r * chunks + c] = norm_chunk(su[r * chunks + c], w4[2 * c], w4[2 * c + 1], rr);
            // staged_r's warp partials are read before the next row writes them.
            if (r + 1 < rows) __syncthreads();
        }
        if (threadIdx.x == 0) {
            last = seen == gridDim.x * gridDim.y - 1;
            if (last) atomicExch(counter, 0u);
        }
        __syncthreads();  // the stage is whole before the slices read it; `last` is known
        if (last) {
            for (u32 c = threadIdx.x; c < all; c += T) {
                ((uint4*)acc)[c] = su[c];
                ((uint4*)nout)[c] = st[c];
            }
        }
    }
};

// Dynamic shared memory: the weights (k floats), the sums and the stage (rows * k bf16 each),
// then the partials as in linear.cu.
#define NORM_SMEM                                                                              \
    float* wsm = dyn_floats();                                                                 \
    bf16* sums = (bf16*)(wsm + k);                                                             \
    bf16* stage = sums + (u64)rows * k;                                                        \
    float* parts = (float*)(stage + (u64)rows * k);                                            \
    const NormPrologue prologue{NORM_ARGS, rows, k, wsm, sums, stage};

// TF_GROUP_CHAIN (1, the default; a knob through TENSORFOLD_KERNEL_DEFINES): the q/k/v entry runs
// linear_group.cu's group_chained (each warp's next job's weights issued as a chain ends, so a
// CTA's second tile starts with its loads in flight); 0: group_body a tile, its first loads after
// the previous tile's combine. The same jobs, chains and combine: the same bits. H200, session 26:
// llama3-8b's 384 tiles fit one wave (3 CTAs an SM), so only k and v's second jobs a warp chain
// there (16 slices on 8 warps); bench decode, 3 alternated rounds, 213.3 / 213.3, 215.7 / 218.7,
// 219.0 / 219.2 tok/s against 212.9 / 212.8, 214.2 / 214.8, 214.1 / 219.2 with 0 (+0.8%); check
// exact's fingerprints and tests/cuda_fused_norm.rs (the 33B geometry's 576 tiles: second tiles
// chained) unchanged. The gate/up norm entry (off by default, TENSORFOLD_NORM_FUSE=all) runs
// linear_group.cu's swiglu_chained under the same knob.
#ifndef TF_GROUP_CHAIN
#define TF_GROUP_CHAIN 1
#endif

// q, k, v (GROUP_PARAMS' x is unused: the input is the staged normed rows) with one token tile
// (rows <= 8). Persistent: grid (min(tiles, CTAs resident at once)); CTA b runs tiles b, b +
// gridDim.x, ... (the prologue once); block as linear_bf16_group; dynamic shared memory k * 4
// + 2 * rows * k * 2 bytes + max_j(sl_j) * 128 floats.
extern "C" __global__ void __launch_bounds__(256, TF_GROUP_MINB)
    linear_bf16_group_norm(GROUP_PARAMS, NORM_PARAMS) {
    NORM_SMEM
    if (TF_GROUP_CHAIN) {
        group_chained<TF_NT_U, true>(GROUP_ARGS_X(stage), parts, prologue);
        return;
    }
    const u32 tiles = ctas0 + ctas1 + (n_2 + 15) / 16;
    for (u32 t = blockIdx.x; t < tiles; t += gridDim.x) {
        group_body<1, TF_NT_U, true>(GROUP_ARGS_X(stage), parts, t, prologue, t == blockIdx.x);
        __syncthreads();  // the partials are read before the next tile writes them
    }
}

// gate, up and SwiGLU over the staged normed rows, as linear_bf16_swiglu_d8 (rows <= 8);
// persistent as above over ceil(n / 16) tiles, chained as that entry (TF_GROUP_CHAIN);
// dynamic shared memory k * 4 + 2 * rows * k * 2 bytes + 2S * 128 floats.
extern "C" __global__ void D8_BOUNDS(256) linear_bf16_swiglu_norm(SWIGLU_PARAMS, NORM_PARAMS) {
    NORM_SMEM
    if (TF_GROUP_CHAIN) {
        swiglu_chained<1, TF_D8_U, true>(SWIGLU_ARGS_X(stage), parts, prologue);
        return;
    }
    const u32 tiles = (n + 15) / 16;
    for (u32 t = blockIdx.x; t < tiles; t += gridDim.x) {
        swiglu_body<1, TF_D8_U, true>(SWIGLU_ARGS_X(stage), parts, t, prologue, t == blockIdx.x);
        __syncthreads();
    }
}
