// embed: out[r] = table[tokens[r]] (bf16 table rows copied exactly).
// grid: rows; block: 256. The host checked every token against the table's rows.
extern "C" __global__ void __launch_bounds__(256) embed(
    const bf16* __restrict__ table, const u32* __restrict__ tokens, void* out, int out_f32, u32 k) {
    pdl_wait();
    pdl_launch();
    const u64 r = blockIdx.x;
    const bf16* src = table + (u64)tokens[r] * k;
    for (u32 c = threadIdx.x; c < k; c += blockDim.x) st_act(out, r * k + c, out_f32, bf2f(src[c]));
}
