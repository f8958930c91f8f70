"""`kvplan size`: model reference -> ModelSpec -> engine layout -> CachePlan + weights, as one result object.

The same `Setup` (model, engine, dtypes, prepared layout, weights) is what `fit` and `verify` start from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvplan import JSON_SCHEMA, engines, weights
from kvplan.architectures import normalize
from kvplan.engines import Engine
from kvplan.engines.base import CachePlan, GpuContext, KVDtypes, PreparedLayout
from kvplan.errors import ConfigError, InputError
from kvplan.model_ref import ModelRef, ResolvedModel
from kvplan.resolve import resolve
from kvplan.spec import ModelSpec


@dataclass(frozen=True)
class ModelOptions:
    """How to find the model and read its config."""

    model: str
    revision: str | None = None
    offline: bool | None = None
    refresh: bool = False
    hub: bool = False
    token: str | None = None
    timeout: float | None = None
    encoder_len: int | None = None
    mmproj: str | None = None  # a GGUF vision projector (llama.cpp --mmproj): its tensors join the weights


@dataclass(frozen=True)
class EngineOptions:
    """Engine, dtypes, parallelism and engine knobs (None = the engine's default)."""

    engine: str | None = None
    kv_dtype: str | None = None
    k_dtype: str | None = None
    v_dtype: str | None = None
    state_dtype: str | None = None
    weight_dtype: str | None = None
    tp: int = 1
    pp: int = 1
    knobs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Setup:
    """Everything fixed before choosing ctx and batch."""

    resolved: ResolvedModel
    spec: ModelSpec
    engine: Engine
    kvd: KVDtypes
    prepared: PreparedLayout
    tp: int
    pp: int
    weight_format: weights.WeightFormat
    float_dtype: str
    max_ctx: int | None
    max_ctx_source: str
    include_mtp: bool = False
    safetensors: Any = None  # hub.SafetensorsWeights when the checkpoint's headers were read
    weight_notes: tuple[str, ...] = ()

    @property
    def ref(self) -> ModelRef:
        return self.resolved.ref

    def weight_bytes(self, stage: int) -> int:
        """Weights on one GPU of `stage`: the config-derived split, scaled to the checkpoint's safetensors bytes
        when those were read (exact on one GPU)."""
        cfg = weights.per_gpu_bytes(self.spec, self.weight_format, self.float_dtype, self.tp, self.pp, stage,
                                    include_mtp=self.include_mtp)
        if self.safetensors is None:
            return cfg
        if self.tp == 1 and self.pp == 1:
            return self.safetensors.total_bytes
        return cfg * self.safetensors.total_bytes // max(1, self.weight_bytes_config())

    def json_header(self, engine: str, ctx: int, batch: int) -> dict[str, Any]:
        """The keys every per-request JSON output starts with (size, verify): CONTRACTS.md order."""
        out: dict[str, Any] = {
            "schema": JSON_SCHEMA, "model": self.ref.to_json(), "engine": engine, "tp": self.tp, "pp": self.pp,
            "ctx": ctx, "batch": batch, "kv_dtype": self.kvd.label, "kv_dtype_source": self.kvd.source,
        }
        if self.kvd.k != self.kvd.v:
            out["k_dtype"], out["v_dtype"] = self.kvd.k.name, self.kvd.v.name
        return out

    @property
    def weight_source(self) -> str:
        if self.resolved.extras.get("gguf") is not None:
            return "gguf"
        return "safetensors" if self.safetensors is not None else "config"

    def weight_bytes_all_gpus(self) -> int:
        if self.tp == 1 and self.pp == 1:
            return self.weight_bytes(0)
        return sum(self.weight_bytes(s) for s in range(self.pp)) * self.tp

    def weight_bytes_config(self) -> int:
        return weights.total_bytes(self.spec, self.weight_format, self.float_dtype, include_mtp=self.include_mtp)


def load_spec(mo: ModelOptions) -> tuple[ResolvedModel, ModelSpec]:
    hub_options = dict(revision=mo.revision, offline=mo.offline, refresh=mo.refresh, hub=mo.hub, token=mo.token,
                       timeout=mo.timeout)
    resolved = resolve(mo.model, **hub_options)
    header = resolved.extras.get("gguf")
    if header is None:
        if mo.mmproj:
            raise InputError("--mmproj applies to a GGUF model (a .gguf file or org/name:file.gguf)")
        try:
            spec = normalize(resolved.config, encoder_len=mo.encoder_len)
        except ConfigError as e:
            raise ConfigError(f"{mo.model}: {e}") from None
        if mo.encoder_len and not spec.is_encoder_decoder:
            raise InputError("--encoder-len applies to encoder-decoder and cross-attention models (T5, Whisper, "
                             f"Llama-3.2-Vision); {mo.model} has no cross attention")
        return resolved, spec
    from kvplan.architectures import gguf_spec
    from kvplan.resolve import read_gguf

    mmproj = read_gguf(mo.mmproj, **hub_options) if mo.mmproj else None
    if mmproj is not None:
        resolved = replace(resolved, extras={**resolved.extras, "mmproj": mmproj})
    return resolved, gguf_spec.from_header(header, mmproj)


def quant_mix(header: Any) -> list[dict[str, Any]]:
    """A GGUF file's weight bytes by ggml type, largest first: [{type, bytes, share}]."""
    return [{"type": t, "bytes": b, "share": round(f, 6)} for t, b, f in header.quant_mix()]


def quant_mix_text(header: Any) -> str:
    """"Q4_K 61%, Q6_K 20%, F32 0.4%": what llama.cpp users recognise from llama-quantize."""
    def pct(f: float) -> str:
        return f"{f:.0%}" if f >= 0.01 else ("<0.1%" if f < 0.001 else f"{f:.1%}")

    return ", ".join(f"{t} {pct(f)}" for t, _, f in header.quant_mix())


def float_dtype_for(engine: Engine, spec: ModelSpec) -> str:
    """The dtype an engine loads unquantized weights in (EngineInfo.weight_float_dtype)."""
    return engines.weight_float_dtype(engine, spec).name


def setup(mo: ModelOptions, eo: EngineOptions, *, gpu: GpuContext | None = None,
          loaded: tuple[ResolvedModel, ModelSpec] | None = None) -> Setup:
    """gpu: the device fit plans for (some engine defaults depend on it); None for `size`, which knows none."""
    resolved, spec = loaded or load_spec(mo)
    engine = engines.choose(eo.engine)
    kvd = engines.kv_dtypes(engine, spec, eo.kv_dtype, eo.k_dtype, eo.v_dtype, eo.state_dtype)
    prepared = engines.prepare(engine, spec, eo.tp, eo.pp, kvd, {k: v for k, v in eo.knobs.items() if v is not None},
                               gpu)
    fmt = weights.weight_format(spec, eo.weight_dtype, float_dtype_for(engine, spec))
    fdt = fmt.float_dtype(float_dtype_for(engine, spec))
    max_ctx, src = engines.model_max_ctx(engine, spec)
    s = Setup(resolved, spec, engine, kvd, prepared, eo.tp, eo.pp, fmt, fdt, max_ctx, src)
    if resolved.ref.source in ("hub", "cache") and eo.weight_dtype is None and resolved.extras.get("gguf") is None:
        s = _with_safetensors(s, mo)
    return s


def _with_safetensors(s: Setup, mo: ModelOptions) -> Setup:
    """Exact checkpoint bytes from the safetensors headers (kvplan/hub/); config-derived bytes when unavailable."""
    from kvplan import hub

    try:
        st = hub.safetensors_weights(s.ref.id, s.resolved.config, revision=s.ref.revision, commit=s.ref.commit,
                                     token=mo.token, timeout=mo.timeout, offline=mo.offline, include_mtp=s.include_mtp)
    except hub.WeightsUnavailable as e:
        return replace(s, weight_notes=(f"weights from the config: {e}",))
    cfg = s.weight_bytes_config()
    notes = [f"weights from safetensors headers: {st.total_bytes:,} B in {st.n_tensors:,} tensors"
             + (f" ({st.excluded_reason})" if st.excluded_bytes else "")]
    if cfg and abs(st.total_bytes - cfg) > 0.01 * cfg:
        notes.append(f"the config-derived weights ({cfg:,} B, {s.weight_format.name}) differ from the checkpoint by "
                     f"{100 * (st.total_bytes - cfg) / cfg:+.1f}%")
    return replace(s, safetensors=st, weight_notes=tuple(notes))


@dataclass(frozen=True)
class SizeResult:
    """`kvplan size`'s answer: the cache plan, weights, and the warnings and assumptions behind them."""
    setup: Setup
    plan: CachePlan
    ctx: int
    batch: int
    weight_bytes: int
    warnings: tuple[str, ...]
    assumptions: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.plan.kv_bytes

    def to_json(self) -> dict[str, Any]:
        s, p = self.setup, self.plan
        weight_all = s.weight_bytes_all_gpus()
        gguf, mmproj = s.resolved.extras.get("gguf"), s.resolved.extras.get("mmproj")
        out = s.json_header(p.engine, self.ctx, self.batch)
        out.update({
            "model_max_ctx": s.max_ctx,
            "model_max_ctx_source": s.max_ctx_source,
            "kv_bytes": p.kv_bytes,
            "kv_bytes_all_gpus": p.kv_bytes_all_gpus,
            "kv_bytes_per_token": p.kv_bytes_per_token,
            **weights.params_breakdown(s.spec),
            "weight_bytes": self.weight_bytes,
            "weight_bytes_all_gpus": weight_all,
            "weight_source": s.weight_source,
            "weight_bytes_config": s.weight_bytes_config(),
            **({"weight_bytes_safetensors": s.safetensors.total_bytes} if s.safetensors is not None else {}),
            "weight_dtype": s.weight_format.name,
            **({"quant_mix": quant_mix(gguf)} if gguf is not None else {}),
            **({"mmproj_bytes": mmproj.weight_bytes()} if mmproj is not None else {}),
            "total_bytes": self.total_bytes,
            "total_bytes_all_gpus": weight_all + p.kv_bytes_all_gpus,
            "assumptions": list(self.assumptions),
            "warnings": list(self.warnings),
            "groups": [g.to_json() for g in p.groups],
            "engine_details": p.details,
            "architecture": s.spec.architecture,
            "family": s.spec.family,
        })
        return out


def size(mo: ModelOptions, eo: EngineOptions, ctx: int | None, batch: int = 1,
         loaded: tuple[ResolvedModel, ModelSpec] | None = None) -> SizeResult:
    s = setup(mo, eo, loaded=loaded)
    warnings: list[str] = [*s.ref.notes, *s.spec.warnings]
    assumptions: list[str] = []
    if ctx is None:
        if s.max_ctx is None:
            raise InputError(f"{s.ref.requested} has no maximum context in its config; pass --ctx")
        ctx = s.max_ctx
        assumptions.append(f"ctx = the model maximum {ctx:,} ({s.max_ctx_source}); --ctx changes it")
    elif s.max_ctx is not None and ctx > s.max_ctx:
        warnings.append(f"ctx {ctx:,} exceeds the model maximum {s.max_ctx:,} ({s.max_ctx_source}); computed anyway")
    if batch < 1:
        raise InputError("--batch must be a positive integer")
    plan = s.prepared.plan(ctx, batch)
    assumptions.append(f"KV dtype {s.kvd.label} ({s.kvd.source})")
    assumptions.append(f"weights: {s.weight_format.description}")
    assumptions.extend(gguf_assumptions(s))
    assumptions.extend(s.weight_notes)
    if s.spec.mtp_layers:
        assumptions.append(f"{s.spec.mtp_layers} multi-token-prediction layer(s) excluded (no speculative decoding)")
    if s.tp > 1 or s.pp > 1:
        assumptions.append(f"per-GPU figures for the limiting GPU (pipeline stage {plan.limiting_stage}); "
                           "sharded weights split evenly over tp")
    assumptions.extend(plan.assumptions)
    assumptions.extend(s.spec.notes)
    return SizeResult(s, plan, ctx, batch, s.weight_bytes(plan.limiting_stage), tuple(warnings), tuple(assumptions))


def gguf_assumptions(s: Setup) -> list[str]:
    """What a GGUF input adds: the quantization mix, the projector, where llama.cpp keeps token_embd."""
    gguf, mmproj = s.resolved.extras.get("gguf"), s.resolved.extras.get("mmproj")
    if gguf is None:
        return []
    out = [f"GGUF {s.spec.stored_format}: {len(gguf.tensors):,} tensors, {gguf.weight_bytes():,} B as stored "
           f"({quant_mix_text(gguf)})"]
    if mmproj is not None:
        out.append(f"vision projector {mmproj.source}: {mmproj.weight_bytes():,} B ({quant_mix_text(mmproj)}) "
                   "added to the weights")
    if s.engine.info.gguf_native:
        emb = next((t for t in gguf.tensors if t.name == "token_embd.weight"), None)
        if emb is not None:
            out.append(f"llama.cpp keeps token_embd ({emb.nbytes:,} B) in host memory, never on a GPU; "
                       "weight bytes include it")
    else:
        out.append(f"a GGUF file is usually served by llama.cpp (--engine llamacpp); sized for {s.engine.name} "
                   "as asked")
    return out
