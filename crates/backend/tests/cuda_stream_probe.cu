// Decode weight-streaming probe (tests/cuda_stream_probe.rs): how fast can one token tile's
// product stream a weight matrix when each mma step holds 16 CONSECUTIVE k (natural layout,
// what TMA and the wgmma prefill want), against today's definition, where a step holds k
// {8c + e} of a 32-k super-step (linear.cu). Not a backend op: a question for one GPU call.
//
// Both kernels: W [N][K] bf16 row-major, x [8][K] bf16 (8 tokens), y [S][N][8] f32 partials
// (slice s of K = [s K / S, (s + 1) K / S)). grid (N / 64, S), block 128: warp w owns rows
// r0 = 64 blockIdx.x + 16 w. Each warp streams its 16 rows of the slice through two register
// buffers of U steps of 32 k (the next buffer's loads in flight while the current one's mma
// steps run), one 16-byte weight load a lane per 16 x 16 tile in both kernels. The slice is
// walked two buffers at a time (their names fixed, so they stay in registers): k / S must be
// a multiple of 64 PU.
// - stream_frag: lane (g, c) loads rows g and g + 8 at k0 + 8c .. k0 + 8c + 7; elements 0..3
//   feed the first mma, 4..7 the second (linear.cu's fragment order). No data moves between
//   lanes.
// - stream_nat: lane l loads row l % 16 at k0 + 16j + 8 (l / 16) for step j (natural tiles);
//   the warp stores the tile to its own shared memory (16-byte chunks XOR-swizzled by row / 4,
//   so ldmatrix reads are conflict-free) and reads the A fragment back with ldmatrix.x4.
// The two give different bits (other k sets a step); the test checks each against float64.

#define PU 4  // steps of 32 k a register buffer (mma16816 is common.cuh's, prepended)

