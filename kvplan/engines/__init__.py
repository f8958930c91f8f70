"""Engine registry: `name[@version]` -> the module that lays out the cache and budgets memory.

Each module in this package declares `ENGINE` (an EngineInfo: names, versions, dtypes, knobs and the rules that
differ by engine) and `KIND_RULES` (one layout rule per cache class); nothing outside the engine modules asks for
an engine by name. Names, aliases and knobs come from listing.py, so a run imports only the engine it uses.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kvplan import dtypes
from kvplan.engines import base
from kvplan.engines.base import EngineInfo, EngineModule, GpuContext, Knob, KVDtypes
from kvplan.engines.listing import LISTINGS
from kvplan.engines.versions import Selected
from kvplan.errors import InputError
from kvplan.spec import ModelSpec

DEFAULT_ENGINE = "vllm"


class _Registry(Mapping[str, EngineModule]):
    """engine name -> its module, imported on first use (a run that sizes for vLLM never loads the other four)."""

    def __getitem__(self, name: str) -> EngineModule:
        return importlib.import_module(LISTINGS[name].module)  # type: ignore[return-value]

    def __contains__(self, name: object) -> bool:  # Mapping's own would import the module to find out
        return name in LISTINGS

    def __iter__(self) -> Iterator[str]:
        return iter(LISTINGS)

    def __len__(self) -> int:
        return len(LISTINGS)


REGISTRY: Mapping[str, EngineModule] = _Registry()
MODULES = REGISTRY  # the name older callers use
_ALIASES = {alias: row.name for row in LISTINGS.values() for alias in row.aliases}


@dataclass(frozen=True)
class Engine:
    """An engine's module together with the version rules a run selected."""
    name: str
    module: EngineModule
    selected: Selected

    @property
    def info(self) -> EngineInfo:
        return self.module.ENGINE

    @property
    def label(self) -> str:
        return self.selected.label


def names() -> tuple[str, ...]:
    return tuple(LISTINGS)


def split_engine(text: str) -> tuple[str, str | None]:
    """'vllm@0.10' -> ('vllm', '0.10'); aliases such as 'llama.cpp' or 'transformers' resolve to their engine."""
    name, at, version = text.strip().partition("@")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    accepted = f"accepted: {', '.join(REGISTRY)} (optionally name@version, e.g. vllm@0.10)"
    if key not in REGISTRY:
        raise InputError(f"unknown engine {text!r}; {accepted}")
    if at and not version.strip():
        raise InputError(f"--engine {text!r} names no version after '@'; {accepted}")
    return key, (version.strip() or None)


def choose(text: str | None) -> Engine:
    name, version = split_engine(text or DEFAULT_ENGINE)
    module = REGISTRY[name]
    return Engine(name, module, module.select_version(version))


def all_knobs() -> dict[str, Knob]:
    """Every engine's knobs by name (a knob name belongs to one engine)."""
    out: dict[str, Knob] = {}
    for row in LISTINGS.values():
        out.update(row.knobs)
    return out


def knob_owners(key: str) -> list[str]:
    return [name for name, row in LISTINGS.items() if key in row.knobs]


def check_knobs(engine: Engine, opts: dict[str, Any]) -> None:
    """A knob that does not apply to the chosen engine is an error, not silently ignored."""
    for key, value in opts.items():
        if value is None:
            continue
        if key not in engine.info.knobs:
            owners = knob_owners(key)
            flag = "--" + key.replace("_", "-")
            where = f" (it applies to {', '.join(owners)})" if owners else ""
            raise InputError(f"{flag} does not apply to engine {engine.name}{where}")


def kv_dtypes(engine: Engine, spec: ModelSpec, kv: str | None, k: str | None, v: str | None, state: str | None) -> KVDtypes:
    info = engine.info
    kvd = base.resolve_kv_dtypes(spec, info.default_kv_dtype(spec), kv, k, v, state,
                                 honours_checkpoint=info.honours_checkpoint_kv)
    for d in {kvd.k, kvd.v}:
        if d.name not in info.kv_dtypes:
            raise InputError(f"{engine.name} cannot store its KV cache as {d.name}; accepted for {engine.name}: "
                             f"{', '.join(info.kv_dtypes)}")
    return kvd


def weight_float_dtype(engine: Engine, spec: ModelSpec) -> dtypes.DType:
    """The dtype an engine loads unquantized weights in."""
    return engine.info.weight_float_dtype(spec)


def model_max_ctx(engine: Engine, spec: ModelSpec) -> tuple[int | None, str]:
    if engine.info.uses_vllm_max_ctx:
        return spec.vllm_max_ctx, spec.vllm_max_ctx_source
    return spec.max_ctx, spec.max_ctx_source


def prepare(engine: Engine, spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, opts: dict[str, Any],
            gpu: GpuContext | None = None):
    check_knobs(engine, opts)
    if tp < 1 or pp < 1:
        raise InputError("--tp and --pp must be positive integers")
    return engine.module.prepare(spec, tp, pp, kvd, engine.selected, opts, gpu)
