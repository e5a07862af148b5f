#!/usr/bin/env python3
"""Cancellation receipt: 25 steps of clients that leave early against a real `tensorfold serve`,
then greedy probes that must equal the same probes on a fresh server.

Step kinds, mixed over the 25 steps:
  decode-drop     a stream closed after a few tokens (mid-decode)
  prefill-drop    a ~1,500-token prompt of its own streamed and closed before its first token
                  (mid-prompt; its computed blocks stay in the prompt cache)
  beside-probe    a stream closed mid-decode while a greedy probe runs beside it; the probe's
                  token ids must equal the same probe run alone before the steps
  too-long        a prompt + max_tokens past the context: must be a 400 with an OpenAI error
  nonstream-drop  a non-streaming request whose socket is closed mid-decode

After every step the server must settle: no request running or waiting, and every KV block
either free or held by the prompt cache (`kv_blocks_free + prompt_cache_blocks == kv_blocks`
in /metrics), i.e. no leaked lane. After the steps: all lanes run at once (full parallel), and
the greedy probes (fixed prompts, temperature 0, `return_token_ids`; one resumes the long
prompt the prefill-drops left in the prompt cache) equal their hashes from a second, fresh
server. Prints a per-step table and a final PASS/FAIL line; exits 1 on failure.

    python3 tools/test_cancel.py [--steps 25] [--parallel 4]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
import urllib.request

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server  # noqa: E402

CONTEXT = 2048
MAX_ROWS = 256  # rows per engine step: a prefill runs in chunks of this many tokens
DROP_MAX_TOKENS = 400  # max_tokens of the requests dropped mid-decode
KINDS = ["decode-drop", "prefill-drop", "beside-probe", "too-long", "nonstream-drop"]
PROBES = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]
SENTENCES = [
    "The harbour town woke slowly, its fishing boats knocking against the old stone quay.",
    "A baker carried trays of bread across the square while gulls argued over the crumbs.",
    "In the library on the hill, a clock that had not been wound for years began to tick again.",
    "Children raced paper boats along the gutter, cheering whenever one survived the drain.",
]


def long_text(words: int) -> str:
    out, n, i = [], 0, 0
    while n < words:
        s = SENTENCES[i % len(SENTENCES)] + f" (Note {i}.)"
        out.append(s)
        n += len(s.split())
        i += 1
    return " ".join(out)


BODY = long_text(1100)  # ~1,500 tokens: prefill takes a while


def long_prompt(i: int) -> str:
    """A long prompt of its own per step, so no step resumes another's prefill from the cache."""
    return f"Summarize text number {i}.\n\n" + BODY


TOO_LONG = "Summarize this.\n\n" + long_text(1800)  # over the 2,048-token context by itself


def chat(content: str, max_tokens: int, **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "return_token_ids": True, **kw}


