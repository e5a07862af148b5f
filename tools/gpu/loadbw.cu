// Read bandwidth of the decode products' weight-load pattern and its variants (tools/gpu/loadbw.py
// builds and runs this; nothing here is part of the engine). A warp streams a work unit of 16
// weight rows x one K slice through two register buffers, as linear.cu's slice_chain does; a
// buffer holds 64 U bytes of each of the 16 rows, loaded 16 bytes a lane. R: rows one load
// instruction covers (512 / R bytes of each; R = 8 is linear.cu's pattern: 8 rows x 64 bytes).
// F: the load's cache hints: 0 = linear.cu's before session 20 (ld.global.nc.L1::no_allocate),
// 1 = + .L2::128B, 2 = + .L2::256B, 3 = plain ld.global.nc. The loaded words are folded into
// one value per warp so that no load is dead.
typedef unsigned int u32;
typedef unsigned long long u64;

#define LD16(HINTS)                                                                        \
    asm volatile("ld.global.nc" HINTS ".v4.u32 {%0,%1,%2,%3}, [%4];"                        \
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p))
template <int F>
__device__ __forceinline__ uint4 ld16(const char* p) {
    uint4 v;
    if (F == 0) LD16(".L1::no_allocate");
    if (F == 1) LD16(".L1::no_allocate.L2::128B");
    if (F == 2) LD16(".L1::no_allocate.L2::256B");
    if (F == 3) LD16("");
    return v;
}

// Buffer at byte offset o of the unit's slice: 2 U instructions of R rows x 512 / R bytes.
template <int R, int U, int F>
__device__ __forceinline__ void issue(uint4 (&b)[2 * U], const char* base, u32 rowb, u32 o,
                                      u32 lane) {
    constexpr int LPR = 32 / R, BPR = 512 / R, RG = 16 / R;
#pragma unroll
    for (int j = 0; j < 2 * U; j++) {
        const u32 row = (j % RG) * R + lane / LPR;
        b[j] = ld16<F>(base + (u64)row * rowb + o + (j / RG) * BPR + (lane % LPR) * 16);
    }
}

template <int U>
__device__ __forceinline__ void fold(const uint4 (&b)[2 * U], u32& acc) {
#pragma unroll
    for (int j = 0; j < 2 * U; j++) acc = acc * 3u + (b[j].x ^ b[j].y ^ b[j].z ^ b[j].w);
}

// Unit = (16-row tile, slice): warp `unit` reads rows [16 tile, 16 tile + 16) x bytes
// [slice sliceb, (slice + 1) sliceb) of a matrix of `rowb`-byte rows.
template <int R, int U, int F>
__device__ void stream(const char* w, u32 rowb, u32 sliceb, u32 nslices, u32 units, u32* out) {
    const u32 lane = threadIdx.x & 31;
    const u32 unit = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (unit >= units) return;
    const char* base = w + (u64)(unit / nslices) * 16 * rowb + (u64)(unit % nslices) * sliceb;
    uint4 b0[2 * U], b1[2 * U];
    u32 acc = 0;
    issue<R, U, F>(b0, base, rowb, 0, lane);
    for (u32 o = 0; o < sliceb; o += 128 * U) {
        if (o + 64 * U < sliceb) issue<R, U, F>(b1, base, rowb, o + 64 * U, lane);
        fold<U>(b0, acc);
        if (o + 128 * U < sliceb) issue<R, U, F>(b0, base, rowb, o + 128 * U, lane);
        if (o + 64 * U < sliceb) fold<U>(b1, acc);
    }
    if (acc == 0x12345678u) out[unit] = acc;
}

#define ENTRY(R, U, F)                                                                     \
    extern "C" __global__ void __launch_bounds__(256) rd_##R##_##U##_##F(                  \
        const char* w, u32 rowb, u32 sliceb, u32 nslices, u32 units, u32* out) {           \
        stream<R, U, F>(w, rowb, sliceb, nslices, units, out);                             \
    }
ENTRY(8, 4, 0) ENTRY(8, 4, 1) ENTRY(8, 4, 2) ENTRY(8, 4, 3)
ENTRY(4, 4, 0) ENTRY(4, 4, 1) ENTRY(2, 4, 0) ENTRY(8, 2, 1) ENTRY(8, 8, 1)

