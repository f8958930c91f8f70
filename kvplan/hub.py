"""The Hugging Face Hub: configs, safetensors headers, GGUF headers (fetch_gguf), `pull` and model search.

The only kvplan module that imports huggingface_hub, and only inside functions, so `import kvplan` stays fast.

Order of a lookup (fetch_config): the HF cache at that revision (unless refresh), then one short metadata request
(HEAD on config.json, no retries), then the download, then, when config.json has no quantization_config, the
same for hf_quant_config.json at that commit (a ModelOpt export's quantization); all of it under one deadline
(--timeout, KVPLAN_HUB_TIMEOUT, default 10 s), because huggingface_hub alone retries a failing Hub for minutes. When the Hub fails: the cache, then
a bundled config that aliases.yaml marks as the same architecture, with a one-line note. Failures are told apart by
huggingface_hub's exception types (see _explain, the one place that turns them into kvplan errors).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import re
import shutil
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from kvplan import catalog
from kvplan.errors import ConfigError, EnvironmentProblem, InputError, KvplanError, ModelNotFoundError
from kvplan.model_ref import (
    MODELOPT_QUANT_FILE, ModelRef, ResolvedModel, looks_like_hub_id, needs_modelopt_quant_file, parse_json,
    read_config_file, read_text_file, with_modelopt_quant,
)

T = TypeVar("T")

CONFIG_NAME = "config.json"
DEFAULT_TIMEOUT_S = 10.0
WEIGHTS_FILE = "safetensors.json"  # the safetensors header summary inside a `pull --to DIR` catalog folder
RECORD_FORMAT = "kvplan-safetensors-1"


class WeightsUnavailable(KvplanError):
    """No safetensors metadata for a model (none on the Hub, unreachable, not pulled): the CLI falls back to
    config-derived weight bytes and says why."""


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


def _hf() -> Any:
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


class _Deadline(Exception):
    """The lookup did not finish in time (raised by _bounded)."""


class _Offline(Exception):
    """Offline and nothing cached."""


def _bounded(fn: Callable[[], T], seconds: float, message: str = "asking the Hub") -> T:
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
        raise _Deadline()
    if "error" in box:
        raise box["error"]
    return box["value"]


# ------------------------------------------------------------------------------------- errors, one place


@dataclass(frozen=True)
class _Ctx:
    repo_id: str
    revision: str
    endpoint: str
    timeout: float
    filename: str = CONFIG_NAME


@dataclass(frozen=True)
class _Failure:
    error: KvplanError
    cache_ok: bool  # a cached copy (older commit or earlier login) may stand in
    bundled_ok: bool  # a bundled same-architecture config may stand in


def _line(text: object, limit: int = 160) -> str:
    first = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _sent_token(exc: BaseException) -> bool:
    """Whether the refused request carried a token (401 vs 403 is the Hub's business; we look at what we sent)."""
    try:
        return bool(exc.response.request.headers.get("authorization"))  # type: ignore[attr-defined]
    except Exception:  # httpx raises RuntimeError, not AttributeError, for an unset .request
        return False


def _transport_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(timeouts, connection failures) of the HTTP client huggingface_hub uses (httpx2 in 2.x, httpx in 1.x)."""
    timeouts: list[type[BaseException]] = [TimeoutError]
    network: list[type[BaseException]] = [ConnectionError]
    for name in ("httpx2", "httpx"):
        try:
            mod = __import__(name)
        except ImportError:
            continue
        timeouts.append(mod.TimeoutException)
        network += [mod.NetworkError, mod.RemoteProtocolError, mod.ProxyError, mod.TooManyRedirects]
    return tuple(timeouts), tuple(network)


def _explain(exc: BaseException, c: _Ctx) -> _Failure:
    """Every huggingface_hub failure -> one line and whether something may be fallen back on. By exception type:
    the Hub answers 401 both for missing repos and for private/gated ones without a token."""
    from huggingface_hub import errors as E

    repo, at, ep = c.repo_id, f"{c.repo_id}@{c.revision}", c.endpoint
    remote_entry = getattr(E, "RemoteEntryNotFoundError", E.EntryNotFoundError)
    timeouts, network = _transport_errors()

    def fail(cls: type[KvplanError], msg: str, cache_ok: bool = False, bundled_ok: bool = False) -> _Failure:
        return _Failure(cls(msg), cache_ok, bundled_ok)

    if isinstance(exc, KvplanError):
        return _Failure(exc, False, False)
    if isinstance(exc, _Deadline) or isinstance(exc, timeouts):
        return fail(
            EnvironmentProblem,
            f"no complete answer from {ep} for {repo} within {c.timeout:g} s "
            "(raise --timeout or KVPLAN_HUB_TIMEOUT, or use --offline with a cached copy)",
            True,
            True,
        )
    if isinstance(exc, (_Offline, E.OfflineModeIsEnabled)):
        return fail(
            EnvironmentProblem,
            f"offline (--offline or HF_HUB_OFFLINE) and {at} is not in the Hugging Face cache ({hub_cache_dir()}); "
            f"run `kvplan pull {repo}` while online",
            True,
            True,
        )
    if isinstance(exc, E.GatedRepoError):
        url = f"{ep}/{repo}"
        if _sent_token(exc):
            msg = f"{repo} is gated and this token has no access: accept the license at {url} with its account"
        else:
            msg = f"{repo} is gated: accept its license at {url}, then set HF_TOKEN, run `hf auth login` or pass --token"
        return fail(InputError, msg, True, True)
    if isinstance(exc, E.DisabledRepoError):
        return fail(ModelNotFoundError, f"{repo} has been disabled by its author on {ep}", True)
    if isinstance(exc, E.RepositoryNotFoundError):
        close = catalog.suggest(repo)
        hint = f"; close names in the catalog: {', '.join(close)}" if close else ""
        why = "or private and this token has no access" if _sent_token(exc) else "or private and you are not logged in"
        return fail(ModelNotFoundError, f"{repo} not found on {ep}, {why}{hint}", True)
    if isinstance(exc, E.RevisionNotFoundError):
        return fail(ModelNotFoundError, f"{repo} has no revision {c.revision!r} (a branch, tag or full commit sha)")
    if isinstance(exc, E.LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, E.FileMetadataError):  # the endpoint answered, but not with the Hub's headers
            return _explain(cause, c)
        return fail(EnvironmentProblem, f"{at} is not in the Hugging Face cache and the Hub cannot be reached", True, True)
    if isinstance(exc, remote_entry):
        if c.filename == CONFIG_NAME:
            msg = f"{at} has no config.json (a GGUF-only or non-transformers repo?); pass a local config.json or .gguf path"
        else:
            msg = f"{at} has no {c.filename}"
        return fail(ConfigError, msg)
    if isinstance(exc, E.NotASafetensorsRepoError):
        return fail(WeightsUnavailable, f"{at} has no safetensors weights (model.safetensors or its .index.json)")
    if isinstance(exc, E.SafetensorsParsingError):
        return fail(WeightsUnavailable, f"{at}: unreadable safetensors header ({_line(exc)})")
    if isinstance(exc, E.FileMetadataError):
        return fail(
            EnvironmentProblem,
            f"{ep} does not answer like the Hugging Face Hub (no X-Repo-Commit or ETag); check HF_ENDPOINT and proxies",
            True,
            True,
        )
    if isinstance(exc, E.HfHubHTTPError):
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", "?")
        server = _line(getattr(exc, "server_message", None) or "")
        if "invalid credentials" in server.lower():
            return fail(InputError, f"{ep} rejected the token (invalid credentials); check HF_TOKEN, your login or --token", True, True)
        detail = f": {server}" if server else ""
        return fail(EnvironmentProblem, f"the Hub at {ep} failed for {repo} (HTTP {status}{detail})", True, True)
    if isinstance(exc, E.HFValidationError):
        return fail(InputError, f"{repo!r} is not a valid Hub id: {_line(exc)}")
    if isinstance(exc, network):
        return fail(
            EnvironmentProblem,
            f"cannot reach {ep} ({_line(exc) or type(exc).__name__}); check the network, HF_ENDPOINT or proxy, "
            "or use --offline with a cached copy",
            True,
            True,
        )
    return fail(EnvironmentProblem, f"Hub lookup of {at} failed: {type(exc).__name__}: {_line(exc)}", True, True)


def hub_error(
    exc: BaseException,
    repo_id: str,
    *,
    revision: str | None = None,
    endpoint: str | None = None,
    timeout: float | None = None,
    filename: str = CONFIG_NAME,
) -> KvplanError:
    """The one-line kvplan error (exit 2) for a huggingface_hub exception."""
    ctx = _Ctx(repo_id, revision or "main", resolve_endpoint(endpoint), resolve_timeout(timeout), filename)
    return _explain(exc, ctx).error


# ------------------------------------------------------------------------------------------------- configs


def _cached_config(repo_id: str, revision: str) -> Path | None:
    """config.json from the HF cache at that revision (a branch or tag via refs/, or a commit sha)."""
    return _cached_file(repo_id, CONFIG_NAME, revision)


def _cached_file(repo_id: str, filename: str, revision: str) -> Path | None:
    hf = _hf()
    try:
        hit = hf.try_to_load_from_cache(repo_id, filename, cache_dir=hub_cache_dir(), revision=revision)
    except Exception:  # invalid repo id or revision name: not cached
        return None
    return Path(hit) if isinstance(hit, str) else None


def _from_file(path: Path, requested: str, repo_id: str, revision: str, source: str, notes: tuple[str, ...] = (),
               fetch_quant: Callable[[str], None] | None = None) -> ResolvedModel:
    """A cached config.json, with the hf_quant_config.json of the same commit when config.json has no
    quantization_config (model_ref.with_modelopt_quant). fetch_quant(commit) asks the Hub for that file when the
    cache does not know it; without it (offline, or the Hub just failed) an unknown answer is said in a note."""
    config = read_config_file(path, f"{repo_id} config.json ({source})")
    commit = path.parent.name  # snapshots/<commit>/config.json
    if needs_modelopt_quant_file(config):
        quant = _cached_quant_file(repo_id, commit)
        if quant is None and fetch_quant is not None:
            try:
                fetch_quant(commit)
            except KvplanError as e:  # the Hub failed on this file: said, the config stands
                notes = (*notes, f"{MODELOPT_QUANT_FILE} not checked, so a ModelOpt export's quantization is not "
                                 f"counted: {e}")
                fetch_quant = None
            else:
                quant = _cached_quant_file(repo_id, commit) or False  # answered, even without a .no_exist marker
        if isinstance(quant, Path):
            config = with_modelopt_quant(config, quant, f"{repo_id} {MODELOPT_QUANT_FILE} ({source})")
        elif quant is None and fetch_quant is None and not any(MODELOPT_QUANT_FILE in n for n in notes):
            notes = (*notes, f"the Hugging Face cache does not say whether {repo_id}@{commit[:12]} has an "
                             f"{MODELOPT_QUANT_FILE} (where ModelOpt exports up to 0.29 declare their quantization): "
                             "counted as config.json alone says; `kvplan pull` while online settles it")
    ref = ModelRef(requested, repo_id, source, revision=revision, commit=commit, path=str(path), notes=notes)
    return ResolvedModel(ref, config)


def _cached_quant_file(repo_id: str, commit: str) -> Path | bool | None:
    """hf_quant_config.json at that commit in the HF cache: its path, False where the Hub answered that the repo
    has none (huggingface_hub's .no_exist marker), None where the cache does not know."""
    hf = _hf()
    try:
        hit = hf.try_to_load_from_cache(repo_id, MODELOPT_QUANT_FILE, cache_dir=hub_cache_dir(), revision=commit)
    except Exception:  # an invalid name: unknown
        return None
    if isinstance(hit, str):
        return Path(hit)
    return None if hit is None else False


def _quant_fetcher(repo_id: str, token: str | None, ctx: _Ctx, deadline: float) -> Callable[[str], None]:
    """Downloads hf_quant_config.json at a commit into the HF cache, within what is left of the lookup's deadline;
    the Hub's 404 is an answer (huggingface_hub records it under .no_exist, so the cache knows next time, offline
    too). Any other failure: its one line."""
    import time

    endpoint = ctx.endpoint

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    def fetch(commit: str) -> None:
        from huggingface_hub import errors as E

        hf = _hf()

        def download() -> None:
            url = hf.hf_hub_url(repo_id, MODELOPT_QUANT_FILE, revision=commit, endpoint=endpoint)
            try:  # one request without retries first, as for config.json: a 5xx comes back at once
                hf.get_hf_file_metadata(url, token=token, timeout=left(), endpoint=endpoint)
            except getattr(E, "RemoteEntryNotFoundError", E.EntryNotFoundError):
                pass  # hf_hub_download below answers 404 again and leaves the .no_exist marker
            try:
                hf.hf_hub_download(repo_id, MODELOPT_QUANT_FILE, revision=commit, cache_dir=hub_cache_dir(),
                                   token=token, endpoint=endpoint, etag_timeout=left())
            except getattr(E, "RemoteEntryNotFoundError", E.EntryNotFoundError):
                pass

        try:
            _bounded(download, left(), f"fetching {repo_id}'s {MODELOPT_QUANT_FILE} from the Hub")
        except Exception as e:
            raise _explain(e, _Ctx(repo_id, commit, endpoint, ctx.timeout, MODELOPT_QUANT_FILE)).error from None

    return fetch


def _download_config(repo_id: str, revision: str, token: str | None, endpoint: str, deadline: float) -> Path:
    """One short metadata request without retries, so a 5xx, a refusal or a dead network comes back at once and
    typed; then hf_hub_download into the HF cache (it records refs/<revision> for later offline use)."""
    import time

    hf = _hf()

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    url = hf.hf_hub_url(repo_id, CONFIG_NAME, revision=revision, endpoint=endpoint)
    hf.get_hf_file_metadata(url, token=token, timeout=left(), endpoint=endpoint)
    path = hf.hf_hub_download(
        repo_id,
        CONFIG_NAME,
        revision=revision,
        cache_dir=hub_cache_dir(),
        token=token,
        endpoint=endpoint,
        etag_timeout=left(),
    )
    return Path(path)


def fetch_config(
    repo_id: str,
    *,
    revision: str | None = None,
    offline: bool | None = None,
    refresh: bool = False,
    token: str | None = None,
    timeout: float | str | None = None,
    endpoint: str | None = None,
    requested: str | None = None,
    fallback: bool = True,
) -> ResolvedModel:
    """A Hub id's config.json: the HF cache (offline, or cached at that revision and not refresh), else the Hub;
    when the Hub fails, the cache, then a bundled same-architecture config (source "bundled", with a note).

    token=None uses HF_TOKEN or the stored login. fallback=False (pull) raises instead of standing in.
    """
    import time

    requested = requested or repo_id
    rev = revision or "main"
    ctx = _Ctx(repo_id, rev, resolve_endpoint(endpoint), resolve_timeout(timeout))
    offline = is_offline(offline)

    deadline = time.monotonic() + ctx.timeout  # config.json and hf_quant_config.json together
    fetch_quant = None if offline else _quant_fetcher(repo_id, token, ctx, deadline)
    if offline or not refresh:
        cached = _cached_config(repo_id, rev)
        if cached is not None:
            return _from_file(cached, requested, repo_id, rev, "cache", fetch_quant=fetch_quant)

    failure: BaseException
    if offline:
        failure = _Offline()
    else:
        try:
            path = _bounded(lambda: _download_config(repo_id, rev, token, ctx.endpoint, deadline), ctx.timeout,
                            f"fetching {repo_id}'s config.json from the Hub")
        except Exception as e:  # explained below
            failure = e
        else:
            return _from_file(path, requested, repo_id, rev, "hub", fetch_quant=fetch_quant)

    why = _explain(failure, ctx)
    if fallback and why.cache_ok:
        cached = _cached_config(repo_id, rev)
        if cached is not None:
            note = f"{why.error}; using the cached config.json at commit {cached.parent.name[:12]}"
            return _from_file(cached, requested, repo_id, rev, "cache", (note,))
    if fallback and why.bundled_ok:
        entry = catalog.lookup_same_architecture(repo_id)
        if entry is not None:
            same = "" if entry.repo_id.lower() == repo_id.lower() else " (same architecture)"
            note = f"{why.error}; using the bundled config of {entry.repo_id}{same}"
            config = read_config_file(entry.config_path, f"bundled {entry.repo_id}")
            ref = ModelRef(requested, entry.repo_id, "bundled", path=str(entry.config_path), notes=(note,))
            return ResolvedModel(ref, config)
    raise why.error from None


# ------------------------------------------------------------------------------------------------------ GGUF


def _range_reader(url: str, headers: dict[str, str], left: Callable[[], float]) -> Callable[[int, int], bytes]:
    """read(offset, n) as one HTTP range request on huggingface_hub's shared client. A server that ignores the
    Range header is refused before its body (the whole file) is read."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    def read(offset: int, n: int) -> bytes:
        rng = {"range": f"bytes={offset}-{offset + n - 1}"}
        with get_session().stream("GET", url, headers={**headers, **rng}, timeout=left()) as response:
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            if response.status_code != 206:
                raise EnvironmentProblem(
                    f"{url.split('?')[0]} ignored an HTTP range request (status {response.status_code}); kvplan reads "
                    "only the GGUF header and will not download the whole file"
                )
            return response.read()

    return read


def _remote_gguf(repo_id: str, filename: str, revision: str, token: str | None, ctx: _Ctx, deadline: float) -> tuple[Any, str | None]:
    """The header of a Hub GGUF file (and of its sibling shards for a split model) by range requests: one HEAD
    per file (size, commit), then a growing prefix of 1, 2, 4 ... MiB until the header is parsed (kvplan.gguf)."""
    import time
    from dataclasses import replace

    from huggingface_hub.utils import build_hf_headers

    from kvplan.gguf import read_header, shard_paths

    hf = _hf()
    headers = build_hf_headers(token=token)

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    def header(name: str, rev: str) -> tuple[Any, str | None]:
        url = hf.hf_hub_url(repo_id, name, revision=rev, endpoint=ctx.endpoint)
        meta = hf.get_hf_file_metadata(url, token=token, timeout=left(), endpoint=ctx.endpoint)
        return read_header(_range_reader(url, headers, left), meta.size, source=f"{repo_id}:{name}"), meta.commit_hash

    first, commit = header(filename, revision)
    count = first.metadata.get("split.count", 1)
    if not isinstance(count, int) or count <= 1:
        return first, commit
    paths = shard_paths(filename, count)
    if paths is None:
        raise ConfigError(f"{repo_id}:{filename}: split.count = {count} but the name is not "
                          f"<model>-NNNNN-of-{count:05d}.gguf, so the other shards cannot be found")
    names = [p.as_posix() for p in paths]
    shards = [first if name == filename else header(name, commit or revision)[0] for name in names]
    for i, (name, h) in enumerate(zip(names, shards)):
        if h.metadata.get("split.no") != i or h.metadata.get("split.count") != count:
            raise ConfigError(f"{repo_id}:{name}: shard says split.no = {h.metadata.get('split.no')}, "
                              f"split.count = {h.metadata.get('split.count')}; expected {i} and {count}")
    tensors = tuple(t for h in shards for t in h.tensors)
    return replace(shards[0], tensors=tensors, shards=tuple(shards), source=f"{repo_id}:{names[0]}"), commit


def _snapshot_commit(path: Path) -> str | None:
    parts = path.parts
    return parts[parts.index("snapshots") + 1] if "snapshots" in parts[:-1] else None


def fetch_gguf(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    offline: bool | None = None,
    refresh: bool = False,
    token: str | None = None,
    timeout: float | str | None = None,
    endpoint: str | None = None,
    requested: str | None = None,
) -> ResolvedModel:
    """A GGUF file in a Hub repo as a ResolvedModel: extras["gguf"] is its header, config is empty.

    The file from the HF cache when it is there at that revision (always when offline, unless refresh);
    otherwise only its header, read by HTTP range requests (a few MiB of a file that may hold hundreds of GiB),
    all under one deadline like fetch_config. When the Hub fails, a cached copy stands in with a note."""
    import time

    from kvplan.gguf import read_split_headers

    requested = requested or f"{repo_id}:{filename}"
    rev = revision or "main"
    ctx = _Ctx(repo_id, rev, resolve_endpoint(endpoint), resolve_timeout(timeout), filename)
    offline = is_offline(offline)

    def from_cache(notes: tuple[str, ...] = ()) -> ResolvedModel | None:
        path = _cached_file(repo_id, filename, rev)
        if path is None:
            return None
        ref = ModelRef(requested, repo_id, "cache", rev, _snapshot_commit(path), str(path), notes)
        return ResolvedModel(ref, {}, {"gguf": read_split_headers(path)})

    if offline or not refresh:
        hit = from_cache()
        if hit is not None:
            return hit
    if offline:
        raise EnvironmentProblem(
            f"offline (--offline or HF_HUB_OFFLINE) and {repo_id}:{filename}@{rev} is not in the Hugging Face cache "
            f"({hub_cache_dir()}); run `hf download {repo_id} {filename}` while online, or pass a local path"
        )
    deadline = time.monotonic() + ctx.timeout
    try:
        header, commit = _bounded(lambda: _remote_gguf(repo_id, filename, rev, token, ctx, deadline), ctx.timeout,
                                  f"reading {filename}'s header from the Hub")
    except Exception as e:  # explained below
        why = _explain(e, ctx)
        hit = from_cache((f"{why.error}; using the cached {filename}",)) if why.cache_ok else None
        if hit is not None:
            return hit
        raise why.error from None
    return ResolvedModel(ModelRef(requested, repo_id, "hub", rev, commit), {}, {"gguf": header})


def gguf_header(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    timeout: float | str | None = None,
    endpoint: str | None = None,
    offline: bool | None = None,
) -> Any:
    """The GGUFHeader of `filename` in a Hub repo (see fetch_gguf), tensor data never fetched."""
    return fetch_gguf(repo_id, filename, revision=revision, token=token, timeout=timeout, endpoint=endpoint,
                      offline=offline).extras["gguf"]


# -------------------------------------------------------------------------------------- safetensors weights

# Bits per element as stored; packed formats (int4/mxfp4 blocks in U8/I32) count as stored.
_DTYPE_BITS = {
    "F64": 64, "I64": 64, "U64": 64, "C64": 64,
    "F32": 32, "I32": 32, "U32": 32,
    "F16": 16, "BF16": 16, "I16": 16, "U16": 16,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I8": 8, "U8": 8, "BOOL": 8,
    "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}  # fmt: skip

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_MTP_NAME = re.compile(r"(?:^|\.)mtp[._]")  # mtp.*, model.mtp_layers.*, mtp_block.* (Qwen3-Next, MiMo, ERNIE)


@dataclass(frozen=True)
class SafetensorsWeights:
    """Weight bytes as the checkpoint stores them, from the safetensors headers (no tensor data is read)."""

    total_bytes: int  # what the engine loads
    bytes_by_dtype: dict[str, int]
    n_tensors: int
    excluded_bytes: int = 0
    excluded_reason: str | None = None
    n_files: int = 1
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    source: str = "hub"  # hub | cache | file


_MAX_DIM = 1 << 40
_MAX_TENSOR_BYTES = 1 << 50  # a PiB: no real tensor comes near; a header claiming more is broken


def _is_count(v: Any, high: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= high


def _tensor_bytes(name: str, dtype: Any, shape: Any, stored: Any) -> int:
    """Bytes of one tensor from its header entry, which must be self-consistent: a dtype name, a shape of
    non-negative integers, and (for whole-byte dtypes) a data span of exactly numel x element size, as the
    safetensors format requires. A broken header raises WeightsUnavailable (the config's figure is used, with
    the reason), never a negative, fractional or absurd "exact" weight."""
    if not isinstance(dtype, str) or not isinstance(shape, list) or len(shape) > 8 \
            or not all(_is_count(d, _MAX_DIM) for d in shape) or not _is_count(stored, _MAX_TENSOR_BYTES):
        raise WeightsUnavailable(f"safetensors header entry {name[:80]!r} is malformed "
                                 f"(dtype {str(dtype)[:20]!r}, shape {str(shape)[:60]}, data span {str(stored)[:30]})")
    bits = _DTYPE_BITS.get(dtype.upper())
    if bits is None:
        return stored  # unknown dtype: the byte span the header gives it
    nbytes = (math.prod(shape) * bits + 7) // 8
    if bits % 8 == 0 and nbytes != stored:
        raise WeightsUnavailable(f"safetensors header entry {name[:80]!r}: shape {shape} of {dtype} is {nbytes:,} B "
                                 f"but its data span is {stored:,} B")
    return nbytes


def _mtp_rule(config: dict[str, Any]) -> tuple[Callable[[str], bool], str]:
    """Tensors of multi-token-prediction layers: layer index >= num_hidden_layers when num_nextn_predict_layers
    N > 0 (DeepSeek-V3: model.layers.61.*), and mtp.* / *.mtp_layers.* names (loaded only for speculative decoding)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    n_mtp = int(config.get("num_nextn_predict_layers") or text.get("num_nextn_predict_layers") or 0)
    n_layers = config.get("num_hidden_layers") or text.get("num_hidden_layers")

    def is_mtp(name: str) -> bool:
        if _MTP_NAME.search(name):
            return True
        if n_mtp > 0 and n_layers:
            m = _LAYER_INDEX.search(name)
            return bool(m and int(m.group(1)) >= int(n_layers))
        return False

    if n_mtp > 0 and n_layers:
        last = int(n_layers) + n_mtp - 1
        layers = f"layer {n_layers}" if n_mtp == 1 else f"layers {n_layers}-{last}"
        reason = f"multi-token-prediction {layers} (num_nextn_predict_layers={n_mtp}), loaded only for speculative decoding"
    else:
        reason = "multi-token-prediction (mtp) tensors, loaded only for speculative decoding"
    return is_mtp, reason


def weights_from_record(record: dict[str, Any], config: dict[str, Any], *, include_mtp: bool = False, source: str = "cache") -> SafetensorsWeights:
    """Sum numel x dtype size over a stored header summary (see _record), leaving out MTP unless include_mtp."""
    is_mtp, reason = _mtp_rule(config)
    by_dtype: dict[str, int] = {}
    total = excluded = n = 0
    files = record.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(f, dict) and isinstance(f.get("tensors") or {}, dict)
                                              for f in files.values()):
        raise WeightsUnavailable("the safetensors summary has no files -> tensors map")
    for file in files.values():
        for name, entry in (file.get("tensors") or {}).items():
            if not isinstance(entry, list) or len(entry) != 3:
                raise WeightsUnavailable(f"safetensors header entry {str(name)[:80]!r} is malformed")
            dtype, shape, stored = entry
            nbytes = _tensor_bytes(str(name), dtype, shape, stored)
            if not include_mtp and is_mtp(name):
                excluded += nbytes
                continue
            by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
            total += nbytes
            n += 1
    if n + (1 if excluded else 0) == 0:
        raise WeightsUnavailable("the safetensors headers list no tensors")
    return SafetensorsWeights(
        total_bytes=total,
        bytes_by_dtype=dict(sorted(by_dtype.items())),
        n_tensors=n,
        excluded_bytes=excluded,
        excluded_reason=reason if excluded else None,
        n_files=len(record.get("files") or {}),
        repo_id=record.get("repo"),
        revision=record.get("revision"),
        commit=record.get("commit"),
        source=source,
    )


def load_weights_file(path: str | Path, config: dict[str, Any], *, include_mtp: bool = False) -> SafetensorsWeights:
    """A stored header summary ($HF_HOME/kvplan/... or DIR/<org>--<name>/safetensors.json from `pull --to`)."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise WeightsUnavailable(f"cannot read safetensors metadata {path}: {_line(e)}") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise WeightsUnavailable(f"{path} is not a kvplan safetensors summary ({RECORD_FORMAT})")
    return weights_from_record(record, config, include_mtp=include_mtp, source="file")


def _record(sharded: bool, index_metadata: Any, files: dict[str, Any], repo_id: str, revision: str, commit: str | None) -> dict[str, Any]:
    """huggingface_hub's SafetensorsFileMetadata per file -> a small JSON record: per tensor [dtype, shape, stored
    bytes], with the repo, revision, commit and date it was read at."""
    return {
        "format": RECORD_FORMAT,
        "repo": repo_id,
        "revision": revision,
        "commit": commit,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sharded": sharded,
        "index_metadata": index_metadata,
        "files": {
            fname: {
                "metadata": fm.metadata or {},
                "tensors": {
                    name: [t.dtype, list(t.shape), int(t.data_offsets[1]) - int(t.data_offsets[0])]
                    for name, t in fm.tensors.items()
                },
            }
            for fname, fm in sorted(files.items())
        },
    }


def _store_folder(repo_id: str) -> Path:
    return kvplan_store_dir() / repo_id.replace("/", "--")


def _stored_record(repo_id: str, commit: str | None, revision: str) -> dict[str, Any] | None:
    """What pull stored: <commit>.json when the commit is known, else the newest record for that revision."""
    folder = _store_folder(repo_id)
    candidates = [folder / f"{commit}.json"] if commit else sorted(folder.glob("*.json"))
    best: dict[str, Any] | None = None
    for path in candidates:
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
            continue
        if commit or rec.get("revision") == revision or rec.get("commit") == revision:
            if best is None or str(rec.get("date", "")) > str(best.get("date", "")):
                best = rec
    return best


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    tmp.replace(path)


def _cached_commit(repo_id: str, revision: str) -> str | None:
    hit = _cached_config(repo_id, revision)
    return hit.parent.name if hit is not None else None


def _map_bounded(fn: Callable[[str], T], items: list[str], deadline: float, workers: int = 16) -> dict[str, T]:
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
        raise _Deadline()
    return results


def _fetch_record(repo_id: str, ctx: _Ctx, commit: str | None, token: str | None) -> dict[str, Any]:
    """The safetensors headers of a single-file or sharded checkpoint, as get_safetensors_metadata reads them
    (HEAD model.safetensors, else the index, then a 100 kB range read per file), under one deadline."""
    import time

    hf = _hf()
    from huggingface_hub import constants
    from huggingface_hub import errors as E

    remote_entry = getattr(E, "RemoteEntryNotFoundError", E.EntryNotFoundError)
    api = hf.HfApi(endpoint=ctx.endpoint)
    rev = commit or ctx.revision
    deadline = time.monotonic() + ctx.timeout

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    def exists(name: str) -> bool:
        url = hf.hf_hub_url(repo_id, name, revision=rev, endpoint=ctx.endpoint)
        try:
            hf.get_hf_file_metadata(url, token=token, timeout=left(), endpoint=ctx.endpoint)
        except remote_entry:
            return False
        return True

    def header(name: str) -> Any:
        return api.parse_safetensors_file_metadata(repo_id, name, revision=rev, token=token, timeout=left())

    def fetch() -> tuple[bool, Any, dict[str, Any]]:
        single, index_name = constants.SAFETENSORS_SINGLE_FILE, constants.SAFETENSORS_INDEX_FILE
        if exists(single):
            return False, None, {single: header(single)}
        if not exists(index_name):
            raise E.NotASafetensorsRepoError(f"{repo_id} has neither {single} nor {index_name}")
        path = hf.hf_hub_download(
            repo_id, index_name, revision=rev, cache_dir=hub_cache_dir(), token=token, endpoint=ctx.endpoint,
            etag_timeout=left(),
        )  # fmt: skip
        index = parse_json(read_text_file(Path(path), f"{repo_id} {index_name}", "a safetensors index"),
                           f"{repo_id} {index_name}")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise E.NotASafetensorsRepoError(f"{repo_id} {index_name} has no weight_map of tensor -> file names")
        shards = sorted(set(weight_map.values()))
        return True, index.get("metadata"), _map_bounded(header, shards, deadline)

    sharded, index_metadata, files = _bounded(fetch, ctx.timeout, "reading safetensors headers from the Hub")
    return _record(sharded, index_metadata, files, repo_id, ctx.revision, commit)


def safetensors_weights(
    repo_id: str,
    config: dict[str, Any],
    *,
    revision: str | None = None,
    commit: str | None = None,
    token: str | None = None,
    timeout: float | str | None = None,
    endpoint: str | None = None,
    offline: bool | None = None,
    include_mtp: bool = False,
) -> SafetensorsWeights:
    """Weight bytes from the safetensors headers (single file or sharded index), via HTTP range reads.

    Pass the commit fetch_config reported so weights and config match; the summary is then stored under
    $HF_HOME/kvplan/ and later lookups (and --offline) read it. Raises WeightsUnavailable with one line.
    """
    rev = revision or "main"
    ctx = _Ctx(repo_id, rev, resolve_endpoint(endpoint), resolve_timeout(timeout), "model.safetensors")
    commit = commit or _cached_commit(repo_id, rev)
    stored = _stored_record(repo_id, commit, rev)
    if stored is not None:
        return weights_from_record(stored, config, include_mtp=include_mtp, source="cache")
    if is_offline(offline):
        raise WeightsUnavailable(
            f"offline and no safetensors metadata stored for {repo_id}@{rev}; run `kvplan pull {repo_id}` while online"
        )
    try:
        record = _fetch_record(repo_id, ctx, commit, token)
    except Exception as e:
        raise WeightsUnavailable(str(_explain(e, ctx).error)) from None
    if commit:
        try:
            _write_json(_store_folder(repo_id) / f"{commit}.json", record)
        except OSError:
            pass  # a read-only HF_HOME only costs the next lookup a request
    return weights_from_record(record, config, include_mtp=include_mtp, source="hub")


# ------------------------------------------------------------------------------------------------------ pull


@dataclass(frozen=True)
class Pulled:
    requested: str
    repo_id: str
    revision: str
    commit: str | None
    config_path: str
    weights_path: str | None  # the stored safetensors summary, None when the repo has no safetensors
    weight_bytes: int | None
    note: str | None = None


def _pull_target(ref: str) -> tuple[str, str | None]:
    """An alias or a Hub id -> (repo id, alias or None)."""
    entry = catalog.lookup(ref)
    if entry is not None:
        return entry.repo_id, (None if ref.lower() == entry.repo_id.lower() else ref)
    if looks_like_hub_id(ref):
        return ref, None
    raise ModelNotFoundError(f"cannot pull {ref!r}: give a Hub id org/name or an alias (`kvplan models`)")


def _update_aliases(folder: Path, repo_id: str, alias: str | None, revision: str, commit: str | None) -> None:
    """DIR/aliases.yaml in the model_configs/aliases.yaml layout (models: {repo_id: {dir, aliases, ...}})."""
    import yaml

    path = folder / "aliases.yaml"
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {_line(e)}") from None
    models = data.setdefault("models", {}) or {}
    data["models"] = models
    entry = models.setdefault(repo_id, {})
    entry["dir"] = repo_id.replace("/", "--")
    aliases = list(entry.get("aliases") or [])
    if alias and alias not in aliases:
        aliases.append(alias)
    entry["aliases"] = aliases
    entry["revision"] = revision
    entry["commit"] = commit
    header = "# Written by `kvplan pull --to`: the model_configs/aliases.yaml layout (pass this folder as a catalog).\n"
    path.write_text(header + yaml.safe_dump(data, sort_keys=True), encoding="utf-8")


def pull(
    refs: Iterable[str],
    *,
    to: str | Path | None = None,
    revision: str | None = None,
    token: str | None = None,
    timeout: float | str | None = None,
    endpoint: str | None = None,
) -> list[Pulled]:
    """Store configs (HF cache) and safetensors header summaries ($HF_HOME/kvplan/<org>--<name>/<commit>.json) so
    later runs work offline; with `to`, also DIR/<org>--<name>/{config.json,safetensors.json} + DIR/aliases.yaml."""
    if is_offline(None):
        raise InputError("kvplan pull needs the Hub, but HF_HUB_OFFLINE is set")
    out: list[Pulled] = []
    for ref in refs:
        repo_id, alias = _pull_target(ref.strip())
        rev = revision or "main"
        resolved = fetch_config(
            repo_id, revision=rev, refresh=True, offline=False, token=token, timeout=timeout,
            endpoint=endpoint, requested=ref, fallback=False,
        )  # fmt: skip
        commit = resolved.ref.commit
        ctx = _Ctx(repo_id, rev, resolve_endpoint(endpoint), resolve_timeout(timeout), "model.safetensors")
        note = None
        record: dict[str, Any] | None = None
        weights_path: Path | None = None
        try:
            record = _fetch_record(repo_id, ctx, commit, token)
        except Exception as e:
            err = _explain(e, ctx).error
            if not isinstance(err, WeightsUnavailable):
                raise err from None
            note = f"{err}; stored the config only"
        weight_bytes = None
        if record is not None:
            try:
                weight_bytes = weights_from_record(record, resolved.config).total_bytes
            except WeightsUnavailable as err:  # a broken header is not stored as if it were exact
                record, note = None, f"{err}; stored the config only"
        if record is not None:
            weights_path = _store_folder(repo_id) / f"{commit or rev}.json"
            _write_json(weights_path, record)
        config_path = Path(resolved.ref.path or "")
        if to is not None:
            folder = Path(to).expanduser()
            model_dir = folder / repo_id.replace("/", "--")
            model_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(config_path, model_dir / CONFIG_NAME)
            config_path = model_dir / CONFIG_NAME
            if record is not None:
                weights_path = model_dir / WEIGHTS_FILE
                _write_json(weights_path, record)
            _update_aliases(folder, repo_id, alias, rev, commit)
        out.append(Pulled(ref, repo_id, rev, commit, str(config_path), str(weights_path) if weights_path else None, weight_bytes, note))
    return out


# ---------------------------------------------------------------------------------------------------- search


@dataclass(frozen=True)
class ModelHit:
    repo_id: str
    aliases: tuple[str, ...] = ()
    source: str = "catalog"  # catalog | hub
    downloads: int | None = None
    gated: bool | str | None = None
    match: str = "substring"  # substring | close | hub


def _list_models_page(hf: Any, ctx: _Ctx, text: str, limit: int, token: str | None) -> list[Any]:
    """The first page of HfApi.list_models(search=text, limit=limit), as one request. list_models pages through
    http_backoff, which retries a refused or unresolvable connection five times with back-off: with the network
    down a search spent the whole deadline (10.4 s) where one failed request already says so."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

    params: dict[str, Any] = {"search": text}
    if limit:
        params["limit"] = limit
    response = http_backoff("GET", f"{ctx.endpoint}/api/models", params=params, max_retries=0,
                            headers=build_hf_headers(token=token), timeout=ctx.timeout)
    hf_raise_for_status(response)
    items = response.json()
    if not isinstance(items, list):
        raise ValueError(f"the Hub's model list is not a list ({type(items).__name__})")
    return [hf.ModelInfo(**{"siblings": None, **item}) for item in items if isinstance(item, dict)]


