#!/usr/bin/env bash
# Downloads, on the CPU machine, the Python wheels the GPU machine lacks for the serving
# benchmarks (tools/bench_concurrent.py talks to the server through the `openai` client): CPython
# 3.12 x86-64 wheels into <repo>/.whl (git-ignored), to be carried with the device tool's
# `carry: [".whl"]`. receipt.sh's conc/serve/s11ab stages install them with pip --no-index.
# Pinned to versions whose needs the GPU image already meets (httpx, anyio, tqdm and
# typing-extensions are there; openai 3.x would need httpx2).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$repo/.whl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$repo/.whl" openai==1.99.9 distro==1.9.0 jiter==0.10.0 pydantic==2.11.7 \
  pydantic_core==2.33.2 annotated_types==0.8.0 typing_inspection==0.4.1 sniffio==1.3.1
ls "$repo/.whl"
