// rope in place: per pair (x1, x2) at the row's absolute position, with the bf16 table row
// (cos of the head_dim/2 frequencies, then their sin):
//   y1 = bf16(bf16(x1*c) + bf16(-x2*s)), y2 = bf16(bf16(x2*c) + bf16(x1*s)).
// Products of two bf16 values are exact in f32, so this matches the CPU backend bit for bit.
// Pairs: Neox (i, i + half), Interleaved (2i, 2i + 1). grid: rows; block: 256; each thread
// owns whole pairs, so the in-place update has no races.
extern "C" __global__ void __launch_bounds__(256) rope(
    void* x, int x_f32, const bf16* __restrict__ table, const u32* __restrict__ positions,
    u32 heads, u32 hd, int interleaved) {
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
