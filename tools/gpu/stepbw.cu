// What a persistent decode step could gain on weight streaming alone (tools/gpu/stepbw.py
// builds and runs this; nothing here is part of the engine). The step is llama3-8b's weights
// in decode order (per layer q/k/v, o, gate/up, down; then the head), streamed with
// loadbw.cu's group pattern (8 warps a CTA, each a unit of 16 rows x one K slice through two
// register buffers of 4 KB, 120 registers a thread so 2 CTAs an SM, as the decode entries).
// Between two matrices the data dependence of a real step (the next product needs the whole
// previous output) is a barrier: a kernel boundary when each matrix is its own launch, or,
// in one persistent launch, a grid barrier (a counter a matrix: each CTA adds 1 after its
// last fold of the matrix; a CTA folds nothing of the next matrix before the counter is
// full). MODE 0: no barrier (the stream's ceiling); 1: the barrier before the next matrix's
// first load (nothing in flight across it); 2: the barrier before its first fold (its first
// two buffers are issued before the wait: weights do not depend on activations).
// A latency phase (attention after q/k/v, say) is modelled as `delay_ns` of one thread after
// the barrier fills: with `Mat::delay` set, CTA 0's thread 0 spins that long once the
// counter is full and then adds one more, which the other CTAs wait for. Launched per
// matrix (nm = 1), PDL: the first buffer is issued before griddepcontrol.wait, as the
// engine's products do, and the next launch is allowed at once (TF_EARLY_TRIGGER).
// Built with the backend's common.cuh prepended (u32, u64, pdl_wait, the mbarrier and bulk-copy
// helpers).

struct Mat {
    const char* w;
    u32 rowb, sliceb, nslices, groups, per, delay;
};

__device__ __forceinline__ uint4 ld16(const char* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// A buffer: 8 loads of 8 rows x 64 bytes (loadbw.cu's R 8, U 4).
__device__ __forceinline__ void issue(uint4 (&b)[8], const char* base, u32 rowb, u32 o, u32 lane) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const u32 row = (j % 2) * 8 + lane / 4;
        b[j] = ld16(base + (u64)row * rowb + o + (j / 2) * 64 + (lane % 4) * 16);
    }
}
__device__ __forceinline__ void fold(const uint4 (&b)[8], u32& acc) {
#pragma unroll
    for (int j = 0; j < 8; j++) acc = acc * 3u + (b[j].x ^ b[j].y ^ b[j].z ^ b[j].w);
}

// Position in the CTA's walk: matrix m, group g (of m), buffer i (of the warp's unit).
struct Cur {
    u32 m, g, i;
};
// To the first group of this CTA at or after c.m.
__device__ __forceinline__ void walk_skip(const Mat* __restrict__ mats, u32 nm, Cur& c) {
    while (c.m < nm && blockIdx.x >= mats[c.m].groups) c.m++;
    if (c.m < nm) c.g = blockIdx.x, c.i = 0;
}
// The CTA's next buffer: the unit's next, else its next group of the matrix, else the next
// matrix's first.
__device__ __forceinline__ Cur walk_next(const Mat* __restrict__ mats, u32 nm, Cur c) {
    if (++c.i == mats[c.m].per) {
        c.i = 0;
        c.g += gridDim.x;
        if (c.g >= mats[c.m].groups) {
            c.m++;
            walk_skip(mats, nm, c);
        }
    }
    return c;
}

// The grid barrier before matrix m (m >= 1), run by one thread of the CTA: arrive for every
// matrix before m (`arrived` of them so far; the CTA has folded all of them), then wait until
// every CTA has arrived for m - 1 and, when a latency phase follows m - 1 (`Mat::delay`), CTA
// 0's thread has spun delay_ns after that and added one more.
__device__ __forceinline__ void grid_wait(const Mat* __restrict__ mats, u32* counters, u32 m,
                                          u32 delay_ns, u32& arrived) {
    for (; arrived < m; arrived++) atomicAdd(counters + arrived, 1u);
    const u32 full = gridDim.x + (mats[m - 1].delay ? 1 : 0);
    if (mats[m - 1].delay && blockIdx.x == 0) {
        while (ld_acquire(counters + m - 1) < gridDim.x) {
        }
        const u64 t0 = now_ns();
        while (now_ns() - t0 < delay_ns) {
        }
        atomicAdd(counters + m - 1, 1u);
    }
    while (ld_acquire(counters + m - 1) < full) {
    }
}

