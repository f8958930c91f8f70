"""The skeleton every engine layout shares: rule lookup by cache class, pipeline stages, merged groups, the
no-cache group, geometry, and plan assembly.

An engine module states one rule per cache class in KIND_RULES (rows side by side, like vLLM's
spec_manager_map). `rule_for` looks a cache up by its exact class: a kind without a row is one clear input error
naming the engine and the kind, never an AttributeError or a silent 0 B.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, TypeVar

from kvplan.engines.base import CachePlan, PlanGroup, Request
from kvplan.errors import InputError
from kvplan.parallel import pp_partition
from kvplan.spec import (CompressedIndexerKeys, CompressedLatent, CompressorState, FullAttention, IndexerKeys,
                         LatentAttention, LayerCache, ModelSpec, SlidingLatent)

R = TypeVar("R")
Caches = tuple[tuple[int, LayerCache], ...]


@dataclass(frozen=True)
class NoCacheRule:
    """The layer keeps nothing in this engine (MLP-only blocks, KV shared with an earlier layer, cross-attention
    K/V an engine recomputes)."""

    why: str = ""


@dataclass(frozen=True)
class Omitted:
    """Not part of this engine's cache memory at all (llama.cpp recomputes cross-attention K/V from the stored
    encoder output): the plan leaves such layers out."""

    why: str


@dataclass(frozen=True)
class Unsupported:
    """The engine cannot run layers of this kind at all: sizing them is an input error that says why."""

    why: str


@dataclass(frozen=True)
class NotModelled:
    """The engine runs layers of this kind, but kvplan does not model how it lays them out yet: sizing them is an
    input error that says so (never a figure from another engine's rules)."""

    why: str


NO_CACHE = NoCacheRule()

# DeepSeek-V4's four cache kinds, laid out from vLLM's, SGLang 0.5.23's and transformers' source; the other engines
# decline them (not_modelled)
DEEPSEEK_V4_CACHES = (SlidingLatent, CompressedLatent, CompressedIndexerKeys, CompressorState)


def not_modelled(kinds: tuple[type, ...], why: str) -> dict[type, NotModelled]:
    return {k: NotModelled(why) for k in kinds}


DEEPSEEK_V4_NOT_MODELLED = not_modelled(DEEPSEEK_V4_CACHES, "DeepSeek-V4's window, compressed-latent, indexer and "
                                        "compressor-state caches are modelled for vLLM, SGLang 0.5.23 and transformers (hf) only")


class UnsupportedKind(InputError):
    """A cache kind an engine has no rule for, or cannot run."""


def model_row(table: Mapping[str, R], spec: ModelSpec) -> R | None:
    """A per-model table's row: keyed by what the engine keys a model on, its class (config.json's architectures[0],
    a GGUF file's architecture), or for a config type the engine has no class of at all, the config's model_type."""
    row = table.get(spec.architecture)
    return row if row is not None else table.get(spec.model_type)


@dataclass(frozen=True)
class Refusal:
    """Why an engine does not run a model (or kvplan has not read how it does): the model as messages name it."""

    name: str
    why: str


def refuse_model(engine: str, refused: Mapping[str, Refusal], spec: ModelSpec) -> None:
    """A model the engine does not run, or whose handling in that engine kvplan has not read: one line."""
    row = model_row(refused, spec)
    if row is not None:
        raise UnsupportedKind(f"{engine} cannot size this {row.name} model: {row.why}")


def refusals(why: str, name: str, *keys: str) -> dict[str, Refusal]:
    """Table rows: one refusal under each key (the classes and model types of one model)."""
    return dict.fromkeys(keys, Refusal(name, why))


@dataclass(frozen=True)
class Coverage:
    """The rule sets of an engine whose handling of a cache kind kvplan read: spans of (first, last) row labels,
    last None for every later row; `message` is the refusal elsewhere, with {version} the resolved row's label."""

    spans: tuple[tuple[str, str | None], ...]
    message: str

    def covers(self, version: str) -> bool:
        from kvplan.engines.versions import version_key

        v = version_key(version)
        return any(version_key(lo) <= v and (hi is None or v <= version_key(hi)) for lo, hi in self.spans)


def check_coverage(coverage: Mapping[type, Coverage], caches: Caches, version: str) -> None:
    """A kind the selected rule set's layout was not read for: one line, before any figure is made."""
    kinds = {type(c) for _, c in caches}
    for kind, cov in coverage.items():
        if kind in kinds and not cov.covers(version):
            raise UnsupportedKind(cov.message.format(version=version))


def rule_for(engine: str, rules: Mapping[type, R], cache: LayerCache) -> R | NoCacheRule:
    try:
        rule = rules[type(cache)]
    except KeyError:
        raise UnsupportedKind(f"{engine} has no layout rule for {cache.kind} layers ({type(cache).__name__}); "
                              "kvplan cannot size this model for that engine") from None
    if isinstance(rule, Unsupported):
        raise UnsupportedKind(f"{engine} does not support {cache.kind} layers: {rule.why}")
    if isinstance(rule, NotModelled):
        raise UnsupportedKind(f"kvplan does not model {engine}'s cache for {cache.kind} layers yet: {rule.why}")
    return rule


def check_rules(engine: str, rules: Mapping[type, Any], caches: Caches) -> None:
    """Fail early (at prepare) for a model holding a kind the engine has no rule for."""
    for cls in {type(c): c for _, c in caches}.values():
        rule_for(engine, rules, cls)


def refuse_parallel_hybrid(engine: str, caches: Caches, why: str) -> None:
    """A layer holding both attention and a recurrent state (Falcon-H1's parallel attention + Mamba-2): refused by an
    engine whose layout for it kvplan has not read, rather than sized as two separate layers' caches."""
    from kvplan.spec import NoCache, RecurrentState, SharedKV

    kinds: dict[int, set[bool]] = {}
    for layer, c in caches:
        if not isinstance(c, (NoCache, SharedKV)):
            kinds.setdefault(layer, set()).add(isinstance(c, RecurrentState))
    if any(len(k) == 2 for k in kinds.values()):
        raise UnsupportedKind(f"kvplan does not model {engine}'s cache for layers holding attention and a Mamba state "
                              f"side by side (Falcon-H1) yet: {why}")


def stages(spec: ModelSpec, pp: int) -> tuple[Caches, ...]:
    """The (layer, cache) entries of each pipeline stage (vLLM's layer split, which kvplan uses for every engine)."""
    return tuple(spec.caches_of_layers(set(r)) for r in pp_partition(spec.num_layers, pp))


def merged(caches: Caches) -> "OrderedDict[LayerCache, list[int]]":
    """Identical layer caches merged, in order of first appearance."""
    out: OrderedDict[LayerCache, list[int]] = OrderedDict()
    for i, c in caches:
        out.setdefault(c, []).append(i)
    return out


def groups(engine: str, rules: Mapping[type, R], caches: Caches) -> Iterator[tuple[LayerCache, list[int], R | NoCacheRule]]:
    """Each merged cache with its layers and this engine's rule for it (omitted kinds left out)."""
    for c, layers in merged(caches).items():
        rule = rule_for(engine, rules, c)
        if not isinstance(rule, Omitted):
            yield c, layers, rule


def kept(engine: str, rules: Mapping[type, Any], caches: Caches) -> Caches:
    """The entries this engine keeps memory for (omitted kinds dropped)."""
    return tuple((i, c) for i, c in caches if not isinstance(rule_for(engine, rules, c), Omitted))


def no_cache_group(c: LayerCache, layers: list[int] | tuple[int, ...], dtype: str = "-") -> PlanGroup:
    """A zero-byte group, so every layer of the model appears in the plan."""
    return PlanGroup(c.kind, tuple(layers), None, None, None, None, 0, dtype, 0, 0, (), c.describe())


def geometry(c: LayerCache, tp: int, heads_per_gpu: Callable[[int, int], int]) -> dict[str, Any]:
    """JSON geometry of a layer cache on one GPU (MLA: one latent 'head', never split by TP; state: none)."""
    if isinstance(c, LatentAttention):
        return {"kv_heads": 1, "head_dim_k": c.latent_dim, "head_dim_v": 0, "window": None}
    if isinstance(c, IndexerKeys):
        return {"kv_heads": 1, "head_dim_k": c.head_dim, "head_dim_v": 0, "window": None}
    if isinstance(c, SlidingLatent):  # DeepSeek-V4: one K=V vector, never split by TP
        return {"kv_heads": 1, "head_dim_k": c.dim, "head_dim_v": 0, "window": c.span}
    if isinstance(c, CompressorState):
        return {"kv_heads": None, "head_dim_k": None, "head_dim_v": None, "window": c.window}
    if not isinstance(c, FullAttention):
        return {"kv_heads": None, "head_dim_k": None, "head_dim_v": None, "window": None}
    window = c.span if c.grows_with_context else None  # cross attention's span is its fixed encoder length
    return {"kv_heads": heads_per_gpu(c.kv_heads, tp), "head_dim_k": c.head_dim_k, "head_dim_v": c.head_dim_v,
            "window": window or None}


def limiting(per_stage: list[int]) -> int:
    """The stage holding the most KV bytes (the first of equals)."""
    return per_stage.index(max(per_stage))


class StagedLayout:
    """Plan assembly for engines that size each pipeline stage by summing its groups (SGLang, TensorRT-LLM,
    llama.cpp, transformers). A subclass provides `stages`, `label`, `groups_of(ctx, batch, stage)`,
    `gpus_per_stage`, `tp`, `pp`, `assumptions` and `details(ctx, batch, stage)`."""

    stages: tuple[Caches, ...]
    assumptions: tuple[str, ...]
    tp: int
    pp: int

    @property
    def label(self) -> str:  # pragma: no cover - every layout sets it
        raise NotImplementedError

    @property
    def gpus_per_stage(self) -> int:
        return self.tp

    def groups_of(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:  # pragma: no cover
        raise NotImplementedError

    def details(self, ctx: int, batch: int, stage: int) -> dict[str, Any]:
        return {}

    def stage_bytes(self, ctx: int, batch: int, stage: int) -> int:
        return sum(g.bytes for g in self.groups_of(ctx, batch, stage))

    def limiting_stage(self, ctx: int) -> int:
        return limiting([self.stage_bytes(ctx, 1, s) for s in range(len(self.stages))])

    def plan(self, ctx: int, batch: int, stage: int | None = None) -> CachePlan:
        stage = self.limiting_stage(ctx) if stage is None else stage
        groups_ = self.groups_of(ctx, batch, stage)
        all_gpus = sum(self.stage_bytes(ctx, batch, s) for s in range(len(self.stages))) * self.gpus_per_stage
        return CachePlan(self.label, Request(ctx, batch, self.tp, self.pp), tuple(groups_), all_gpus,
                         self.assumptions, stage, self.details(ctx, batch, stage))
