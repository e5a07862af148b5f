#!/usr/bin/env python3
"""Read bandwidth of the decode products' weight-load pattern (tools/gpu/loadbw.cu) on the
shapes of llama3-8b and the 33B geometry, beside a copy: the measurement behind linear.cu's
`TF_L2_128` (session 20, docs/bench/2026-12-04-h200.md).

    python3 tools/gpu/loadbw.py --build OUT.cubin   # on the CPU machine: NVRTC from the pip
                                                    # wheel (scripts/nvrtc-wheels.sh), sm_90a
    python3 tools/gpu/loadbw.py OUT.cubin           # on the GPU machine: PyTorch + libcuda

Each kernel runs 3 warm-ups and 20 timed launches (CUDA events) over rotating copies of the
matrix, so no launch finds its weights in L2. Prints one line per (shape, kernel): MB, us,
TB/s: first loadbw.cu's group kernels (a CTA's 8 warps on 8 units, buffers running on across
a warp's units), launched a group a CTA and persistent, with their registers a thread and
CTAs an SM; then the unit kernels, some of them held to 2 or 1 CTAs an SM (the decode
entries' occupancy) and rd_8_4_1 under preferred shared-memory carveouts. Session 25 (H200):
the L1 part bounds the loads in flight (8B gate/up rd_8_4_1 4.16 TB/s at carveout 0 or 50%,
3.23 at 100%, as held to 2 an SM by shared memory, 3.20), and a group a CTA held to 2 an SM
by registers reads as fast as the unheld kernels (g_8_4_1_ep 4.13). Prints only; asserts
nothing about speed.
"""
import ctypes
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = ["rd_8_4_0", "rd_8_4_1", "rd_8_4_2", "rd_8_4_3", "rd_4_4_0", "rd_4_4_1", "rd_2_4_0",
           "rd_8_2_1", "rd_8_8_1", "rd_flat"]
# The same kernels held to fewer CTAs an SM by unused dynamic shared memory: the decode
# entries' registers (~120 a thread) allow 2 CTAs of 256 threads, these kernels' (~80) 3.
# Then rd_8_4_1 unheld with a preferred shared-memory carveout (percent): 100 leaves the SM
# ~28 KB of L1 (what a 2/SM hold by shared memory leaves), 0 the most; does the L1 part bound
# the loads in flight? (kernel, bytes, label, carveout; -1 the driver's default)
HELD = [("rd_8_4_0", 100 << 10, "2/SM", -1), ("rd_8_4_1", 100 << 10, "2/SM", -1),
        ("rd_8_4_1", 150 << 10, "1/SM", -1), ("rd_4_4_1", 100 << 10, "2/SM", -1),
        ("rd_8_4_1", 0, "co0", 0), ("rd_8_4_1", 0, "co50", 50), ("rd_8_4_1", 0, "co100", 100)]
# loadbw.cu's group kernels (8 units a CTA, a warp's buffers running on across its units):
# launched a group a CTA ("1g") and persistent, as many CTAs as fit ("pers"). _e: the slice
# combine's barrier a unit; _p: held to 2 CTAs an SM by registers, as the decode entries.
GROUPED = ["g_8_4_1", "g_8_4_1_e", "g_8_4_1_p", "g_8_4_1_ep", "g_4_4_1_ep"]
MAX_DYN_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
# name: (rows, k, slices), the slices linear::k_split gives the shape.
SHAPES = {"8B gate/up": (28672, 4096, 4), "8B gate/up s1": (28672, 4096, 1),
          "8B o": (4096, 4096, 8), "8B q/k/v": (6144, 4096, 8),
          "33B gate/up": (44032, 7168, 2), "33B down": (7168, 22016, 8)}
POOL = 640 << 20


