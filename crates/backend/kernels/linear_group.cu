// The grouped decode products (compiled in one unit after linear.cu, whose slice chains they
// run, and before linear_norm.cu, which reuses their bodies).

// ---- Grouped products (decode): several weights over the same x in one launch. ----
// Each CTA covers one 16-feature tile of one weight; its warps run that weight's K slices
// (warp w runs slices w, w + W, ...: which warp runs a slice changes no bit), each through
// slice_chain, then the partials are added in slice order, the bias, one rounding: exactly
// linear_bf16's arithmetic for every element, with that weight's own k_split.

// group_body: up to three weights (q, k, v). Weight j has n_j features, K split (sl_j, len_j)
// and ctas_j = ceil(n_j / 16) tiles; CTA x in [0, ctas_0) is weight 0, then weight 1, then
// weight 2. grid: (sum ctas_j, ceil(rows / (8 NT))); block: 32 * W threads; dynamic shared
// memory max_j(sl_j) * NT * 128 floats. bf16 outputs.
#define GROUP_PARAMS                                                                          \
    const bf16 *__restrict__ x, u32 k, u32 rows, const bf16 *w0, const float *b0, bf16 *o0,   \
        u32 n_0, u32 sl0, u32 len0, u32 ctas0, const bf16 *w1, const float *b1, bf16 *o1,     \
        u32 n_1, u32 sl1, u32 len1, u32 ctas1, const bf16 *w2, const float *b2, bf16 *o2,     \
        u32 n_2, u32 sl2, u32 len2
#define GROUP_ARGS_X(X) \
    X, k, rows, w0, b0, o0, n_0, sl0, len0, ctas0, w1, b1, o1, n_1, sl1, len1, ctas1, w2, b2, o2, n_2, sl2, len2
#define GROUP_ARGS GROUP_ARGS_X(x)

// Tile bx of a grouped launch: its weight (0, 1, 2 in CTA order), bias, output, features, K
// split and first feature.
struct GroupTile {
    const bf16* w;
    const float* bias;
    bf16* out;
    u32 n, S, len, n0;
    __device__ __forceinline__ Slice slice(u32 k, u32 j) const {
        return make_slice(w, n, k, n0, j * len, len);
    }
    // The tile's outputs (tokens t0 ..) from its slices' partials, in slice order.
    template <int NT>
    __device__ __forceinline__ void store(const float* parts, u32 t0, u32 rows) const {
        for (u32 e = threadIdx.x; e < NT * 32 * 4; e += blockDim.x) {
            u32 f, tok;
            tile_elem<NT>(e, n0, t0, &f, &tok);
            if (f >= n || tok >= rows) continue;
            store_linear(out, 0, (u64)tok * n + f, slice_total<NT>(parts, e, 0, S), bias, f);
        }
    }
};
__device__ __forceinline__ GroupTile group_tile(GROUP_PARAMS, u32 bx) {
    if (bx < ctas0) return {w0, b0, o0, n_0, sl0, len0, bx * 16};
    bx -= ctas0;
    if (bx < ctas1) return {w1, b1, o1, n_1, sl1, len1, bx * 16};
    bx -= ctas1;
    return {w2, b2, o2, n_2, sl2, len2, bx * 16};
}

// `part`: the partials' shared memory ([S][NT][32 lanes][4] floats). SX and `prologue`: see
// run_jobs (linear_norm.cu's entries stage their normed input in shared memory).
// `bx`: the CTA's tile (blockIdx.x, or one of a persistent CTA's), `first` as run_jobs.
template <int NT, int U, bool SX = false, class P = NoPrologue>
__device__ __forceinline__ void group_body(GROUP_PARAMS, float* parts, u32 bx, P prologue = P(),
                                           bool first = true) {
    const GroupTile d = group_tile(GROUP_ARGS, bx);
    const u32 t0 = blockIdx.y * 8 * NT;
    auto slice_of = [&](u32 j) { return d.slice(k, j); };
    run_jobs<NT, U, decltype(slice_of), SX>(slice_of, d.S, x, nullptr, k, rows, t0, parts,
                                            prologue, first);
    __syncthreads();
    d.store<NT>(parts, t0, rows);
}

