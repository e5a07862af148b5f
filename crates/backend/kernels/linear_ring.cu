// Decode products with their weights through a shared-memory ring (sm_90: bulk copies
// completing on mbarriers): `linear_bf16_ring` (linear_bf16's product) and
// `linear_bf16_swiglu_ring` (linear_bf16_swiglu_d8's gate, up and SwiGLU), for calls of at most
// 8 rows. Compiled in one unit after linear.cu and linear_group.cu, whose definitions they
// compute; the host takes them only under TENSORFOLD_DEC_RING=1 (`cuda/ring.rs`) until the GPU
// has measured them.
//
// Why: the register-buffered entries hold a whole SM (2 CTAs x 256 threads x ~120 registers),
// so the next launch's CTAs cannot become resident, and issue their first weights, before this
// launch's CTAs exit; each kernel boundary of a decode step then drains the weight stream
// (tools/gpu/stepbw.py, session 26: the step's weights by a launch a matrix with PDL 3.81-3.87
// ms, in one launch without barriers 3.38-3.46). Here the bytes in flight live in shared
// memory, not registers: a CTA is 8 consumer warps and TF_RING_PRODUCERS producer warps (at
// most 384 threads, 85 registers) with a ring of TF_RING_STAGES stages of 34 KB, so two CTAs fit an SM: the next
// launch's CTA sits beside this one and its producer streams before its pdl_wait (weights are
// immutable), through the boundary.
//
// The arithmetic is linear.cu's, element for element. A tile is 16 features (weight rows n0 ..
// n0 + 15, n % 16 == 0) and its jobs are its matrices' K slices (the host's k_split: S slices
// of len k; gate's S then up's S for the SwiGLU entry; taken only where every slice is full,
// S * len == K, and len % 128 == 0). A job is one warp's chain from +0 over the k16 steps of
// [s * len, (s + 1) * len) in increasing k: step e of a 128-k run sums the 16 consecutive
// k0 + 16e + 0..15 (linear.cu's k16 sets; which lane feeds which k inside a step changes no
// bit, tests/cuda_wgmma.rs's probe mode 0, so the weights are read by ldmatrix in their natural
// order and the activations as the mma's natural B fragment). A matrix's partials are added
// in slice order (part0, += part1, ...), then the bias, one rounding (store_linear; for SwiGLU
// swiglu_store). Which CTA or warp runs a job, and when its bytes arrived, change no bit.
//
// Layout: a bundle is B = max(1, 8 / J) consecutive tiles of J jobs (their B * J jobs, 8 a
// round, R = B * J / 8 rounds); a CTA walks bundles blockIdx.x, + gridDim.x, ... A stage is one
// 128-k run (256 bytes) of each of a round's 8 jobs' 16 rows: 128 row runs, run q = 16 * warp +
// row at q * RING_PITCH (272 bytes: the 16 bytes of padding put the 8 rows an ldmatrix reads in
// 8 different bank groups). A bundle is R * (len / 128) stages, round by round, each round's
// runs in k order. The producer warps (8 ..) issue a stage's 128 copies once the consumers
// freed it (`empty`, 8 arrivals), completing on `full` (an arrival a producer warp, with its
// bytes); they never wait for the previous kernel (TF_RING_EARLY). Consumer warp w runs its job's 8 k16 steps of each stage and
// stores its chain's partial to `part` at its job's last run; at a bundle's end the 256
// consumer threads combine (named barrier 1 around it).

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
// Producer warps a CTA (1, 2 or 4; the host reads it too, `ring::producers`): a stage's 128 bulk
// copies are issued by one lane at a time (the copy takes uniform operands), ~8 instructions a
// copy, so one warp issues ~1,000 instructions per 34 KB stage; P warps share them.
#ifndef TF_RING_PRODUCERS
#define TF_RING_PRODUCERS 2
#endif
static_assert(TF_RING_PRODUCERS == 1 || TF_RING_PRODUCERS == 2 || TF_RING_PRODUCERS == 4,
              "1, 2 or 4 producer warps");
#define RING_THREADS (256 + 32 * TF_RING_PRODUCERS)
#define RING_PITCH 272
#define RING_STAGE_BYTES (8 * 16 * RING_PITCH)
// Jobs of a bundle with partials (R <= 2: S <= 16).
#define RING_JOBS 16

// A CUtensorMap as the driver encodes it (opaque; a 64-byte aligned kernel parameter).
struct __align__(64) RingMap {
    u64 v[16];
};

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
// One 2-D tensor copy of box (x, y) of the map at `map` (a kernel parameter) to shared dst,
// completing on bar.
template <class M>
__device__ __forceinline__ void ring_tensor_copy(u32 dst, const M& map, u32 x, u32 y, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%2, %3}], [%4];" ::"r"(dst),
        "l"((u64)&map), "r"(x), "r"(y), "r"(bar)
        : "memory");
}
// 4 bytes (two bf16) of activations at p, cached (a C++ load: never moved above pdl_wait's
// memory clobber).
__device__ __forceinline__ u32 ld_act4(const bf16* p) { return __ldg((const unsigned int*)p); }

