#!/usr/bin/env python3
"""What one persistent launch a decode step would gain on weight streaming (tools/gpu/stepbw.cu):
llama3-8b's 32 layers of weights (q/k/v, o, gate/up, down) and its head, 15 GB, streamed in
decode order with the decode products' load pattern, as

  kernels      one launch a matrix (129 launches, in a CUDA graph), PDL as the engine's
               products (first buffer before the wait, the next launch allowed at once):
               persistent (2 CTAs an SM walking the groups) and a group a CTA
  step0        one persistent launch, no barriers: the stream's ceiling
  step1        one persistent launch, a grid barrier between matrices, nothing in flight
               across it
  step2        the same barriers, the next matrix's first two buffers issued before each
  ring0        one persistent launch, the weights through a ring of 6 shared-memory stages of
               32 KB that one producer warp fills by bulk copies (TMA), no barriers
  ring2        the same with step1's grid barriers: the producer runs on into the next
               matrix (up to 6 stages, 192 KB an SM, in flight) while the consumers wait
  ring2s3      ring2 with 3 stages a CTA and two CTAs an SM
  ring_pdl     a launch a matrix with PDL, as `kernels`, each a CTA an SM with a 3-stage ring
               (96 KB) whose producer streams before the wait: the next launch's CTA fits
               beside the current one, so its bytes are in flight through the boundary

each with no latency phase and with a latency phase after every q/k/v (attention, `--delay`
microseconds of one thread: a `spin` launch between the kernels, a held barrier in the step
kernels). Prints ms a step, TB/s, and the copy bandwidth of the same run.

    python3 tools/gpu/stepbw.py --build OUT.cubin   # CPU machine: NVRTC from the pip wheel
    python3 tools/gpu/stepbw.py OUT.cubin [--delay US ...]   # GPU machine: PyTorch + libcuda

Prints only; asserts nothing about speed.
"""
import ctypes
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# (rows, k, slices) of each product in a layer, as linear::k_split gives them; gate/up as
# one matrix of both weights' rows with the 14,336-row weights' 4 slices.
LAYER = [("qkv", 6144, 4096, 8), ("o", 4096, 4096, 8), ("gate/up", 28672, 4096, 4),
         ("down", 4096, 14336, 8)]
HEAD = ("head", 128256, 4096, 1)
LAYERS = 32
BUF = 256  # bytes of a row one buffer holds
# The ring kernels' stages (stepbw.cu's entries) and dynamic shared memory (its ring_smem).
RINGS = {"ring0": 6, "ring2": 6, "ring2s3": 3}
RING_PDL = 3  # ring_pdl's stages (a launch a matrix, a CTA an SM)


def ring_smem(stages: int) -> int:
    return stages * 32768 + 2 * stages * 8


class Mat(ctypes.Structure):
    _fields_ = [("w", ctypes.c_uint64), ("rowb", ctypes.c_uint32), ("sliceb", ctypes.c_uint32),
                ("nslices", ctypes.c_uint32), ("groups", ctypes.c_uint32),
                ("per", ctypes.c_uint32), ("delay", ctypes.c_uint32)]


class LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
                ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttr)), ("nattrs", ctypes.c_uint)]


def build(out: str) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import loadbw

    return loadbw.build(out, "stepbw.cu", common=True)


