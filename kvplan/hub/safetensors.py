"""Exact weight bytes from safetensors headers (never the tensor data): read from the Hub by range requests,
summarised in a small JSON record stored under $HF_HOME/kvplan for offline runs, and summed by dtype with
multi-token-prediction layers left out (they load only for speculative decoding)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvplan.hub.client import (
    Ctx, bounded, hf_module, hub_cache_dir, is_offline, kvplan_store_dir, map_bounded, resolve_endpoint,
    resolve_timeout,
)
from kvplan.hub.configs import cached_config
from kvplan.hub.errors import WeightsUnavailable, explain, line
from kvplan.model_ref import parse_json, read_text_file

RECORD_FORMAT = "kvplan-safetensors-1"

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
        raise WeightsUnavailable(f"cannot read safetensors metadata {path}: {line(e)}") from None
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


def store_folder(repo_id: str) -> Path:
    return kvplan_store_dir() / repo_id.replace("/", "--")


def _stored_record(repo_id: str, commit: str | None, revision: str) -> dict[str, Any] | None:
    """What pull stored: <commit>.json when the commit is known, else the newest record for that revision."""
    folder = store_folder(repo_id)
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    tmp.replace(path)


def _cached_commit(repo_id: str, revision: str) -> str | None:
    hit = cached_config(repo_id, revision)
    return hit.parent.name if hit is not None else None


def fetch_record(repo_id: str, ctx: Ctx, commit: str | None, token: str | None) -> dict[str, Any]:
    """The safetensors headers of a single-file or sharded checkpoint, as get_safetensors_metadata reads them
    (HEAD model.safetensors, else the index, then a 100 kB range read per file), under one deadline."""
    import time

    hf = hf_module()
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
        return True, index.get("metadata"), map_bounded(header, shards, deadline)

    sharded, index_metadata, files = bounded(fetch, ctx.timeout, "reading safetensors headers from the Hub")
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
    ctx = Ctx(repo_id, rev, resolve_endpoint(endpoint), resolve_timeout(timeout), "model.safetensors")
    commit = commit or _cached_commit(repo_id, rev)
    stored = _stored_record(repo_id, commit, rev)
    if stored is not None:
        return weights_from_record(stored, config, include_mtp=include_mtp, source="cache")
    if is_offline(offline):
        raise WeightsUnavailable(
            f"offline and no safetensors metadata stored for {repo_id}@{rev}; run `kvplan pull {repo_id}` while online"
        )
    try:
        record = fetch_record(repo_id, ctx, commit, token)
    except Exception as e:
        raise WeightsUnavailable(str(explain(e, ctx).error)) from None
    if commit:
        try:
            write_json(store_folder(repo_id) / f"{commit}.json", record)
        except OSError:
            pass  # a read-only HF_HOME only costs the next lookup a request
    return weights_from_record(record, config, include_mtp=include_mtp, source="hub")
