"""A GGUF file on the Hub without downloading it: its header (and its sibling shards' for a split model) by HTTP
range requests, a few MiB of a file that may hold hundreds of GiB, or the file itself from the HF cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError, EnvironmentProblem
from kvplan.hub.client import Ctx, bounded, hf_module, hub_cache_dir, is_offline, resolve_endpoint, resolve_timeout
from kvplan.hub.configs import cached_file
from kvplan.hub.errors import explain
from kvplan.model_ref import ModelRef, ResolvedModel


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


def _remote_gguf(repo_id: str, filename: str, revision: str, token: str | None, ctx: Ctx, deadline: float) -> tuple[Any, str | None]:
    """The header of a Hub GGUF file (and of its sibling shards for a split model) by range requests: one HEAD
    per file (size, commit), then a growing prefix of 1, 2, 4 ... MiB until the header is parsed (kvplan.gguf)."""
    import time
    from dataclasses import replace

    from huggingface_hub.utils import build_hf_headers

    from kvplan.gguf import read_header, shard_paths

    hf = hf_module()
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
    ctx = Ctx(repo_id, rev, resolve_endpoint(endpoint), resolve_timeout(timeout), filename)
    offline = is_offline(offline)

    def from_cache(notes: tuple[str, ...] = ()) -> ResolvedModel | None:
        path = cached_file(repo_id, filename, rev)
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
        header, commit = bounded(lambda: _remote_gguf(repo_id, filename, rev, token, ctx, deadline), ctx.timeout,
                                  f"reading {filename}'s header from the Hub")
    except Exception as e:  # explained below
        why = explain(e, ctx)
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
