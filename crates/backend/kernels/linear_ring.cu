// The decode product with its weights through a shared-memory ring (sm_90: bulk copies
// completing on mbarriers), `linear_bf16_ring`: linear_bf16's arithmetic for calls of at most
// 8 rows (compiled in one unit after linear.cu, whose definition it computes; the host takes it
// only under TENSORFOLD_DEC_RING=1, `cuda/ring.rs`, until the GPU has measured it).
//
// Why: the register-buffered entries hold a whole SM (2 CTAs x 256 threads x ~120 registers),
// so the next launch's CTAs cannot become resident, and issue their first weights, before this
// launch's CTAs exit; each kernel boundary of a decode step then drains the weight stream
// (tools/gpu/stepbw.py, session 26: the step's weights by a launch a matrix with PDL 3.81-3.87
// ms, in one launch without barriers 3.38-3.46). Here the bytes in flight live in shared
// memory, not registers: a CTA is one producer warp and 8 consumer warps (288 threads, at most
// 112 registers) with a ring of TF_RING_STAGES stages of 34 KB, so two CTAs fit an SM: the next
// launch's CTA sits beside this one and its producer streams before its pdl_wait (weights are
// immutable), through the boundary.
//
// The arithmetic is linear.cu's, element for element. A tile is 16 features (weight rows n0 ..
// n0 + 15, n % 16 == 0) and its S K slices are its jobs (the host's k_split; taken only where
// every slice is full, S * len == K, and len % 128 == 0). Job (tile, s) is one warp's chain
// from +0 over the k16 steps of [s * len, (s + 1) * len) in increasing k: step e of a 128-k run
// sums the 16 consecutive k0 + 16e + 0..15 (linear.cu's k16 sets; which lane feeds which k
// inside a step changes no bit, tests/cuda_wgmma.rs's probe mode 0, so the weights are read by
// ldmatrix in their natural order and the activations as the mma's natural B fragment). The
// tile's partials are added in slice order (part0, += part1, ...), then the bias, one
// rounding (store_linear). Which CTA or warp runs a job, and when its bytes arrived, change no
// bit.
//
// Layout: a bundle is B = max(1, 8 / S) consecutive tiles (their B * S jobs, 8 a round, R =
// B * S / 8 rounds); a CTA walks bundles blockIdx.x, + gridDim.x, ... A stage is one 128-k run
// (256 bytes) of each of a round's 8 jobs' 16 rows: 128 row runs, run q = 16 * warp + row at
// q * RING_PITCH (272 bytes: the 16 bytes of padding put the 8 rows an ldmatrix reads in 8
// different bank groups). A bundle is R * (len / 128) stages, round by round, each round's
// runs in k order. The producer (warp 8) issues a stage's 128 copies (4 a lane) once the
// consumers freed it (`empty`, 8 arrivals), completing on `full`; it never waits for the
// previous kernel. Consumer warp w runs its job's 8 k16 steps of each stage and stores its
// chain's partial to `part` at its job's last run; at a bundle's end the 256 consumer threads
// combine (named barrier 1 around it).

#ifndef TF_RING_STAGES
#define TF_RING_STAGES 3
#endif
// Whether the producer streams before the previous kernel has ended (1) or only after its own
// pdl_wait (0: no weight traffic beside a latency-bound predecessor such as attention, whose
// KV loads lost to o's weight prefetch in session 10). Speed only.
#ifndef TF_RING_EARLY
#define TF_RING_EARLY 1
#endif
static_assert(TF_RING_STAGES >= 2 && TF_RING_STAGES <= 3, "the host sizes shared memory for 3");
#define RING_PITCH 272
#define RING_STAGE_BYTES (8 * 16 * RING_PITCH)
// Jobs of a bundle with partials (R <= 2: S <= 16).
#define RING_JOBS 16

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ u32 ring_saddr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ring_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void ring_consumers_sync() {
    asm volatile("bar.sync 1, 256;" ::: "memory");
}
// The A fragment of an m16n8k16 step from 16 rows x 16 k at `addr` (row pitch RING_PITCH):
// lane L gives the address of row (L & 7) + 8 ((L >> 3) & 1), k + 8 (L >> 4) of matrix L >> 3.
__device__ __forceinline__ void ring_ldmatrix(u32 addr, u32& a0, u32& a1, u32& a2, u32& a3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                 : "r"(addr));
}
// 4 bytes (two bf16) of activations at p, cached (a C++ load: never moved above pdl_wait's
// memory clobber).
__device__ __forceinline__ u32 ld_act4(const bf16* p) { return __ldg((const unsigned int*)p); }

