"""How kvplan talks to the Hub: the settings every lookup reads (offline, timeout, endpoint, cache folders), the
lazy huggingface_hub import, and the bounded waits that keep a failing Hub from holding a run for minutes."""

from __future__ import annotations

import logging
import math
import os
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kvplan.errors import InputError

T = TypeVar("T")

CONFIG_NAME = "config.json"
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Ctx:
    """One lookup: what is asked for, of which endpoint, within how long (error messages name all of it)."""
    repo_id: str
    revision: str
    endpoint: str
    timeout: float
    filename: str = CONFIG_NAME


# --------------------------------------------------------------------------------------------------- settings


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def is_offline(offline: bool | None = None) -> bool:
    """--offline, else HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE now or when huggingface_hub was imported (it reads
    the variable once, at import)."""
    if offline is not None:
        return offline
    if _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE"):
        return True
    _check_endpoint_env()
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def resolve_timeout(timeout: float | str | None = None) -> float:
    """--timeout, else KVPLAN_HUB_TIMEOUT, else 10 s."""
    raw: Any = timeout if timeout is not None else os.environ.get("KVPLAN_HUB_TIMEOUT")
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if not (value > 0 and math.isfinite(value)):
        where = "--timeout" if timeout is not None else "KVPLAN_HUB_TIMEOUT"
        raise InputError(f"{where} must be a positive number of seconds, got {raw!r}")
    return value


def resolve_endpoint(endpoint: str | None = None) -> str:
    """endpoint=, else HF_ENDPOINT as it is now (huggingface_hub reads it only at import), else its default."""
    if endpoint:
        return endpoint.rstrip("/")
    if os.environ.get("HF_ENDPOINT"):
        return os.environ["HF_ENDPOINT"].rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def hub_cache_dir() -> Path:
    """huggingface_hub's cache (HF_HUB_CACHE, else $HF_HOME/hub), as huggingface_hub itself resolved it."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def kvplan_store_dir() -> Path:
    """$HF_HOME/kvplan: safetensors header summaries that `pull` (or an online lookup) stored for offline use."""
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "kvplan"


def _check_endpoint_env() -> None:
    """huggingface_hub parses HF_ENDPOINT at import and raises on a malformed one (`http://[::1`): say so first."""
    raw = os.environ.get("HF_ENDPOINT")
    if not raw:
        return
    try:
        parts = urllib.parse.urlsplit(raw)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as e:
        raise InputError(f"HF_ENDPOINT {raw[:80]!r} is not a URL ({e}); use e.g. https://huggingface.co") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"HF_ENDPOINT {raw[:80]!r} is not an http(s) URL; use e.g. https://huggingface.co")


def hf_module() -> Any:
    """Import huggingface_hub on first use; keep its logger and progress bars off kvplan's one-line stderr."""
    _check_endpoint_env()
    import huggingface_hub
    import huggingface_hub.utils._http  # noqa: F401 (its logger set-up runs at import: before ours, not after)
    from huggingface_hub.utils import disable_progress_bars

    if not os.environ.get("HF_HUB_VERBOSITY"):
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    disable_progress_bars()
    if "HF_HUB_DISABLE_TELEMETRY" not in os.environ or _env_true("HF_HUB_DISABLE_TELEMETRY"):
        # Telemetry in the user agent makes huggingface_hub fetch {import-time endpoint}/api/agent-harnesses with
        # a 3 s timeout before the first request: an unbounded-by-us extra wait, and a request to the default Hub
        # even when endpoint= points at a mirror. An explicit HF_HUB_DISABLE_TELEMETRY=0 keeps it on.
        huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY = True
    return huggingface_hub


# ------------------------------------------------------------------------------------------ bounded waits


class Deadline(Exception):
    """The lookup did not finish in time (raised by bounded)."""


class Offline(Exception):
    """Offline and nothing cached."""


def bounded(fn: Callable[[], T], seconds: float, message: str = "asking the Hub") -> T:
    """Run fn in a daemon thread and wait at most `seconds` (a spinner with `message` on a terminal's stderr).

    huggingface_hub retries 5xx and timeouts inside hf_hub_download (a 60 s metadata timeout and 5 retries with
    back-off) and streams downloads with its own retries, so per-request timeouts alone do not bound a lookup.
    A daemon thread left behind cannot keep the process alive at exit.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    from kvplan.progress import waiting

    worker = threading.Thread(target=run, name="kvplan-hub", daemon=True)
    worker.start()
    with waiting(message):
        worker.join(seconds)
    if worker.is_alive():
        raise Deadline()
    if "error" in box:
        raise box["error"]
    return box["value"]


def map_bounded(fn: Callable[[str], T], items: list[str], deadline: float, workers: int = 16) -> dict[str, T]:
    """fn over items on daemon threads that stop taking work at the deadline or the first error.

    (get_safetensors_metadata reads shards on a ThreadPoolExecutor: its threads are joined at interpreter exit and
    keep draining the queue, so a hanging mirror would hold the process for shards/workers x timeout.)
    """
    import time

    results: dict[str, T] = {}
    errors: list[BaseException] = []
    queue = iter(items)
    lock = threading.Lock()

    def work() -> None:
        while time.monotonic() < deadline and not errors:
            with lock:
                item = next(queue, None)
            if item is None:
                return
            try:
                value = fn(item)
            except BaseException as e:
                errors.append(e)
                return
            with lock:
                results[item] = value

    threads = [threading.Thread(target=work, name="kvplan-hub", daemon=True) for _ in range(min(workers, len(items)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    if len(results) < len(items):
        raise Deadline()
    return results
