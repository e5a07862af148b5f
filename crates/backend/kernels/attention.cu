// Causal attention over the paged pool (layout in kv.cu), one kernel family for prefill
// chunks and decode rows.
//
// Block (r, h, z) handles query row r, head h, and the KV split z: absolute positions
// [z * SPLIT, (z + 1) * SPLIT) cut to the row's 0..=p. Inside a split, warp w takes the tiles
// of 32 positions w, w + 4, w + 8, ... (tiles at absolute multiples of 32); per tile, lane j
// scores position j (dot over dims 0..hd by fma in order, then * scale), and the warp updates
// its online softmax (m, l, o) with the tile max, exp(s - m) and a chain over j in increasing
// order for o. The 4 warps merge in order 0..3, splits in order 0..nz-1 (attention_combine).
// Every boundary is an absolute position, so a row's bits depend on its q, its KV and p only,
// never on the chunk it came in or the rows beside it. A row needing one split writes its
// output directly: the combine of one split is the identity (exp(0) = 1), so the bits agree.
#define SPLIT 512
#define WARPS 4

// Per (row, head, split) partial: m, l, then o[hd] (f32).
template <int DPL>
__device__ __forceinline__ void attend(
    const bf16* __restrict__ q, const bf16* __restrict__ pool, bf16* __restrict__ out,
    float* __restrict__ partial, const u32* __restrict__ positions,
    const u32* __restrict__ row_table, const u32* __restrict__ tables, u32 layers, u32 layer,
    u32 heads, u32 kvh, u32 bs, float scale) {
    constexpr u32 HD = 32 * DPL;
    __shared__ float qs[HD];
    __shared__ float wm[WARPS], wl[WARPS];
    __shared__ float wo[WARPS][HD];
    const u32 r = blockIdx.x, h = blockIdx.y, z = blockIdx.z;
    const u32 n = positions[r] + 1;
    const u32 start = z * SPLIT;
    if (start >= n) return;
    const u32 end = min(n, start + SPLIT);
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 g = h / (heads / kvh);
    for (u32 d = threadIdx.x; d < HD; d += blockDim.x) qs[d] = bf2f(q[((u64)r * heads + h) * HD + d]);
    __syncthreads();
    const u64 plane = (u64)kvh * bs * HD;
    const u32* table = tables + row_table[r];
    float m = -__int_as_float(0x7f800000), l = 0.0f, o[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) o[i] = 0.0f;
    for (u32 t0 = start + 32 * warp; t0 < end; t0 += 32 * WARPS) {
        const u32 j = t0 + lane;
        const bool valid = j < end;
        u64 row_at = 0;
        float s = -__int_as_float(0x7f800000);
        if (valid) {
            const u64 blk = table[j / bs];
            row_at = (blk * layers + layer) * 2 * plane + ((u64)g * bs + j % bs) * HD;
            const uint4* kr = (const uint4*)(pool + row_at);
            float dot = 0.0f;
#pragma unroll 4
            for (u32 d8 = 0; d8 < HD / 8; d8++) {
                const uint4 kv8 = kr[d8];
                const u32 w4[4] = {kv8.x, kv8.y, kv8.z, kv8.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    dot = fmaf(qs[8 * d8 + 2 * e], __uint_as_float(w4[e] << 16), dot);
                    dot = fmaf(qs[8 * d8 + 2 * e + 1], __uint_as_float(w4[e] & 0xffff0000u), dot);
                }
            }
            s = dot * scale;
        }
        const float m_new = fmaxf(m, warp_max(s));
        const float alpha = expf(m - m_new);
        const float p = valid ? expf(s - m_new) : 0.0f;
        l = l * alpha + warp_sum(p);
#pragma unroll
        for (int i = 0; i < DPL; i++) o[i] *= alpha;
        const u32 cnt = min(32u, end - t0);
        for (u32 jj = 0; jj < cnt; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const u64 vat = __shfl_sync(0xffffffffu, row_at, jj) + plane;
            const bf16* vr = pool + vat + lane * DPL;
#pragma unroll
            for (int i = 0; i < DPL; i++) o[i] = fmaf(pj, bf2f(vr[i]), o[i]);
        }
        m = m_new;
    }
    if (lane == 0) { wm[warp] = m; wl[warp] = l; }
#pragma unroll
    for (int i = 0; i < DPL; i++) wo[warp][lane * DPL + i] = o[i];
    __syncthreads();
    // Merge the warps in order (warp 0 always holds the split's first position).
    float mm = wm[0];
    for (int w = 1; w < WARPS; w++) mm = fmaxf(mm, wm[w]);
    const u32 nz = (n + SPLIT - 1) / SPLIT;
    float* part = partial + (((u64)r * heads + h) * gridDim.z + z) * (HD + 2);
    float ll = 0.0f;
    float e[WARPS];
    for (int w = 0; w < WARPS; w++) {
        e[w] = wl[w] > 0.0f ? expf(wm[w] - mm) : 0.0f;
        ll += wl[w] * e[w];
    }
    for (u32 d = threadIdx.x; d < HD; d += blockDim.x) {
        float od = 0.0f;
        for (int w = 0; w < WARPS; w++) od += wo[w][d] * e[w];
        if (nz == 1) out[((u64)r * heads + h) * HD + d] = f2bf(od / ll);
        else part[2 + d] = od;
    }
    if (nz > 1 && threadIdx.x == 0) { part[0] = mm; part[1] = ll; }
}

#define ATTN_ENTRY(NAME, DPL)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) NAME(                             \
        const bf16* q, const bf16* pool, bf16* out, float* partial, const u32* positions,     \
        const u32* row_table, const u32* tables, u32 layers, u32 layer, u32 heads, u32 kvh,   \
        u32 bs, float scale) {                                                               \
        attend<DPL>(q, pool, out, partial, positions, row_table, tables, layers, layer,      \
                    heads, kvh, bs, scale);                                                  \
    }
ATTN_ENTRY(attention_hd64, 2)
ATTN_ENTRY(attention_hd96, 3)
ATTN_ENTRY(attention_hd128, 4)
ATTN_ENTRY(attention_hd256, 8)

// Combines the splits of rows needing more than one, in split order:
// M = max m_z, L = sum l_z exp(m_z - M), O = sum o_z exp(m_z - M), out = bf16(O / L).
// grid: (rows, heads); block: 128. `nsplit` is the partial buffer's split stride.
extern "C" __global__ void __launch_bounds__(128) attention_combine(
    bf16* __restrict__ out, const float* __restrict__ partial, const u32* __restrict__ positions,
    u32 heads, u32 hd, u32 nsplit) {
    const u32 r = blockIdx.x, h = blockIdx.y;
    const u32 n = positions[r] + 1;
    const u32 nz = (n + SPLIT - 1) / SPLIT;
    if (nz == 1) return;
    const float* part = partial + ((u64)r * heads + h) * nsplit * (hd + 2);
    float mm = part[0];
    for (u32 z = 1; z < nz; z++) mm = fmaxf(mm, part[z * (hd + 2)]);
    float ll = 0.0f;
    for (u32 z = 0; z < nz; z++) ll += part[z * (hd + 2) + 1] * expf(part[z * (hd + 2)] - mm);
    for (u32 d = threadIdx.x; d < hd; d += blockDim.x) {
        float od = 0.0f;
        for (u32 z = 0; z < nz; z++) od += part[z * (hd + 2) + 2 + d] * expf(part[z * (hd + 2)] - mm);
        out[((u64)r * heads + h) * hd + d] = f2bf(od / ll);
    }
}
