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
