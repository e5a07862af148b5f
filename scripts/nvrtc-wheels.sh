#!/usr/bin/env bash
# Installs NVRTC from NVIDIA's pip wheels, so kernels compile on a machine without the CUDA
# toolkit or a GPU (CI: crates/backend/tests/nvrtc_compile.rs). Prints the directory holding
# libnvrtc.so.13; the test finds it there by default, or via TENSORFOLD_NVRTC_LIB.
#
# Installs into $TENSORFOLD_CACHE/nvrtc (default <repo>/.cache/nvrtc). Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TENSORFOLD_CACHE:-$repo/.cache}"
dest="$cache/nvrtc"
# Pinned: the versions issue 5 names (CUDA 13.0, the GPU machine's driver generation).
wheels=(nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96)
lib="$dest/nvidia/cu13/lib"
if ! ls "$lib"/libnvrtc.so.13* >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dest" "${wheels[@]}" >&2
fi
found="$(dirname "$(find "$dest" -name 'libnvrtc.so.13*' | head -n1)")"
if [ -z "$found" ] || [ "$found" = "." ]; then
    echo "nvrtc-wheels.sh: libnvrtc.so.13 not found under $dest after install" >&2
    exit 1
fi
echo "$found"
