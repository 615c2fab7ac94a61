"""One live ``vllm-rl serve`` for every test that talks to a server.

The server runs the embedded model with the DAS drafter and an ARRoL head (so group,
darts, duet, das and arrol flags are all valid), the multiprocess engine (engine core
in its own process, ``/metrics`` served by the API server), a plain chat template (the
embedded model has none) for ``/v1/chat/completions``, and vLLM's development routes
(``VLLM_SERVER_DEV_MODE=1``: ``GET /is_paused``, on which the reload tests order their
requests).  It is started by the installed console script (``setup.py``: ``vllm-rl =
vllm_rl.cli:main``), the way a user starts it.  :func:`shared_server` starts it once per
pytest process and stops it at exit: the server, flag, metrics, reload and soak tests
and TRL's server mode share it.  A test that changes the server's state puts it back
(the reload tests end on the served checkpoint).
"""
from __future__ import annotations

import atexit
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import MAX_MODEL_LEN
from vllm_rl.llm import CPU_KV_CACHE_BYTES
from vllm_rl.metrics import parse
from vllm_rl.task import MODEL_PATH

DAS = {"batch_cap": "linear"}      # budgets that do not depend on this machine's step times
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
_server: dict | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list[str], log: Path, what: str = "the server",
           env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``cmd`` plus ``--host 127.0.0.1 --port P`` with its output in ``log`` (``env``:
    variables added to this process's environment); wait for ``/health``.  Returns
    (process, base URL); raises with the log's tail if it dies."""
    port = _free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([*cmd, "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT,
                                env=None if env is None else {**os.environ, **env})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        try:
            urllib.request.urlopen(base + "/health", timeout=2)
            return proc, base
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"{what} did not come up:\n" + log.read_text()[-4000:])
            time.sleep(1)


def vllm_rl_script() -> list[str]:
    """The installed console script (setup.py: ``vllm-rl = vllm_rl.cli:main``)."""
    script = Path(sys.executable).parent / "vllm-rl"
    assert script.exists(), "the vllm-rl console script is not installed (pip install -e .)"
    return [str(script)]


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def shared_server() -> str:
    """The base URL of the shared server, started on first use."""
    global _server
    if _server is not None:
        if _server["proc"].poll() is not None:
            raise RuntimeError("the shared vllm_rl server died:\n" + _log_tail())
        return _server["base"]
    folder = Path(tempfile.mkdtemp(prefix="vllm-rl-server-"))
    (folder / "chat.jinja").write_text(CHAT_TEMPLATE)
    cmd = [*vllm_rl_script(), "serve", str(MODEL_PATH), "--seed", "0",
           "--max-model-len", str(MAX_MODEL_LEN),
           "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES),
           "--das", "--das-batch-cap", DAS["batch_cap"], "--arrol",
           "--chat-template", str(folder / "chat.jinja")]
    log = folder / "serve.log"
    proc, base = launch(cmd, log, "vllm-rl serve", env={"VLLM_SERVER_DEV_MODE": "1"})
    _server = {"proc": proc, "base": base, "log": log}
    atexit.register(_stop)
    return base


def _log_tail() -> str:
    return _server["log"].read_text()[-4000:] if _server else ""


def _stop() -> None:
    global _server
    if _server is None:
        return
    proc, _server = _server["proc"], None
    stop(proc)


# ----------------------------------------------------------------------------- client
def call(base: str, path: str, body: dict | None = None, timeout: float = 120,
         raw: bytes | None = None):
    """(status, JSON body) of a GET (no body) or POST (``body`` as JSON, or ``raw`` bytes)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(base + path, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read() or b"{}"
        try:
            return e.code, json.loads(raw)
        except json.JSONDecodeError:
            return e.code, {"raw": raw.decode(errors="replace")}


def stream(base: str, body: dict, stop_after: int | None = None, timeout: float = 120,
           on_first=None):
    """A streamed completion: (status, choices by index with their token_ids, text,
    finish_reason, stop_reason and record (``rollout_info``) accumulated, aborted).  ``stop_after`` chunks: close
    the connection there (a client abort).  ``on_first()`` is called once, at the first
    chunk with a choice: the request is in the engine and has produced output.  An error
    event in the stream (vLLM sends HTTP 200 once streaming starts, then
    ``data: {"error": {..., "code": 500}}``) gives that code as the status, and the
    response ``"in_stream": True`` (a bad RL flag is never one: it is an HTTP 400 before
    the stream starts)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return resp.status, json.loads(resp.read() or b"{}"), False
        choices: dict[int, dict] = {}
        chunks = 0
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            msg = json.loads(data)
            if "error" in msg:
                return int(msg["error"].get("code") or 500), {**msg, "in_stream": True}, False
            for c in msg.get("choices", []):
                acc = choices.setdefault(c["index"], {"index": c["index"], "text": "",
                                                      "token_ids": [], "finish_reason": None,
                                                      "stop_reason": None})
                acc["text"] += c.get("text") or ""
                acc["token_ids"] += c.get("token_ids") or []
                if c.get("finish_reason") is not None:
                    acc["finish_reason"] = c["finish_reason"]
                    acc["stop_reason"] = c.get("stop_reason")
                    if "rollout_info" in c:             # a flagged sample's record
                        acc["rollout_info"] = c["rollout_info"]
            if on_first is not None and msg.get("choices"):
                on_first()
                on_first = None
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                return 200, {"choices": [choices[i] for i in sorted(choices)]}, True
        return 200, {"choices": [choices[i] for i in sorted(choices)]}, False
    finally:
        conn.close()


class Background:
    """``fn(*args, **kwargs)`` running in a thread; ``done`` is set when it has returned.
    :meth:`result` joins it (its deadline is only a safety net) and returns its value or
    raises its exception."""

    def __init__(self, fn, *args, **kwargs):
        self.done = threading.Event()
        self._out: dict = {}

        def run():
            try:
                self._out["r"] = fn(*args, **kwargs)
            except BaseException as e:          # noqa: BLE001 - raised by result()
                self._out["e"] = e
            finally:
                self._ended()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def _ended(self) -> None:
        self.done.set()

    def result(self, deadline_s: float = 300):
        self._thread.join(deadline_s)
        assert not self._thread.is_alive(), f"still running after {deadline_s} s"
        if "e" in self._out:
            raise self._out["e"]
        return self._out["r"]


class Flight(Background):
    """A streamed completion (:func:`stream`) running in a thread: ``started`` is set at
    its first chunk (it is in the engine and has produced output), ``done`` once its
    stream has ended."""

    def __init__(self, base: str, body: dict):
        self.started, self._wake = threading.Event(), threading.Event()

        def first():
            self.started.set()
            self._wake.set()

        super().__init__(stream, base, body, on_first=first)

    def _ended(self) -> None:
        super()._ended()
        self._wake.set()

    def wait_started(self, deadline_s: float = 120) -> None:
        """Until the first chunk; fails if the stream ended without one."""
        assert self._wake.wait(deadline_s), f"no streamed output within {deadline_s} s"
        if not self.started.is_set():
            raise AssertionError(f"the stream ended before any output: {self.result()}")


def wait_until(predicate, what: str, deadline_s: float = 120, every_s: float = 0.02):
    """Poll ``predicate()`` until it returns something true, and return that.  The
    deadline is only a safety net: past it the test fails saying ``what`` never held."""
    end = time.monotonic() + deadline_s
    while True:
        got = predicate()
        if got:
            return got
        assert time.monotonic() < end, f"{what}: still not so after {deadline_s} s"
        time.sleep(every_s)


def metrics(base: str) -> dict[str, float]:
    """``GET /metrics`` as ``{'name{labels}': value}`` (vllm_rl:* and vllm:*)."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        return parse(r.read().decode())


def wait_idle(base: str, deadline_s: float = 120) -> dict[str, float]:
    """/metrics once no request is running or waiting and the KV cache is empty (or the
    last page read when the deadline passes; the caller asserts on it)."""
    from vllm_rl.metrics import total

    end = time.monotonic() + deadline_s
    while True:
        m = metrics(base)
        idle = (total(m, "vllm:num_requests_running") == 0
                and total(m, "vllm:num_requests_waiting") == 0
                and total(m, "vllm:kv_cache_usage_perc") == 0)
        if idle or time.monotonic() > end:
            return m
        time.sleep(0.5)