template <int MODE, bool PDL>
__device__ void step_stream(const Mat* __restrict__ mats, u32 nm, u32* counters, u32 delay_ns,
                            u32* out) {
    __shared__ u32 part[2][8];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // 40 registers a thread held live (loaded at the start, folded at the end): ~120 in all.
    uint4 pad[10];
#pragma unroll
    for (int j = 0; j < 10; j++) pad[j] = ld16(mats[0].w + (j * 32 + lane) * 16);
    u32 acc = 0, parity = 0, arrived = 0, nj = 0, nf = 0;
    auto next = [&](Cur c) { return walk_next(mats, nm, c); };
    auto base = [&](const Cur& c) {
        const Mat& M = mats[c.m];
        const u32 unit = 8 * c.g + warp;
        return M.w + (u64)(unit / M.nslices) * 16 * M.rowb + (u64)(unit % M.nslices) * M.sliceb +
               c.i * 256;
    };
    auto barrier = [&](u32 m) {
        if (MODE == 0 || m == 0) return;
        __syncthreads();
        if (threadIdx.x == 0) grid_wait(mats, counters, m, delay_ns, arrived);
        __syncthreads();
    };
    Cur ci = {0, 0, 0};
    walk_skip(mats, nm, ci);
    Cur cf = ci;
    u32 waited = 0;  // matrices whose barrier this CTA has passed (m < waited)
    uint4 b0[8], b1[8];
    while (ci.m < nm || nf < nj) {
        if (ci.m < nm && nj - nf < 2) {
            if (MODE == 1 && ci.m >= waited) {
                if (nf < nj) goto fold_one;  // drain before crossing
                barrier(ci.m);
                waited = ci.m + 1;
            }
            if (nj & 1) issue(b1, base(ci), mats[ci.m].rowb, 0, lane);
            else issue(b0, base(ci), mats[ci.m].rowb, 0, lane);
            if (PDL && nj == 0) {
                pdl_wait();
                pdl_launch();
            }
            nj++;
            ci = next(ci);
            continue;
        }
    fold_one:
        if (MODE == 2 && cf.m >= waited) {
            barrier(cf.m);
            waited = cf.m + 1;
        }
        if (nf & 1) fold(b1, acc);
        else fold(b0, acc);
        if (cf.i == mats[cf.m].per - 1) {  // the unit's end: the slice combine's barrier
            if (lane == 0) part[parity][warp] = acc;
            __syncthreads();
            if (warp == 0 && lane < 8) acc = acc * 5u + part[parity][lane];
            parity ^= 1;
        }
        nf++;
        cf = next(cf);
    }
    if (PDL && nj == 0) {
        pdl_wait();
        pdl_launch();
    }
    if (MODE != 0) {
        __syncthreads();
        if (threadIdx.x == 0)
            for (; arrived < nm; arrived++) atomicAdd(counters + arrived, 1u);
    }
#pragma unroll
    for (int j = 0; j < 10; j++) acc ^= pad[j].x + pad[j].y + pad[j].z + pad[j].w;
    if (acc == 0x12345678u) out[blockIdx.x * 8 + warp] = acc;
}

#define ENTRY(NAME, MODE, PDL)                                                               \
    extern "C" __global__ void __launch_bounds__(256) NAME(const Mat* mats, u32 nm,           \
                                                           u32* counters, u32 delay_ns,       \
                                                           u32* out) {                        \
        step_stream<MODE, PDL>(mats, nm, counters, delay_ns, out);                           \
    }
ENTRY(step0, 0, false) ENTRY(step1, 1, false) ENTRY(step2, 2, false) ENTRY(mat_pdl, 0, true)

// The latency phase as its own launch: one thread spins delay_ns after the wait (PDL: the
// next launch is allowed at once, so its CTAs may issue their first loads meanwhile).
extern "C" __global__ void spin(u32 delay_ns) {
    pdl_wait();
    pdl_launch();
    const u64 t0 = now_ns();
    while (now_ns() - t0 < delay_ns) {
    }
}

// ---- The weights through a shared-memory ring filled by bulk copies (ring*) ----
// Would a persistent step keep the weight stream going through its dependences if the bytes
// landed in shared memory rather than in registers? Here one producer warp brings every buffer
// of the CTA's walk (the same groups, units and buffers as above; a stage is one buffer of the
// CTA's 8 units: 128 rows x 256 bytes = 32 KB) by cp.async.bulk (the TMA unit: 4 copies of a
// 256-byte row run a lane), completing on the stage's `full` mbarrier, into a ring of NR
// stages; 8 consumer warps fold their unit's rows from it (the register pattern's reads, from
// shared memory) and free the stage on `empty`. The producer never waits for a barrier:
// weights do not depend on activations, so with barriers (ring2) up to NR stages of the next
// matrix are in flight while the consumers wait for the previous matrix's counter (and the
// latency phase); ring0 has no barriers (the ring's own ceiling). The consumers' unit-end
// combine is a barrier of the 8 consumer warps (named barrier 1), as the slice combine.
// ring0 and ring2: 6 stages (192 KB, a CTA an SM); ring2s3: 3 stages (96 KB, two CTAs an SM,
// the same bytes an SM in flight from two producers). Dynamic shared memory: ring_smem(NR).
#define RING_STAGE (128 * 256)
__host__ __device__ constexpr u32 ring_smem(u32 nr) { return nr * RING_STAGE + 2 * nr * 8; }

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

