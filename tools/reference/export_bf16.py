#!/usr/bin/env python3
"""Export a GGUF, as transformers dequantizes it, to an HF-layout bf16 safetensors checkpoint.

Role: an independent cross-check of the engine's own GGUF -> bf16 derivation. transformers'
GGUF loader (gguf-py's numpy dequantization to float32, llama q/k rows un-permuted, one cast to
bf16) produces the weights; this script writes them with save_pretrained(safe_serialization=True)
together with the tokenizer (tokenizer.json + chat template) into --out. The output is not
committed; keep it under .cache/ (default: <cache>/ref/SmolLM2-135M-Instruct-bf16).

Invariants: the written checkpoint carries no quantization_config (it is a plain dense model);
with --verify (on by default) it is reloaded with transformers and every tensor must equal the
in-memory GGUF-derived tensor bit for bit, and the tokenizer must encode a chat prompt to the
same ids, else the script exits 1.

Alternative rejected: writing safetensors by hand from gguf-py: that would re-implement the very
derivation (names, permutation, tied embeddings) that this is meant to check independently.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import refcommon as rc


def strip_quantization(model) -> None:
    """Mark the dequantized model as a plain dense one so save_pretrained writes it as such."""
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    if getattr(model, "is_quantized", False):
        model.is_quantized = False
    cfg._name_or_path = ""


def verify(out: Path, model, tok, dtype: str) -> list[str]:
    """Reload `out` and list every difference from the in-memory model and tokenizer."""
    import torch

    problems = []
    again = rc.load_model(out, dtype, "sdpa")
    mine = dict(model.state_dict())
    theirs = dict(again.state_dict())
    if sorted(mine) != sorted(theirs):
        problems.append(f"tensor names differ: {sorted(set(mine) ^ set(theirs))[:10]}")
    for name in sorted(set(mine) & set(theirs)):
        a, b = mine[name], theirs[name]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            problems.append(
                f"tensor {name} differs after reload ({a.dtype}{tuple(a.shape)} vs "
                f"{b.dtype}{tuple(b.shape)})"
            )
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    tok2 = rc.load_tokenizer(out)
    if rc.chat_ids(tok, msgs) != rc.chat_ids(tok2, msgs):
        problems.append("the exported tokenizer encodes the chat prompt differently")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help=".gguf file (default: the test model)")
    ap.add_argument("--out", type=Path, help="output dir (default: <cache>/ref/<name>-bf16)")
    ap.add_argument("--dtype", choices=rc.DTYPES, default="bf16")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    rc.setup_torch(args.threads)
    src = args.model or rc.default_model()
    out = args.out or rc.cache_dir() / "ref" / f"{src.stem.split('.')[0]}-{args.dtype}"
    t0 = time.perf_counter()
    tok = rc.load_tokenizer(src)
    model = rc.load_model(src, args.dtype, "sdpa")
    strip_quantization(model)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if args.no_verify:
        return 0
    problems = verify(out, model, tok, args.dtype)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"verified: {len(model.state_dict())} tensors equal after reload; tokenizer agrees",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
