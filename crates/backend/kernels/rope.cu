//! rope in place: per pair (x1, x2) at the row's absolute position, with the bf16 table row
//! (cos of the head_dim/2 frequencies, then their sin):
//!   y1 = bf16(bf16(x1*c) + bf16(-x2*s)), y2 = bf16(bf16(x2*c) + bf16(x1*s)).
//! Products of two bf16 values are exact in f32, so this matches the CPU backend bit for bit.
//! Pairs: Neox (i, i + half), Interleaved (2i, 2i + 1). grid: rows; block: 256; each thread
//! owns whole pairs, so the in-place update has no races.
//!
//! rope_kv_store's 16-byte path (since 2026-12-02; head_dim % 16 == 0, 16-byte aligned
//! buffers): a thread owns a unit of 8 whole pairs, i = 8j..8j+7 of one head (Neox: the
//! chunks at i and half + i; interleaved: the two chunks at 2i), or 8 v elements, and issues
//! its four 16-byte loads (x, x, cos, sin) before any store; the host sizes the grid to one
//! unit a thread (448 units a llama3-8b row: 2 CTAs). The pair formula and the pool slot are
//! unchanged, so are the bits. Measured (H200, a 2,048-row llama3-8b call,
//! tests/cuda_norm_rope.rs, same run): 26.8 us (2.0 TB/s), was 48.3 us (1.1 TB/s) with 2-byte
//! accesses over 8 CTAs a row. Other
//! calls take the element path (`TF_VEC16=0` forces it, with the old 8 CTAs a row: an A/B of
//! one binary). `rope` itself keeps its element loop: the CUDA backend launches it only for
//! f32 activations (rope_kv_store covers bf16, the prefill's case).

#ifndef TF_VEC16
#define TF_VEC16 1
#endif
#ifndef TF_ROPE_EARLY
#define TF_ROPE_EARLY 0
#endif
// `trigger_first` (the host's: the attention after this launch takes the decode entries in
// split mode on sm_90, `attention::copies_early`): rope_kv_store lets the next kernel launch
// before its own wait, so the attention CTAs' early KV copies (attention_dec.cu's
// TF_DEC_EARLY: rows below the call's positions, final since the step began) start during the
// q/k/v product's tail instead of after it. Every kernel still waits for the one before it;
// speed only. H200 (session 19, bench decode, 3 alternated pairs, with the trigger then taken
// for every call): 206.6 vs 203.6 tok/s; check exact fingerprints unchanged. Other calls now
// trigger after the wait (a walk CTA can do nothing before its wait; launched early it only
// holds an SM's registers).
// TF_ROPE_TRIGGER=0 (a knob): never first.
#ifndef TF_ROPE_TRIGGER
#define TF_ROPE_TRIGGER 1
#endif

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

// bf16 j of 8 packed in a uint4, and its replacement.
__device__ __forceinline__ bf16 u8_get(const uint4& v, int j) {
    const u32 w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
    return (bf16)((j & 1) ? w >> 16 : w & 0xffffu);
}
__device__ __forceinline__ uint4 u8_pack(const bf16* h) {
    return make_uint4((u32)h[0] | ((u32)h[1] << 16), (u32)h[2] | ((u32)h[3] << 16),
                      (u32)h[4] | ((u32)h[5] << 16), (u32)h[6] | ((u32)h[7] << 16));
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
    u32 bstride, u32 loff, u32 bs, int trigger_first) {
    // TF_ROPE_EARLY=1: the row's position and block come from the step's metadata, which the
    // host wrote before the step's first kernel and no kernel writes, so they may be read
    // before the wait (as attention's DEC_EARLY does). Speed only; a measurement knob.
    const bool early_launch = TF_ROPE_TRIGGER && trigger_first;
    if (early_launch) pdl_launch();
    if (!TF_ROPE_EARLY) {
        pdl_wait();
        if (!early_launch) pdl_launch();
    }
    const u32 r = blockIdx.x, half = hd / 2;
    const u32 pos = positions[r];
    const bf16* t = table + (u64)pos * hd;
    const u64 blk = tables[row_table[r] + pos / bs];
    if (TF_ROPE_EARLY) {
        pdl_wait();
        if (!early_launch) pdl_launch();
    }
    const u32 slot = pos % bs;
    const u64 plane = (u64)kvh * bs * hd;
    const u64 kp = (blk * bstride + loff) * 2 * plane;  // kv.cu's layout
    const u32 first = blockIdx.y * blockDim.x, step = gridDim.y * blockDim.x;
    const bool vec = TF_VEC16 && hd % 16 == 0 &&
                     (((u64)q | (u64)k | (u64)v | (u64)table | (u64)pool) & 15) == 0;
    if (vec) {
        // Units: 8 pairs of a q or k head (half / 8 a head), then 8 v elements.
        const u32 per = half / 8, pair_units = (heads + kvh) * per;
        for (u32 u = first + threadIdx.x; u < pair_units + kvh * hd / 8; u += step) {
            if (u >= pair_units) {
                const u32 e = (u - pair_units) * 8, g = e / hd, d = e % hd;
                const uint4 x = *(const uint4*)(v + (u64)r * kvh * hd + e);
                bf16 o[8];
#pragma unroll
                for (int j = 0; j < 8; j++) o[j] = f2bf(bf2f(u8_get(x, j)));
                *(uint4*)(pool + kp + plane + ((u64)g * bs + slot) * hd + d) = u8_pack(o);
                continue;
            }
            const u32 h = u / per, i0 = (u % per) * 8;
            const bool is_k = h >= heads;
            const u32 hh = is_k ? h - heads : h;
            bf16* x = (is_k ? k + (u64)r * kvh * hd : q + (u64)r * heads * hd) + (u64)hh * hd;
            // Neox: x1 of pair i0 + j at i0 + j, x2 at half + i0 + j. Interleaved: pair
            // i0 + j at 2 (i0 + j), 2 (i0 + j) + 1: the 16 elements from 2 i0.
            const u32 e1 = interleaved ? 2 * i0 : i0, e2 = interleaved ? 2 * i0 + 8 : half + i0;
            const uint4 a = *(const uint4*)(x + e1), b = *(const uint4*)(x + e2);
            const uint4 cs = *(const uint4*)(t + i0), sn = *(const uint4*)(t + half + i0);
            bf16 ya[8], yb[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float c = bf2f(u8_get(cs, j)), s = bf2f(u8_get(sn, j));
                if (interleaved) {
                    const uint4& src = j < 4 ? a : b;
                    bf16* dst = j < 4 ? ya : yb;
                    const int m = 2 * (j & 3);
                    rope_pair(bf2f(u8_get(src, m)), bf2f(u8_get(src, m + 1)), c, s, dst[m],
                              dst[m + 1]);
                } else {
                    rope_pair(bf2f(u8_get(a, j)), bf2f(u8_get(b, j)), c, s, ya[j], yb[j]);
                }
            }
            const uint4 pa = u8_pack(ya), pb = u8_pack(yb);
            *(uint4*)(x + e1) = pa;
            *(uint4*)(x + e2) = pb;
            if (is_k) {
                bf16* dst = pool + kp + ((u64)hh * bs + slot) * hd;
                *(uint4*)(dst + e1) = pa;
                *(uint4*)(dst + e2) = pb;
            }
        }
        return;
    }
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