__device__ __forceinline__ uint4 ldg16(const bf16* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void store_out(float* y, u32 s, u32 n, u32 r0, u32 lane,
                                          const float* acc) {
    const u32 g = lane / 4, c = lane % 4;
    float* o = y + ((u64)s * n + r0) * 8;
    o[g * 8 + 2 * c] = acc[0];
    o[g * 8 + 2 * c + 1] = acc[1];
    o[(g + 8) * 8 + 2 * c] = acc[2];
    o[(g + 8) * 8 + 2 * c + 1] = acc[3];
}

// Loads one buffer (PU steps of 32 k from k0) of stream_frag's lane.
__device__ __forceinline__ void frag_load(uint4 (&A)[PU], uint4 (&B)[PU], uint4 (&X)[PU],
                                          const bf16* wa, const bf16* wb, const bf16* xg, u32 k0) {
#pragma unroll
    for (int u = 0; u < PU; u++) {
        A[u] = ldg16(wa + k0 + 32 * u);
        B[u] = ldg16(wb + k0 + 32 * u);
        X[u] = *(const uint4*)(xg + k0 + 32 * u);
    }
}
__device__ __forceinline__ void frag_mma(float* acc, const uint4 (&A)[PU], const uint4 (&B)[PU],
                                         const uint4 (&X)[PU]) {
#pragma unroll
    for (int u = 0; u < PU; u++) {
        mma16816(acc, A[u].x, B[u].x, A[u].y, B[u].y, X[u].x, X[u].y);
        mma16816(acc, A[u].z, B[u].z, A[u].w, B[u].w, X[u].z, X[u].w);
    }
}

extern "C" __global__ void __launch_bounds__(128) stream_frag(const bf16* __restrict__ w,
                                                              const bf16* __restrict__ x,
                                                              float* __restrict__ y, u32 n, u32 k,
                                                              u32 slices) {
    const u32 lane = threadIdx.x & 31, g = lane / 4, c = lane % 4;
    const u32 r0 = blockIdx.x * 64 + (threadIdx.x >> 5) * 16;
    const u32 kb = blockIdx.y * (k / slices), ke = kb + k / slices;
    const bf16* wa = w + (u64)(r0 + g) * k + 8 * c;
    const bf16* wb = wa + (u64)8 * k;
    const bf16* xg = x + (u64)g * k + 8 * c;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint4 A0[PU], B0[PU], X0[PU], A1[PU], B1[PU], X1[PU];
    frag_load(A0, B0, X0, wa, wb, xg, kb);
    for (u32 k0 = kb; k0 < ke; k0 += 64 * PU) {
        frag_load(A1, B1, X1, wa, wb, xg, k0 + 32 * PU);
        frag_mma(acc, A0, B0, X0);
        if (k0 + 64 * PU < ke) frag_load(A0, B0, X0, wa, wb, xg, k0 + 64 * PU);
        frag_mma(acc, A1, B1, X1);
    }
    store_out(y, blockIdx.y, n, r0, lane, acc);
}

// The byte offset of 16-byte chunk (row r, half h) of a warp's 16 x 16 tile (32 bytes a row).
__device__ __forceinline__ u32 chunk(u32 r, u32 h) { return r * 32 + ((h ^ ((r >> 2) & 1)) * 16); }

// Loads one buffer (2 PU steps of 16 k from k0) of stream_nat's lane: its weight chunk and
// the two 4-byte pieces of x its B fragment takes (k 2c, 2c + 1 and 2c + 8, 2c + 9).
__device__ __forceinline__ void nat_load(uint4 (&A)[2 * PU], u32 (&X)[2 * PU][2], const bf16* wl,
                                         const bf16* xg, u32 k0) {
#pragma unroll
    for (int j = 0; j < 2 * PU; j++) {
        A[j] = ldg16(wl + k0 + 16 * j);
        X[j][0] = *(const u32*)(xg + k0 + 16 * j);
        X[j][1] = *(const u32*)(xg + k0 + 16 * j + 8);
    }
}
// The buffer's steps: chunks to the warp's tiles, A fragments back by ldmatrix, the mma chain.
__device__ __forceinline__ void nat_mma(float* acc, const uint4 (&A)[2 * PU],
                                        const u32 (&X)[2 * PU][2], unsigned char* my, u32 at) {
#pragma unroll
    for (int j = 0; j < 2 * PU; j++) *(uint4*)(my + j * 512 + at) = A[j];
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 2 * PU; j++) {
        u32 a[4];
        const u32 addr = (u32)__cvta_generic_to_shared(my + j * 512 + at);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                     : "r"(addr));
        mma16816(acc, a[0], a[1], a[2], a[3], X[j][0], X[j][1]);
    }
    __syncwarp();  // the tiles are read before the next buffer overwrites them
}

extern "C" __global__ void __launch_bounds__(128) stream_nat(const bf16* __restrict__ w,
                                                             const bf16* __restrict__ x,
                                                             float* __restrict__ y, u32 n, u32 k,
                                                             u32 slices) {
    __shared__ __align__(16) unsigned char tiles[4][2 * PU][512];  // [warp][step][tile]
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / 4, c = lane % 4;
    const u32 r0 = blockIdx.x * 64 + warp * 16;
    const u32 kb = blockIdx.y * (k / slices), ke = kb + k / slices;
    const bf16* wl = w + (u64)(r0 + lane % 16) * k + 8 * (lane / 16);
    const bf16* xg = x + (u64)g * k + 2 * c;
    // This lane's chunk: row l % 16, half l / 16, stored there; ldmatrix.x4 takes the address
    // of the same chunk from the same lane (matrices 0..3 = rows 0-7 / 8-15 x halves 0 / 1:
    // a0..a3 of the A fragment).
    const u32 at = chunk(lane % 16, lane / 16);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint4 A0[2 * PU], A1[2 * PU];
    u32 X0[2 * PU][2], X1[2 * PU][2];
    nat_load(A0, X0, wl, xg, kb);
    for (u32 k0 = kb; k0 < ke; k0 += 64 * PU) {
        nat_load(A1, X1, wl, xg, k0 + 32 * PU);
        nat_mma(acc, A0, X0, tiles[warp][0], at);
        if (k0 + 64 * PU < ke) nat_load(A0, X0, wl, xg, k0 + 64 * PU);
        nat_mma(acc, A1, X1, tiles[warp][0], at);
    }
    store_out(y, blockIdx.y, n, r0, lane, acc);
}
