// Element-wise ops over flat ranges (grid-stride; block 256):
//   swiglu: out = bf16(bf16(silu(g)) * u), silu(g) = g / (1 + expf(-g));
//   add:    acc = bf16(acc + x) in place (f32 sum, one rounding).
// Each element depends on its own inputs only.
extern "C" __global__ void __launch_bounds__(256) swiglu(
    const void* g, int g_f32, const void* u, int u_f32, void* out, int out_f32, u64 n) {
    pdl_wait();
    pdl_launch();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float gv = ld_act(g, i, g_f32);
        const float s = rbf(gv / (1.0f + expf(-gv)));
        st_act(out, i, out_f32, s * ld_act(u, i, u_f32));
    }
}

extern "C" __global__ void __launch_bounds__(256) add(
    void* acc, int acc_f32, const void* x, int x_f32, u64 n) {
    pdl_wait();
    pdl_launch();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        st_act(acc, i, acc_f32, ld_act(acc, i, acc_f32) + ld_act(x, i, x_f32));
    }
}