// The shape of a ring launch: tiles of 16 features with J jobs each (a job: one K slice, of
// len k, of one of the tile's matrices: job j reads matrix j / S, slice j % S), bundles of B
// tiles (R rounds of 8 jobs).
struct RingShape {
    u32 tiles, J, S, len, runs, B, R, bundles;
    __device__ __forceinline__ RingShape(u32 n, u32 J_, u32 S_, u32 len_) {
        tiles = n / 16;
        J = J_;
        S = S_;
        len = len_;
        runs = len / 128;
        B = J >= 8 ? 1 : 8 / J;
        R = B * J / 8;
        bundles = (tiles + B - 1) / B;
    }
    // The tile of job `u` (0 .. B * J) of bundle b (`tiles` when past the last).
    __device__ __forceinline__ u32 tile_of(u32 b, u32 u) const {
        const u32 t = b * B + u / J;
        return t < tiles ? t : tiles;
    }
};

// Where a stage's bytes come from, and where a job's k16 step sits in it. RingBulk: a stage is
// 128 row runs of 256 bytes at a 272-byte pitch, brought by 1-D bulk copies (a lane a copy,
// issued one lane at a time: the copy takes uniform operands) from TF_RING_PRODUCERS warps,
// each arriving on `full` with its bytes. Job j of a tile reads matrix w0 (j < S) or w1 (each
// (n, k), row-major).
struct RingBulk {
    const bf16* w0;
    const bf16* w1;
    static constexpr u32 STAGE = RING_STAGE_BYTES, PRODUCERS = TF_RING_PRODUCERS, ALIGN = 16;
    // Producer warp p's row runs q = p * 128 / P + lane + 32 j of the stage of round r, run i.
    __device__ __forceinline__ void stage(const RingShape& sh, u32 b, u32 r, u32 i, u32 k,
                                          u32 dst, u32 bar) const {
        constexpr u32 PER = 4 / TF_RING_PRODUCERS;  // copies a lane a stage
        const u32 lane = threadIdx.x & 31, q0 = ((threadIdx.x >> 5) - 8) * 32 * PER;
        u32 runs = 0;  // this warp's row runs with a tile
#pragma unroll
        for (u32 j = 0; j < PER; j++)
            runs += 16 * (sh.tile_of(b, 8 * r + (q0 + 32 * j) / 16) < sh.tiles) +
                    16 * (sh.tile_of(b, 8 * r + (q0 + 32 * j) / 16 + 1) < sh.tiles);
        if (lane == 0) mbar_expect_at(bar, runs * 256);
        __syncwarp();
#pragma unroll
        for (u32 j = 0; j < PER; j++) {
            const u32 qq = q0 + lane + 32 * j, u = 8 * r + qq / 16, job = u % sh.J;
            const u32 t = sh.tile_of(b, u);
            if (t == sh.tiles) continue;
            const bf16* src = (job < sh.S ? w0 : w1) + (u64)(16 * t + qq % 16) * k +
                              (job % sh.S) * sh.len + 128 * i;
            bulk_copy_at(dst + qq * RING_PITCH, src, 256, bar);
        }
    }
    // The ldmatrix address of lane L for step e of warp w's job in the stage at `st`: row
    // (L & 7) + 8 ((L >> 3) & 1), k 16 e + 8 (L >> 4).
    __device__ __forceinline__ u32 step(u32 st, u32 w, u32 lane, u32 e) const {
        const u32 mi = lane >> 3;
        return st + (16 * w + (lane & 7) + 8 * (mi & 1)) * RING_PITCH + 32 * e + 16 * (mi >> 1);
    }
};

