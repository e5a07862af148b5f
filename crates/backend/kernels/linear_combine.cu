// attention_combine as the prologue of the o product (compiled in one unit after linear.cu,
// linear_group.cu, linear_norm.cu and linear_rope.cu): `linear_bf16_d8_combine` of
// cuda/fused_combine.rs, for decode calls (at most 8 rows) whose attention ran in split mode.
// Each CTA merges the call's split partials into its own shared-memory stage, element by
// element exactly as attention_combine does (common.cuh's merge_splits: M, L and O from split
// 0, then merge_ml / merge_o of splits 1, 2, ... in split order, bf16(finish(O, L))), and takes a
// row of one split (whose attention CTA wrote its final values) as written. Then the same
// slice chains and combine as linear_bf16_d8 over the stage: the product's bits, and the stage
// holds the bits attention_combine would have written. CTA 0 also writes the merged rows to
// the attention output, so the call leaves every tensor as attention + linear would. What it
// removes is the combine launch between attention and o (its wait, its partial loads, its
// writes and the o CTAs' reads of them); o's first weights are still issued before the wait.

#define COMBINE_PARAMS                                                                         \
    bf16 *attn, const float *__restrict__ partial, const u32 *__restrict__ positions,          \
        u32 heads, u32 hd, u32 nsplit, u32 split

// The combine prologue of `rows` rows of k = heads * hd features (hd % 16 == 0) into `stage`
// (rows * k bf16). A thread takes runs of 16 features of one head: the merge factors of a
// split are the same for every feature of the head (merge_ml's chain), so it computes them once
// a run and applies them to its 16 features' O chains, each the chain merge_splits runs; its
// loads of 2 splits are in flight together. `nzs` (shared) holds each row's split count, read
// before pdl_wait() (host-written step metadata, final before the step's first kernel).
struct CombinePrologue {
    bf16* attn;
    const float* partial;
    const u32* positions;
    u32 heads, hd, nsplit, split, rows, k;
    u32* nzs;
    bf16* stage;

    __device__ __forceinline__ void pre() const {
        if (threadIdx.x < rows) nzs[threadIdx.x] = positions[threadIdx.x] / split + 1;
    }

    __device__ __forceinline__ void main() const {
        __syncthreads();  // nzs
        const u32 T = blockDim.x, runs = hd / 16, per_row = heads * runs;
        for (u32 it = threadIdx.x; it < rows * per_row; it += T) {
            const u32 r = it / per_row, h = (it % per_row) / runs, d0 = (it % runs) * 16;
            const u32 nz = nzs[r];
            const u64 at = (u64)r * k + h * hd + d0;
            uint4* st = (uint4*)(stage + at);
            if (nz == 1) {
                const uint4* src = (const uint4*)(attn + at);
                st[0] = src[0];
                st[1] = src[1];
                continue;
            }
            const float* part = partial + ((u64)r * heads + h) * nsplit * (hd + 2);
            const float2 ml = *(const float2*)part;
            float M = ml.x, L = ml.y, O[16];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float2 o = *(const float2*)(part + 2 + d0 + 2 * j);
                O[2 * j] = o.x;
                O[2 * j + 1] = o.y;
            }
#pragma unroll 2
            for (u32 z = 1; z < nz; z++) {
                const float* pz = part + z * (hd + 2);
                const float2 mz = *(const float2*)pz;
                float2 o[8];
#pragma unroll
                for (int j = 0; j < 8; j++) o[j] = *(const float2*)(pz + 2 + d0 + 2 * j);
                float a, c;
                merge_ml(M, L, mz.x, mz.y, a, c);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    O[2 * j] = merge_o(O[2 * j], o[j].x, a, c);
                    O[2 * j + 1] = merge_o(O[2 * j + 1], o[j].y, a, c);
                }
            }
#pragma unroll
            for (int j = 0; j < 16; j++) O[j] = finish(O[j], L);
            st[0] = pack8(O);
            st[1] = pack8(O + 8);
        }
        __syncthreads();  // the stage is whole before the slices read it
        if (blockIdx.x != 0) return;
        const u32 chunks = k / 8;
        for (u32 c = threadIdx.x; c < rows * chunks; c += T)
            if (nzs[c / chunks] > 1) ((uint4*)attn)[c] = ((const uint4*)stage)[c];
    }
};

// grid: (ceil(n / 16)); block: 32 * S threads (S = the weight's K split); dynamic shared
// memory 32 bytes (nzs) + rows * k * 2 (the stage) + S * 32 * 4 floats. LINEAR_ENTRY's parameters (x and
// row_idx unused: the input is the stage), then the combine's.
extern "C" __global__ void D8_BOUNDS(512) linear_bf16_d8_combine(
    const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx,
    const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,
    u32 slice_len, COMBINE_PARAMS) {
    u32* nzs = (u32*)dyn_floats();
    bf16* stage = (bf16*)(nzs + 8);
    float* part = (float*)(stage + (u64)rows * k);
    const CombinePrologue prologue{attn, partial, positions, heads, hd, nsplit, split, rows, k,
                                   nzs,  stage};
    const u32 S = blockDim.x >> 5, n0 = blockIdx.x * 16;
    auto slice_of = [&](u32 j) { return make_slice(w, n, k, n0, j * slice_len, slice_len); };
    run_jobs<1, TF_D8_U, decltype(slice_of), true>(slice_of, S, stage, nullptr, k, rows, 0, part,
                                                   prologue);
    __syncthreads();
    linear_store<1>(part, S, n0, 0, bias, out, out_mode, n, rows);
}
