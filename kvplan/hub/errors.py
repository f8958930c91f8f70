"""Every huggingface_hub failure -> one kvplan error line, and whether a cached or bundled config may stand in.

One table at one boundary, as huggingface_hub's own cli/_errors.py CLI_ERROR_MAPPINGS: errors_table() maps an
exception type to its rule, in order, and the first type the exception is an instance of decides (explain). The
order matters where huggingface_hub's types nest (GatedRepoError is a RepositoryNotFoundError, which is an
HfHubHTTPError; OfflineModeIsEnabled is a ConnectionError). Failures are told apart by type, never by message:
the Hub answers 401 both for missing repos and for private or gated ones without a token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from kvplan import catalog
from kvplan.errors import ConfigError, EnvironmentProblem, InputError, KvplanError, ModelNotFoundError
from kvplan.hub.client import CONFIG_NAME, Ctx, Deadline, Offline, hub_cache_dir, resolve_endpoint, resolve_timeout


class WeightsUnavailable(KvplanError):
    """No safetensors metadata for a model (none on the Hub, unreachable, not pulled): the CLI falls back to
    config-derived weight bytes and says why."""


@dataclass(frozen=True)
class Failure:
    error: KvplanError
    cache_ok: bool  # a cached copy (older commit or earlier login) may stand in
    bundled_ok: bool  # a bundled same-architecture config may stand in


Rule = Callable[[BaseException, Ctx], Failure]


def line(text: object, limit: int = 160) -> str:
    """The first non-blank line of a message, cut to `limit` characters (kvplan's errors are one line)."""
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


def _at(c: Ctx) -> str:
    return f"{c.repo_id}@{c.revision}"


# ---------------------------------------------------------------------------------------------------- rules


def _passed_on(exc: BaseException, c: Ctx) -> Failure:
    return Failure(exc, False, False)  # type: ignore[arg-type] (a KvplanError already says it)


def _timed_out(exc: BaseException, c: Ctx) -> Failure:
    return Failure(EnvironmentProblem(
        f"no complete answer from {c.endpoint} for {c.repo_id} within {c.timeout:g} s "
        "(raise --timeout or KVPLAN_HUB_TIMEOUT, or use --offline with a cached copy)"), True, True)


def _offline(exc: BaseException, c: Ctx) -> Failure:
    return Failure(EnvironmentProblem(
        f"offline (--offline or HF_HUB_OFFLINE) and {_at(c)} is not in the Hugging Face cache ({hub_cache_dir()}); "
        f"run `kvplan pull {c.repo_id}` while online"), True, True)


def _gated(exc: BaseException, c: Ctx) -> Failure:
    repo, url = c.repo_id, f"{c.endpoint}/{c.repo_id}"
    if _sent_token(exc):
        msg = f"{repo} is gated and this token has no access: accept the license at {url} with its account"
    else:
        msg = f"{repo} is gated: accept its license at {url}, then set HF_TOKEN, run `hf auth login` or pass --token"
    return Failure(InputError(msg), True, True)


def _disabled(exc: BaseException, c: Ctx) -> Failure:
    return Failure(ModelNotFoundError(f"{c.repo_id} has been disabled by its author on {c.endpoint}"), True, False)


def _repo_not_found(exc: BaseException, c: Ctx) -> Failure:
    repo = c.repo_id
    close = catalog.suggest(repo)
    hint = f"; close names in the catalog: {', '.join(close)}" if close else ""
    why = "or private and this token has no access" if _sent_token(exc) else "or private and you are not logged in"
    return Failure(ModelNotFoundError(f"{repo} not found on {c.endpoint}, {why}{hint}"), True, False)


def _revision_not_found(exc: BaseException, c: Ctx) -> Failure:
    return Failure(ModelNotFoundError(f"{c.repo_id} has no revision {c.revision!r} (a branch, tag or full commit sha)"),
                   False, False)


def _not_cached(exc: BaseException, c: Ctx) -> Failure:
    from huggingface_hub import errors as E

    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, E.FileMetadataError):  # the endpoint answered, but not with the Hub's headers
        return explain(cause, c)
    return Failure(EnvironmentProblem(f"{_at(c)} is not in the Hugging Face cache and the Hub cannot be reached"),
                   True, True)


