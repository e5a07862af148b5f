#!/usr/bin/env bash
# Runs every test of tensorfold: formatting, lints, unit and model tests, tool self-tests.
# The model tests need the test model, which this script fetches first (once).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/fetch-model.sh >/dev/null
echo "== cargo fmt --check" >&2
cargo fmt --all -- --check
echo "== cargo clippy" >&2
cargo clippy --locked --workspace --all-targets -- -D warnings
echo "== cargo test" >&2
cargo test --locked --workspace
echo "== tool self-tests" >&2
python3 tools/reference/compare_greedy.py --self-test
echo "all tests passed" >&2
