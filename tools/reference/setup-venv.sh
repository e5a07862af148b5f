#!/usr/bin/env bash
# Creates (idempotently) the Python venv used by the Hugging Face reference tools in
# tools/reference/: torch (CPU use only), transformers, gguf, numpy, safetensors,
# sentencepiece, tokenizers, accelerate (transformers needs it to load a GGUF). The venv
# lives at <repo>/.cache/venv-ref (or $TENSORFOLD_CACHE/venv-ref); .cache is git-ignored.
# Prints the venv's python path on stdout.
#
#   tools/reference/setup-venv.sh
#   TENSORFOLD_REF_PIN=1 tools/reference/setup-venv.sh   # install the versions recorded in README.md
#
# A venv whose marker file exists and whose imports succeed is kept as is.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${TENSORFOLD_CACHE:-$root/.cache}
venv=$cache/venv-ref
py=$venv/bin/python
marker=$venv/.tensorfold-ref-ok
pkgs=(torch transformers gguf numpy safetensors sentencepiece tokenizers accelerate)
pinned=(torch==2.15.0 transformers==5.24.0 gguf==0.19.0 numpy==2.4.6 safetensors==0.8.0
        sentencepiece==0.2.3 tokenizers==0.23.3 accelerate==1.15.0)
ok() { [ -f "$marker" ] && "$py" -c 'import torch, transformers, gguf, numpy, safetensors, sentencepiece, tokenizers, accelerate' 2>/dev/null; }
if ! ok; then
  mkdir -p "$cache"
  [ -x "$py" ] || python3 -m venv "$venv" >&2
  "$py" -m pip install --quiet --upgrade pip >&2
  if [ "${TENSORFOLD_REF_PIN:-0}" = 1 ]; then
    "$py" -m pip install --quiet "${pinned[@]}" >&2
  else
    "$py" -m pip install --quiet "${pkgs[@]}" >&2
  fi
  "$py" -c 'import torch, transformers, gguf, numpy, safetensors, sentencepiece, tokenizers, accelerate' >&2
  touch "$marker"
fi
echo "$py"
