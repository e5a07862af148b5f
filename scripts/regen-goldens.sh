#!/usr/bin/env bash
# Regenerates the committed greedy goldens (tests/fixtures/golden/{gguf,bf16}.json) of the test
# model and of its bf16 export, with the binary built from this tree (CPU backend).
#
# It is crates/cli/tests/goldens.rs run in regeneration mode: the same code that checks the
# goldens writes them, from `tensorfold golden` on tests/fixtures/golden/prompts.json. A
# checkpoint's file is rewritten only when every difference from the committed goldens is
# declared in tests/fixtures/golden/DECLARED.json (old sha -> new sha, with a reason); an
# undeclared difference prints the entry to add and fails. New prompts need no declaration.
# The bf16 export is made on the fly (`tensorfold export`) in a temporary directory.
#
#   scripts/regen-goldens.sh            # then review `git diff tests/fixtures/golden`
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/fetch-model.sh >/dev/null
TENSORFOLD_REGEN_GOLDENS=1 cargo test --locked -p tensorfold --test goldens \
  goldens_are_byte_exact -- --exact --nocapture
