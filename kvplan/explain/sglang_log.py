"""Reading an SGLang log: the pool it allocated (#tokens and the K / V / KV sizes at that many tokens), the
weights it loaded, and the refusal when none is left. Pool sizes at a printed token count are exact; the token
count itself comes from the memory SGLang measured, which kvplan estimates from the GPU."""

from __future__ import annotations

import re
from decimal import Decimal

from kvplan.errors import KvplanError
from kvplan.explain.common import (DIFFERS, ESTIMATED, GiB, NOT_REPRODUCED, REPRODUCED, Finding, LogFacts, Printed,
                                   dtype_word, flag_values, lines, number, unread_kv_lines, worker_tag)

_ALLOC = re.compile(r"KV Cache is allocated\.(?: dtype: ([\w.]+),)? #tokens: (\d+), (?:K size: ([\d.]+) GB, V size: "
                    r"([\d.]+) GB|KV size: ([\d.]+) GB)")
_SWA = re.compile(r"SWAKVPool mem usage: ([\d.]+) GB, swa size: (\d+), full size: (\d+)")
_LOAD = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")
_NO_ROOM = re.compile(r"Loaded weights leave no GPU memory for the KV cache")


def looks_like(text: str) -> bool:
    return bool(re.search(r"sglang|KV Cache is allocated|SWAKVPool|Load weight end|mem_fraction_static", text, re.I))


def read(text: str) -> LogFacts:
    ls = lines(text)
    f = LogFacts("sglang")
    flags = flag_values(text)
    m = re.search(r"--model(?:-path)?[= ]\s*(\S+)|model_path='([^']+)'", text)
    if m:
        f.set("model", m.group(1) or m.group(2), "the command line")
    for keys, name, cast in ((("tp", "tp_size", "tensor_parallel_size"), "tp", int),
                             (("pp", "pp_size", "pipeline_parallel_size"), "pp", int),
                             (("mem_fraction_static",), "mem_fraction_static", float),
                             (("page_size",), "page_size", int), (("context_length",), "context_length", int),
                             (("max_running_requests",), "max_running_requests", int),
                             (("max_total_tokens",), "max_total_tokens", int)):
        for key in keys:
            if key in flags:
                try:
                    f.set(name, cast(flags[key]), "the command line")
                except ValueError:
                    pass
    m = re.search(r"mem[-_]fraction[-_]static\W{0,3}([\d.]+)", text)
    if m:
        f.set("mem_fraction_static", float(m.group(1).rstrip(".")), "the log text")
    if "kv_cache_dtype" in flags and flags["kv_cache_dtype"] != "auto":
        f.set("kv_dtype", dtype_word(flags["kv_cache_dtype"]) or flags["kv_cache_dtype"], "the command line")
    m = re.search(r"Setting KV cache dtype to (\w+)", text)
    if m:
        f.set("kv_dtype", dtype_word(m.group(1)), "SGLang's server_args warning")
    m = re.search(r"sglang(?:==| version:? ?v?)(\d+\.\d+\.\d+\S*)", text, re.I)
    if m:
        f.set("version", m.group(1), "a version in the text")
    seen_rank: dict[str | None, int] = {}
    for i, line in enumerate(ls, 1):
        m = _ALLOC.search(line)
        if m:
            rank = worker_tag(line)
            seen_rank[rank] = seen_rank.get(rank, 0) + 1
            tokens = int(m.group(2))
            tag = f"{rank or 'pool'} #{seen_rank[rank]}"
            if m.group(1):
                f.set("kv_dtype", dtype_word(m.group(1)), "the allocation line's dtype")
            f.printed.append(Printed(i, "kv_tokens", Decimal(tokens), worker=tag))
            if m.group(3):
                f.printed.append(Printed(i, "k_size", number(m.group(3)), GiB, at=tokens, worker=tag))
                f.printed.append(Printed(i, "v_size", number(m.group(4)), GiB, at=tokens, worker=tag))
            else:
                f.printed.append(Printed(i, "kv_total", number(m.group(5)), GiB, at=tokens, worker=tag))
        m = _SWA.search(line)
        if m:
            f.printed.append(Printed(i, "pool_bytes", number(m.group(1)), GiB, at=int(m.group(3)), worker=worker_tag(line)))
        m = _LOAD.search(line)
        if m:
            f.printed.append(Printed(i, "weights", number(m.group(1)), GiB, worker=worker_tag(line)))
        if _NO_ROOM.search(line):
            f.printed.append(Printed(i, "kv_budget", Decimal(0), GiB))
    _dedupe(f)
    unread_kv_lines(ls, f)
    return f


