// rope in place: per pair (x1, x2) at the row's absolute position, with the bf16 table row
// (cos of the head_dim/2 frequencies, then their sin):
//   y1 = bf16(bf16(x1*c) + bf16(-x2*s)), y2 = bf16(bf16(x2*c) + bf16(x1*s)).
// Products of two bf16 values are exact in f32, so this matches the CPU backend bit for bit.
// Pairs: Neox (i, i + half), Interleaved (2i, 2i + 1). grid: rows; block: 256; each thread
// owns whole pairs, so the in-place update has no races.
extern "C" __global__ void __launch_bounds__(256) rope(
    void* x, int x_f32, const bf16* __restrict__ table, const u32* __restrict__ positions,
    u32 heads, u32 hd, int interleaved) {
    pdl_wait();
    pdl_launch();
    const u32 r = blockIdx.x, half = hd / 2;
    const bf16* t = table + (u64)positions[r] * hd;
    const u64 base = (u64)r * heads * hd;
    for (u32 idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
        const u32 h = idx / half, i = idx % half;
        const float c = bf2f(t[i]), s = bf2f(t[half + i]);
        const u64 i1 = base + (u64)h * hd + (interleaved ? 2 * i : i);
        const u64 i2 = base + (u64)h * hd + (interleaved ? 2 * i + 1 : half + i);
        const float x1 = ld_act(x, i1, x_f32), x2 = ld_act(x, i2, x_f32);
        const float y1 = rbf(rbf(x1 * c) + rbf(-x2 * s));
        const float y2 = rbf(rbf(x2 * c) + rbf(x1 * s));
        st_act(x, i1, x_f32, y1);
        st_act(x, i2, x_f32, y2);
    }
}

// rope_kv_store: the decode layer's rope of q (heads) and k (kvh heads) in place, then k (as
// rotated) and v stored into the row's slot of the paged pool, in one launch. Per pair the
// formula of `rope` above; the pool layout and slot of `kv_store` (kv.cu): the stored k is
// the rotated value's bf16 bits, as kv_store would copy them; v goes through kv_store's
// f2bf(bf2f(.)) (a signalling NaN comes out quiet there too). bf16 activations only (the
// host checks). grid: (rows, parts); block: 256; each thread owns whole pairs and whole v
// elements (the parts only spread them over more CTAs).
extern "C" __global__ void __launch_bounds__(256) rope_kv_store(
    bf16* q, bf16* k, const bf16* __restrict__ v, const bf16* __restrict__ table,
    const u32* __restrict__ positions, u32 heads, u32 kvh, u32 hd, int interleaved,
    bf16* __restrict__ pool, const u32* __restrict__ row_table, const u32* __restrict__ tables,
    u32 bstride, u32 loff, u32 bs) {
    pdl_wait();
    pdl_launch();
    const u32 r = blockIdx.x, half = hd / 2;
    const u32 pos = positions[r];
    const bf16* t = table + (u64)pos * hd;
    const u64 blk = tables[row_table[r] + pos / bs];
    const u32 slot = pos % bs;
    const u64 plane = (u64)kvh * bs * hd;
    const u64 kp = (blk * bstride + loff) * 2 * plane;  // kv.cu's layout
    const u32 first = blockIdx.y * blockDim.x, step = gridDim.y * blockDim.x;
    for (u32 idx = first + threadIdx.x; idx < (heads + kvh) * half; idx += step) {
        const u32 h = idx / half, i = idx % half;
        const bool is_k = h >= heads;
        const u32 hh = is_k ? h - heads : h;
        bf16* x = is_k ? k + (u64)r * kvh * hd : q + (u64)r * heads * hd;
        const float c = bf2f(t[i]), s = bf2f(t[half + i]);
        const u32 d1 = interleaved ? 2 * i : i, d2 = interleaved ? 2 * i + 1 : half + i;
        const u64 i1 = (u64)hh * hd + d1, i2 = (u64)hh * hd + d2;
        const float x1 = bf2f(x[i1]), x2 = bf2f(x[i2]);
        const bf16 y1 = f2bf(rbf(rbf(x1 * c) + rbf(-x2 * s)));
        const bf16 y2 = f2bf(rbf(rbf(x2 * c) + rbf(x1 * s)));
        x[i1] = y1;
        x[i2] = y2;
        if (is_k) {
            pool[kp + ((u64)hh * bs + slot) * hd + d1] = y1;
            pool[kp + ((u64)hh * bs + slot) * hd + d2] = y2;
        }
    }
    const u32 width = kvh * hd;
    for (u32 i = first + threadIdx.x; i < width; i += step) {
        const u32 g = i / hd, d = i % hd;
        pool[kp + plane + ((u64)g * bs + slot) * hd + d] = f2bf(bf2f(v[(u64)r * width + i]));
    }
}
