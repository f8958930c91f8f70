"""What a resolved model is (a reference with provenance and its raw config) and the small readers both the local
resolver (resolve.py) and the Hub client (kvplan/hub/) need; a leaf module, so neither imports the other for them."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError
from kvplan.spec import QUANT_SOURCE_KEY


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
    """A model reference loaded: its config dict, plus what else the source gave (safetensors header, GGUF)."""
    ref: ModelRef
    config: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. safetensors metadata, GGUF header ("gguf")


MAX_TEXT_FILE = 64 << 20  # a config.json is kilobytes; a check file too


def read_text_file(path: Path, shown: str, expected: str, limit: int = MAX_TEXT_FILE) -> str:
    """A regular UTF-8 file's text, or one line: a FIFO, a device (/dev/zero) or a huge file is refused before it
    is read, so none of them can hang the command or fill memory."""
    try:
        info = os.stat(path)
    except OSError as e:
        raise ConfigError(f"cannot read {shown}: {e.strerror or e}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{shown} is not a regular file; expected {expected}")
    if info.st_size > limit:
        raise ConfigError(f"{shown} is {info.st_size:,} bytes, more than the {limit:,} accepted for {expected}")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {shown}: {e.strerror or e}") from None
    if len(data) > limit:
        raise ConfigError(f"{shown} is more than the {limit:,} bytes accepted for {expected}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{shown} is not a UTF-8 text file; expected {expected}") from None


def parse_json(text: str, shown: str) -> Any:
    """json.loads with every parser limit as one line: syntax, nesting too deep for Python's recursion, integers
    beyond Python's digit limit. NaN and Infinity are accepted: real configs (Nemotron-H) contain them."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{shown} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise ConfigError(f"{shown}: JSON nested too deeply to read; a config is a few levels deep") from None
    except ValueError as e:  # int digit limit (sys.set_int_max_str_digits)
        raise ConfigError(f"{shown}: {str(e).split(':')[0]}; a config's numbers are short") from None


def read_config_file(path: Path, shown: str | None = None) -> dict[str, Any]:
    """Read a config.json; one clear line for unreadable or malformed files."""
    shown = shown or str(path)
    data = parse_json(read_text_file(path, shown, "a config.json"), shown)
    if not isinstance(data, dict):
        raise ConfigError(f"{shown} must hold a JSON object (a config.json), found {type(data).__name__}")
    return data


def looks_like_hub_id(ref: str) -> bool:
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not ref.startswith((".", "/", "~"))


# ModelOpt exports up to 0.29 keep their quantization in a file beside config.json, not in it
MODELOPT_QUANT_FILE = "hf_quant_config.json"


def needs_modelopt_quant_file(config: dict[str, Any]) -> bool:
    """vLLM (transformers_utils/config.py get_config) and SGLang (ModelConfig._parse_quant_hf_config) look for
    hf_quant_config.json when config.json has no top-level quantization_config; vLLM also when that config is
    MIXED_PRECISION without its per-module map (model_loader/weight_utils.py: "older ones keep it only in
    hf_quant_config.json")."""
    q = config.get("quantization_config")
    return q is None or (isinstance(q, dict) and not q.get("quantized_layers")
                         and str(q.get("quant_algo") or "").upper() == "MIXED_PRECISION")


def with_modelopt_quant(config: dict[str, Any], path: Path | None, shown: str) -> dict[str, Any]:
    """config with the quantization an hf_quant_config.json beside it declares (path None: there is none).
    The file nests its settings ({"producer": ..., "quantization": {"quant_algo": ...}}); both engines read them
    as a ModelOpt quantization_config, so it becomes one here, flat, with quant_method "modelopt". A
    MIXED_PRECISION config.json without quantized_layers takes only the file's map."""
    if path is None or not needs_modelopt_quant_file(config):
        return config
    data = parse_json(read_text_file(path, shown, "an hf_quant_config.json"), shown)
    settings = data.get("quantization") if isinstance(data, dict) else None
    if not isinstance(settings, dict) or not isinstance(settings.get("quant_algo", ""), (str, type(None))):
        raise ConfigError(f"{shown} must hold a JSON object with a \"quantization\" object (ModelOpt's "
                          "{\"quantization\": {\"quant_algo\": ...}}); found something else")
    own = config.get("quantization_config")
    if isinstance(own, dict):
        if not isinstance(settings.get("quantized_layers"), dict):
            return config  # the file has no map either: the export stays as config.json says (warned later)
        flat = {**own, "quantized_layers": settings["quantized_layers"], QUANT_SOURCE_KEY: MODELOPT_QUANT_FILE}
    else:
        flat = {"quant_method": "modelopt", **settings, QUANT_SOURCE_KEY: MODELOPT_QUANT_FILE}
    return {**config, "quantization_config": flat}
