#!/usr/bin/env python3
"""Prompt-cache receipt: a multi-turn chat with a long first turn.

Turn 1 sends a long user message (~2,000 tokens); turn 2 resends the conversation (turn 1, the
assistant's reply, a new question). Prints the cold TTFT of turn 1, the resumed TTFT of turn 2
and its `cached_tokens`, and checks that turn 2's reply token ids equal those of a server
started with `--prompt-cache-gib 0` (resumed == fresh). Exits 1 on a difference.

    python3 tools/bench_cache.py [--words 1500] [--reps 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, served_model  # noqa: E402

MODEL = ["default"]  # the served model id, set once a server is up

SENTENCES = [
    "The harbour town woke slowly, its fishing boats knocking against the old stone quay.",
    "A baker carried trays of bread across the square while gulls argued over the crumbs.",
    "In the library on the hill, a clock that had not been wound for years began to tick again.",
    "Children raced paper boats along the gutter, cheering whenever one survived the drain.",
    "By noon the fog had lifted, and the lighthouse keeper counted ships on the horizon.",
]


def long_text(words: int, salt: int) -> str:
    out, n, i = [], 0, salt
    while n < words:
        s = SENTENCES[i % len(SENTENCES)] + f" (Note {i}.)"
        out.append(s)
        n += len(s.split())
        i += 1
    return " ".join(out)


def stream_ttft(client, messages, max_tokens):
    t0 = time.perf_counter()
    ttft, ids, usage = None, [], None
    stream = client.chat.completions.create(model=MODEL[0], messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True})
    for ch in stream:
        if ch.choices:
            extra = ch.choices[0].model_extra or {}
            if ttft is None and (ch.choices[0].delta.content or extra.get("token_ids")):
                ttft = time.perf_counter() - t0
            ids += list(extra.get("token_ids") or [])
        if ch.usage:
            usage = ch.usage
    return ttft, ids, usage


def conversation(client, words, salt, max_tokens):
    first = [{"role": "user", "content": "Read this and then answer questions.\n\n" + long_text(words, salt)}]
    t1, ids1, u1 = stream_ttft(client, first, max_tokens)
    reply = client.chat.completions.create(model=MODEL[0], messages=first, max_tokens=max_tokens, temperature=0)
    second = first + [{"role": "assistant", "content": reply.choices[0].message.content},
                      {"role": "user", "content": "What did the baker carry?"}]
    t2, ids2, u2 = stream_ttft(client, second, max_tokens)
    return t1, u1, t2, u2, ids2, second


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", type=int, default=1500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--model", default=None)
    ap.add_argument("--serve-args", default="")
    a = ap.parse_args()
    extra = a.serve_args.split()
    cold, warm, convs = [], [], []
    with Server(["--parallel", "2", "--context", "4096"] + extra, model=a.model) as s:
        MODEL[0] = s.model_id
        c = s.client(timeout=900)
        for r in range(a.reps):
            t1, u1, t2, u2, ids2, second = conversation(c, a.words, 17 * r, a.max_tokens)
            cached = u2.prompt_tokens_details.cached_tokens if u2 and u2.prompt_tokens_details else 0
            print(f"rep {r}: turn 1 {u1.prompt_tokens} prompt tokens, cold TTFT {t1 * 1e3:8.1f} ms | "
                  f"turn 2 {u2.prompt_tokens} prompt tokens, {cached} cached, resumed TTFT {t2 * 1e3:8.1f} ms",
                  flush=True)
            cold.append(t1)
            warm.append(t2)
            convs.append((second, ids2))
    with Server(["--parallel", "1", "--context", "4096", "--prompt-cache-gib", "0"] + extra, model=a.model) as s0:
        c0 = s0.client(timeout=900)
        equal = sum(1 for second, ids2 in convs if stream_ttft(c0, second, a.max_tokens)[1] == ids2)
    mc, mw = statistics.median(cold), statistics.median(warm)
    print(f"median cold TTFT {mc * 1e3:.1f} ms, resumed TTFT {mw * 1e3:.1f} ms = {100 * mw / mc:.1f}% of cold "
          f"(target <= 20%)")
    print(f"resumed == fresh (server without prompt cache): equal {equal}/{len(convs)}")
    return 0 if equal == len(convs) else 1


if __name__ == "__main__":
    sys.exit(main())
