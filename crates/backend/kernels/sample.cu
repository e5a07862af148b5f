// Sampling on the GPU. argmax: the greedy token of each logits row, the host rule of
// `sampler::argmax` (and `tf_backend::argmax_row`): the highest value, ties to the lowest id,
// NaN never wins, id 0 when no value is above -inf.
//
// One block per row. Each thread scans ids i, i + 1024, ... keeping the first strict
// maximum it meets (so its lowest id among equal values); the block then reduces the
// (value, id) pairs by "higher value, else lower id". That order is total on non-NaN values
// and associative, so the result does not depend on the reduction tree: it is exactly the
// lowest id holding the row's maximum, as the host's left-to-right scan finds. +0 and -0
// compare equal on both sides, so the lower id wins there too.

#define ARGMAX_THREADS 1024
#define NO_ID 0xffffffffu

__device__ __forceinline__ void better(float& v, u32& i, float ov, u32 oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_f32(const void* logits, int is_f32, u32* out, u32 cols) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ u32 si[ARGMAX_THREADS / 32];
    const u64 base = (u64)blockIdx.x * cols;
    float bv = __int_as_float(0xff800000);  // -inf: only a value above it is ever taken
    u32 bi = NO_ID;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = ld_act(logits, base + c, is_f32);
        if (v > bv) {
            bv = v;
            bi = c;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        better(bv, bi, ov, oi);
    }
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        const u32 warps = blockDim.x / 32;
        bv = lane < warps ? sv[lane] : __int_as_float(0xff800000);
        bi = lane < warps ? si[lane] : NO_ID;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
            better(bv, bi, ov, oi);
        }
        if (lane == 0) out[blockIdx.x] = bi == NO_ID ? 0u : bi;
    }
}
