"""What every engine's log reader produces and every reproduction reports.

A start-up log is read into LogFacts: the settings it states (model, engine version, GPU, parallelism, dtypes,
knobs) and the numbers it printed (Printed, each with the precision it was printed at). A reproduction turns each
printed number into a Finding: reproduced (the printed value lies in the interval kvplan computes for the printed
precision), differs, estimated (kvplan's budget model or weight count against a measurement: a signed error), or
not reproduced (and why). Nothing here imports an engine module.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

MiB, GiB = 1 << 20, 1 << 30

REPRODUCED, DIFFERS, ESTIMATED, NOT_REPRODUCED = "reproduced", "differs", "estimated", "not reproduced"
VERDICTS = (REPRODUCED, DIFFERS, ESTIMATED, NOT_REPRODUCED)


@dataclass(frozen=True)
class Printed:
    """One number an engine printed, where, and at what precision ('5.01 GiB' covers [5.005, 5.015) GiB)."""

    line: int  # 1-based line of the log
    what: str  # a key of FIGURES
    value: Decimal
    unit: int = 1  # bytes per printed unit; 1 for counts
    at: int | None = None  # the request length a per-request figure is for
    worker: str | None = None  # the rank / TP tag of the worker that printed it
    terms: int = 1  # a sum of this many printed values (each off by up to half a digit)

    def bounds(self) -> tuple[Decimal, Decimal]:
        """[value - half a printed digit, value + half a printed digit) in bytes (or counts)."""
        exp = self.value.as_tuple().exponent
        half = Decimal(5) * Decimal(10) ** (exp - 1) if isinstance(exp, int) and exp < 0 else Decimal("0.5")
        half *= self.terms
        return (self.value - half) * self.unit, (self.value + half) * self.unit

    @property
    def shown(self) -> str:
        unit = {1: "", MiB: " MiB", GiB: " GiB"}.get(self.unit, f" x{self.unit}")
        text = f"{self.value:,}" if self.value == self.value.to_integral_value() and self.unit == 1 else f"{self.value}"
        return text + unit

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "what": self.what, "value": str(self.value), "unit_bytes": self.unit,
                "at": self.at, "worker": self.worker}


# what each printed figure is, in words (the report's first column)
FIGURES = {
    "kv_budget": "KV cache memory available",
    "kv_tokens": "KV cache size in tokens",
    "num_blocks": "KV cache blocks",
    "concurrency": "maximum concurrency",
    "weights": "weights loaded (per GPU)",
    "checkpoint_size": "checkpoint files (all weights)",
    "non_kv": "non-KV memory (per GPU)",
    "activation_peak": "profile run's activation peak",
    "non_torch": "non-torch memory",
    "cudagraph_estimate": "CUDA-graph memory (vLLM's estimate)",
    "kv_needed": "KV cache one request at max_model_len needs",
    "suggested_max_len": "estimated maximum model length",
    "mamba_blocks": "Mamba cache blocks",
    "kv_total": "KV cache size",
    "k_size": "K cache size",
    "v_size": "V cache size",
    "latent_size": "latent (c^KV) cache size",
    "kv_buffers": "KV buffers (sum over devices)",
    "cells": "KV cells",
    "rs_total": "recurrent state size",
    "r_size": "conv (R) state size",
    "s_size": "SSM (S) state size",
    "rs_buffers": "RS buffers (sum over devices)",
    "rs_cells": "recurrent state cells (sequences)",
    "swa_tokens": "sliding-window pool tokens",
    "pool_bytes": "KV pool memory",
    "tokens_per_block": "tokens per block",
    "blocks_per_request": "KV pages per sequence",
    "free_before_load": "free memory before the weights load",
    "free_after_load": "free memory after the weights load",
    "hybrid_block_size": "attention block size (hybrid)",
    "mamba_padding_pct": "Mamba page padding (%)",
    "padding_layers": "padding layer slots",
    "padding_waste_pct": "padding waste bound (%)",
    "mamba_slots": "Mamba state slots (max_mamba_cache_size)",
    "conv_state_size": "Mamba conv state size",
    "ssm_state_size": "Mamba SSM state size",
    "mamba_request_cap": "running-request cap from the Mamba pool",
}


@dataclass(frozen=True)
class Finding:
    printed: Printed | None
    verdict: str
    kvplan: str  # kvplan's figure as text ('' when none)
    why: str  # how it was computed, or why it was not
    error: float | None = None  # signed relative error (kvplan - printed) / printed, estimates and differences

    def to_json(self) -> dict[str, Any]:
        p = self.printed
        return {"what": p.what if p else None, "line": p.line if p else None,
                "printed": p.shown if p else None, "verdict": self.verdict, "kvplan": self.kvplan,
                "why": self.why, "error": None if self.error is None else round(self.error, 6)}


@dataclass
class LogFacts:
    """The settings a log states and the numbers it printed; `stated` says where each setting came from."""

    engine: str
    version: str | None = None
    model: str | None = None
    gpu_name: str | None = None
    gpu_total: Printed | None = None  # a CUDA total the engine printed
    tp: int = 1
    pp: int = 1
    kv_dtype: str | None = None
    k_dtype: str | None = None
    v_dtype: str | None = None
    weight_dtype: str | None = None
    ctx: int | None = None  # llama.cpp n_ctx / the request length the engine sized for
    knobs: dict[str, Any] = field(default_factory=dict)
    printed: list[Printed] = field(default_factory=list)
    unread: list[tuple[int, str]] = field(default_factory=list)  # KV lines with numbers no rule read
    notes: list[str] = field(default_factory=list)
    stated: dict[str, str] = field(default_factory=dict)
    runs: list[Any] = field(default_factory=list)  # engine-specific pieces: llama.cpp, one per context created
    model_facts: dict[str, Any] = field(default_factory=dict)  # model metadata the log printed (llama.cpp print_info)
    repeats: set[int] = field(default_factory=set)  # lines that repeat a figure already read (another worker, a re-print)

    def figures(self, what: str) -> list[Printed]:
        return [p for p in self.printed if p.what == what]

    def set_from(self, text: str, pattern: str, name: str, cast: Any, where: str) -> None:
        """The setting `name` from the first match of `pattern` in the log (group 1, through `cast`), if any."""
        m = re.search(pattern, text)
        if m:
            self.set(name, cast(m.group(1)), where)

    def set(self, name: str, value: Any, where: str) -> None:
        """A setting, first statement wins (readers go from the most to the least authoritative source)."""
        if value is None or name in self.stated:
            return
        if name in ("engine", "version", "model", "gpu_name", "tp", "pp", "kv_dtype", "k_dtype", "v_dtype",
                    "weight_dtype", "ctx"):
            setattr(self, name, value)
        else:
            self.knobs[name] = value
        self.stated[name] = where


# ---------------------------------------------------------------------------------------------- reading helpers
def lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def number(text: str) -> Decimal:
    return Decimal(text.replace(",", "").replace("_", ""))


def find_all(text_lines: list[str], pattern: str | re.Pattern, what: str, unit: int = 1, *, group: int = 1,
             at_group: int | None = None, worker: bool = False) -> list[Printed]:
    """Every match of `pattern` (one per line) as a Printed figure; `at_group` reads the request length."""
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    out = []
    for i, line in enumerate(text_lines, 1):
        m = rx.search(line)
        if not m:
            continue
        at = int(number(m.group(at_group))) if at_group else None
        out.append(Printed(i, what, number(m.group(group)), unit, at, worker_tag(line) if worker else None))
    return out


_WORKER = re.compile(r"(?:\brank[= ](\d+)|(?:\b|_)TP(\d+)(?:\b|_)|(?:\b|_)PP(\d+)\b)")


def worker_tag(line: str) -> str | None:
    """'rank 3', 'tp 1' or 'pp 2': which worker printed a line (vLLM and SGLang prefixes)."""
    m = _WORKER.search(line)
    if not m:
        return None
    rank, tp, pp = m.groups()
    return f"rank {rank}" if rank is not None else (f"tp {tp}" if tp is not None else f"pp {pp}")


def literal_dict(text: str) -> dict[str, Any]:
    """A printed Python dict ("non-default args: {...}"); elided dicts ('...') read pair by pair."""
    try:
        value = ast.literal_eval(text)
        if isinstance(value, dict):
            return value
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    pairs: dict[str, Any] = {}
    for k, v in re.findall(r"'(\w+)': ('[^']*'|True|False|None|-?[\d.]+)", text):
        try:
            pairs[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            pass
    return pairs


def flag_values(text: str) -> dict[str, str]:
    """Command-line flags and keyword arguments ('--max-model-len 4096', '--tp=2', 'block_size=256,') by their
    underscored name; the first statement of each wins."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(?:(?<=\s)|^)--?([A-Za-z][\w-]*)(?:[ =]+|=)(?!-)([^\s\\'\"]+|'[^']*'|\"[^\"]*\")", text, re.M):
        out.setdefault(m.group(1).replace("-", "_"), m.group(2).strip("'\""))
    for m in re.finditer(r"\b([a-z][a-z_]+)\s*=\s*([\w.\-/]+|\"[^\"]*\"|'[^']*'|[\u201c\u201d][^\u201c\u201d]*[\u201c\u201d])\s*,",
                         text):
        out.setdefault(m.group(1), m.group(2).strip("'\"\u201c\u201d"))
    return out


