"""Engine registry: `name[@version]` -> the module that lays out the cache (and later budgets memory)."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kvplan import dtypes
from kvplan.engines import base, hf, llamacpp, sglang, trtllm, vllm
from kvplan.engines.base import KVDtypes
from kvplan.engines.versions import Selected, split_engine
from kvplan.errors import InputError
from kvplan.spec import ModelSpec

MODULES: dict[str, ModuleType] = {"vllm": vllm, "sglang": sglang, "llamacpp": llamacpp, "trtllm": trtllm, "hf": hf}


@dataclass(frozen=True)
class Engine:
    name: str
    module: ModuleType
    selected: Selected

    @property
    def label(self) -> str:
        return self.selected.label


def choose(text: str | None) -> Engine:
    name, version = split_engine(text or "vllm")
    module = MODULES[name]
    return Engine(name, module, module.select_version(version))


def knob_names(name: str) -> list[str]:
    return sorted(MODULES[name].KNOBS)


def check_knobs(engine: Engine, opts: dict[str, Any]) -> None:
    """A knob that does not apply to the chosen engine is an error, not silently ignored."""
    for key, value in opts.items():
        if value is None:
            continue
        if key not in engine.module.KNOBS:
            owners = [n for n, m in MODULES.items() if key in m.KNOBS]
            flag = "--" + key.replace("_", "-")
            where = f" (it applies to {', '.join(owners)})" if owners else ""
            raise InputError(f"{flag} does not apply to engine {engine.name}{where}")


def default_kv_dtype(engine: Engine, spec: ModelSpec) -> dtypes.DType:
    if engine.name == "hf":
        return hf.load_dtype(spec)
    if engine.name == "llamacpp":
        return dtypes.KV_DTYPES["fp16"]
    return base.serving_dtype(spec)


def kv_dtypes(engine: Engine, spec: ModelSpec, kv: str | None, k: str | None, v: str | None, state: str | None) -> KVDtypes:
    honours = engine.name in ("vllm", "sglang", "trtllm")
    kvd = base.resolve_kv_dtypes(spec, default_kv_dtype(engine, spec), kv, k, v, state, honours_checkpoint=honours)
    allowed = engine.module.KV_DTYPES
    for d in {kvd.k, kvd.v}:
        if d.name not in allowed:
            raise InputError(f"{engine.name} cannot store its KV cache as {d.name}; accepted for {engine.name}: "
                             f"{', '.join(allowed)}")
    return kvd


def model_max_ctx(engine: Engine, spec: ModelSpec) -> tuple[int | None, str]:
    if engine.name in ("vllm", "sglang", "trtllm"):
        return spec.vllm_max_ctx, spec.vllm_max_ctx_source
    return spec.max_ctx, spec.max_ctx_source


def prepare(engine: Engine, spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, opts: dict[str, Any], **gpu: Any):
    check_knobs(engine, opts)
    if tp < 1 or pp < 1:
        raise InputError("--tp and --pp must be positive integers")
    return engine.module.prepare(spec, tp, pp, kvd, engine.selected, opts, **gpu)