// Tiles blockIdx.x, + gridDim.x, ... of `tiles` (NT token tiles from blockIdx.y * 8 NT), each
// warp issuing its next job's first weights (its next slice of the tile, else its first of the
// CTA's next tile) as soon as a chain ends, so they are in flight through the tile's combine:
// the same jobs, chains and combine as group_body, so the same bits (linear_swiglu_d8's
// scheme). `tile_of(t)`: tile t (its slice count S and `slice(k, j)`); `store(d, parts, t0,
// rows)`: its combine.
template <int NT, int U, bool SX, class P, class T, class St>
__device__ __forceinline__ void tiles_chained(T tile_of, St store, u32 tiles,
                                              const bf16* __restrict__ x, u32 k, u32 rows,
                                              float* parts, P prologue) {
    const u32 warp = threadIdx.x >> 5, W = blockDim.x >> 5, t0 = blockIdx.y * 8 * NT;
    u32 t = blockIdx.x, j = warp;
    auto d = tile_of(t);
    Slice s = d.slice(k, j < d.S ? j : 0);
    uint4 a[U], b[U];
    if (!product_start<U>(s, j < d.S, a, b, prologue) && j < d.S) issue_w<U>(s, s.k_begin, a, b);
    const bf16* xr[NT];
    bool vx[NT];
    token_rows<NT>(x, nullptr, k, rows, t0, (threadIdx.x & 31) >> 2, xr, vx);
    while (t < tiles) {
        for (; j < d.S; j += W) {
            slice_chain<NT, U, SX>(s, a, b, xr, vx, t0, rows, parts, j);
            if (j + W < d.S) {
                s = d.slice(k, j + W);
                issue_w<U>(s, s.k_begin, a, b);
            } else if (t + gridDim.x < tiles) {
                const auto dn = tile_of(t + gridDim.x);
                if (warp < dn.S) {
                    s = dn.slice(k, warp);
                    issue_w<U>(s, s.k_begin, a, b);
                }
            }
        }
        __syncthreads();
        store(d, parts, t0, rows);
        __syncthreads();  // the partials are read before the next tile writes them
        t += gridDim.x;
        if (t < tiles) d = tile_of(t);
        j = warp;
    }
}

// group_body's tiles through tiles_chained.
template <int U, bool SX = false, class P = NoPrologue>
__device__ __forceinline__ void group_chained(GROUP_PARAMS, float* parts, P prologue = P()) {
    auto tile_of = [&](u32 t) { return group_tile(GROUP_ARGS, t); };
    auto store = [](const GroupTile& d, const float* p, u32 t0, u32 r) { d.store<1>(p, t0, r); };
    tiles_chained<1, U, SX>(tile_of, store, ctas0 + ctas1 + (n_2 + 15) / 16, x, k, rows, parts,
                            prologue);
}
extern "C" __global__ void __launch_bounds__(256, TF_GROUP_MINB) linear_bf16_group(GROUP_PARAMS) {
    group_body<4, TF_NT_U>(GROUP_ARGS, dyn_floats(), blockIdx.x);
}
// Decode rows (at most 8), as linear_bf16_d8 (TENSORFOLD_GROUP_D8=1 picks it; same bits).
extern "C" __global__ void D8_BOUNDS(256) linear_bf16_group_d8(GROUP_PARAMS) {
    group_body<1, TF_D8_U>(GROUP_ARGS, dyn_floats(), blockIdx.x);
}

// swiglu_body: gate and up (both (n, k), K split (S, len), no bias) for the same 16
// features in one CTA: jobs 0 .. S-1 are gate's slices, S .. 2S-1 up's. Writes
// gate = bf16(x Wg^T), up = bf16(x Wu^T) and act = bf16(bf16(silu(gate)) * up), the
// `swiglu` kernel's formula on those bf16 values (elementwise.cu), so act has its bits.
// grid: (ceil(n / 16), ceil(rows / (8 NT))); block: 32 * W; shared 2S * NT * 128 floats.
#define SWIGLU_PARAMS                                                                          \
    const bf16 *__restrict__ x, u32 k, u32 rows, const bf16 *wg, const bf16 *wu, bf16 *gate,   \
        bf16 *up, bf16 *act, u32 n, u32 S, u32 len
#define SWIGLU_ARGS_X(X) X, k, rows, wg, wu, gate, up, act, n, S, len
#define SWIGLU_ARGS SWIGLU_ARGS_X(x)

template <int NT>
__device__ __forceinline__ void swiglu_store(SWIGLU_PARAMS, const float* parts, u32 n0, u32 t0);

// `part`: [2S][NT][32 lanes][4] floats of shared memory; SX, `prologue`: as group_body.
template <int NT, int U, bool SX = false, class P = NoPrologue>
__device__ __forceinline__ void swiglu_body(SWIGLU_PARAMS, float* parts, u32 tile,
                                            P prologue = P(), bool first = true) {
    const u32 n0 = tile * 16, t0 = blockIdx.y * 8 * NT;
    auto slice_of = [&](u32 j) {
        return make_slice(j < S ? wg : wu, n, k, n0, (j < S ? j : j - S) * len, len);
    };
    run_jobs<NT, U, decltype(slice_of), SX>(slice_of, 2 * S, x, nullptr, k, rows, t0, parts,
                                             prologue, first);
    __syncthreads();
    swiglu_store<NT>(SWIGLU_ARGS, parts, n0, t0);
}

