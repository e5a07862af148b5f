#!/usr/bin/env bash
# Runs every test of tensorfold: formatting, lints, unit and model tests, tool self-tests.
# The model tests need the test model, which this script fetches first (once).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/fetch-model.sh >/dev/null
# NVRTC from pip wheels, for crates/backend/tests/nvrtc_compile.rs (every kernel compiles for
# sm_80, sm_89 and sm_90a on this GPU-less machine).
scripts/nvrtc-wheels.sh >/dev/null
# The server tests drive it with the official openai client.
python3 -c "import openai" 2>/dev/null || python3 -m pip install --quiet "openai>=1.50" >&2
echo "== cargo fmt --check" >&2
cargo fmt --all -- --check
echo "== cargo clippy" >&2
cargo clippy --locked --workspace --all-targets -- -D warnings
echo "== cargo test" >&2
cargo test --locked --workspace
echo "== row-dependent fault build: windows and concurrent must fail" >&2
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/fault" \
  cargo test --locked -p tf-engine --features fault-row-dependent --test fault_build
echo "== tool self-tests" >&2
python3 tools/reference/compare_greedy.py --self-test
python3 tools/gpu/loadbw.py --build "${TMPDIR:-/tmp}/loadbw.cubin"  # the GPU tools' kernels compile
python3 tools/gpu/stepbw.py --build "${TMPDIR:-/tmp}/stepbw.cubin"
echo "== OpenAI-client conformance against a real tensorfold serve on loopback" >&2
TENSORFOLD_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/tensorfold" python3 tools/test_openai_conformance.py
echo "all tests passed" >&2