// Groups of 8 units (16-row tiles x slices, in the order above) a CTA, as the decode entries'
// 8 warps a 16-feature tile: a CTA walks groups blockIdx.x, + gridDim.x, ... (the host
// launches a group a CTA, or as many CTAs as fit: persistent), warp w streaming unit 8 g + w.
// One warp's buffers run on across its units: the next unit's first buffer is issued into
// the buffer the current unit's last fold freed. EPI: at each unit's end the warp leaves its
// fold in shared memory (two slots, alternating) and the CTA meets at a barrier, after which
// warp 0 folds the 8 (the decode entries' slice combine). PAD: 4 x PAD registers a thread
// held live throughout (loaded at the start, folded at the end), so that PAD 10 gives ~120 a
// thread, 2 CTAs of 256 an SM, as the decode entries.
template <int R, int U, int F, bool EPI, int PAD>
__device__ void stream_g(const char* w, u32 rowb, u32 sliceb, u32 nslices, u32 units, u32* out) {
    __shared__ u32 part[2][8];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 groups = units / 8, per = sliceb / (64 * U);  // buffers a unit
    uint4 pad[PAD > 0 ? PAD : 1];
#pragma unroll
    for (int j = 0; j < PAD; j++) pad[j] = ld16<3>(w + (j * 32 + lane) * 16);
    u32 g = blockIdx.x, i = 0, parity = 0;  // buffer i of the current unit of group g
    auto base = [&](u32 gg) {
        const u32 unit = 8 * gg + warp;
        return w + (u64)(unit / nslices) * 16 * rowb + (u64)(unit % nslices) * sliceb;
    };
    u32 acc = 0;
    auto advance = [&](u32& gg, u32& ii) {
        if (++ii == per) { ii = 0; gg += gridDim.x; }
    };
    // Called after a fold of buffer (gg, ii): the unit's end when ii is its last.
    auto unit_end = [&](u32 ii) {
        if (!EPI || ii != per - 1) return;
        if (lane == 0) part[parity][warp] = acc;
        __syncthreads();
        if (warp == 0 && lane < 8) acc = acc * 5u + part[parity][lane];
        parity ^= 1;
    };
    if (g >= groups) return;
    uint4 b0[2 * U], b1[2 * U];
    issue<R, U, F>(b0, base(g), rowb, i * 64 * U, lane);
    u32 g1 = g, i1 = i;
    advance(g1, i1);
    while (g < groups) {
        if (g1 < groups) issue<R, U, F>(b1, base(g1), rowb, i1 * 64 * U, lane);
        fold<U>(b0, acc);
        unit_end(i);
        g = g1; i = i1;
        advance(g, i);
        if (g < groups) issue<R, U, F>(b0, base(g), rowb, i * 64 * U, lane);
        if (g1 < groups) {
            fold<U>(b1, acc);
            unit_end(i1);
        }
        g1 = g; i1 = i;
        advance(g1, i1);
    }
#pragma unroll
    for (int j = 0; j < PAD; j++) acc ^= pad[j].x + pad[j].y + pad[j].z + pad[j].w;
    if (acc == 0x12345678u) out[blockIdx.x * 8 + warp] = acc;
}

#define GENTRY(NAME, R, U, F, EPI, PAD)                                                    \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                \
        const char* w, u32 rowb, u32 sliceb, u32 nslices, u32 units, u32* out) {           \
        stream_g<R, U, F, EPI, PAD>(w, rowb, sliceb, nslices, units, out);                 \
    }
GENTRY(g_8_4_1, 8, 4, 1, false, 0) GENTRY(g_8_4_1_e, 8, 4, 1, true, 0)
GENTRY(g_8_4_1_p, 8, 4, 1, false, 10) GENTRY(g_8_4_1_ep, 8, 4, 1, true, 10)
GENTRY(g_4_4_1_ep, 4, 4, 1, true, 10)

// The same bytes a warp as one contiguous run, 512 bytes an instruction (a copy's reads).
extern "C" __global__ void __launch_bounds__(256) rd_flat(const char* w, u32 rowb, u32 sliceb,
                                                          u32 nslices, u32 units, u32* out) {
    const u32 lane = threadIdx.x & 31;
    const u32 unit = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (unit >= units) return;
    const char* base = w + (u64)unit * 16 * sliceb;
    const u32 n = 16 * sliceb;
    u32 acc = 0;
    uint4 b0[8], b1[8];
#pragma unroll
    for (int j = 0; j < 8; j++) b0[j] = ld16<0>(base + j * 512 + lane * 16);
    for (u32 o = 0; o < n; o += 8192) {
        if (o + 4096 < n) {
#pragma unroll
            for (int j = 0; j < 8; j++) b1[j] = ld16<0>(base + o + 4096 + j * 512 + lane * 16);
        }
        fold<4>(b0, acc);
        if (o + 8192 < n) {
#pragma unroll
            for (int j = 0; j < 8; j++) b0[j] = ld16<0>(base + o + 8192 + j * 512 + lane * 16);
        }
        if (o + 4096 < n) fold<4>(b1, acc);
    }
    if (acc == 0x12345678u) out[unit] = acc;
}