// RingTensor: a stage is 8 jobs x 2 boxes of 16 rows x 64 k (2 KB, the 128-byte swizzle: chunk
// c of row r at r * 128 + ((c ^ (r % 8)) << 4)), brought by 16 2-D tensor copies of the
// matrices' maps (m0, m1 as w0, w1), issued by one thread.
struct RingTensor {
    const RingMap* m0;
    const RingMap* m1;
    static constexpr u32 STAGE = 8 * 4096, PRODUCERS = 1, ALIGN = 1024;
    __device__ __forceinline__ void stage(const RingShape& sh, u32 b, u32 r, u32 i, u32 k,
                                          u32 dst, u32 bar) const {
        if (threadIdx.x != 256) return;
        u32 jobs = 0;  // this round's jobs with a tile
        for (u32 v = 0; v < 8; v++) jobs += sh.tile_of(b, 8 * r + v) < sh.tiles;
        mbar_expect_at(bar, jobs * 4096);
        for (u32 v = 0; v < 8; v++) {
            const u32 u = 8 * r + v, job = u % sh.J, t = sh.tile_of(b, u);
            if (t == sh.tiles) continue;
            const RingMap* m = job < sh.S ? m0 : m1;
            const u32 x0 = (job % sh.S) * sh.len + 128 * i;
            ring_tensor_copy(dst + 4096 * v, *m, x0, 16 * t, bar);
            ring_tensor_copy(dst + 4096 * v + 2048, *m, x0 + 64, 16 * t, bar);
        }
    }
    __device__ __forceinline__ u32 step(u32 st, u32 w, u32 lane, u32 e) const {
        const u32 mi = lane >> 3, row = (lane & 7) + 8 * (mi & 1);
        const u32 chunk = 2 * (e & 3) + (mi >> 1);
        return st + 4096 * w + 2048 * (e >> 2) + 128 * row + ((chunk ^ (lane & 7)) << 4);
    }
};

// The producer warps: every stage of the CTA's bundles, in the consumers' order, each once
// the consumers freed it (`empty`); they never wait for the previous kernel (TF_RING_EARLY).
template <class Src>
__device__ __forceinline__ void ring_produce(const RingShape& sh, const Src& src, u32 k,
                                             u32 stages, u32 full, u32 empty) {
    if (!TF_RING_EARLY) pdl_wait();
    u32 q = 0;  // stages issued
    for (u32 b = blockIdx.x; b < sh.bundles; b += gridDim.x)
        for (u32 r = 0; r < sh.R; r++)
            for (u32 i = 0; i < sh.runs; i++, q++) {
                const u32 s = q % TF_RING_STAGES, ph = (q / TF_RING_STAGES) & 1;
                mbar_wait_parity(empty + 8 * s, ph ^ 1);
                src.stage(sh, b, r, i, k, stages + s * Src::STAGE, full + 8 * s);
            }
}

