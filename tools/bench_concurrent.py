#!/usr/bin/env python3
"""Aggregate decode throughput at several concurrency levels, with every reply's token ids
compared against the same request alone (a separate server with one lane and no prompt cache)
and sent serially (the same server, one request at a time).

    python3 tools/bench_concurrent.py --levels 1,2,4,8 --alone --serial [--max-tokens 64]

Prints per level: requests, completion tokens, wall seconds, aggregate tok/s; then
`equal k/k` for each comparison. Exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, served_model  # noqa: E402

MODEL = ["default"]  # the served model id, set once a server is up

TOPICS = ["the sea", "mountains", "a city at night", "autumn", "a library", "trains", "bread", "the moon",
          "rain", "a garden", "chess", "winter", "bees", "a lighthouse", "coffee", "rivers"]


def requests(n: int) -> list[dict]:
    out = []
    for i in range(n):
        sampled = i % 2 == 1
        out.append({
            "messages": [{"role": "user", "content": f"Write a short paragraph about {TOPICS[i % len(TOPICS)]}."}],
            "temperature": 0.8 if sampled else 0.0,
            "top_p": 0.95 if sampled else 1.0,
            "seed": 1234 + i,
        })
    return out


def send(client, req: dict, max_tokens: int) -> tuple[list[int], int]:
    r = client.chat.completions.create(model=MODEL[0], max_tokens=max_tokens,
                                       extra_body={"return_token_ids": True}, **req)
    ids = r.choices[0].model_extra.get("token_ids") if r.choices[0].model_extra else None
    if ids is None:
        raise SystemExit("the server did not return token_ids")
    return list(ids), r.usage.completion_tokens


def run_level(client, reqs: list[dict], max_tokens: int) -> tuple[list[list[int]], int, float]:
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(len(reqs)) as ex:
        res = list(ex.map(lambda q: send(client, q, max_tokens), reqs))
    dt = time.perf_counter() - t0
    return [r[0] for r in res], sum(r[1] for r in res), dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--alone", action="store_true", help="compare with a one-lane, cache-less server")
    ap.add_argument("--serial", action="store_true", help="compare with the same requests sent one by one")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default=None)
    ap.add_argument("--serve-args", default="", help="extra flags for serve, e.g. '--device cuda'")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    extra = a.serve_args.split()
    top = max(levels)
    reqs = requests(top)
    results = {}
    rates = {}
    with Server(["--parallel", str(top)] + extra, model=a.model) as s:
        MODEL[0] = s.model_id
        client = s.client(timeout=600)
        send(client, reqs[0], 4)  # warm up
        for lv in levels:
            ids, toks, dt = run_level(client, reqs[:lv], a.max_tokens)
            results[lv] = ids
            rates[lv] = toks / dt
            print(f"level {lv:3d}: {lv} requests, {toks} tokens in {dt:6.2f} s = {toks / dt:8.1f} tok/s aggregate", flush=True)
        serial = [send(client, q, a.max_tokens)[0] for q in reqs] if a.serial else None
    alone = None
    if a.alone:
        with Server(["--parallel", "1", "--prompt-cache-gib", "0"] + extra, model=a.model) as s1:
            c1 = s1.client(timeout=600)
            alone = [send(c1, q, a.max_tokens)[0] for q in reqs]
    ok = True
    for name, ref in (("alone", alone), ("serial", serial)):
        if ref is None:
            continue
        total = sum(len(v) for v in results.values())
        equal = sum(1 for lv, ids in results.items() for i, x in enumerate(ids) if x == ref[i])
        print(f"vs {name}: equal {equal}/{total}")
        ok &= equal == total
    if 1 in rates and top > 1:
        print(f"aggregate level {top} / level 1: {rates[top] / rates[1]:.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
