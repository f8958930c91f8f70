"""`kvplan pull`: store a model's config and safetensors header summary so later runs work offline, and with
--to DIR also a catalog folder (DIR/<org>--<name>/ and DIR/aliases.yaml in the model_configs layout)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplan import catalog
from kvplan.errors import ConfigError, InputError, ModelNotFoundError
from kvplan.hub.client import CONFIG_NAME, Ctx, is_offline, resolve_endpoint, resolve_timeout
from kvplan.hub.configs import fetch_config
from kvplan.hub.errors import WeightsUnavailable, explain, line
from kvplan.hub.safetensors import fetch_record, store_folder, weights_from_record, write_json
from kvplan.model_ref import looks_like_hub_id

WEIGHTS_FILE = "safetensors.json"  # the safetensors header summary inside a `pull --to DIR` catalog folder


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
    """DIR/aliases.yaml: model_configs/aliases.json's layout, as YAML (models: {repo_id: {dir, aliases, ...}})."""
    import yaml

    path = folder / "aliases.yaml"
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {line(e)}") from None
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
    header = ("# Written by `kvplan pull --to`: the layout of model_configs/aliases.json, as YAML (pass this folder as a "
              "catalog).\n")
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
        ctx = Ctx(repo_id, rev, resolve_endpoint(endpoint), resolve_timeout(timeout), "model.safetensors")
        note = None
        record: dict[str, Any] | None = None
        weights_path: Path | None = None
        try:
            record = fetch_record(repo_id, ctx, commit, token)
        except Exception as e:
            err = explain(e, ctx).error
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
            weights_path = store_folder(repo_id) / f"{commit or rev}.json"
            write_json(weights_path, record)
        config_path = Path(resolved.ref.path or "")
        if to is not None:
            folder = Path(to).expanduser()
            model_dir = folder / repo_id.replace("/", "--")
            model_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(config_path, model_dir / CONFIG_NAME)
            config_path = model_dir / CONFIG_NAME
            if record is not None:
                weights_path = model_dir / WEIGHTS_FILE
                write_json(weights_path, record)
            _update_aliases(folder, repo_id, alias, rev, commit)
        out.append(Pulled(ref, repo_id, rev, commit, str(config_path), str(weights_path) if weights_path else None, weight_bytes, note))
    return out