def search_models(
    text: str,
    *,
    hub: bool = False,
    limit: int = 20,
    token: str | None = None,
    timeout: float | str | None = None,
    endpoint: str | None = None,
) -> list[ModelHit]:
    """The bundled catalog (aliases and ids containing the text, else close matches), or with hub=True the Hub's
    model list (HfApi.list_models(search=...)), bounded like every lookup."""
    needle = text.strip().lower()
    if not hub:
        hits: list[ModelHit] = []
        close: list[ModelHit] = []
        for m in sorted(catalog.bundled_models(), key=lambda m: m.repo_id.lower()):
            names = [m.repo_id.lower(), *(a.lower() for a in m.aliases)]
            if any(needle in n for n in names):
                hits.append(ModelHit(m.repo_id, m.aliases))
            elif needle and difflib.get_close_matches(needle, names, n=1, cutoff=0.6):
                close.append(ModelHit(m.repo_id, m.aliases, match="close"))
        found = hits or close  # close matches only when nothing contains the text
        return found[:limit] if limit else found
    if is_offline(None):
        raise InputError("--hub search needs the Hub, but HF_HUB_OFFLINE is set; drop --hub to search the catalog")
    ctx = _Ctx(text, "main", resolve_endpoint(endpoint), resolve_timeout(timeout))
    hf = _hf()
    try:
        found = _bounded(lambda: _list_models_page(hf, ctx, text, limit, token), ctx.timeout,
                         f"searching the Hub for {text!r}")
    except Exception as e:
        raise _explain(e, ctx).error from None
    return [ModelHit(str(m.id), source="hub", match="hub",
                     downloads=m.downloads if isinstance(m.downloads, int) and not isinstance(m.downloads, bool) and m.downloads >= 0 else None,
                     gated=m.gated if isinstance(m.gated, (bool, str)) else None)
            for m in found if isinstance(m.id, str)]  # a Hub answer is data, not trusted types


__all__ = [
    "ModelHit",
    "Pulled",
    "SafetensorsWeights",
    "WeightsUnavailable",
    "fetch_config",
    "fetch_gguf",
    "gguf_header",
    "hub_cache_dir",
    "hub_error",
    "is_offline",
    "kvplan_store_dir",
    "load_weights_file",
    "pull",
    "resolve_endpoint",
    "resolve_timeout",
    "safetensors_weights",
    "search_models",
    "weights_from_record",
]