def _no_such_file(exc: BaseException, c: Ctx) -> Failure:
    if c.filename == CONFIG_NAME:
        msg = (f"{_at(c)} has no config.json (a GGUF-only or non-transformers repo?); pass a local config.json or "
               ".gguf path")
    else:
        msg = f"{_at(c)} has no {c.filename}"
    return Failure(ConfigError(msg), False, False)


def _no_safetensors(exc: BaseException, c: Ctx) -> Failure:
    return Failure(WeightsUnavailable(f"{_at(c)} has no safetensors weights (model.safetensors or its .index.json)"),
                   False, False)


def _bad_safetensors(exc: BaseException, c: Ctx) -> Failure:
    return Failure(WeightsUnavailable(f"{_at(c)}: unreadable safetensors header ({line(exc)})"), False, False)


def _not_the_hub(exc: BaseException, c: Ctx) -> Failure:
    return Failure(EnvironmentProblem(
        f"{c.endpoint} does not answer like the Hugging Face Hub (no X-Repo-Commit or ETag); check HF_ENDPOINT and "
        "proxies"), True, True)


def _http(exc: BaseException, c: Ctx) -> Failure:
    ep = c.endpoint
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", "?")
    server = line(getattr(exc, "server_message", None) or "")
    if "invalid credentials" in server.lower():
        msg = f"{ep} rejected the token (invalid credentials); check HF_TOKEN, your login or --token"
        return Failure(InputError(msg), True, True)
    detail = f": {server}" if server else ""
    return Failure(EnvironmentProblem(f"the Hub at {ep} failed for {c.repo_id} (HTTP {status}{detail})"), True, True)


def _invalid_id(exc: BaseException, c: Ctx) -> Failure:
    return Failure(InputError(f"{c.repo_id!r} is not a valid Hub id: {line(exc)}"), False, False)


def _unreachable(exc: BaseException, c: Ctx) -> Failure:
    return Failure(EnvironmentProblem(
        f"cannot reach {c.endpoint} ({line(exc) or type(exc).__name__}); check the network, HF_ENDPOINT or proxy, "
        "or use --offline with a cached copy"), True, True)


def _unknown(exc: BaseException, c: Ctx) -> Failure:
    return Failure(EnvironmentProblem(f"Hub lookup of {_at(c)} failed: {type(exc).__name__}: {line(exc)}"), True, True)


@functools.lru_cache(maxsize=1)
def errors_table() -> dict[type[BaseException], Rule]:
    """Exception type -> rule, first match wins; built on first use, so huggingface_hub is imported only when a
    lookup has failed."""
    from huggingface_hub import errors as E

    timeouts, network = _transport_errors()
    rows: list[tuple[tuple[type[BaseException], ...], Rule]] = [
        ((KvplanError,), _passed_on),
        ((Deadline, *timeouts), _timed_out),
        ((Offline, E.OfflineModeIsEnabled), _offline),
        ((E.GatedRepoError,), _gated),
        ((E.DisabledRepoError,), _disabled),
        ((E.RepositoryNotFoundError,), _repo_not_found),
        ((E.RevisionNotFoundError,), _revision_not_found),
        ((E.LocalEntryNotFoundError,), _not_cached),  # before EntryNotFoundError, its base in huggingface_hub 0.x
        ((getattr(E, "RemoteEntryNotFoundError", E.EntryNotFoundError),), _no_such_file),
        ((E.NotASafetensorsRepoError,), _no_safetensors),
        ((E.SafetensorsParsingError,), _bad_safetensors),
        ((E.FileMetadataError,), _not_the_hub),
        ((E.HfHubHTTPError,), _http),
        ((E.HFValidationError,), _invalid_id),
        (network, _unreachable),
    ]
    table: dict[type[BaseException], Rule] = {}
    for types, rule in rows:
        for t in types:
            table.setdefault(t, rule)  # a type listed twice keeps its first (earlier, more specific) rule
    return table


def explain(exc: BaseException, c: Ctx) -> Failure:
    """The first rule of errors_table() whose type `exc` is an instance of; anything else is 'Hub lookup ... failed'."""
    for kind, rule in errors_table().items():
        if isinstance(exc, kind):
            return rule(exc, c)
    return _unknown(exc, c)


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
    ctx = Ctx(repo_id, revision or "main", resolve_endpoint(endpoint), resolve_timeout(timeout), filename)
    return explain(exc, ctx).error