// The shape of a ring launch: tiles of 16 features, S slices of len k, bundles of B tiles.
struct RingShape {
    u32 tiles, S, len, runs, B, R, bundles;
    __device__ __forceinline__ RingShape(u32 n, u32 S_, u32 len_) {
        tiles = n / 16;
        S = S_;
        len = len_;
        runs = len / 128;
        B = S >= 8 ? 1 : 8 / S;
        R = B * S / 8;
        bundles = (tiles + B - 1) / B;
    }
    // Job `u` (0 .. B * S) of bundle b: its tile (tiles when past the last) and slice.
    __device__ __forceinline__ u32 tile_of(u32 b, u32 u) const {
        const u32 t = b * B + u / S;
        return t < tiles ? t : tiles;
    }
};

// The producer warp: every stage of the CTA's bundles, in the consumers' order.
__device__ __forceinline__ void ring_produce(const RingShape& sh, const bf16* __restrict__ w,
                                             u32 k, unsigned char* ring, u32 full, u32 empty) {
    const u32 lane = threadIdx.x & 31;
    if (!TF_RING_EARLY) pdl_wait();
    u32 q = 0;  // stages issued
    for (u32 b = blockIdx.x; b < sh.bundles; b += gridDim.x)
        for (u32 r = 0; r < sh.R; r++)
            for (u32 i = 0; i < sh.runs; i++, q++) {
                const u32 s = q % TF_RING_STAGES, ph = (q / TF_RING_STAGES) & 1;
                mbar_wait_parity(empty + 8 * s, ph ^ 1);
                u32 jobs = 0;  // this round's jobs with a tile
                for (u32 v = 0; v < 8; v++) jobs += sh.tile_of(b, 8 * r + v) < sh.tiles;
                if (lane == 0) mbar_expect_at(full + 8 * s, jobs * 16 * 256);
                __syncwarp();
#pragma unroll
                for (u32 j = 0; j < 4; j++) {
                    const u32 qq = lane + 32 * j, u = 8 * r + qq / 16;
                    const u32 t = sh.tile_of(b, u);
                    if (t == sh.tiles) continue;
                    const bf16* src =
                        w + (u64)(16 * t + qq % 16) * k + (u % sh.S) * sh.len + 128 * i;
                    bulk_copy_at(ring_saddr(ring + s * RING_STAGE_BYTES + qq * RING_PITCH), src,
                                 256, full + 8 * s);
                }
            }
}