def run(path: str, delays_us) -> int:
    import torch

    cu = ctypes.CDLL("libcuda.so.1")
    torch.zeros(1, device="cuda")
    mod = ctypes.c_void_p()
    with open(path, "rb") as f:
        assert cu.cuModuleLoadData(ctypes.byref(mod), f.read()) == 0, "cuModuleLoadData"

    def fn(name):
        f = ctypes.c_void_p()
        assert cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()) == 0, name
        return f

    shapes = [s for _ in range(LAYERS) for s in LAYER] + [HEAD]
    total = sum(2 * n * k for _, n, k, _ in shapes)
    weights = torch.empty(total, dtype=torch.uint8, device="cuda")
    sink = torch.zeros(1 << 20, dtype=torch.int32, device="cuda")
    counters = torch.zeros(len(shapes), dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def mats(delay):
        arr, off = (Mat * len(shapes))(), 0
        for i, (name, n, k, sl) in enumerate(shapes):
            rowb = 2 * k
            arr[i] = Mat(weights.data_ptr() + off, rowb, rowb // sl, sl, (n // 16) * sl // 8,
                         rowb // sl // BUF, 1 if (delay and name == "qkv") else 0)
            off += 2 * n * k
        return arr

    # Device copies of the tables: all matrices (step kernels), with and without delays.
    def table(delay):
        a = mats(delay)
        t = torch.empty(ctypes.sizeof(a), dtype=torch.uint8, device="cuda")
        t.copy_(torch.frombuffer(bytearray(a), dtype=torch.uint8))
        return t

    tables = {d: table(d) for d in (False, True)}
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    pdl = LaunchAttr()
    pdl.id = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    pdl.value = (1).to_bytes(4, "little") + bytes(60)

    P, U = ctypes.c_uint64, ctypes.c_uint32

    def launch(f, grid, block, args, with_pdl, smem=0):
        """args: (ctypes type, value) pairs."""
        vals = [t(a) for t, a in args]
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                              for v in vals])
        cfg = LaunchConfig(grid, 1, 1, block, 1, 1, smem, stream,
                           ctypes.pointer(pdl) if with_pdl else None, 1 if with_pdl else 0)
        rc = cu.cuLaunchKernelEx(ctypes.byref(cfg), f, ptrs, None)
        assert rc == 0, f"cuLaunchKernelEx: {rc}"

    per_sm = ctypes.c_int()
    step_fns = {m: fn(f"step{m}") for m in range(3)}
    mat_fn, spin_fn = fn("mat_pdl"), fn("spin")
    assert cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(per_sm), step_fns[2], 256,
                                                          ctypes.c_size_t(0)) == 0
    regs = ctypes.c_int()
    assert cu.cuFuncGetAttribute(ctypes.byref(regs), 4, step_fns[2]) == 0
    grid = per_sm.value * sms
    print(f"step kernels: {regs.value} registers, {per_sm.value} CTAs an SM, grid {grid}; "
          f"{len(shapes)} matrices, {total / 1e9:.2f} GB a step")
    mat_size = ctypes.sizeof(Mat)
    rings = {}  # name: (function, grid, block, dynamic shared memory)
    for name, stages in RINGS.items():
        f, smem, per = fn(name), ring_smem(stages), ctypes.c_int()
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        assert cu.cuFuncSetAttribute(f, 8, smem) == 0, f"{name} shared memory"
        assert cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(per), f, 288,
                                                              ctypes.c_size_t(smem)) == 0
        rings[name] = (f, per.value * sms, 288, smem)
        print(f"{name}: {stages} stages of 32 KB, {per.value} CTAs an SM of 288 threads, "
              f"grid {per.value * sms}")

    def per_matrix(delay_ns, f=None, grid_of=lambda n, sl: grid, block=256, smem=0):
        """A launch a matrix with PDL (mat_pdl unless f), `spin` after each q/k/v."""
        t = tables[False].data_ptr()
        for i, (name, n, k, sl) in enumerate(shapes):
            launch(f or mat_fn, grid_of(n, sl), block,
                   [(P, t + i * mat_size), (U, 1), (P, counters.data_ptr()), (U, 0),
                    (P, sink.data_ptr())], True, smem)
            if delay_ns and name == "qkv":
                launch(spin_fn, 1, 32, [(U, delay_ns)], True)

    def one_launch(f, grid_f, block, smem, delay_ns):
        """One persistent launch over every matrix (its counters zeroed first)."""
        def go():
            counters.zero_()
            launch(f, grid_f, block, [(P, tables[delay_ns > 0].data_ptr()), (U, len(shapes)),
                                      (P, counters.data_ptr()), (U, delay_ns),
                                      (P, sink.data_ptr())], False, smem)
        return go

    def a_group_a_cta(n, sl):
        return (n // 16) * sl // 8

    pdl_ring, pdl_smem = fn("ring_pdl"), ring_smem(RING_PDL)
    assert cu.cuFuncSetAttribute(pdl_ring, 8, pdl_smem) == 0, "ring_pdl shared memory"

    def timed(label, body, reps=10, size=None):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            nonlocal stream
            old, stream = stream, ctypes.c_void_p(s.cuda_stream)
            body()
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                body()
            stream = old
        torch.cuda.current_stream().wait_stream(s)
        for _ in range(2):
            g.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / reps
        print(f"{label:48s} {ms:7.3f} ms  {(size or total) / ms / 1e9:5.2f} TB/s", flush=True)
        return ms

    half = 1 << 31
    a, b = weights[:half], torch.empty(half, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    copy = 2 * half * 20 / start.elapsed_time(end) / 1e9
    del b
    print(f"copy: {copy:.2f} TB/s (read + write); the step's bytes at that rate: "
          f"{total / copy / 1e9:.3f} ms")
    # Each shape alone: its 32 matrices (the head 8 times) back to back, persistent and a
    # group a CTA, so the launch form's cost shows by shape.
    for shape in [name for name, _, _, _ in LAYER] + [HEAD[0]]:
        idx = [i for i, sh in enumerate(shapes) if sh[0] == shape] * (8 if shape == "head" else 1)
        size = sum(2 * shapes[i][1] * shapes[i][2] for i in idx)
        t = tables[False].data_ptr()
        for one_group in (False, True):
            def body(one_group=one_group):
                for i in idx:
                    n, sl = shapes[i][1], shapes[i][3]
                    launch(mat_fn, (n // 16) * sl // 8 if one_group else grid, 256,
                           [(P, t + i * mat_size), (U, 1), (P, counters.data_ptr()), (U, 0),
                            (P, sink.data_ptr())], True)
            ms = timed(f"{shape} x{len(idx)}, " + ("a group a CTA" if one_group else "persistent"),
                       body, size=size)
            print(f"    {ms * 1000 / len(idx):.2f} us a matrix")
    for d in [0] + [int(x * 1000) for x in delays_us]:
        tag = f"delay {d / 1000:g} us after q/k/v"
        timed(f"kernels (PDL), {tag}", lambda: per_matrix(d))
        timed(f"kernels (PDL, a group a CTA), {tag}", lambda: per_matrix(d, grid_of=a_group_a_cta))
        for m in (0, 1, 2) if d == 0 else (1, 2):
            timed(f"step{m}, {tag}", one_launch(step_fns[m], grid, 256, 0, d))
        for name in RINGS if d == 0 else [r for r in RINGS if r != "ring0"]:
            timed(f"{name}, {tag}", one_launch(*rings[name], d))
        timed(f"ring_pdl (a launch a matrix, PDL), {tag}",
              lambda: per_matrix(d, pdl_ring, lambda n, sl: sms, 288, pdl_smem))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--build":
        sys.exit(build(sys.argv[2]))
    if len(sys.argv) >= 2 and not sys.argv[1].startswith("-"):
        ds = [float(x) for x in sys.argv[3:]] if len(sys.argv) > 3 and sys.argv[2] == "--delay" else [4.0, 8.0]
        sys.exit(run(sys.argv[1], ds))
    print(__doc__)
    sys.exit(2)
