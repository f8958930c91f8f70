"""The bundled catalog: genuine config.json files shipped in model_configs/, and their aliases."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvplan.errors import ConfigError

ALIASES = "aliases.json"  # fields: model_configs/README.md


@dataclass(frozen=True)
class BundledModel:
    """One entry of model_configs/aliases.json: the genuine config.json shipped for a Hub id, and its short names."""
    repo_id: str
    config_path: Path
    aliases: tuple[str, ...]
    same_architecture: tuple[str, ...]
    note: str | None


def catalog_dir() -> Path:
    """model_configs/ inside the wheel (kvplan/model_configs), or at the repo root for a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "model_configs", here.parent / "model_configs"):
        if (candidate / ALIASES).is_file():
            return candidate
    raise ConfigError("the bundled model catalog (model_configs/aliases.json) is missing from this installation")


@lru_cache(maxsize=1)
def bundled_models() -> tuple[BundledModel, ...]:
    root = catalog_dir()
    data = json.loads((root / ALIASES).read_text(encoding="utf-8"))
    out = []
    for repo_id, entry in (data.get("models") or {}).items():
        out.append(
            BundledModel(
                repo_id=repo_id,
                config_path=root / entry["dir"] / "config.json",
                aliases=tuple(entry.get("aliases") or ()),
                same_architecture=tuple(entry.get("same_architecture") or ()),
                note=entry.get("note"),
            )
        )
    return tuple(out)


@lru_cache(maxsize=1)
def _index() -> dict[str, BundledModel]:
    idx: dict[str, BundledModel] = {}
    for m in bundled_models():
        idx[m.repo_id.lower()] = m
        for a in m.aliases:
            idx[a.lower()] = m
    return idx


def lookup(ref: str) -> BundledModel | None:
    """An alias or a bundled Hub id (case-insensitive) -> its bundled file."""
    return _index().get(ref.strip().lower())


def lookup_same_architecture(repo_id: str) -> BundledModel | None:
    """A bundled file that aliases.json marks as the same architecture as `repo_id` (Hub fallback)."""
    key = repo_id.strip().lower()
    for m in bundled_models():
        if m.repo_id.lower() == key or key in (s.lower() for s in m.same_architecture):
            return m
    return None


def suggest(ref: str, limit: int = 3) -> list[str]:
    names = sorted({a for m in bundled_models() for a in (*m.aliases, m.repo_id)})
    lowered = {n.lower(): n for n in names}
    hits = difflib.get_close_matches(ref.strip().lower(), list(lowered), n=limit, cutoff=0.5)
    if not hits:  # substring matches help with e.g. "llama-3" or "qwen3"
        hits = [k for k in lowered if ref.strip().lower() in k][:limit]
    return [lowered[h] for h in hits]