def _dedupe(f: LogFacts) -> None:
    """Ranks print the same pool: keep the first rank's lines (the rank tag stays on the figure)."""
    seen, out = set(), []
    for p in f.printed:
        pool = (p.worker or "").split("#")[-1]
        key = (p.what, p.value, p.at, pool)
        if key not in seen:
            seen.add(key)
            out.append(p)
        else:
            f.repeats.add(p.line)
    f.printed = out


# ---------------------------------------------------------------------------------------------- reproduction
def reproduce(c) -> list[Finding]:
    f = c.facts
    if c.model is None:
        return [Finding(p, NOT_REPRODUCED, "", c.model_why) for p in f.printed]
    pools = {p.worker for p in f.printed if p.what == "kv_tokens"}
    several = len({(w or "").split("#")[-1] for w in pools}) > 1
    out = []
    for p in f.printed:
        try:
            out.append(_finding(c, p, several))
        except KvplanError as e:
            out.append(Finding(p, NOT_REPRODUCED, "", f"kvplan cannot size this model or setting: {e}"))
    return out


def _finding(c, p: Printed, several_pools: bool) -> Finding:
    from kvplan.explain.reproduce import gib, rel_error

    if p.what in ("k_size", "v_size", "kv_total", "pool_bytes"):
        _, plan = c.size(p.at)
        names = {"k_size": ("k_buffer", "K"), "v_size": ("v_buffer", "V")}.get(p.what)
        lo, hi = p.bounds()
        how = f"kvplan's SGLang pool for {p.at:,} tokens (tp {c.facts.tp})"
        candidates = [("", plan.groups)] + [(f" ({g.kind} layers' pool)", [g]) for g in plan.groups]
        for label, groups in candidates:
            tensors = [t for g in groups for t in g.tensors]
            v = sum(t.total_bytes for t in tensors if t.name.startswith(names)) if names else sum(g.bytes for g in groups)
            if lo <= v < hi:
                return Finding(p, REPRODUCED, f"{v:,} B ({gib(v)})", how + label)
        value = (sum(t.total_bytes for t in plan.tensors if t.name.startswith(names)) if names else plan.kv_bytes)
        if several_pools and not (p.worker or "").endswith("#1"):
            return Finding(p, NOT_REPRODUCED, f"{value:,} B ({gib(value)})",
                           "a second pool on this rank (a speculative-decoding draft model's cache, or a hybrid's other "
                           "pool): kvplan sizes the served model's own pool")
        return Finding(p, DIFFERS, f"{value:,} B ({gib(value)})", how, rel_error(value, float(p.value) * p.unit))
    if p.what == "weights":
        r = c.fit(kv_budget=1 << 40)
        return Finding(p, ESTIMATED, f"{r.weight_bytes:,} B ({gib(r.weight_bytes)})",
                       "checkpoint weights per GPU; SGLang's 'mem usage' is the memory the load took",
                       rel_error(r.weight_bytes, float(p.value) * p.unit))
    if not c.gpu_known:
        why = ("the pool's token count comes from memory SGLang measured after loading; kvplan estimates it from the "
               "GPU: give --gpu")
        return Finding(p, NOT_REPRODUCED, "", why)
    r = c.fit(kv_budget=None, ctx=None)
    if p.what == "kv_budget":
        b = r.kv_budget_bytes
        verdict = ESTIMATED
        return Finding(p, verdict, f"{b:,} B ({gib(b)})",
                       "kvplan's budget model: " + ("no room either" if b <= 0 else "it would leave room (the log says none)"))
    tokens = r.capacity.kv_capacity_tokens
    return Finding(p, ESTIMATED, f"{tokens:,}", f"kvplan's budget model on {c.gpu.gpu.name}",
                   rel_error(tokens, float(p.value)) if tokens is not None else None)