// A consumer warp: its job's steps of every stage, and the bundles' combines.
__device__ __forceinline__ void ring_consume(const RingShape& sh, const bf16* __restrict__ x,
                                             const u32* __restrict__ row_idx,
                                             const float* __restrict__ bias, void* out,
                                             int out_mode, u32 n, u32 k, u32 rows,
                                             const unsigned char* ring, float* part, u32 full,
                                             u32 empty) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    pdl_wait();
    const bool vx = g < rows;
    const bf16* xr = x + (u64)(vx ? (row_idx ? row_idx[g] : g) : 0) * k + 2 * c;
    // This lane's ldmatrix row and k offset inside a job's 16 rows.
    const u32 mi = lane >> 3;
    const u32 lofs = ((lane & 7) + 8 * (mi & 1)) * RING_PITCH + 16 * (mi >> 1);
    u32 q = 0;
    float acc[4];
    for (u32 b = blockIdx.x; b < sh.bundles; b += gridDim.x) {
        for (u32 r = 0; r < sh.R; r++) {
            const u32 u = 8 * r + warp;
            const bool has = sh.tile_of(b, u) < sh.tiles;
            const u32 k0 = (u % sh.S) * sh.len;
            for (u32 i = 0; i < sh.runs; i++, q++) {
                const u32 s = q % TF_RING_STAGES, ph = (q / TF_RING_STAGES) & 1;
                mbar_wait_parity(full + 8 * s, ph);
                if (has) {
                    if (i == 0) acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
                    const u32 base =
                        ring_saddr(ring + s * RING_STAGE_BYTES + warp * 16 * RING_PITCH) + lofs;
                    const bf16* xk = xr + k0 + 128 * i;
#pragma unroll
                    for (u32 e = 0; e < 8; e++) {
                        u32 a0, a1, a2, a3;
                        ring_ldmatrix(base + 32 * e, a0, a1, a2, a3);
                        const u32 b0 = vx ? ld_act4(xk + 16 * e) : 0u;
                        const u32 b1 = vx ? ld_act4(xk + 16 * e + 8) : 0u;
                        mma16816(acc, a0, a1, a2, a3, b0, b1);
                    }
                    if (i + 1 == sh.runs) {
#pragma unroll
                        for (u32 j = 0; j < 4; j++) part[(u * 32 + lane) * 4 + j] = acc[j];
                    }
                }
                __syncwarp();
                if (lane == 0) ring_arrive(empty + 8 * s);
            }
        }
        // The bundle's combine: each tile's partials in slice order (linear_body's).
        ring_consumers_sync();
        for (u32 e = threadIdx.x; e < sh.B * 128; e += 256) {
            const u32 tl = e / 128, t = b * sh.B + tl;
            u32 f, tok;
            tile_elem<1>(e % 128, 16 * t, 0, &f, &tok);
            if (t >= sh.tiles || tok >= rows) continue;
            float total = part[tl * sh.S * 128 + e % 128];
            for (u32 s2 = 1; s2 < sh.S; s2++) total += part[(tl * sh.S + s2) * 128 + e % 128];
            store_linear(out, out_mode, (u64)tok * n + f, total, bias, f);
        }
        ring_consumers_sync();  // the partials are read before the next bundle writes them
    }
}
#endif

// grid: (min(bundles, SMs)); block: 288 threads; dynamic shared memory ring_smem (the host's
// `ring::RING_SMEM`): TF_RING_STAGES stages, RING_JOBS x 128 partials, 2 x TF_RING_STAGES
// mbarriers. rows <= 8; n % 16 == 0, S * len == k, len % 128 == 0, S a power of two <= 16
// (checked by the host). Arguments as linear_bf16's, plus S.
extern "C" __global__ void __launch_bounds__(288, 2) linear_bf16_ring(
    const bf16* __restrict__ w, const bf16* __restrict__ x, const u32* __restrict__ row_idx,
    const float* __restrict__ bias, void* out, int out_mode, u32 n, u32 k, u32 rows,
    u32 slice_len, u32 S) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char ring[];
    float* part = (float*)(ring + TF_RING_STAGES * RING_STAGE_BYTES);
    const u32 full = ring_saddr(part + RING_JOBS * 128), empty = full + 8 * TF_RING_STAGES;
    pdl_launch();  // the next launch's CTAs may sit beside these and stream their weights
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < TF_RING_STAGES; s++) {
            mbar_init_at(full + 8 * s, 1);
            mbar_init_at(empty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const RingShape sh(n, S, slice_len);
    if (threadIdx.x >= 256) {
        ring_produce(sh, w, k, ring, full, empty);
        return;
    }
    ring_consume(sh, x, row_idx, bias, out, out_mode, n, k, rows, ring, part, full, empty);
#endif
}
