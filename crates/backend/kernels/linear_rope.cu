// q, k, v with rope and the KV write in their epilogue (compiled in one unit after linear.cu,
// linear_group.cu and linear_norm.cu, whose chains, tiles and norm prologue it reuses):
// `qkv_rope_kv_store` of cuda/fused_rope.rs, for calls of at most 64 rows (decode steps: one
// token tile a CTA up to 8 rows, four past that).
// One launch does what linear_bf16_group(_norm) and then rope_kv_store (rope.cu) do:
// - every product element as linear_bf16 forms it (its weight's slices, each the same mma
//   chain, added in slice order, the bias, one rounding to bf16);
// - q and k: rope's pair formula (`rope_pair`, common.cuh) on those bf16 values with the
//   table row of the token's position, the rotated values written to q and k;
// - k (rotated) and v written to the token's slot of the paged pool, as rope_kv_store writes
//   them (k's bf16 bits, v through f2bf(bf2f(.))).
// So q, k, v and the pool hold the bits of the two launches. What makes it one launch: a rope
// weight's 16-feature tile holds 8 whole pairs, the pair's two features on the lane rows g and
// g + 8 (`qkv_feature`): Neox pairs (i, i + hd/2) take tile rows i0 + g and hd/2 + i0 + g,
// interleaved pairs (2i, 2i + 1) rows 2 (i0 + g) and + 1. An mma tile's rows are independent
// (each element is its own chain over k, whichever rows share the tile; linear_bf16_ws tiles
// 128 rows, the decode entries 16), so this changes which CTA computes an element, not its
// bits; the combine then finds both features of a pair in the same lane's partials (elements
// e and e + 2). v's tiles are group_body's.
// The CTAs are persistent and chained as linear_bf16_group_norm (linear_group.cu's
// tiles_chained), the norm entry with the same prologue. The pool rows written are this call's
// positions only, as rope_kv_store's, so the decode attention after it may copy older rows
// before its wait (attention_dec.cu's TF_DEC_EARLY; the host records the write).

// The rope table, the positions and the pool (rope_kv_store's arguments after its q, k, v).
#define ROPE_PARAMS                                                                             \
    const bf16 *__restrict__ table, const u32 *__restrict__ positions, u32 hd, int interleaved, \
        bf16 *pool, const u32 *__restrict__ row_table, const u32 *__restrict__ tables,         \
        u32 bstride, u32 loff, u32 bs
#define ROPE_ARGS table, positions, hd, interleaved, pool, row_table, tables, bstride, loff, bs

// The feature on row r (0..15) of the tile at n0 of weight `kind` (0 q, 1 k: pairs on rows g
// and g + 8; 2 v: 16 consecutive features). hd % 16 == 0 (the host checks).
__device__ __forceinline__ u32 qkv_feature(u32 kind, u32 n0, u32 r, u32 hd, int interleaved) {
    if (kind == 2) return n0 + r;
    const u32 g = r & 7, hi = r >> 3;
    if (interleaved) return n0 + 2 * g + hi;
    const u32 head0 = n0 - n0 % hd, i0 = (n0 % hd) / 2;
    return head0 + i0 + g + hi * (hd / 2);
}

// A tile of the rope entries: group_tile's, its lane rows the features of its weight's kind.
struct QkvTile : GroupTile {
    u32 kind, hd;
    int interleaved;
    __device__ __forceinline__ Slice slice(u32 k, u32 j) const {
        const u32 g = (threadIdx.x & 31) >> 2;
        const u32 fa = qkv_feature(kind, n0, g, hd, interleaved);
        const u32 fb = qkv_feature(kind, n0, g + 8, hd, interleaved);
        return make_slice_rows(w, n, k, fa, fb, j * len, len);
    }
};

// The positions of a CTA's rows t0 .. t0 + 8 NT - 1 and their pool slots (element 0 of the
// slot in kv head 0's k plane of this layer, kv.cu's layout; v's is `plane` further).
template <int NT>
struct RowSlots {
    u32 pos[8 * NT];
    u64 at[8 * NT];
};

// Fills `s` (its rows below `rows`). Read before the products' wait: the positions and block
// tables are step metadata the host writes before the step's first kernel and no kernel
// writes (attention_dec.cu's early copies read them so too), so their loads leave the k and v
// tiles' combine. Visible to the combine through tiles_chained's barriers.
template <int NT>
__device__ __forceinline__ void row_slots(RowSlots<NT>& s, const u32* __restrict__ positions,
                                          const u32* __restrict__ row_table,
                                          const u32* __restrict__ tables, u32 t0, u32 rows,
                                          u32 bstride, u32 loff, u32 bs, u32 hd, u64 plane) {
    for (u32 i = threadIdx.x; i < 8 * NT && t0 + i < rows; i += blockDim.x) {
        const u32 pos = positions[t0 + i];
        const u64 blk = tables[row_table[t0 + i] + pos / bs];
        s.pos[i] = pos;
        s.at[i] = (blk * bstride + loff) * 2 * plane + (u64)(pos % bs) * hd;
    }
}

// A product element from its slices' partials, as store_linear forms a bf16 output.
template <int NT>
__device__ __forceinline__ bf16 qkv_value(const QkvTile& d, const float* parts, u32 e, u32 f) {
    float total = slice_total<NT>(parts, e, 0, d.S);
    if (d.bias) total += d.bias[f];
    return f2bf(total);
}