template <bool BARRIERS, u32 NR, bool PDL = false>
__device__ void step_ring(const Mat* __restrict__ mats, u32 nm, u32* counters, u32 delay_ns,
                          u32* out) {
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ u32 part[2][8];
    if (PDL) pdl_launch();  // the next matrix's CTAs may become resident beside these
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 full = smem_addr(ring + NR * RING_STAGE), empty = full + 8 * NR;
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < NR; s++) {
            mbar_init_at(full + 8 * s, 1);
            mbar_init_at(empty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto next = [&](Cur c) { return walk_next(mats, nm, c); };
    Cur c = {0, 0, 0};
    walk_skip(mats, nm, c);
    if (warp == 8) {  // the producer
        for (u32 k = 0; c.m < nm; k++, c = next(c)) {
            const u32 s = k % NR, ph = (k / NR) & 1;
            mbar_wait_parity(empty + 8 * s, ph ^ 1);
            if (lane == 0) mbar_expect_at(full + 8 * s, RING_STAGE);
            __syncwarp();
            const Mat& M = mats[c.m];
#pragma unroll
            for (u32 j = 0; j < 4; j++) {
                const u32 q = lane + 32 * j, w = q / 16, r = q % 16, unit = 8 * c.g + w;
                const char* src = M.w + ((u64)(unit / M.nslices) * 16 + r) * M.rowb +
                                  (u64)(unit % M.nslices) * M.sliceb + c.i * 256;
                bulk_copy_at(smem_addr(ring + s * RING_STAGE + q * 256), src, 256, full + 8 * s);
            }
        }
        return;
    }
    // PDL: the producer streams before the previous launch has ended (weights are immutable);
    // the consumers fold nothing before it has.
    if (PDL) pdl_wait();
    u32 acc = 0, parity = 0, arrived = 0, waited = 0;
    // The step kernels' barrier, over the 256 consumer threads.
    auto barrier = [&](u32 m) {
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (threadIdx.x == 0) grid_wait(mats, counters, m, delay_ns, arrived);
        asm volatile("bar.sync 1, 256;" ::: "memory");
    };
    for (u32 k = 0; c.m < nm; k++, c = next(c)) {
        if (BARRIERS && c.m >= waited) {
            if (c.m > 0) barrier(c.m);
            waited = c.m + 1;
        }
        const u32 s = k % NR, ph = (k / NR) & 1;
        mbar_wait_parity(full + 8 * s, ph);
        const unsigned char* st = ring + s * RING_STAGE + warp * 16 * 256;
        uint4 b[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const u32 row = (j % 2) * 8 + lane / 4;
            b[j] = *(const uint4*)(st + row * 256 + (j / 2) * 64 + (lane % 4) * 16);
        }
        fold(b, acc);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * s);
        if (c.i == mats[c.m].per - 1) {  // the unit's end: the slice combine's barrier
            if (lane == 0) part[parity][warp] = acc;
            asm volatile("bar.sync 1, 256;" ::: "memory");
            if (warp == 0 && lane < 8) acc = acc * 5u + part[parity][lane];
            parity ^= 1;
        }
    }
    if (BARRIERS) {
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (threadIdx.x == 0)
            for (; arrived < nm; arrived++) atomicAdd(counters + arrived, 1u);
    }
    if (acc == 0x12345678u) out[blockIdx.x * 8 + warp] = acc;
}

#define RING_ENTRY(NAME, B, NR, PDL)                                                         \
    extern "C" __global__ void __launch_bounds__(288) NAME(const Mat* mats, u32 nm,           \
                                                           u32* counters, u32 delay_ns,       \
                                                           u32* out) {                        \
        step_ring<B, NR, PDL>(mats, nm, counters, delay_ns, out);                            \
    }
RING_ENTRY(ring0, false, 6, false) RING_ENTRY(ring2, true, 6, false)
RING_ENTRY(ring2s3, true, 3, false)
// A launch a matrix (nm = 1) with PDL, as the engine's products: 3 stages (96 KB) and a CTA an
// SM, so that the next matrix's CTA fits beside this one and its producer streams while this
// one ends (and through a latency launch between them).
RING_ENTRY(ring_pdl, false, 3, true)