# engine-log spellings kvplan's dtype names do not cover (torch names, vLLM's MLA record format)
_LOG_DTYPE_WORDS = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "fp8_ds_mla": "fp8"}


def dtype_word(text: Any) -> str | None:
    """'fp8', 'torch.bfloat16', 'f16' -> kvplan's dtype name (kvplan.dtypes' aliases); 'auto' and unknown -> None."""
    from kvplan.dtypes import kv_dtype
    from kvplan.errors import KvplanError

    if text is None:
        return None
    word = str(text).strip().strip("'\"").lower().removeprefix("torch.")
    word = _LOG_DTYPE_WORDS.get(word, word)
    if word == "auto":
        return None
    try:
        return kv_dtype(word).name
    except KvplanError:
        return None


KV_LINE = re.compile(r"KV cache|KV Cache|kv cache|KV buffer|KV self|#tokens|num_gpu_blocks|GPU blocks|"
                     r"[Cc]oncurrency|paged KV|SWAKVPool|kv_cache_size|c\^KV", re.I)


def unread_kv_lines(text_lines: list[str], facts: LogFacts) -> None:
    """Lines that speak of the KV cache with a number in them that no rule read: reported, never dropped."""
    taken = {p.line for p in facts.printed} | facts.repeats
    for i, line in enumerate(text_lines, 1):
        if i in taken or not KV_LINE.search(line) or not _NUMBER.search(_DURATION.sub("", _without_prefix(line))):
            continue
        facts.unread.append((i, line.strip()))


_NUMBER = re.compile(r"(?<![\w.])\d[\d,.]*(?![\w])")
_DURATION = re.compile(r"\d[\d.]*\s*(?:s|secs?|seconds)\b")  # "took 6.84 seconds": a timing, not a KV figure


def _without_prefix(line: str) -> str:
    """The message without the logger's timestamp, pid and source position (and a log collector's own column:
    'YYYY-MM-DD HH:MM:SS.fff | ' as Docker Desktop and Portainer print it, 'service | ' as docker-compose does)."""
    line = re.sub(r"^\s*(?:\d{4}-\d{2}-\d{2}[ T][\d:.]+|[\w.-]+)\s*\|\s+", "", line)
    line = re.sub(r"^\s*(\([^)]*\)\s*)*", "", line)
    line = re.sub(r"^(INFO|DEBUG|WARNING|ERROR)\s+[\d-]+\s+[\d:.]+\s+(\[[^\]]*\]\s*)?", "", line)
    line = re.sub(r"^\[[\d\-/ :.,]+[^\]]*\]\s*", "", line)
    line = re.sub(r"\b(TP|DP|EP|PP)\d+\b|\brank[= ]\d+|pid=\d+", "", line)
    return line
