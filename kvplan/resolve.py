"""Model reference -> raw config.json with provenance (a local path, an alias or bundled Hub id, or the Hub).

A GGUF model resolves to its header instead of a config: a local .gguf file (any shard of a split model: the
others are read from beside it), a directory holding one GGUF model, or `org/name:path/file.gguf` on the Hub
(header read by HTTP range requests, hub.fetch_gguf). The header is `extras["gguf"]`; `config` stays empty.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kvplan import catalog
from kvplan.errors import ConfigError, ModelNotFoundError, shown
from kvplan.model_ref import (  # noqa: F401 (read_config_file re-exported)
    MODELOPT_QUANT_FILE, ModelRef, ResolvedModel, looks_like_hub_id, read_config_file, with_modelopt_quant,
)


# ---------------------------------------------------------------------------------------------- GGUF
GGUF_HUB_REF = re.compile(r"^(?P<repo>[^/:\s]+/[^/:\s]+):(?P<file>\S+\.gguf)$", re.IGNORECASE)
_SHARD = re.compile(r"-(\d{5})-of-\d{5}\.gguf$", re.IGNORECASE)


def split_gguf_ref(ref: str) -> tuple[str, str] | None:
    """`org/name:path/file.gguf` -> (repo id, file in the repo)."""
    m = GGUF_HUB_REF.match(ref.strip())
    return (m["repo"], m["file"]) if m else None


def is_gguf_file(path: Path) -> bool:
    """A .gguf name, or a regular file starting with the GGUF magic (never opens a FIFO or a device)."""
    if path.suffix.lower() == ".gguf":
        return True
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def gguf_in_dir(path: Path, ref: str) -> Path | None:
    """The one GGUF model in a directory: its single file or the first shard of a split, mmproj files aside."""
    files = sorted(p for p in path.glob("*.gguf") if p.is_file())
    models = [p for p in files if "mmproj" not in p.name.lower()
              and ((m := _SHARD.search(p.name)) is None or int(m.group(1)) == 1)]
    if len(models) > 1:
        raise ConfigError(f"{ref} holds several GGUF models ({', '.join(p.name for p in models[:4])}"
                          f"{', ...' if len(models) > 4 else ''}); pass one file")
    return models[0] if models else None


def local_gguf(path: Path, ref: str) -> ResolvedModel:
    from kvplan.gguf import read_split_headers

    header = read_split_headers(path)
    return ResolvedModel(ModelRef(requested=ref, id=None, source="file", path=header.source or str(path)), {},
                         {"gguf": header})


def read_gguf(ref: str, **hub_options: Any) -> Any:
    """The GGUF header of a local file or `org/name:file.gguf` (e.g. --mmproj), or one line of error."""
    path = Path(ref).expanduser()
    if path.is_file():
        return local_gguf(path, ref).extras["gguf"]
    hub_ref = split_gguf_ref(ref)
    if hub_ref is None:
        raise ModelNotFoundError(f"{ref}: no such file (a .gguf path or org/name:file.gguf is accepted)")
    return _resolve_hub_gguf(ref, *hub_ref, **hub_options).extras["gguf"]


# ---------------------------------------------------------------------------------------------- local, bundled
def resolve_local(ref: str) -> ResolvedModel | None:
    path = Path(ref).expanduser()
    try:
        if not path.exists():
            return None
    except OSError as e:  # a name too long for the filesystem, for instance
        raise ModelNotFoundError(f"{shown(ref, 120)}: {e.strerror or e}") from None
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            gguf = gguf_in_dir(path, ref)
            if gguf is None:
                raise ConfigError(f"{ref} is a directory without a config.json or a .gguf model")
            return local_gguf(gguf, ref)
        path = cfg
    elif not path.is_file():
        raise ConfigError(f"{ref} is not a regular file (a FIFO or a device?); expected a config.json, a .gguf file "
                          "or a directory holding one")
    elif is_gguf_file(path):
        return local_gguf(path, ref)
    config = local_modelopt_quant(read_config_file(path, ref), path)
    name = config.get("_name_or_path")
    return ResolvedModel(ModelRef(requested=ref, id=name if isinstance(name, str) and name else None, source="file",
                                  path=str(path)), config)


def local_modelopt_quant(config: dict[str, Any], path: Path, shown: str | None = None) -> dict[str, Any]:
    """A model directory's config.json with the hf_quant_config.json beside it, as vLLM and SGLang load a local
    ModelOpt export (model_ref.with_modelopt_quant); a config file under another name stands alone."""
    quant = path.parent / MODELOPT_QUANT_FILE
    if path.name != "config.json" or not quant.exists():
        return config
    return with_modelopt_quant(config, quant, f"{shown} {MODELOPT_QUANT_FILE}" if shown else str(quant))


def resolve_bundled(ref: str) -> ResolvedModel | None:
    entry = catalog.lookup(ref)
    if entry is None:
        return None
    notes = (entry.note,) if entry.note and ref.lower() != entry.repo_id.lower() else ()
    config = local_modelopt_quant(read_config_file(entry.config_path, f"bundled {entry.repo_id}"), entry.config_path,
                                  f"bundled {entry.repo_id}")
    return ResolvedModel(
        ModelRef(requested=ref, id=entry.repo_id, source="bundled", path=str(entry.config_path), notes=notes), config
    )


def resolve(ref: str, **hub_options: Any) -> ResolvedModel:
    """Resolve a model reference. Order: local path, alias / bundled Hub id, then the Hub (see kvplan/hub/)."""
    ref = ref.strip()
    if not ref:
        raise ModelNotFoundError("no model given; pass an alias (kvplan models), a Hub id org/name or a path")
    wants_hub = any(hub_options.get(k) for k in ("revision", "refresh", "hub"))
    local = resolve_local(ref)
    if local is not None:
        return local
    hub_gguf = split_gguf_ref(ref)
    if hub_gguf is not None:
        return _resolve_hub_gguf(ref, *hub_gguf, **hub_options)
    if ref.lower().endswith(".gguf"):
        raise ModelNotFoundError(f"{ref}: no such file (a GGUF on the Hub is written org/name:file.gguf)")
    if not wants_hub:
        bundled = resolve_bundled(ref)
        if bundled is not None:
            return bundled
    elif (entry := catalog.lookup(ref)) is not None:  # an alias with --revision/--refresh/--hub: its Hub id
        return _resolve_hub(entry.repo_id, **{**hub_options, "requested": ref})
    if looks_like_hub_id(ref):
        return _resolve_hub(ref, **hub_options)
    close = catalog.suggest(ref)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ModelNotFoundError(
        f"unknown model {ref!r}: not a file, not an alias and not a Hub id (org/name){hint} "
        "(`kvplan models` lists the aliases)"
    )


def _resolve_hub(ref: str, **hub_options: Any) -> ResolvedModel:
    """A Hub id: the HF cache or the Hub, falling back as hub.fetch_config explains (huggingface_hub loads lazily)."""
    from kvplan import hub

    known = ("revision", "offline", "refresh", "token", "timeout", "endpoint", "requested")
    return hub.fetch_config(ref, **{k: hub_options[k] for k in known if hub_options.get(k) is not None})


def _resolve_hub_gguf(ref: str, repo_id: str, filename: str, **hub_options: Any) -> ResolvedModel:
    """A GGUF file in a Hub repo: its header by HTTP range requests, or the HF cache (hub.fetch_gguf)."""
    from kvplan import hub

    known = ("revision", "offline", "refresh", "token", "timeout", "endpoint")
    return hub.fetch_gguf(repo_id, filename, requested=ref,
                          **{k: hub_options[k] for k in known if hub_options.get(k) is not None})
