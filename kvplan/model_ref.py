"""What a resolved model is (a reference with provenance and its raw config) and the small readers both the local
resolver (resolve.py) and the Hub client (hub.py) need; a leaf module, so neither imports the other for them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError


@dataclass(frozen=True)
class ModelRef:
    """Where a config came from: the `model` object of every JSON output (CONTRACTS.md)."""

    requested: str
    id: str | None
    source: str  # file | bundled | cache | hub
    revision: str | None = None
    commit: str | None = None
    path: str | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "id": self.id,
            "source": self.source,
            "revision": self.revision,
            "commit": self.commit,
        }


@dataclass(frozen=True)
class ResolvedModel:
    ref: ModelRef
    config: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. safetensors metadata, GGUF header ("gguf")


def read_config_file(path: Path, shown: str | None = None) -> dict[str, Any]:
    """Read a config.json; one clear line for unreadable or malformed files."""
    shown = shown or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {shown}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{shown} is not a UTF-8 text file; expected a config.json") from None
    try:
        data = json.loads(text)  # accepts Infinity/NaN, which real configs (Nemotron-H) contain
    except json.JSONDecodeError as e:
        raise ConfigError(f"{shown} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{shown} must hold a JSON object (a config.json), found {type(data).__name__}")
    return data


def looks_like_hub_id(ref: str) -> bool:
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not ref.startswith((".", "/", "~"))
