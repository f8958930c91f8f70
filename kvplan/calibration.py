"""Calibrations: the non-KV memory an engine measured at start-up, saved from its log (`kvplan explain LOG
--save-calibration`) and used by later `fit`, `check` and `plan` runs instead of the budget model's estimate.

An engine budgets its cache as the memory it may use less what it measured besides the cache (weights as loaded,
the profile run's activation peak, non-torch memory, CUDA graphs). The log prints the result; a calibration keeps
"requested memory less the printed KV budget" per GPU, for one engine rules row, GPU, model shape, weight format
and parallelism. A later run with the same key takes that figure whole; a different profile (max_num_batched_tokens,
max_num_seqs) moves only the activation peak, by kvplan's estimate of the change, and says so.

The file is YAML, one entry per key (a new save replaces the entry of the same key). Where it lives:
`--calibrations FILE`, else $KVPLAN_CALIBRATIONS, else $XDG_CONFIG_HOME/kvplan/calibrations.yaml
(~/.config/kvplan/calibrations.yaml).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from kvplan.errors import InputError

ENV = "KVPLAN_CALIBRATIONS"
FILE_VERSION = 1


@dataclass(frozen=True)
class Key:
    """What must match for a measured non-KV figure to carry over to another run."""

    engine: str  # kvplan engine name (vllm)
    rules: str  # the engine's rules row the version falls in (0.19 for 0.19.x, 0.20.1 for 0.20.1 .. 0.21.x)
    gpu: str  # catalog GPU name
    model_shape: str  # fingerprint of kvplan's model spec (layers, widths, caches, parameters)
    weight_dtype: str
    tp: int
    pp: int


@dataclass(frozen=True)
class Calibration:
    """Non-KV memory measured from an engine's start-up log, reused for the same model, engine and GPU setup."""
    key: Key
    non_kv_bytes: tuple[int, ...]  # per pipeline stage: requested memory less the printed KV budget (its midpoint)
    half_width_bytes: int  # half the printed precision of the KV budget (0.005 GiB for "43.61 GiB")
    max_num_batched_tokens: int  # the profile it was measured with
    max_num_seqs: int
    engine_version: str  # as the log states it
    model: str  # as kvplan loaded it (for people; matching uses model_shape)
    log: str  # the log's file name, or "stdin"
    log_sha256: str
    # SGLang: the free memory it measured before the weights load, per stage (its budget is a fraction of it);
    # non_kv_bytes is then what the load took (free before less free after). Empty for vLLM.
    free_at_start_bytes: tuple[int, ...] = ()

    def describe(self) -> str:
        k = self.key
        profile = f"max_num_batched_tokens {self.max_num_batched_tokens}, " if self.max_num_batched_tokens else ""
        return f"{k.engine}@{self.engine_version} on {k.gpu}, {self.model}, tp {k.tp} x pp {k.pp}, {profile}from {self.log}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["key"] = asdict(self.key)
        d["non_kv_bytes"] = list(self.non_kv_bytes)
        d["free_at_start_bytes"] = list(self.free_at_start_bytes)
        if not self.free_at_start_bytes:
            del d["free_at_start_bytes"]
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "Calibration":
        try:
            key = Key(**{f.name: _typed(d["key"][f.name], f.type) for f in fields(Key)})
            values = {f.name: d[f.name] for f in fields(cls) if f.name not in ("key", "free_at_start_bytes")}
            values["non_kv_bytes"] = tuple(int(v) for v in values["non_kv_bytes"])
            values["free_at_start_bytes"] = tuple(int(v) for v in d.get("free_at_start_bytes") or ())
            if values["free_at_start_bytes"] and len(values["free_at_start_bytes"]) != key.pp:
                raise ValueError("one free_at_start_bytes figure per pipeline stage")
            for name in ("half_width_bytes", "max_num_batched_tokens", "max_num_seqs"):
                values[name] = int(values[name])
            for name in ("engine_version", "model", "log", "log_sha256"):
                values[name] = _typed(values[name], "str")
            if len(values["non_kv_bytes"]) != key.pp:
                raise ValueError("one non_kv_bytes figure per pipeline stage")
            return cls(key=key, **values)
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"{where}: a calibration entry is malformed ({type(e).__name__}: {e}); save it again with "
                             "kvplan explain LOG --save-calibration") from None


