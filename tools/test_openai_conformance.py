#!/usr/bin/env python3
"""OpenAI-client conformance of a real `tensorfold serve` on loopback (run by scripts/test.sh).

Uses the official `openai` package: streaming and not, both endpoints, stop strings, seeds,
usage (with cached_tokens), token ids, and the error statuses of bad requests.
"""
from __future__ import annotations

import json
import os
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, served_model  # noqa: E402

MODEL = ["default"]  # the served model id, set once a server is up

import openai  # noqa: E402

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
SERVER: Server | None = None


def setUpModule():
    global SERVER
    SERVER = Server(["--parallel", "4", "--context", "2048"]).__enter__()
    MODEL[0] = SERVER.model_id


def tearDownModule():
    rc = SERVER.stop()
    assert rc == 0, f"server exit code {rc} after SIGTERM"


def raw(path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(SERVER.base + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def oversized_status(n: int) -> int:
    """Status for a body of `n` bytes; a server may answer 413 and close before reading it all."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", SERVER.port, timeout=30)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(n))
    conn.endheaders()
    try:
        conn.send(b"{" + b" " * (n - 2) + b"}")
    except OSError:
        pass  # the server may stop reading once the limit is passed
    status = conn.getresponse().status
    conn.close()
    return status


class Conformance(unittest.TestCase):
    def setUp(self):
        self.c = SERVER.client(timeout=300)

    def test_models_lists_the_served_model(self):
        ids = [m.id for m in self.c.models.list().data]
        self.assertEqual(len(ids), 1)

    def test_chat_non_stream_reply_and_usage(self):
        r = self.c.chat.completions.create(model=MODEL[0], messages=FRANCE, max_tokens=32, temperature=0)
        self.assertEqual(r.choices[0].message.content, "The capital of France is Paris.")
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertGreater(r.usage.prompt_tokens, 30)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        self.assertIsNotNone(r.usage.prompt_tokens_details)

    def test_stream_equals_non_stream_and_reports_usage(self):
        full = self.c.chat.completions.create(model=MODEL[0], messages=FRANCE, max_tokens=32, temperature=0)
        chunks = list(self.c.chat.completions.create(model=MODEL[0], messages=FRANCE, max_tokens=32,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(text, full.choices[0].message.content)
        self.assertEqual([ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason],
                         ["stop"])
        self.assertEqual(chunks[-1].usage.completion_tokens, full.usage.completion_tokens)

    def test_completions_endpoint(self):
        r = self.c.completions.create(model=MODEL[0], prompt="The capital of France is", max_tokens=5,
                                      temperature=0)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 5)
        s = "".join(ch.choices[0].text for ch in self.c.completions.create(
            model=MODEL[0], prompt="The capital of France is", max_tokens=5, temperature=0, stream=True)
            if ch.choices)
        self.assertEqual(s, r.choices[0].text)

    def test_stop_string_ends_the_reply_before_it(self):
        r = self.c.chat.completions.create(model=MODEL[0], messages=FRANCE, max_tokens=32, temperature=0,
                                           stop=["Paris"])
        self.assertEqual(r.choices[0].message.content, "The capital of France is ")
        self.assertEqual(r.choices[0].finish_reason, "stop")
        s = "".join(ch.choices[0].delta.content or "" for ch in self.c.chat.completions.create(
            model=MODEL[0], messages=FRANCE, max_tokens=32, temperature=0, stop=["Paris"], stream=True)
            if ch.choices)
        self.assertEqual(s, "The capital of France is ")

    def test_seeded_sampling_is_reproducible(self):
        def ask(seed):
            return self.c.chat.completions.create(
                model=MODEL[0], messages=[{"role": "user", "content": "Write a sentence about cats."}],
                max_tokens=24, temperature=1.0, seed=seed).choices[0].message.content
        a = ask(7)
        self.assertEqual(a, ask(7))
        self.assertTrue(any(ask(s) != a for s in (8, 9, 10)), "different seeds never changed the reply")

    def test_token_ids_and_length_limit(self):
        r = self.c.chat.completions.create(model=MODEL[0], messages=FRANCE, max_tokens=3, temperature=0,
                                           extra_body={"return_token_ids": True})
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(len(r.choices[0].model_extra["token_ids"]), 3)
        self.assertEqual(len(r.model_extra["prompt_token_ids"]), r.usage.prompt_tokens)

    def test_bad_requests_get_4xx(self):
        bad = [
            dict(messages=[], max_tokens=4),
            dict(messages=[{"role": "wizard", "content": "hi"}], max_tokens=4),
            dict(messages=FRANCE, max_tokens=-1),
            dict(messages=FRANCE, max_tokens=4, n=2),
            dict(messages=FRANCE, max_tokens=4, temperature=-1),
            dict(messages=FRANCE, max_tokens=4, top_p=7),
            dict(messages=[{"role": "user", "content": "hi " * 3000}], max_tokens=4),
        ]
        for kw in bad:
            with self.subTest(kw=str(kw)[:60]):
                with self.assertRaises(openai.BadRequestError):
                    self.c.chat.completions.create(model=MODEL[0], **kw)

    def test_malformed_bodies(self):
        self.assertEqual(raw("/v1/chat/completions", b"{not json")[0], 400)
        self.assertEqual(raw("/v1/chat/completions", b"\xff\xfe")[0], 400)
        code, body = raw("/v1/chat/completions", json.dumps({"messages": "hi"}).encode())
        self.assertEqual(code, 400)
        self.assertIn("error", body)
        self.assertEqual(oversized_status(8 << 20), 413)

    def test_api_key(self):
        with Server(["--parallel", "1", "--context", "512"], api_key="sekrit") as s:
            with self.assertRaises(openai.AuthenticationError):
                openai.OpenAI(base_url=s.base + "/v1", api_key="wrong", max_retries=0).models.list()
            self.assertEqual(len(s.client().models.list().data), 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