class Client:
    """Raw HTTP against one server (httpx: a stream can be closed at any byte)."""

    def __init__(self, server: Server):
        self.s = server
        self.model = server.model_id

    def url(self, path: str) -> str:
        return self.s.base + path

    def complete(self, body: dict, timeout: float = 600) -> tuple[int, dict]:
        r = httpx.post(self.url("/v1/chat/completions"), json={"model": self.model, **body}, timeout=timeout)
        return r.status_code, r.json()

    def probe(self, content: str, max_tokens: int = 32) -> list[int]:
        return self.probe_usage(content, max_tokens)[0]

    def probe_usage(self, content: str, max_tokens: int) -> tuple[list[int], int]:
        """A greedy probe's token ids and its cached prompt tokens."""
        status, j = self.complete(chat(content, max_tokens))
        if status != 200:
            raise RuntimeError(f"probe failed with {status}: {j}")
        cached = (j["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return list(j["choices"][0]["token_ids"]), cached

    def stream_then_drop(self, body: dict, drop_after_tokens: int | None, silent_s: float | None,
                         started: threading.Event | None = None) -> tuple[int, float]:
        """Streams `body` and closes the connection after `drop_after_tokens` content tokens, or
        (prefill) once nothing has arrived for `silent_s` seconds after the role chunk; a token
        arriving first also ends it. Returns (tokens seen, seconds from the first byte)."""
        seen, t0 = 0, time.perf_counter()
        payload = {"model": self.model, "stream": True, **body}
        timeout = httpx.Timeout(600, read=silent_s) if silent_s is not None else httpx.Timeout(600)
        with httpx.Client(timeout=timeout) as c:
            with c.stream("POST", self.url("/v1/chat/completions"), json=payload) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"stream got {r.status_code}: {r.read()!r}")
                t0 = time.perf_counter()
                try:
                    for line in r.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        ch = json.loads(line[6:])
                        ids = (ch.get("choices") or [{}])[0].get("token_ids") or []
                        seen += len(ids)
                        if seen and started is not None:
                            started.set()
                        if seen and silent_s is not None:
                            break
                        if drop_after_tokens is not None and seen >= drop_after_tokens:
                            break
                except httpx.ReadTimeout:
                    if silent_s is None:
                        raise
                # Leaving both `with` blocks closes the connection mid-stream.
        return seen, time.perf_counter() - t0

    def nonstream_then_drop(self, body: dict, after_s: float) -> None:
        """Sends a non-streaming request on a raw socket and closes it after `after_s`."""
        data = json.dumps({"model": self.model, **body}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=30) as sock:
            sock.sendall(head + data)
            time.sleep(after_s)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url("/metrics"), timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def settle(self, timeout: float = 60) -> tuple[bool, float, str]:
        """Waits until nothing runs or waits and no block is leaked, in two readings 0.1 s
        apart with no engine step between them; (ok, seconds, detail)."""
        t0 = time.perf_counter()
        idle_steps = None
        while True:
            m = self.metrics()
            running, waiting = m["tensorfold_requests_running"], m["tensorfold_requests_waiting"]
            free, cached, total = (m["tensorfold_kv_blocks_free"], m["tensorfold_prompt_cache_blocks"],
                                   m["tensorfold_kv_blocks"])
            detail = f"run={running:.0f} wait={waiting:.0f} free+cached={free + cached:.0f}/{total:.0f}"
            steps = m["tensorfold_step_seconds_count"]
            if running == 0 and waiting == 0 and free + cached == total:
                if idle_steps == steps:
                    return True, time.perf_counter() - t0, detail
                idle_steps = steps
            else:
                idle_steps = None
            if time.perf_counter() - t0 > timeout:
                return False, time.perf_counter() - t0, detail
            time.sleep(0.1)


def digest(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def run_step(c: Client, i: int, kind: str, alone: dict[str, list[int]]) -> tuple[bool, str]:
    """One step; (ok, what happened)."""
    if kind == "decode-drop":
        n = 2 + (i * 7) % 13
        seen, dt = c.stream_then_drop(chat(f"Tell a long story, number {i}.", DROP_MAX_TOKENS), n, None)
        return seen >= n, f"dropped after {seen} tokens, {dt:.2f} s"
    if kind == "prefill-drop":
        after = [0.05, 0.2, 0.5][i % 3]
        seen, dt = c.stream_then_drop(chat(long_prompt(i), 64), None, after)
        return seen == 0, f"dropped mid-prompt at {dt:.2f} s, {seen} tokens seen"
    if kind == "beside-probe":
        prompt = PROBES[i % len(PROBES)]
        started = threading.Event()
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(
            r=c.stream_then_drop(chat(f"Describe a city, number {i}.", DROP_MAX_TOKENS), 6 + i % 10, None,
                                 started)))
        t.start()
        started.wait(60)
        got = c.probe(prompt)
        t.join()
        same = got == alone[prompt]
        return same, f"probe {'==' if same else '!='} alone ({len(got)} tokens), stream dropped after {out['r'][0]}"
    if kind == "too-long":
        body = chat(TOO_LONG, 16) if i % 2 else chat(long_prompt(i), CONTEXT)
        status, j = c.complete(body)
        err = j.get("error", {}) if isinstance(j, dict) else {}
        ok = status == 400 and bool(err.get("message"))
        return ok, f"status {status}: {str(err.get('message'))[:70]}"
    if kind == "nonstream-drop":
        after = [0.3, 0.8][i % 2]
        c.nonstream_then_drop(chat(f"Tell a long story about a fox, number {i}.", DROP_MAX_TOKENS), after)
        return True, f"socket closed at {after:.1f} s"
    raise ValueError(kind)


def engine_work(kind: str, m0: dict, m1: dict) -> tuple[bool, str]:
    """What the engine did during a step, from /metrics, and whether it proves the drop took
    effect: a dropped decode generated fewer than its max_tokens; a dropped prefill generated
    nothing and ran fewer steps than its whole prompt needs (it was cut mid-prompt)."""
    def delta(name: str) -> int:
        return int(m1[f"tensorfold_{name}"] - m0[f"tensorfold_{name}"])

    steps, gen = delta("step_seconds_count"), delta("completion_tokens_total")
    prompt = delta("prompt_tokens_total") - delta("cached_tokens_total")
    what = f"engine: {steps} steps, {gen} tokens generated"
    if kind in ("decode-drop", "nonstream-drop"):
        return gen < DROP_MAX_TOKENS, what
    if kind == "prefill-drop":
        need = -(-prompt // MAX_ROWS)
        return gen == 0 and steps < need, what + f" (the whole {prompt}-token prefill needs {need})"
    return True, what


def full_parallel(c: Client, parallel: int) -> tuple[bool, str]:
    """`parallel` requests at once: all must run together and finish."""
    peak = [0.0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], c.metrics()["tensorfold_requests_running"])
            time.sleep(0.02)

    w = threading.Thread(target=watch)
    w.start()
    res: list = [None] * parallel
    ts = [threading.Thread(target=lambda k=k: res.__setitem__(k, c.complete(chat(f"Count to {k + 20}.", 48))))
          for k in range(parallel)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    done.set()
    w.join()
    ok = all(r and r[0] == 200 for r in res) and peak[0] == parallel
    return ok, f"{sum(1 for r in res if r and r[0] == 200)}/{parallel} served, peak running {peak[0]:.0f}"


def probe_all(c: Client, resumed: int) -> dict[str, str]:
    """The probes' hashes; the last one is the long prompt of step `resumed` (a prefill-drop
    step, so on the stepped server it resumes from the blocks the cancelled prefill cached)."""
    out = {p: digest(c.probe(p)) for p in PROBES}
    ids, cached = c.probe_usage(long_prompt(resumed), 16)
    out[f"<long prompt of step {resumed + 1}, {cached} cached>"] = digest(ids)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--parallel", type=int, default=4)
    a = ap.parse_args()
    args = ["--parallel", str(a.parallel), "--context", str(CONTEXT), "--max-rows", str(MAX_ROWS)]
    ok_all = True
    with Server(args) as s:
        c = Client(s)
        alone = {p: c.probe(p) for p in PROBES}
        print(f"{'step':>4}  {'kind':<15} {'ok':<4} {'settle':>7}  detail")
        for i in range(a.steps):
            kind = KINDS[i % len(KINDS)]
            m0 = c.metrics()
            try:
                ok, what = run_step(c, i, kind, alone)
            except Exception as e:  # noqa: BLE001 - a step that raises is a failed step
                ok, what = False, f"{type(e).__name__}: {e}"
            settled, secs, detail = c.settle()
            work_ok, work = engine_work(kind, m0, c.metrics())
            ok &= settled and work_ok
            ok_all &= ok
            detail = f"{work}; {detail}"
            print(f"{i + 1:>4}  {kind:<15} {'ok' if ok else 'FAIL':<4} {secs:6.2f}s  {what}; {detail}", flush=True)
        par_ok, par_what = full_parallel(c, a.parallel)
        settled, _, detail = c.settle()
        par_ok &= settled
        ok_all &= par_ok
        print(f"full parallel: {'ok' if par_ok else 'FAIL'}: {par_what}; {detail}")
        m = c.metrics()
        n400 = m.get('tensorfold_http_responses_total{code="400"}', 0)
        print(f"metrics: requests_total {m['tensorfold_requests_total']:.0f}, "
              f"cached_tokens_total {m['tensorfold_cached_tokens_total']:.0f}, http 400 {n400:.0f}")
        # The prefill-drop that ran longest (0.5 s) left the most blocks in the prompt cache.
        drops = [i for i in range(a.steps) if KINDS[i % len(KINDS)] == "prefill-drop"]
        resumed = max(drops, key=lambda i: (i % 3, i))
        after = probe_all(c, resumed)
    with Server(args) as fresh:
        before = probe_all(Client(fresh), resumed)
    for (name, h), (name0, h0) in zip(after.items(), before.items()):
        same = h == h0
        ok_all &= same
        print(f"probe {name[:48]!r:<52} after steps {h}  fresh server {h0}  {'equal' if same else 'DIFFERENT'}")
    print("PASS" if ok_all else "FAIL", f"({a.steps} cancellation steps, {len(after)} probes vs a fresh server)")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
