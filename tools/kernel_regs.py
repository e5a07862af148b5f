#!/usr/bin/env python3
"""Registers, stack and shared memory of every entry point of a kernel family, from ptxas,
without a GPU: compiles the family's files under crates/backend/kernels (common.cuh
prepended, as the backend does; a family of two files, e.g. attention.cu attention_dec.cu,
names both in order) with NVRTC from the pip wheel that scripts/nvrtc-wheels.sh installs.

usage: tools/kernel_regs.py linear.cu [more.cu ...] [sm_90a] [--ptx=OUT.ptx] [--sass=OUT.sass]
       [-DNAME=VALUE ...]
-D passes a tuning knob as TENSORFOLD_KERNEL_DEFINES does (e.g. -DTF_SPLIT=64). The figures are the compiler's; occupancy and speed still need the GPU machine. --ptx writes
the unit's PTX (to compare two versions of a kernel: same PTX, same machine code). --sass
writes the machine code (nvdisasm of NVRTC's cubin; the disassembler comes from the pip wheel
nvidia-cuda-nvdisasm, fetched into the cache on first use): the same PTX up to register names
can still give other machine code (session 15: 15-18% slower linear_bf16_ws), so compare it
before spending a GPU call. Labels differ between builds; `sed -E 's/\.L_x_[0-9]+/L/g'` first.
"""
import ctypes
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("TENSORFOLD_CACHE", os.path.join(ROOT, ".cache"))
LIB_DIR = os.path.join(CACHE, "nvrtc/nvidia/cu13/lib")
NVDISASM_WHEEL = "nvidia-cuda-nvdisasm==13.2.51"


def nvdisasm() -> str:
    """The nvdisasm binary, from its pip wheel unpacked under the cache."""
    root = os.path.join(CACHE, "nvdisasm")
    found = glob.glob(os.path.join(root, "**/bin/nvdisasm"), recursive=True)
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--target", root, NVDISASM_WHEEL], check=True)
        found = glob.glob(os.path.join(root, "**/bin/nvdisasm"), recursive=True)
    os.chmod(found[0], 0o755)
    return found[0]


def load_nvrtc():
    """libnvrtc from the pip wheel (scripts/nvrtc-wheels.sh), or None with a message."""
    lib_path = os.path.join(LIB_DIR, "libnvrtc.so.13")
    if not os.path.exists(lib_path):
        print(f"no {lib_path}: run scripts/nvrtc-wheels.sh", file=sys.stderr)
        return None
    # libnvrtc loads its builtins library by name: preload it from the same directory.
    for name in sorted(os.listdir(LIB_DIR)):
        if name.startswith("libnvrtc-builtins.so"):
            ctypes.CDLL(os.path.join(LIB_DIR, name), mode=ctypes.RTLD_GLOBAL)
            break
    return ctypes.CDLL(lib_path)


def compile_unit(lib, src: bytes, name: bytes, opts: list):
    """Compiles one source with NVRTC: (rc, log text, program handle)."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, name, 0, None, None) != 0:
        return 1, "nvrtcCreateProgram failed", prog
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    return rc, log.value.decode(), prog


def cubin_of(lib, prog) -> bytes:
    """The machine code of a compiled program."""
    size = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    lib = load_nvrtc()
    if lib is None:
        return 1
    kernels = os.path.join(ROOT, "crates/backend/kernels")
    files = [a for a in sys.argv[1:] if a.endswith(".cu")]
    ptx_out = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--ptx=")]
    sass_out = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--sass=")]
    defines = [a.encode() for a in sys.argv[1:] if a.startswith("-D")]
    archs = [a for a in sys.argv[1:] if not a.endswith(".cu") and not a.startswith("-")]
    with open(os.path.join(kernels, "common.cuh")) as f:
        src = f.read() + "\n"
    for name in files:
        with open(os.path.join(kernels, name)) as f:
            src += f.read()
    arch = archs[0] if archs else "sm_90a"
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-Xptxas=-v"] + defines
    rc, log, prog = compile_unit(lib, src.encode(), b"k.cu", opts)
    size = ctypes.c_size_t()
    entry = None
    for line in log.splitlines():
        if "Compiling entry function" in line:
            entry = line.split("'")[1]
        elif "Used" in line and entry:
            print(f"{entry:36s} {line.split(':', 1)[1].strip()}")
        elif "error" in line.lower() or "warning" in line.lower() or "performance" in line.lower():
            print(line)
    if rc == 0 and ptx_out:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, ptx)
        with open(ptx_out[0], "wb") as f:
            f.write(ptx.value)
    if rc == 0 and sass_out:
        path = sass_out[0] + ".cubin"
        with open(path, "wb") as f:
            f.write(cubin_of(lib, prog))
        with open(sass_out[0], "w") as f:
            subprocess.run([nvdisasm(), "-c", path], stdout=f, check=True)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