// A consumer warp: its job's steps of every stage, and the bundles' combines: `store(t, p)`
// writes tile t's outputs from its J jobs' partials p ([J][32 lanes][4] floats), run by the
// 256 consumer threads (threads < 128 one element each, linear.cu's tile_elem order).
template <class Src, class Store>
__device__ __forceinline__ void ring_consume(const RingShape& sh, const Src& src,
                                             const bf16* __restrict__ x,
                                             const u32* __restrict__ row_idx, u32 k, u32 rows,
                                             u32 stages, float* part, u32 full, u32 empty,
                                             Store store) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    pdl_wait();
    const bool vx = g < rows;
    const bf16* xr = x + (u64)(vx ? (row_idx ? row_idx[g] : g) : 0) * k + 2 * c;
    u32 q = 0;
    float acc[4];
    for (u32 b = blockIdx.x; b < sh.bundles; b += gridDim.x) {
        for (u32 r = 0; r < sh.R; r++) {
            const u32 u = 8 * r + warp;
            const bool has = sh.tile_of(b, u) < sh.tiles;
            const u32 k0 = (u % sh.J % sh.S) * sh.len;
            for (u32 i = 0; i < sh.runs; i++, q++) {
                const u32 s = q % TF_RING_STAGES, ph = (q / TF_RING_STAGES) & 1;
                mbar_wait_parity(full + 8 * s, ph);
                if (has) {
                    if (i == 0) acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
                    const u32 st = stages + s * Src::STAGE;
                    const bf16* xk = xr + k0 + 128 * i;
#pragma unroll
                    for (u32 e = 0; e < 8; e++) {
                        u32 a0, a1, a2, a3;
                        ring_ldmatrix(src.step(st, warp, lane, e), a0, a1, a2, a3);
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
        ring_consumers_sync();
        for (u32 tl = 0; tl < sh.B; tl++) {
            const u32 t = b * sh.B + tl;
            if (t < sh.tiles) store(t, part + tl * sh.J * 128);
        }
        ring_consumers_sync();  // the partials are read before the next bundle writes them
    }
}

// An entry's start: the mbarriers, then the producer warps (8 ..) and the consumers part.
// `smem`: the dynamic shared memory (the stages from the first Src::ALIGN-aligned byte, then
// RING_JOBS x 128 partials, then the barriers; the host's `ring::SMEM` holds them all).
template <class Src, class Store>
__device__ __forceinline__ void ring_run(const RingShape& sh, const Src& src,
                                         const bf16* __restrict__ x,
                                         const u32* __restrict__ row_idx, u32 k, u32 rows,
                                         unsigned char* smem, Store store) {
    const u32 pad = (Src::ALIGN - ring_saddr(smem) % Src::ALIGN) % Src::ALIGN;
    const u32 stages = ring_saddr(smem) + pad;
    float* part = (float*)(smem + pad + TF_RING_STAGES * Src::STAGE);
    const u32 full = ring_saddr(part + RING_JOBS * 128), empty = full + 8 * TF_RING_STAGES;
    pdl_launch();  // the next launch's CTAs may sit beside these and stream their weights
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < TF_RING_STAGES; s++) {
            mbar_init_at(full + 8 * s, Src::PRODUCERS);
            mbar_init_at(empty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x >= 256) {
        if (threadIdx.x < 256 + 32 * Src::PRODUCERS) ring_produce(sh, src, k, stages, full, empty);
        return;
    }
    ring_consume(sh, src, x, row_idx, k, rows, stages, part, full, empty, store);
}
#endif

// grid: (min(bundles, SMs)); block: RING_THREADS threads; dynamic shared memory ring_smem (the host's
// `ring::SMEM`): TF_RING_STAGES stages, RING_JOBS x 128 partials, 2 x TF_RING_STAGES
// mbarriers. rows <= 8; n % 16 == 0, S * len == k, len % 128 == 0, a tile's jobs a power of
// two <= 16 (checked by the host, `ring::fits`).

// linear_bf16's product: arguments as linear_bf16's, plus S; a tile's jobs are its S slices,
// combined as linear_body does. The _tma entry takes the weight's map (boxes of 16 rows x 64 k,
// the 128-byte swizzle; `ring::weight_map`) and reads w only through it.
#define RING_LINEAR_PARAMS                                                                   \
    const bf16 *__restrict__ w, const bf16 *__restrict__ x, const u32 *__restrict__ row_idx, \
        const float *__restrict__ bias, void *out, int out_mode, u32 n, u32 k, u32 rows,     \
        u32 slice_len, u32 S
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
template <class Src>
__device__ __forceinline__ void ring_linear(RING_LINEAR_PARAMS, const Src& src) {
    extern __shared__ __align__(128) unsigned char smem[];
    auto store = [&](u32 t, const float* p) {
        const u32 e = threadIdx.x;
        u32 f, tok;
        tile_elem<1>(e, 16 * t, 0, &f, &tok);
        if (e >= 128 || tok >= rows) return;
        store_linear(out, out_mode, (u64)tok * n + f, slice_total<1>(p, e, 0, S), bias, f);
    };
    ring_run(RingShape(n, S, S, slice_len), src, x, row_idx, k, rows, smem, store);
}
// linear_bf16_swiglu_d8's product (SWIGLU_PARAMS): a tile's jobs are gate's S slices, then
// up's, combined as swiglu_store does (gate, up and act = bf16(bf16(silu(gate)) * up)).
template <class Src>
__device__ __forceinline__ void ring_swiglu(SWIGLU_PARAMS, const Src& src) {
    extern __shared__ __align__(128) unsigned char smem[];
    auto store = [&](u32 t, const float* p) {
        if (threadIdx.x < 128) swiglu_store<1>(SWIGLU_ARGS, p, 16 * t, 0);
    };
    ring_run(RingShape(n, 2 * S, S, len), src, x, nullptr, k, rows, smem, store);
}
#define RING_BODY(CALL) CALL
#else
#define RING_BODY(CALL)
#endif
extern "C" __global__ void __launch_bounds__(RING_THREADS, 2) linear_bf16_ring(RING_LINEAR_PARAMS) {
    RING_BODY(ring_linear(w, x, row_idx, bias, out, out_mode, n, k, rows, slice_len, S,
                          RingBulk{w, w}));
}
extern "C" __global__ void __launch_bounds__(RING_THREADS, 2)
    linear_bf16_ring_tma(RING_LINEAR_PARAMS, const __grid_constant__ RingMap map) {
    RING_BODY(ring_linear(w, x, row_idx, bias, out, out_mode, n, k, rows, slice_len, S,
                          RingTensor{&map, &map}));
}
extern "C" __global__ void __launch_bounds__(RING_THREADS, 2) linear_bf16_swiglu_ring(SWIGLU_PARAMS) {
    RING_BODY(ring_swiglu(SWIGLU_ARGS, RingBulk{wg, wu}));
}
extern "C" __global__ void __launch_bounds__(RING_THREADS, 2) linear_bf16_swiglu_ring_tma(
    SWIGLU_PARAMS, const __grid_constant__ RingMap gmap, const __grid_constant__ RingMap umap) {
    RING_BODY(ring_swiglu(SWIGLU_ARGS, RingTensor{&gmap, &umap}));
}
