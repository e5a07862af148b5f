#!/usr/bin/env python3
"""Greedy reference generations from Hugging Face transformers, with every step's top-2 logits.

Role: the reference side of tensorfold's greedy fidelity check. For each prompt (a list of chat
messages) it renders the chat template with add_generation_prompt=True, prefills the prompt in
one forward pass, then decodes one token at a time with the KV cache, choosing the argmax (lowest
id among equal maxima). At every generated step it records the top-2 token ids and their logits
and whether the two are within one bf16 step of each other (a near-tie, see refcommon.near_tie).
compare_greedy.py reads the output.

Invariants: CPU, a fixed thread count, no sampling, no logits processors (no repetition penalty,
no temperature): the logits recorded are the model's raw output in the model's dtype, written
as exact decimal floats. Generation stops after --max-new-tokens or after an end-of-sequence
token (which is kept in `tokens`), unless --ignore-eos.

Alternative rejected: `model.generate(output_logits=True)`: equivalent in the simple case, but it
applies whatever the checkpoint's generation config implies; the explicit loop states it all.

Output JSON:
  {model, dtype, attn, versions{torch, transformers, gguf}, max_new_tokens, eos_ids,
   prompts:[{messages, prompt_ids, tokens:[...], text, stop: "eos"|"length",
             steps:[{top:[[id, logit],[id, logit]], near_tie: bool}]}]}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import refcommon as rc


def top2(row) -> list[list]:
    """[[id, logit], [id, logit]]: the argmax, then the argmax of the rest (lowest id on ties)."""
    import torch

    first = int(torch.argmax(row))
    rest = row.clone()
    rest[first] = float("-inf")
    second = int(torch.argmax(rest))
    return [[first, float(row[first])], [second, float(row[second])]]


def greedy(
    model, prompt_ids: list[int], max_new: int, stop_ids: set[int]
) -> tuple[list, list, str]:
    """Greedy-decode up to max_new tokens; returns (tokens, steps, stop reason)."""
    import torch

    tokens, steps = [], []
    cache = None
    feed = torch.tensor([prompt_ids], dtype=torch.long)
    with torch.inference_mode():
        for _ in range(max_new):
            logits, cache = rc.forward(model, feed, cache, logits_to_keep=1)
            row = logits[0, -1]
            if not torch.isfinite(row).all():
                raise RuntimeError(f"non-finite logits at generated step {len(tokens)}")
            top = top2(row)
            steps.append({"top": top, "near_tie": rc.near_tie(top[0][1], top[1][1])})
            tok = top[0][0]
            tokens.append(tok)
            if tok in stop_ids:
                return tokens, steps, "eos"
            feed = torch.tensor([[tok]], dtype=torch.long)
    return tokens, steps, "length"


def load_prompts(path: Path) -> list[list[dict]]:
    data = json.loads(path.read_text())
    prompts = data["prompts"] if isinstance(data, dict) else data
    out = []
    for i, p in enumerate(prompts):
        msgs = p["messages"] if isinstance(p, dict) else p
        if not isinstance(msgs, list) or not all("role" in m and "content" in m for m in msgs):
            raise ValueError(f"{path}: prompt {i} is not a list of {{role, content}} messages")
        out.append(msgs)
    return out


def main() -> int:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", type=Path, help="HF checkpoint dir or .gguf file (default: test model)"
    )
    ap.add_argument("--dtype", choices=rc.DTYPES, default="bf16")
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    ap.add_argument("--prompts", type=Path, default=here / "prompts.json")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    rc.setup_torch(args.threads)
    model_path = args.model or rc.default_model()
    t0 = time.perf_counter()
    tok = rc.load_tokenizer(model_path)
    model = rc.load_model(model_path, args.dtype, args.attn)
    t_load = time.perf_counter() - t0
    stop = set() if args.ignore_eos else set(rc.eos_ids(model, tok))

    results = []
    t1 = time.perf_counter()
    for msgs in load_prompts(args.prompts):
        ids = rc.chat_ids(tok, msgs)
        tokens, steps, why = greedy(model, ids, args.max_new_tokens, stop)
        text = tok.decode(tokens, skip_special_tokens=True)
        results.append(
            {
                "messages": msgs,
                "prompt_ids": ids,
                "tokens": tokens,
                "text": text,
                "stop": why,
                "steps": steps,
            }
        )
        ties = sum(s["near_tie"] for s in steps)
        print(
            f"[{len(steps):2d} steps, {ties} near-ties] {msgs[-1]['content']!r} -> {text!r}",
            file=sys.stderr,
        )
    t_gen = time.perf_counter() - t1

    doc = {
        "model": model_path.name,
        "dtype": args.dtype,
        "attn": args.attn,
        "versions": rc.versions(),
        "max_new_tokens": args.max_new_tokens,
        "eos_ids": sorted(stop),
        "prompts": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"load {t_load:.1f}s, generate {t_gen:.1f}s; wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
