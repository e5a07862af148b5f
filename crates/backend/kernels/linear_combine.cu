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

// The combine prologue of `rows` rows of k = heads * hd features into `stage` (rows * k bf16).
struct CombinePrologue {
    bf16* attn;
    const float* partial;
    const u32* positions;
    u32 heads, hd, nsplit, split, rows, k;
    bf16* stage;

    __device__ __forceinline__ void pre() const {}

    __device__ __forceinline__ void main() const {
        const u32 T = blockDim.x;
        for (u32 r = 0; r < rows; r++) {
            const u32 nz = positions[r] / split + 1;
            for (u32 e = threadIdx.x; e < k; e += T) {
                const u64 at = (u64)r * k + e;
                if (nz == 1) {
                    stage[at] = attn[at];
                    continue;
                }
                const u32 h = e / hd;
                const float* part = partial + ((u64)r * heads + h) * nsplit * (hd + 2);
                stage[at] = merge_splits(part, nz, hd, e % hd);
            }
        }
        __syncthreads();  // the stage is whole before the slices read it
        if (blockIdx.x != 0) return;
        for (u32 r = 0; r < rows; r++) {
            if (positions[r] / split == 0) continue;  // attention wrote this row
            for (u32 e = threadIdx.x; e < k; e += T) attn[(u64)r * k + e] = stage[(u64)r * k + e];
        }
    }
};

// grid: (ceil(n / 16)); block: 32 * S threads (S = the weight's K split); dynamic shared
// memory rows * k * 2 bytes (the stage) + S * 32 * 4 floats. LINEAR_ENTRY's parameters (x and
// row_idx unused: the input is the stage), then the combine's.
extern "C" __global__ void D8_BOUNDS(512) linear_bf16_d8_combine(
    const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx,
    const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,
    u32 slice_len, COMBINE_PARAMS) {
    bf16* stage = (bf16*)dyn_floats();
    float* part = (float*)(stage + (u64)rows * k);
    const CombinePrologue prologue{attn, partial, positions, heads, hd, nsplit, split, rows, k,
                                   stage};
    const u32 S = blockDim.x >> 5, n0 = blockIdx.x * 16;
    auto slice_of = [&](u32 j) { return make_slice(w, n, k, n0, j * slice_len, slice_len); };
    run_jobs<1, TF_D8_U, decltype(slice_of), true>(slice_of, S, stage, nullptr, k, rows, 0, part,
                                                   prologue);
    __syncthreads();
    linear_store<1>(part, S, n0, 0, bias, out, out_mode, n, rows);
}
