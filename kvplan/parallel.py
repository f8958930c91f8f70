"""How work splits over GPUs, engine-neutral integer arithmetic: ceil division, padding, pipeline stages.

Weights and every engine layout use these, so they live in the core (nothing here knows an engine).
"""

from __future__ import annotations

from kvplan.errors import InputError


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad_to(n: int, multiple: int) -> int:
    return cdiv(n, multiple) * multiple


def pp_partition(num_layers: int, pp: int) -> list[range]:
    """vLLM get_pp_indices: base = L // pp; the remainder goes one layer each to stages pp-2, pp-3, ...
    (never the last). 61 layers, pp=4 -> [15, 15, 16, 15]."""
    if pp > num_layers:
        raise InputError(f"--pp {pp} is more pipeline stages than the model's {num_layers} layers")
    sizes = [num_layers // pp] * pp
    remainder = num_layers % pp
    for i in range(remainder):
        sizes[pp - 2 - i] += 1
    out, start = [], 0
    for s in sizes:
        out.append(range(start, start + s))
        start += s
    return out


def heads_floor(total: int, tp: int) -> int:
    """vLLM/SGLang: max(1, H // tp); with tp > H each GPU holds one replicated head."""
    return max(1, total // tp)


def heads_ceil(total: int, tp: int) -> int:
    """TensorRT-LLM: ceil(H / tp)."""
    return cdiv(total, tp)


def heads_unsplit(total: int, tp: int) -> int:
    """Engines without tensor parallelism keep every head on one device."""
    return total
