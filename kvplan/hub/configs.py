"""A Hub id's config.json: from the HF cache, else one short metadata request and the download, with the
hf_quant_config.json of the same commit where config.json declares no quantization (a ModelOpt export's), all
under one deadline; when the Hub fails, a cached copy, then a bundled config of the same architecture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvplan import catalog
from kvplan.errors import KvplanError
from kvplan.hub.client import (
    CONFIG_NAME, Ctx, Offline, bounded, hf_module, hub_cache_dir, is_offline, resolve_endpoint, resolve_timeout,
)
from kvplan.hub.errors import explain
from kvplan.model_ref import (
    MODELOPT_QUANT_FILE, ModelRef, ResolvedModel, needs_modelopt_quant_file, read_config_file, with_modelopt_quant,
)


def cached_config(repo_id: str, revision: str) -> Path | None:
    """config.json from the HF cache at that revision (a branch or tag via refs/, or a commit sha)."""
    return cached_file(repo_id, CONFIG_NAME, revision)


def cached_file(repo_id: str, filename: str, revision: str) -> Path | None:
    hf = hf_module()
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
    hf = hf_module()
    try:
        hit = hf.try_to_load_from_cache(repo_id, MODELOPT_QUANT_FILE, cache_dir=hub_cache_dir(), revision=commit)
    except Exception:  # an invalid name: unknown
        return None
    if isinstance(hit, str):
        return Path(hit)
    return None if hit is None else False


def _quant_fetcher(repo_id: str, token: str | None, ctx: Ctx, deadline: float) -> Callable[[str], None]:
    """Downloads hf_quant_config.json at a commit into the HF cache, within what is left of the lookup's deadline;
    the Hub's 404 is an answer (huggingface_hub records it under .no_exist, so the cache knows next time, offline
    too). Any other failure: its one line."""
    import time

    endpoint = ctx.endpoint

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    def fetch(commit: str) -> None:
        from huggingface_hub import errors as E

        hf = hf_module()

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
            bounded(download, left(), f"fetching {repo_id}'s {MODELOPT_QUANT_FILE} from the Hub")
        except Exception as e:
            raise explain(e, Ctx(repo_id, commit, endpoint, ctx.timeout, MODELOPT_QUANT_FILE)).error from None

    return fetch


def _download_config(repo_id: str, revision: str, token: str | None, endpoint: str, deadline: float) -> Path:
    """One short metadata request without retries, so a 5xx, a refusal or a dead network comes back at once and
    typed; then hf_hub_download into the HF cache (it records refs/<revision> for later offline use)."""
    import time

    hf = hf_module()

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
    ctx = Ctx(repo_id, rev, resolve_endpoint(endpoint), resolve_timeout(timeout))
    offline = is_offline(offline)

    deadline = time.monotonic() + ctx.timeout  # config.json and hf_quant_config.json together
    fetch_quant = None if offline else _quant_fetcher(repo_id, token, ctx, deadline)
    if offline or not refresh:
        cached = cached_config(repo_id, rev)
        if cached is not None:
            return _from_file(cached, requested, repo_id, rev, "cache", fetch_quant=fetch_quant)

    failure: BaseException
    if offline:
        failure = Offline()
    else:
        try:
            path = bounded(lambda: _download_config(repo_id, rev, token, ctx.endpoint, deadline), ctx.timeout,
                            f"fetching {repo_id}'s config.json from the Hub")
        except Exception as e:  # explained below
            failure = e
        else:
            return _from_file(path, requested, repo_id, rev, "hub", fetch_quant=fetch_quant)

    why = explain(failure, ctx)
    if fallback and why.cache_ok:
        cached = cached_config(repo_id, rev)
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
