#!/usr/bin/env python3
"""Check a `tensorfold synth` checkpoint with Hugging Face transformers, and compare its logits
with tensorfold's.

Role: the independent side of synth's verification. It loads the directory with
AutoTokenizer + AutoModelForCausalLM (bf16, CPU) and checks what a consumer relies on: every
parameter is bf16, len(tokenizer) == config.vocab_size == the embedding's rows, the chat
template renders, the padding tokens are special. It prints the greedy continuation of a chat
prompt with each step's top-2 logits and the first step's logit statistics (finite, spread, the
top-1 margin in bf16 steps), so a degenerate random model (all ties, overflow) is visible.

With --golden ENGINE.json (from `tensorfold golden -m DIR --prompts ...`) it teacher-forces each
of the engine's sequences (prompt_ids + tokens) through HF in one forward pass and compares, at
every generated step, the engine's top-2 logits with HF's logits for the same two ids:
max |difference| (absolute and in bf16 steps), and top-1 agreement. A step where HF's argmax is
not the engine's token must be a near-tie on both sides (refcommon.near_tie); anything else
is printed as a FLIP, and with --strict makes the exit status 1 (random-weight models are as
sensitive to rounding as real ones: HF's own bf16 and float32 runs of them agree on 88-97% of
top-1s, so a few wide flips between two bf16 implementations are expected; the figures say how
close the two are).

Alternative rejected: free-running HF greedy beside the engine's (hf_greedy.py +
compare_greedy.py do that; after the first near-tie flip the two runs see different contexts and
nothing more is compared). Teacher forcing compares every step.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import refcommon as rc

PAD_PREFIX = "<|synth_pad_"


def check_layout(model, tok) -> list[str]:
    """Problems with the checkpoint as transformers sees it (empty when fine)."""
    import torch

    problems = []
    rows = model.get_input_embeddings().weight.shape[0]
    if not (len(tok) == model.config.vocab_size == rows):
        problems.append(
            f"len(tokenizer) {len(tok)}, vocab_size {model.config.vocab_size}, "
            f"embedding rows {rows} differ"
        )
    wrong = [n for n, p in model.named_parameters() if p.dtype != torch.bfloat16]
    if wrong:
        problems.append(f"parameters not bf16: {wrong[:5]}")
    last = tok.convert_ids_to_tokens(len(tok) - 1)
    if last.startswith(PAD_PREFIX) and last not in tok.all_special_tokens:
        # transformers lists only named specials in all_special_tokens; check the decoder.
        added = tok.added_tokens_decoder.get(len(tok) - 1)
        if added is None or not added.special:
            problems.append(f"padding token {last!r} is not a special token")
    if tok.chat_template is None:
        problems.append("no chat template")
    return problems


def logit_stats(row) -> dict:
    import torch

    r = row.float()
    top = torch.topk(r, 2).values.tolist()
    return {
        "finite": bool(torch.isfinite(r).all()),
        "mean": float(r.mean()),
        "std": float(r.std()),
        "min": float(r.min()),
        "max": top[0],
        "margin_bf16_steps": (top[0] - top[1]) / rc.bf16_step(top[0]),
    }


def greedy(model, ids: list[int], n: int):
    """n greedy tokens with each step's top-2 [[id, logit], [id, logit]]; first step's row."""
    import torch

    cache, feed, out, first = None, torch.tensor([ids]), [], None
    with torch.inference_mode():
        for _ in range(n):
            logits, cache = rc.forward(model, feed, cache, logits_to_keep=1)
            row = logits[0, -1].float()
            first = row if first is None else first
            v, i = torch.topk(row, 2)
            out.append([[int(i[0]), float(v[0])], [int(i[1]), float(v[1])]])
            feed = torch.tensor([[int(i[0])]])
    return out, first


def compare_golden(model, golden: dict) -> tuple[dict, list[str]]:
    """Teacher-forced comparison of the engine's golden steps with HF's logits."""
    import torch

    worst, worst_steps, steps, agree, ties, failures = 0.0, 0.0, 0, 0, 0, []
    for pi, p in enumerate(golden["prompts"]):
        prompt, toks = p["prompt_ids"], p["tokens"]
        seq = prompt + toks
        with torch.inference_mode():
            logits, _ = rc.forward(model, torch.tensor([seq[:-1]]), None)
        for k, step in enumerate(p["steps"]):
            row = logits[0, len(prompt) - 1 + k].float()
            (e0, l0), (e1, l1) = step["top"]
            h0, h1 = float(row[e0]), float(row[e1])
            for e, h in ((l0, h0), (l1, h1)):
                d = abs(e - h)
                worst = max(worst, d)
                worst_steps = max(worst_steps, d / rc.bf16_step(max(abs(e), abs(h))))
            steps += 1
            hf_top = int(torch.argmax(row))
            if hf_top == e0:
                agree += 1
                continue
            hv = float(row[hf_top])
            # When HF's argmax is not among the engine's top-2, the engine's logit for it is
            # unknown: only HF's side can be judged.
            engine_tie = rc.near_tie(l0, l1) if hf_top == e1 else True
            if engine_tie and rc.near_tie(h0, hv):
                ties += 1
            else:
                failures.append(
                    f"prompt {pi} step {k}: engine {e0} ({l0}), HF {hf_top} ({hv}); "
                    f"HF gives the engine's token {h0}: not a near-tie"
                )
    summary = {
        "steps": steps,
        "top1_agree": agree,
        "near_tie_flips": ties,
        "max_abs_diff": worst,
        "max_diff_bf16_steps": worst_steps,
    }
    return summary, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="a tensorfold synth output directory")
    ap.add_argument("--prompt", default="What is the capital of France?")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--golden", type=Path, help="`tensorfold golden` JSON made on DIR")
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--strict", action="store_true", help="fail on a flip that is no near-tie")
    args = ap.parse_args()

    rc.setup_torch(args.threads)
    t0 = time.perf_counter()
    tok = rc.load_tokenizer(args.dir)
    t_tok = time.perf_counter() - t0
    model = rc.load_model(args.dir, "bf16", args.attn)
    t_load = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    print(
        f"loaded {args.dir}: {params / 1e6:.1f}M parameters, len(tokenizer) {len(tok)}, "
        f"tokenizer {t_tok:.1f}s, total {t_load:.1f}s"
    )
    problems = check_layout(model, tok)
    for p in problems:
        print(f"PROBLEM: {p}")

    ids = rc.chat_ids(tok, [{"role": "user", "content": args.prompt}])
    steps, first = greedy(model, ids, args.max_new_tokens)
    stats = logit_stats(first)
    print(f"prompt {len(ids)} tokens; first step logits: {json.dumps(stats)}")
    if not stats["finite"]:
        problems.append("non-finite logits")
    gen = [s[0][0] for s in steps]
    print(f"greedy ids: {gen}")
    print(f"greedy text: {tok.decode(gen, skip_special_tokens=False)!r}")
    for k, s in enumerate(steps):
        print(f"  step {k}: top {s}")

    if args.golden:
        summary, failures = compare_golden(model, json.loads(args.golden.read_text()))
        print(f"engine vs HF (teacher-forced): {json.dumps(summary)}")
        for f in failures:
            print(f"FLIP: {f}")
        if args.strict:
            problems += failures
    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