def _typed(value: Any, annotation: str) -> Any:
    if annotation == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {value!r}")
        return value
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {value!r}")
    return value


def default_path() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "kvplan" / "calibrations.yaml"


def load(path: Path | str | None = None, *, must_exist: bool = False) -> tuple[Calibration, ...]:
    """Every calibration in the file; none when the default file does not exist (a named one must)."""
    p = Path(path).expanduser() if path else default_path()
    if not p.exists():
        if must_exist:
            raise InputError(f"{p}: no such calibration file; save one with kvplan explain LOG --save-calibration {p}")
        return ()
    import yaml  # only for a file that exists: the import is a tenth of a cold `fit`
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise InputError(f"{p}: not a readable calibration file ({type(e).__name__}); it is YAML written by "
                         "kvplan explain --save-calibration") from None
    if doc is None:
        return ()
    if not isinstance(doc, dict) or not isinstance(doc.get("calibrations"), list):
        raise InputError(f"{p}: not a calibration file (expected a 'calibrations' list, as kvplan explain "
                         "--save-calibration writes)")
    return tuple(Calibration.from_dict(d, str(p)) for d in doc["calibrations"])


def save(cal: Calibration, path: Path | str | None = None) -> tuple[Path, bool]:
    """Add `cal` to the file (creating it), replacing an entry of the same key. Returns (path, replaced)."""
    import yaml

    p = Path(path).expanduser() if path else default_path()
    existing = load(p)
    kept = [c for c in existing if c.key != cal.key]
    replaced = len(kept) != len(existing)
    doc = {"kvplan_calibrations": FILE_VERSION,
           "calibrations": [c.to_dict() for c in (*kept, cal)]}
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text("# measured non-KV memory per GPU, saved by `kvplan explain LOG --save-calibration`\n"
                       + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        tmp.replace(p)
    except OSError as e:
        raise InputError(f"cannot write the calibration file {p}: {e.strerror or e}") from None
    return p, replaced


def find(cals: tuple[Calibration, ...], key: Key) -> tuple[Calibration | None, str | None]:
    """The calibration for `key`, or None and (where one differs only in rules row or parallelism) why it is not used."""
    for c in cals:
        if c.key == key:
            return c, None
    for c in cals:
        k = c.key
        if (k.engine, k.gpu, k.model_shape, k.weight_dtype) == (key.engine, key.gpu, key.model_shape, key.weight_dtype):
            if k.rules != key.rules:
                return None, (f"a calibration ({c.describe()}) is for {k.engine} rules {k.rules}, this run uses "
                              f"{key.rules}: not used (the engine budgets differently)")
            return None, (f"a calibration ({c.describe()}) is for tp {k.tp} x pp {k.pp}, this run is tp {key.tp} x pp "
                          f"{key.pp}: not used (non-KV memory grows with parallelism)")
    return None, None


def key_for(setup: Any, gpu_name: str) -> Key:
    """The key of a kvplan setup (sizing.Setup) on a catalog GPU: what a saved calibration must match."""
    return Key(setup.engine.name, setup.engine.selected.version, gpu_name, model_shape(setup.spec),
               setup.weight_format.name, setup.tp, setup.pp)


def model_shape(spec: Any) -> str:
    """A fingerprint of what the non-KV memory depends on in the model: two configs with the same architecture,
    layers, widths, caches and parameter count (a base model and its instruct tune) share it."""
    import hashlib  # here: OpenSSL's import is 3 ms of every `fit`, which needs it only with calibrations saved

    text = repr((spec.architecture, spec.num_layers, spec.widths, spec.params, spec.caches, spec.quantization))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()


__all__ = ["Key", "Calibration", "default_path", "load", "save", "find", "key_for", "model_shape", "ENV"]