// The combine of a swiglu tile (features n0 .., tokens t0 ..) from its slices' partials.
template <int NT>
__device__ __forceinline__ void swiglu_store(SWIGLU_PARAMS, const float* parts, u32 n0, u32 t0) {
    for (u32 e = threadIdx.x; e < NT * 32 * 4; e += blockDim.x) {
        u32 f, tok;
        tile_elem<NT>(e, n0, t0, &f, &tok);
        if (f >= n || tok >= rows) continue;
        const bf16 gb = f2bf(slice_total<NT>(parts, e, 0, S));
        const bf16 ub = f2bf(slice_total<NT>(parts, e, S, S));
        const u64 at = (u64)tok * n + f;
        gate[at] = gb;
        up[at] = ub;
        act[at] = f2bf(swiglu_f(bf2f(gb), bf2f(ub)));
    }
}

// Decode rows (at most 8: one token tile). Persistent when the host launches fewer CTAs than
// tiles (`fused::linear_swiglu`): CTA b runs tiles b, b + gridDim.x, ..., and each warp
// issues its next job's first weights (its next slice of the tile, else its first of the
// CTA's next tile) as soon as a chain ends, so they are in flight while this tile's partials
// are combined and stored. Each tile's jobs, chains and combine are
// swiglu_body's, in the same order: the same bits whichever CTA runs a tile and whenever its
// loads were issued. With a CTA a tile (grid = tiles) it is swiglu_body exactly. H200,
// session 26 (tools/gpu/stepbw.py first: the bare load pattern on llama3-8b's gate/up read
// 58.5 us a matrix so against 61.9 a CTA a tile): bench decode, 3 alternated rounds,
// 212.9 / 212.3, 208.3 / 209.0, 213.1 / 212.4 tok/s against 203.5 / 204.0, 202.5 / 202.7,
// 208.9 / 208.6 with TENSORFOLD_SWIGLU_PERSIST=0 (+3.1%); check exact's fingerprints and
// tests/cuda_fused.rs unchanged. Issuing the next job's weights during the chain's last
// buffer instead (session 21's TF_CHAIN_NEXT) wanted 151 registers (1 CTA an SM).
// `parts`, SX and `prologue` as swiglu_body (the norm entry stages its normed rows).
template <int NT, int U, bool SX = false, class P = NoPrologue>
__device__ __forceinline__ void swiglu_chained(SWIGLU_PARAMS, float* parts, P prologue = P()) {
    const u32 tiles = (n + 15) / 16, warp = threadIdx.x >> 5, W = blockDim.x >> 5, J = 2 * S;
    auto slice_of = [&](u32 tile, u32 j) {
        return make_slice(j < S ? wg : wu, n, k, tile * 16, (j < S ? j : j - S) * len, len);
    };
    u32 t = blockIdx.x, j = warp;
    Slice s = slice_of(t, j < J ? j : 0);
    uint4 a[U], b[U];
    if (!product_start<U>(s, warp < J, a, b, prologue) && warp < J) issue_w<U>(s, s.k_begin, a, b);
    const bf16* xr[NT];
    bool vx[NT];
    const u32 t0 = blockIdx.y * 8 * NT;
    token_rows<NT>(x, nullptr, k, rows, t0, (threadIdx.x & 31) >> 2, xr, vx);
    for (; t < tiles; t += gridDim.x) {
        for (; j < J; j += W) {
            slice_chain<NT, U, SX>(s, a, b, xr, vx, t0, rows, parts, j);
            // The warp's next job: the next of this tile, else its first of the CTA's next.
            const bool same = j + W < J;
            const u32 nt = same ? t : t + gridDim.x;
            if (nt < tiles) {
                s = slice_of(nt, same ? j + W : warp);
                issue_w<U>(s, s.k_begin, a, b);
            }
        }
        j = warp;
        __syncthreads();
        swiglu_store<NT>(SWIGLU_ARGS, parts, t * 16, t0);
        __syncthreads();  // the partials are read before the next tile writes them
    }
}
extern "C" __global__ void D8_BOUNDS(256) linear_bf16_swiglu_d8(SWIGLU_PARAMS) {
    swiglu_chained<1, TF_D8_U>(SWIGLU_ARGS, dyn_floats());
}
// The general entry (9 to 64 rows: 4 token tiles a CTA, blockIdx.y the next 32 rows), the
// same scheme (80 registers, 88 bytes of stack against 56 before). H200, session 26, serve
// (bench_concurrent, 2 alternated rounds): 16 streams 1,623 / 1,630 tok/s against 1,526 /
// 1,544 with TENSORFOLD_SWIGLU_PERSIST=0, 64 streams 2,625 / 2,585 against 2,620 / 2,622;
// replies equal to alone 81/81 both ways; tests/cuda_fused.rs at 17 and 64 rows unchanged.
extern "C" __global__ void __launch_bounds__(256, TF_GROUP_MINB) linear_bf16_swiglu(SWIGLU_PARAMS) {
    swiglu_chained<4, TF_NT_U>(SWIGLU_ARGS, dyn_floats());
}
