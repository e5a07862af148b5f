#!/usr/bin/env python3
"""Single-stream receipt through the official openai client: TTFT and decode tok/s per stream,
greedy and sampled, N repetitions, medians. Starts its own server unless --base-url is given.

    python3 tools/bench_openai.py [--reps 5] [--max-tokens 128] [--base-url http://127.0.0.1:8080]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, served_model  # noqa: E402

MODEL = ["default"]  # the served model id, set once a server is up


def one(client, sampled: bool, max_tokens: int, seed: int):
    t0 = time.perf_counter()
    first = None
    n = 0
    stream = client.chat.completions.create(
        model=MODEL[0], messages=[{"role": "user", "content": "Tell me a long story about a dragon."}],
        max_tokens=max_tokens, temperature=0.8 if sampled else 0.0, top_p=0.95 if sampled else 1.0, seed=seed,
        stream=True, stream_options={"include_usage": True})
    for ch in stream:
        if ch.usage:
            n = ch.usage.completion_tokens
        if ch.choices and ch.choices[0].delta.content and first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    first = first or end
    return first - t0, (n - 1) / max(end - first, 1e-9), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--base-url")
    ap.add_argument("--model")
    ap.add_argument("--serve-args", default="")
    a = ap.parse_args()
    ctx = contextlib.nullcontext() if a.base_url else Server(a.serve_args.split(), model=a.model)
    with ctx as s:
        import openai
        MODEL[0] = served_model(a.base_url) if a.base_url else s.model_id
        client = openai.OpenAI(base_url=a.base_url + "/v1", api_key="none") if a.base_url else s.client(timeout=600)
        one(client, False, 8, 0)
        for sampled in (False, True):
            ttfts, rates = [], []
            for r in range(a.reps):
                ttft, rate, n = one(client, sampled, a.max_tokens, 100 + r)
                ttfts.append(ttft)
                rates.append(rate)
                print(f"{'sampled' if sampled else 'greedy '} rep {r}: {n} tokens, TTFT {ttft * 1e3:7.1f} ms, "
                      f"decode {rate:7.1f} tok/s", flush=True)
            print(f"{'sampled' if sampled else 'greedy '} median: TTFT {statistics.median(ttfts) * 1e3:.1f} ms, "
                  f"decode {statistics.median(rates):.1f} tok/s per stream")
    return 0


if __name__ == "__main__":
    sys.exit(main())
