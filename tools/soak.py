#!/usr/bin/env python3
"""Soak receipt: one long chat beside continuous decoding streams, every reply checked alone.

A chat of `--turns` turns (each turn resends the whole conversation: the previous replies and a
new user message, so each turn resumes from the prompt cache) runs on a server with
`--parallel 5` while 4 background workers keep streaming requests without pause. Turns
alternate greedy and seeded sampling. Then every turn's request is replayed alone, one at a
time, on a fresh server with one lane and no prompt cache, and its token ids must equal the
soak's. The background streams repeat a few fixed requests; every repeat must give the same
token ids as the first (the batch mix around them changes all the time).

Prints counts (turns, failures, background streams, cached tokens, equal k/k) and PASS/FAIL;
exits 1 on any failure or difference.

    python3 tools/soak.py [--turns 60] [--max-tokens 16] [--replay-cache]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server  # noqa: E402

QUESTIONS = ["Tell me about {}.", "Why is {} interesting?", "Give one fact about {}.",
             "Describe {} in one sentence.", "What would a child ask about {}?"]
TOPICS = ["the sea", "mountains", "bees", "trains", "bread", "the moon", "rain", "chess", "rivers",
          "a lighthouse", "coffee", "winter", "libraries"]
BACKGROUND = [
    {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "temperature": 0},
    {"messages": [{"role": "user", "content": "Explain how a bicycle works."}], "temperature": 0.9,
     "top_p": 0.95, "seed": 7},
    {"messages": [{"role": "user", "content": "List some colours and describe each."}], "temperature": 0.7,
     "seed": 99},
]


def turn_request(t: int) -> dict:
    """Sampling of turn `t`: greedy on even turns, seeded on odd ones."""
    if t % 2 == 0:
        return {"temperature": 0}
    return {"temperature": 0.8, "top_p": 0.95, "seed": 1000 + t}


class Api:
    def __init__(self, server: Server):
        self.base = server.base
        self.model = server.model_id
        self.http = httpx.Client(timeout=900)

    def complete(self, body: dict) -> dict:
        r = self.http.post(self.base + "/v1/chat/completions",
                           json={"model": self.model, "return_token_ids": True, **body})
        if r.status_code != 200:
            raise RuntimeError(f"status {r.status_code}: {r.text[:200]}")
        return r.json()

    def stream(self, body: dict) -> list[int]:
        """A streamed request's token ids; raises unless it ends with a finish reason and [DONE]."""
        ids, finish, done = [], None, False
        payload = {"model": self.model, "return_token_ids": True, "stream": True, **body}
        with httpx.Client(timeout=900) as c, c.stream("POST", self.base + "/v1/chat/completions",
                                                        json=payload) as r:
            if r.status_code != 200:
                raise RuntimeError(f"status {r.status_code}: {r.read()[:200]!r}")
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    ch = json.loads(line[6:])
                    if "error" in ch:
                        raise RuntimeError(f"stream error: {ch['error']}")
                    choice = (ch.get("choices") or [{}])[0]
                    ids += choice.get("token_ids") or []
                    finish = choice.get("finish_reason") or finish
        if not done or finish is None:
            raise RuntimeError(f"stream ended without finish/[DONE] (finish {finish}, done {done})")
        return ids


class Background:
    """Workers that stream the BACKGROUND requests round-robin until stopped."""

    def __init__(self, api: Api, workers: int, max_tokens: int):
        self.api, self.max_tokens = api, max_tokens
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done = 0
        self.failures: list[str] = []
        self.first: dict[int, list[int]] = {}
        self.repeats = 0
        self.repeats_equal = 0
        self.threads = [threading.Thread(target=self.work, args=(w,)) for w in range(workers)]

    def work(self, w: int) -> None:
        k = w
        while not self.stop.is_set():
            q = k % len(BACKGROUND)
            k += 1
            try:
                ids = self.api.stream({**BACKGROUND[q], "max_tokens": self.max_tokens})
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                with self.lock:
                    self.failures.append(f"{type(e).__name__}: {e}")
                continue
            with self.lock:
                self.done += 1
                if q in self.first:
                    self.repeats += 1
                    self.repeats_equal += ids == self.first[q]
                else:
                    self.first[q] = ids

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=16, help="per chat turn")
    ap.add_argument("--background-tokens", type=int, default=48)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--replay-cache", action="store_true",
                    help="replay on a fresh server with the prompt cache on (faster; default: off)")
    a = ap.parse_args()
    ctx = ["--context", "4096"]
    messages = [{"role": "system", "content": "You are a concise assistant."}]
    turns: list[tuple[dict, list[int]]] = []
    chat_failures: list[str] = []
    cached = []
    t0 = time.perf_counter()
    with Server(["--parallel", str(a.workers + 1)] + ctx) as s:
        api = Api(s)
        with Background(api, a.workers, a.background_tokens) as bg:
            time.sleep(1.0)  # the streams are running before the chat starts
            for t in range(a.turns):
                q = QUESTIONS[t % len(QUESTIONS)].format(TOPICS[t % len(TOPICS)])
                messages.append({"role": "user", "content": q})
                body = {"messages": list(messages), "max_tokens": a.max_tokens, **turn_request(t)}
                try:
                    r = api.complete(body)
                except Exception as e:  # noqa: BLE001
                    chat_failures.append(f"turn {t + 1}: {e}")
                    break
                ch = r["choices"][0]
                turns.append((body, list(ch["token_ids"])))
                details = r["usage"].get("prompt_tokens_details") or {}
                cached.append((r["usage"]["prompt_tokens"], details.get("cached_tokens", 0)))
                messages.append({"role": "assistant", "content": ch["message"]["content"]})
                if (t + 1) % 10 == 0:
                    print(f"turn {t + 1}: prompt {cached[-1][0]} tokens, {cached[-1][1]} cached; "
                          f"background streams done {bg.done}, failures {len(bg.failures)}", flush=True)
        bg_done, bg_fail, reps, reps_eq = bg.done, bg.failures, bg.repeats, bg.repeats_equal
    soak_s = time.perf_counter() - t0
    replay_args = ["--parallel", "1"] + ctx + ([] if a.replay_cache else ["--prompt-cache-gib", "0"])
    equal, diffs = 0, []
    with Server(replay_args) as fresh:
        api1 = Api(fresh)
        for t, (body, ids) in enumerate(turns):
            alone = list(api1.complete(body)["choices"][0]["token_ids"])
            if alone == ids:
                equal += 1
            else:
                diffs.append(t + 1)
    total_prompt = sum(p for p, _ in cached)
    total_cached = sum(c for _, c in cached)
    print(f"soak: {len(turns)}/{a.turns} turns in {soak_s:.0f} s, chat failures {len(chat_failures)}; "
          f"last prompt {cached[-1][0] if cached else 0} tokens")
    print(f"prompt cache: {total_cached}/{total_prompt} prompt tokens reused over the turns")
    print(f"background: {bg_done} streams completed by {a.workers} workers, failures {len(bg_fail)}; "
          f"repeats equal to the first {reps_eq}/{reps}")
    print(f"replay alone ({'cache on' if a.replay_cache else 'no prompt cache'}, one lane): "
          f"equal {equal}/{len(turns)}" + (f", different at turns {diffs}" if diffs else ""))
    for f in (chat_failures + bg_fail)[:5]:
        print("failure:", f)
    ok = (len(turns) == a.turns and not chat_failures and not bg_fail and equal == len(turns)
          and reps_eq == reps and bg_done > 0)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