def build(out: str, name: str = "loadbw.cu", common: bool = False) -> int:
    """Compiles tools/gpu/`name` for sm_90a into the cubin `out` (NVRTC, no GPU); `common`:
    with the backend's kernels/common.cuh prepended, as the backend compiles its kernels."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from kernel_regs import compile_unit, cubin_of, load_nvrtc

    lib = load_nvrtc()
    if lib is None:
        return 1
    src = b""
    if common:
        with open(os.path.join(ROOT, "crates/backend/kernels/common.cuh"), "rb") as f:
            src = f.read() + b"\n"
    with open(os.path.join(ROOT, "tools/gpu", name), "rb") as f:
        src += f.read()
    rc, log, prog = compile_unit(lib, src, name.encode(), [b"--gpu-architecture=sm_90a", b"--std=c++17"])
    if rc != 0:
        print(log, file=sys.stderr)
        return 1
    with open(out, "wb") as f:
        f.write(cubin_of(lib, prog))
    return 0


def run(path: str) -> int:
    import torch

    cu = ctypes.CDLL("libcuda.so.1")
    torch.zeros(1, device="cuda")  # the primary context, current on this thread
    mod = ctypes.c_void_p()
    with open(path, "rb") as f:
        assert cu.cuModuleLoadData(ctypes.byref(mod), f.read()) == 0, "cuModuleLoadData"
    pool = torch.randint(0, 255, (POOL,), dtype=torch.uint8, device="cuda")
    sink = torch.zeros(1 << 20, dtype=torch.int32, device="cuda")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def launch(fn, rowb, sliceb, nslices, units, off, smem=0, grid=0):
        vals = [ctypes.c_uint64(pool.data_ptr() + off), ctypes.c_uint32(rowb),
                ctypes.c_uint32(sliceb), ctypes.c_uint32(nslices), ctypes.c_uint32(units),
                ctypes.c_uint64(sink.data_ptr())]
        ptrs = (ctypes.c_void_p * 6)(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        rc = cu.cuLaunchKernel(fn, grid or (units + 7) // 8, 1, 1, 256, 1, 1, smem, stream, ptrs,
                               None)
        assert rc == 0, f"cuLaunchKernel: {rc}"

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    half = POOL // 2
    a, b = pool[:half], torch.empty(half, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        b.copy_(a)
    start.record()
    for _ in range(20):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    print(f"copy: {2 * half * 20 / start.elapsed_time(end) / 1e9:.2f} TB/s (read + write)")

    def timed(shape, n, k, slices, fn, tag, smem=0, grid=0):
        """3 warm-up and 20 timed launches of fn on the shape; prints one line."""
        rowb, total = 2 * k, 2 * n * k
        sliceb, units, copies = rowb // slices, (n // 16) * slices, POOL // total
        for i in range(3):
            launch(fn, rowb, sliceb, slices, units, (i % copies) * total, smem, grid)
        start.record()
        for i in range(20):
            launch(fn, rowb, sliceb, slices, units, (i % copies) * total, smem, grid)
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1000 / 20
        print(f"{shape:12s} {tag:26s} {total / 1e6:8.1f} MB {us:8.2f} us "
              f"{total / us / 1e6:5.2f} TB/s", flush=True)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for shape, (n, k, slices) in SHAPES.items():
        for name in GROUPED:
            fn = ctypes.c_void_p()
            assert cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == 0, name
            regs, per_sm = ctypes.c_int(), ctypes.c_int()
            assert cu.cuFuncGetAttribute(ctypes.byref(regs), 4, fn) == 0  # NUM_REGS
            assert cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(per_sm), fn, 256,
                                                                  ctypes.c_size_t(0)) == 0
            for label, grid in [("1g", 0), ("pers", per_sm.value * sms)]:
                tag = f"{name} {label} r{regs.value} {per_sm.value}/SM"
                timed(shape, n, k, slices, fn, tag, grid=grid)
    for shape, (n, k, slices) in SHAPES.items():
        for name, smem, label, co in [(kn, 0, "", -1) for kn in KERNELS] + HELD:
            fn = ctypes.c_void_p()
            assert cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == 0, name
            if smem:
                rc = cu.cuFuncSetAttribute(fn, MAX_DYN_SMEM, ctypes.c_int(smem))
                assert rc == 0, f"cuFuncSetAttribute: {rc}"
            rc = cu.cuFuncSetAttribute(fn, CARVEOUT, ctypes.c_int(co))
            assert rc == 0, f"cuFuncSetAttribute carveout: {rc}"
            timed(shape, n, k, slices, fn, name + (" " + label if label else ""), smem=smem)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--build":
        sys.exit(build(sys.argv[2]))
    if len(sys.argv) == 2 and not sys.argv[1].startswith("-"):
        sys.exit(run(sys.argv[1]))
    print(__doc__)
    sys.exit(2)