// The combine of a tile (NT token tiles from t0): v's elements to v and the pool; q's and k's
// pairs rotated to q and k (k's also to the pool). kvh: the pool's kv heads.
template <int NT>
__device__ __forceinline__ void qkv_rope_store(const QkvTile& d, const float* parts, u32 t0,
                                               u32 rows, const RowSlots<NT>& slots, ROPE_PARAMS,
                                               u64 plane) {
    if (d.kind == 2) {
        for (u32 e = threadIdx.x; e < NT * 128; e += blockDim.x) {
            u32 f, tok;
            tile_elem<NT>(e, d.n0, t0, &f, &tok);
            if (f >= d.n || tok >= rows) continue;
            const bf16 v = qkv_value<NT>(d, parts, e, f);
            d.out[(u64)tok * d.n + f] = v;
            pool[slots.at[tok - t0] + plane + (u64)(f / hd) * bs * hd + f % hd] = f2bf(bf2f(v));
        }
        return;
    }
    const u32 half = hd / 2;
    // Pair p of token tile t = p / 64: lane (p % 64) / 2's element i = p % 2 (row g, token
    // 2c + i) and its element i + 2 (row g + 8, the same token).
    for (u32 p = threadIdx.x; p < NT * 64; p += blockDim.x) {
        const u32 pp = p % 64, ea = (p / 64) * 128 + (pp >> 1) * 4 + (pp & 1), g = pp >> 3;
        u32 f, tok;
        tile_elem<NT>(ea, 0, t0, &f, &tok);
        if (tok >= rows) continue;
        const u32 fa = qkv_feature(d.kind, d.n0, g, hd, interleaved);
        const u32 fb = qkv_feature(d.kind, d.n0, g + 8, hd, interleaved);
        const bf16 xa = qkv_value<NT>(d, parts, ea, fa), xb = qkv_value<NT>(d, parts, ea + 2, fb);
        const u32 da = fa % hd, i = interleaved ? da / 2 : da;  // the pair's frequency
        const bf16* t = table + (u64)slots.pos[tok - t0] * hd;
        bf16 ya, yb;
        rope_pair(bf2f(xa), bf2f(xb), bf2f(t[i]), bf2f(t[half + i]), ya, yb);
        d.out[(u64)tok * d.n + fa] = ya;
        d.out[(u64)tok * d.n + fb] = yb;
        if (d.kind == 1) {
            const u64 at = slots.at[tok - t0] + (u64)(fa / hd) * bs * hd;
            pool[at + da] = ya;
            pool[at + fb % hd] = yb;
        }
    }
}

// A prologue `p` followed, before the wait, by `f()` (after the first weights are issued).
template <class P, class F>
struct PreThen {
    const P& p;
    F f;
    __device__ __forceinline__ void pre() const {
        p.pre();
        f();
    }
    __device__ __forceinline__ void main() const { p.main(); }
};

// q, k, v (GROUP_PARAMS, bf16 outputs, NT token tiles) through tiles_chained with the rope
// combine.
template <int NT, int U, bool SX, class P>
__device__ __forceinline__ void qkv_rope_chained(GROUP_PARAMS, ROPE_PARAMS, float* parts,
                                                 P prologue) {
    auto tile_of = [&](u32 t) {
        const u32 kind = t < ctas0 ? 0u : (t < ctas0 + ctas1 ? 1u : 2u);
        return QkvTile{group_tile(GROUP_ARGS, t), kind, hd, interleaved};
    };
    __shared__ RowSlots<NT> slots;
    const u64 plane = (u64)(n_1 / hd) * bs * hd;  // n_1: k's features, the pool's kv heads x hd
    auto fill = [&] {
        row_slots<NT>(slots, positions, row_table, tables, blockIdx.y * 8 * NT, rows, bstride,
                      loff, bs, hd, plane);
    };
    const PreThen<P, decltype(fill)> pro{prologue, fill};
    auto store = [&](const QkvTile& q, const float* p, u32 t0, u32 r) {
        qkv_rope_store<NT>(q, p, t0, r, slots, ROPE_ARGS, plane);
    };
    tiles_chained<NT, U, SX>(tile_of, store, ctas0 + ctas1 + (n_2 + 15) / 16, x, k, rows, parts,
                             pro);
}

// After the add + RMSNorm prologue (linear_norm.cu's NormPrologue; the input is the staged
// normed rows). Persistent: grid (min(tiles, CTAs resident at once)); block as
// linear_bf16_group; dynamic shared memory as linear_bf16_group_norm.
extern "C" __global__ void __launch_bounds__(256, TF_GROUP_MINB)
    linear_bf16_qkv_rope_norm(GROUP_PARAMS, NORM_PARAMS, ROPE_PARAMS) {
    NORM_SMEM
    qkv_rope_chained<1, TF_NT_U, true>(GROUP_ARGS_X(stage), ROPE_ARGS, parts, prologue);
}

// Over normed rows in global memory (x). Persistent as above; dynamic shared memory
// max_j(sl_j) * 128 floats.
extern "C" __global__ void __launch_bounds__(256, TF_GROUP_MINB)
    linear_bf16_qkv_rope(GROUP_PARAMS, ROPE_PARAMS) {
    qkv_rope_chained<1, TF_NT_U, false>(GROUP_ARGS, ROPE_ARGS, dyn_floats(), NoPrologue());
}

// 9 to 64 rows: 4 token tiles a CTA (blockIdx.y the next 32 rows), as linear_bf16_group's
// general entry; persistent and chained over the tiles as above; dynamic shared memory
// max_j(sl_j) * 4 * 128 floats.
extern "C" __global__ void __launch_bounds__(256, TF_GROUP_MINB)
    linear_bf16_qkv_rope_nt(GROUP_PARAMS, ROPE_PARAMS) {
    qkv_rope_chained<4, TF_NT_U, false>(GROUP_ARGS, ROPE_ARGS, dyn_floats(), NoPrologue());
}
