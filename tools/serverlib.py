"""Start and stop a real `tensorfold serve` on loopback for the tools and tests in tools/.

    with Server(["--parallel", "4"]) as s:
        client = s.client()          # an openai.OpenAI pointed at it
        ...
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.environ.get("TENSORFOLD_BIN", os.path.join(ROOT, "target", "release", "tensorfold"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_model(base: str, api_key: str | None = None) -> str:
    """The id of the one model a server lists at /v1/models."""
    import json

    req = urllib.request.Request(base + "/v1/models", headers={"Authorization": f"Bearer {api_key or 'none'}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


class Server:
    """A tensorfold server process; `args` are extra `serve` flags."""

    def __init__(self, args: list[str] | None = None, model: str | None = None, api_key: str | None = None):
        self.port = free_port()
        self.args = list(args or [])
        self.model = model
        self.api_key = api_key
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join("/tmp", f"tensorfold-serve-{self.port}.log")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Server":
        cmd = [BINARY, "serve"] + ([self.model] if self.model else []) + ["--port", str(self.port)] + self.args
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {open(self.log_path).read()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.model_id = served_model(self.base, self.api_key)
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not become healthy in 120 s: " + open(self.log_path).read())

    def stop(self) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None

    def __exit__(self, *exc) -> None:
        self.stop()

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.base + "/v1", api_key=self.api_key or "none", max_retries=0, **kw)
