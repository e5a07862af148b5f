// kv_store: writes each row's k and v (rows, kv_heads * head_dim) into its slot of the paged
// pool. Pool layout (shared with rope.cu, attention.cu and the host's read_kv): regions of a K
// plane then a V plane, each plane [kv_head][slot][dim] bf16 (`plane` elements); the region of
// (block b, layer) is b * bstride + loff, with (bstride, loff) from the host (`CudaKv::
// region`): (layers, layer) in the block-major layout, (1, layer * blocks) in the layer-major
// one. Position p of a row's sequence lives in block tables[row_table[r] + p / bs], slot
// p % bs.
// grid: rows; block: 256.
extern "C" __global__ void __launch_bounds__(256) kv_store(
    bf16* __restrict__ pool, const void* k, int k_f32, const void* v, int v_f32,
    const u32* __restrict__ positions, const u32* __restrict__ row_table,
    const u32* __restrict__ tables, u32 bstride, u32 loff, u32 kvh, u32 hd, u32 bs) {
    pdl_wait();
    pdl_launch();
    const u32 r = blockIdx.x;
    const u32 pos = positions[r];
    const u64 blk = tables[row_table[r] + pos / bs];
    const u32 slot = pos % bs;
    const u64 plane = (u64)kvh * bs * hd;
    const u64 kp = (blk * bstride + loff) * 2 * plane;
    const u32 width = kvh * hd;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
        const u32 g = i / hd, d = i % hd;
        const u64 at = kp + ((u64)g * bs + slot) * hd + d;
        pool[at] = f2bf(ld_act(k, (u64)r * width + i, k_f32));
        pool[at + plane] = f2bf(ld_act(v, (u64)r * width + i, v_f32));
    }
}
