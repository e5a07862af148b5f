#!/usr/bin/env bash
# Builds, on the CPU machine, everything tools/gpu/receipt.sh needs on the GPU machine (which
# has no cargo and no network), into the git-ignored .gpu/ and .whl/ that the device tool's
# `carry: [".gpu", ".whl"]` sends (64 MiB at most):
#   .gpu/tensorfold      the release binary, stripped
#   .gpu/tok/            tokenizer.json + tokenizer_config.json of the test model (synth's
#                        --tokenizer-from there)
#   .gpu/torch_peer.py   ../shared/peers/torch_peer.py (the PyTorch peer), when present
#   .gpu/cuda_wgmma      the wgmma test binary, stripped (receipt.sh's products stage)
#   .gpu/cuda_fused_rope the q/k/v + rope test binary, stripped (receipt.sh's rope stage)
#   .gpu/cuda_sample     the sampling test binary, stripped (receipt.sh's sample stage)
#   .gpu/cuda_fused      the fused-launch test binary, stripped (receipt.sh's wsab stage)
#   .gpu/cuda_ahead      the decode-ahead test binary, stripped (receipt.sh's ahead stage)
#   .gpu/loadbw.cubin    tools/gpu/loadbw.py's kernels for sm_90a (the loadbw stage)
#   .gpu/stepbw.cubin    tools/gpu/stepbw.py's kernels for sm_90a (the stepbw stage)
#   .whl/                openai and its deps for CPython 3.12 (tools/gpu/wheels.sh)
# Usage: tools/gpu/prepare.sh   (from anywhere; ~5 minutes on 2 cores after a warm build)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
mkdir -p .gpu
cargo build --release -p tensorfold
cp target/release/tensorfold .gpu/tensorfold
strip .gpu/tensorfold
if [ ! -f .gpu/tok/tokenizer.json ]; then
  gguf=$(scripts/fetch-model.sh)
  tmp=$(mktemp -d)
  target/release/tensorfold synth --like smollm2 --layers 1 --out "$tmp/smol" \
    --tokenizer-from "$gguf" >/dev/null
  mkdir -p .gpu/tok
  cp "$tmp/smol/tokenizer.json" "$tmp/smol/tokenizer_config.json" .gpu/tok/
  rm -rf "$tmp"
fi
peer="$repo/../shared/peers/torch_peer.py"
if [ -f "$peer" ]; then cp "$peer" .gpu/torch_peer.py; else echo "prepare: no $peer (peer stage)" >&2; fi
# A tf-backend test binary into .gpu/, stripped; its path is the one cargo prints for
# `--no-run`. cuda_wgmma: the products and wsab stages; cuda_fused_rope: rope; cuda_sample:
# sample; cuda_fused: wsab (q/k/v and gate/up in one launch); cuda_ahead: ahead.
test_bin() {
  local path
  path=$(cargo test --release -p tf-backend --test "$1" --no-run 2>&1 |
    sed -n "s/.*Executable .*(\(.*$1-[0-9a-f]*\)).*/\1/p" | tail -1)
  cp "$path" ".gpu/$1"
  strip ".gpu/$1"
}
for t in cuda_wgmma cuda_fused_rope cuda_sample cuda_fused cuda_ahead; do test_bin "$t"; done
scripts/nvrtc-wheels.sh >/dev/null
python3 tools/gpu/loadbw.py --build .gpu/loadbw.cubin
python3 tools/gpu/stepbw.py --build .gpu/stepbw.cubin
[ -n "$(ls .whl/*.whl 2>/dev/null)" ] || tools/gpu/wheels.sh >/dev/null
du -shc .gpu .whl
git log -1 --format='prepare: built from %h (%s)' | cut -c1-100
