"""ModelOpt MIXED_PRECISION exports: a format per module (`quantized_layers`), mapped onto kvplan's weight parts.

NVIDIA's newer exports (Qwen3.6 and Nemotron-3.5 NVFP4, MiniMax-M3 NVFP4) name each quantized module's format:
{"model.language_model.layers.0.mlp.gate_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 16}, ...}. vLLM 0.32
(modelopt.py ModelOptMixedPrecisionConfig._resolve_quant_algo, get_quant_method) quantizes a module by its own entry,
a fused module by its shards' common entry, routed experts by the entries below them, and leaves a module with no
entry, or an excluded one, 16-bit. kvplan does the same for each weight part. An entry that names no part kvplan
builds (a module it names otherwise) makes the mapping untrusted: the caller then counts the weights 16-bit and
says so, rather than count some modules by a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvplan.errors import ConfigError
from kvplan.spec import WeightPart

MIXED_ALGOS = ("NVFP4", "W4A16_NVFP4", "FP8", "MXFP8")  # the per-module formats weights.py counts
UNCOUNTED = "modelopt_mixed"  # Quantization.method of an export kvplan cannot count module by module (warned)
FUSED_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
QUANTIZABLE_ROLES = ("linear", "expert", "lm_head")  # vLLM quantizes LinearBase, ParallelLMHead, RoutedExperts
_EXPERT_KEY = re.compile(r"^(?P<module>.*\.experts)\.\d+\.(?P<proj>.+)$")
_WRAPPERS = ("model.", "language_model.", "backbone.", "transformer.")
_LAYERS = "layers."


@dataclass(frozen=True)
class Mapping:
    """Each quantized part's (format, group size), keyed by part_key; the entries no part took."""
    formats: dict[tuple[str, int | None, str], tuple[str, int]]
    unmatched: tuple[str, ...]


def entries(quantized_layers: dict) -> dict[str, tuple[str, int]] | str:
    """quantized_layers by kvplan's module path (from `layers.` on, or the bare name of a top-level module); a
    format kvplan has no storage rule for comes back as its name. MTP modules (`mtp.*`) are left out: their
    layer numbers would collide with the decoder's, and kvplan does not count MTP weights by default."""
    table: dict[str, tuple[str, int]] = {}
    for key, info in quantized_layers.items():
        if not isinstance(info, dict) or str(key).startswith("mtp") or ".mtp." in str(key):
            continue
        algo = str(info.get("quant_algo") or "").upper()
        if algo not in MIXED_ALGOS:
            return algo or "(none)"
        group = info.get("group_size", 16)
        if "NVFP4" in algo and not (isinstance(group, int) and group > 0):
            raise ConfigError(f"quantized_layers[{str(key)[:80]!r}].group_size must be a positive integer for "
                              f"{algo} (16 in NVIDIA's exports), found {group!r}")
        table[module_path(str(key))] = (algo, group if isinstance(group, int) and group > 0 else 16)
    return table


def module_path(key: str) -> str:
    """`model.language_model.layers.3.mlp.up_proj` -> `layers.3.mlp.up_proj`; `model.embed_tokens` -> `embed_tokens`."""
    start = key.find(_LAYERS)
    if start >= 0:
        return key[start:]
    while key.startswith(_WRAPPERS):
        key = key.split(".", 1)[1]
    return key


def assign(weights: list[WeightPart], table: dict[str, tuple[str, int]]) -> Mapping:
    experts: dict[tuple[str, str], set[tuple[str, int]]] = {}
    expert_keys: dict[tuple[str, str], list[str]] = {}
    for path, fmt in table.items():
        if (m := _EXPERT_KEY.match(path)) is not None:
            module, proj = m.group("module", "proj")
            experts.setdefault((module, proj), set()).add(fmt)
            expert_keys.setdefault((module, proj), []).append(path)
    used: set[str] = set()
    formats: dict[tuple[str, int | None, str], tuple[str, int]] = {}
    for w in weights:
        if w.role not in QUANTIZABLE_ROLES or w.part == "vision":  # a tower's layers.N would meet the decoder's
            continue
        path = w.name if w.layer is None else f"layers.{w.layer}.{w.name}"
        found = _own(path, table, used) or (_routed(path, experts, expert_keys, used) if w.role == "expert" else None) \
            or _parent(path, table, used)
        if found is not None:
            formats[part_key(w)] = found
    return Mapping(formats, tuple(k for k in table if k not in used))


def part_key(w: WeightPart) -> tuple[str, int | None, str]:
    return (w.name, w.layer, w.part)


def _own(path: str, table: dict[str, tuple[str, int]], used: set[str]) -> tuple[str, int] | None:
    """The module's own entry, or its shards' one common entry (q/k/v of a fused qkv_proj)."""
    if path in table:
        used.add(path)
        return table[path]
    parent, _, last = path.rpartition(".")
    shards = [f"{parent}.{s}" for s in FUSED_SHARDS.get(last, ())]
    found = {table[s] for s in shards if s in table}
    if len(found) == 1:
        used.update(s for s in shards if s in table)
        return found.pop()
    return None


def _routed(path: str, experts: dict, expert_keys: dict, used: set[str]) -> tuple[str, int] | None:
    """Routed experts (`…experts.gate_up_proj` in kvplan) from the per-expert entries (`…experts.7.up_proj`)."""
    module, _, proj = path.rpartition(".")
    if not module.endswith(".experts"):
        return None
    keys = [(module, p) for p in (proj, *FUSED_SHARDS.get(proj, ())) if (module, p) in experts]
    found = set().union(*(experts[k] for k in keys)) if keys else set()
    if len(found) == 1:
        for k in keys:
            used.update(expert_keys[k])
        return found.pop()
    return None


def _parent(path: str, table: dict[str, tuple[str, int]], used: set[str]) -> tuple[str, int] | None:
    """A parent module's entry (Qwen3.6 names the whole `mlp.experts`), up to, not including, the layer itself."""
    parts = path.split(".")
    shortest = 3 if parts[0] == "layers" else 1  # layers.N.<module> at least
    for end in range(len(parts) - 1, shortest - 1, -1):
        parent = ".".join(parts[:end])
        if parent in table:
            used.add(parent)
            return table[parent]
    return None
