"""A local fake Hugging Face Hub for tests: answers on 127.0.0.1 the way huggingface_hub expects.

Served: HEAD/GET /{repo}/resolve/{revision}/{file} (ETag, X-Repo-Commit, Content-Length, Accept-Ranges and HTTP
range reads with 206 + Content-Range), GET /api/models?search=&limit= (list_models); errors carry
X-Error-Code / X-Error-Message as the Hub sends them (GatedRepo 401 without a token / 403 with a token lacking
access, RepoNotFound 401 without a token / 404 with one, RevisionNotFound, EntryNotFound).
Knobs: `fail_status` (e.g. 500) and `hang_s` (hold the response) for paths containing `fault_match`.
Every request is logged with the bytes of body sent, so tests can assert range reads fetched only headers.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest


@dataclass
class Repo:
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files
    gated: bool = False
    allowed_tokens: set[str] = field(default_factory=set)


@dataclass
class Logged:
    method: str
    path: str
    status: int
    bytes_sent: int
    range: str | None
    authorized: bool


def commit_sha(repo_id: str, revision: str, files: dict[str, bytes]) -> str:
    h = hashlib.sha1(repo_id.encode() + b"\0" + revision.encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha1(files[name]).digest())
    return h.hexdigest()


class FakeHub:
    """Start with `FakeHub().start()`; stop with `.stop()` (also ends held responses at once)."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.log: list[Logged] = []
        self.fail_status: int | None = None
        self.hang_s: float = 0.0
        self.fault_match: str | None = None  # substring of the path the knobs apply to; None = every request
        self.fault_method: str | None = None  # "HEAD" or "GET" the knobs apply to; None = both
        self.model_extra: dict[str, Any] = {}  # fields merged into every /api/models entry (odd types for tests)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- content

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | str | dict[str, Any]],
        *,
        revision: str = "main",
        gated: bool = False,
        allowed_tokens: set[str] | None = None,
    ) -> str:
        """Add (or add a revision to) a repo; dict values are served as JSON. Returns the commit sha."""
        data = {
            k: v if isinstance(v, bytes) else (v.encode() if isinstance(v, str) else json.dumps(v).encode())
            for k, v in files.items()
        }
        repo = self.repos.setdefault(repo_id, Repo())
        repo.gated = repo.gated or gated
        repo.allowed_tokens |= set(allowed_tokens or ())
        commit = commit_sha(repo_id, revision, data)
        repo.commits[commit] = data
        repo.refs[revision] = commit
        return commit

    def add_file(self, repo_id: str, path: Path, name: str | None = None, revision: str = "main") -> str:
        repo = self.repos[repo_id]
        files = dict(repo.commits[repo.refs[revision]])
        files[name or path.name] = path.read_bytes()
        return self.add_repo(repo_id, files, revision=revision)

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(2)

    def record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)

    def requests_for(self, needle: str) -> list[Logged]:
        with self._lock:
            return [e for e in self.log if needle in e.path]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    # ---------------------------------------------------------------- plumbing

    def _token(self) -> str | None:
        auth = self.headers.get("authorization") or ""
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False) -> None:
        sent = 0 if head else len(body)
        # Logged before the response leaves, so a test reading the log after the call sees this request.
        self.fake.record(
            Logged(self.command, self.path, status, sent, self.headers.get("range"), self._token() is not None)
        )
        self.send_response(status)
        headers = {"Content-Length": str(len(body)), **(headers or {})}
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if sent:
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str, head: bool, extra: dict[str, str] | None = None) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers, head)

    def _serve(self, head: bool) -> None:
        fake = self.fake
        path = urlsplit(self.path).path
        if (fake.fault_match is None or fake.fault_match in path) and fake.fault_method in (None, self.command):
            if fake.hang_s:
                fake._stopping.wait(fake.hang_s)  # hold the response; ends at once on stop()
                self.close_connection = True
                return
            if fake.fail_status:
                self._error(fake.fail_status, None, "Internal Error - We're working hard to fix this.", head)
                return
        if path == "/api/models":
            self._list_models(head)
        elif "/resolve/" in path:
            self._resolve(path, head)
        else:
            self._error(404, None, "Sorry, we can't find the page you are looking for.", head)

    def _list_models(self, head: bool) -> None:
        q = parse_qs(urlsplit(self.path).query)
        needle = (q.get("search") or [""])[0].lower()
        limit = int((q.get("limit") or ["1000"])[0])
        found = [
            {"id": rid, "modelId": rid, "private": False, "gated": "auto" if r.gated else False, "downloads": 0, "likes": 0, **self.fake.model_extra}
            for rid, r in sorted(self.fake.repos.items())
            if needle in rid.lower()
        ][:limit]
        self._send(200, json.dumps(found).encode(), {"Content-Type": "application/json"}, head)

    def _resolve(self, path: str, head: bool) -> None:
        repo_part, _, rest = path.lstrip("/").partition("/resolve/")
        repo_id = unquote(repo_part)
        revision, _, filename = rest.partition("/")
        revision, filename = unquote(revision), unquote(filename)
        repo = self.fake.repos.get(repo_id)
        token = self._token()
        if repo is None:
            if token is None:  # the Hub cannot tell missing from private without a token
                self._error(401, "RepoNotFound", "Invalid username or password.", head)
            else:
                self._error(404, "RepoNotFound", "Repository not found", head)
            return
        if repo.gated and token not in repo.allowed_tokens:
            msg = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in."
            if token is not None:
                msg = f"Access to model {repo_id} is restricted and you are not in the authorized list. Visit https://huggingface.co/{repo_id} to ask for access."
            self._error(401 if token is None else 403, "GatedRepo", msg, head)
            return
        commit = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
            return
        data = repo.commits[commit].get(filename)
        if data is None:
            self._error(404, "EntryNotFound", "Entry not found", head, {"X-Repo-Commit": commit})
            return
        etag = hashlib.sha256(data).hexdigest()
        headers = {
            "ETag": f'"{etag}"',
            "X-Repo-Commit": commit,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        rng = self.headers.get("range")
        if rng and not head:
            start_s, _, end_s = rng.strip().removeprefix("bytes=").partition("-")
            start = int(start_s)
            end = min(int(end_s) if end_s else len(data) - 1, len(data) - 1)
            if start >= len(data):
                self._error(416, None, "Range Not Satisfiable", head, {"Content-Range": f"bytes */{len(data)}"})
                return
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(206, data[start : end + 1], headers)
            return
        if head:  # the file's length, no body
            self.fake.record(Logged("HEAD", self.path, 200, 0, None, token is not None))
            self.send_response(200)
            for k, v in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(k, v)
            self.end_headers()
            return
        self._send(200, data, headers)


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A started FakeHub with a temporary HF_HOME (environment and huggingface_hub's import-time constants both),
    no token from the environment or a stored login, HF_ENDPOINT pointing at the fake (for subprocesses), and
    huggingface_hub's shared HTTP client reset so no connection outlives the server."""
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    home = tmp_path / "hf_home"
    home.mkdir()
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE",
                "HUGGINGFACE_HUB_CACHE", "KVPLAN_HUB_TIMEOUT", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)  # fmt: skip
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    # No user-agent telemetry: it fetches {import-time endpoint}/api/agent-harnesses, i.e. possibly the real Hub.
    # (constants.ENDPOINT itself must stay: hf_hub_url swaps endpoint= in only for URLs that start with it.)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    try:
        yield hub
    finally:
        hub.stop()
        _http.close_session()
