"""Reading an SGLang log: the pool it allocated (#tokens and the K / V / KV sizes at that many tokens), the
weights it loaded, and the refusal when none is left. Pool sizes at a printed token count are exact; the token
count itself comes from the memory SGLang measured, which kvplan estimates from the GPU."""

from __future__ import annotations

import re
from decimal import Decimal

from kvplan.errors import KvplanError
from kvplan.explain.common import (DIFFERS, ESTIMATED, GiB, NOT_REPRODUCED, REPRODUCED, Finding, LogFacts, Printed,
                                   dtype_word, flag_values, lines, number, unread_kv_lines, worker_tag)

_ALLOC = re.compile(r"KV Cache is allocated\.(?: dtype: ([\w.]+),)?(?: #tokens: (\d+),)? (?:K size: ([\d.]+) GB, V size: "
                    r"([\d.]+) GB|KV size: ([\d.]+) GB)")
_TOTAL = re.compile(r"max_total_num_tokens=(\d+)")  # the scheduler's line (SGLang <= 0.4 prints no #tokens above)
_BEGIN = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")  # free memory before the load (profile's "pre")
_END_FREE = re.compile(r"Load weight end\..*?avail mem=([\d.]+) GB")  # free memory after it ("post")
_SWA = re.compile(r"SWAKVPool mem usage: ([\d.]+) GB, swa size: (\d+), full size: (\d+)")
_LOAD = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")
_NO_ROOM = re.compile(r"Loaded weights leave no GPU memory for the KV cache")
# a hybrid's MambaPool (mem_cache/memory_pool.py: K + 1 slots allocated, K printed) and the running-request cap it sets
# (kv_cache_configurator.py _resolve_max_num_reqs, 0.5.17+)
_MAMBA = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: ([\d.]+) ?GB, "
                    r"ssm_state size: ([\d.]+) ?GB")
_MAMBA_CAP = re.compile(r"max_running_requests is capped to (\d+) by the mamba state cache "
                        r"\(max_mamba_cache_size=(\d+)")


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
    m = re.search(r"changing page_size from \w+ to (\d+)", text)  # an attention backend forcing its page size
    if m:
        f.set("page_size", int(m.group(1)), "SGLang's page-size warning")
    m = re.search(r"mem[-_]fraction[-_]static\W{0,3}([\d.]+)", text)
    if m:
        f.set("mem_fraction_static", float(m.group(1).rstrip(".")), "the log text")
    if "kv_cache_dtype" in flags and flags["kv_cache_dtype"] != "auto":
        f.set("kv_dtype", dtype_word(flags["kv_cache_dtype"]) or flags["kv_cache_dtype"], "the command line")
    m = re.search(r"Using KV cache dtype: (?:torch\.)?(\w+)", text)  # 0.5.x's model runner line
    if m and dtype_word(m.group(1)):
        f.set("kv_dtype", dtype_word(m.group(1)), "SGLang's KV-dtype line")
    m = re.search(r"Setting KV cache dtype to (\w+)", text)
    if m:
        f.set("kv_dtype", dtype_word(m.group(1)), "SGLang's server_args warning")
    m = re.search(r"sglang(?:==| version:? ?v?)(\d+\.\d+\.\d+\S*)", text, re.I)
    if m:
        f.set("version", m.group(1), "a version in the text")
    seen_rank: dict[str | None, int] = {}
    total = next((int(m.group(1)) for m in map(_TOTAL.search, ls) if m), None)
    for i, line in enumerate(ls, 1):
        m = _ALLOC.search(line)
        if m and (m.group(2) or total is not None):
            rank = worker_tag(line)
            seen_rank[rank] = seen_rank.get(rank, 0) + 1
            tokens = int(m.group(2)) if m.group(2) else total
            tag = f"{rank or 'pool'} #{seen_rank[rank]}"
            if m.group(1):
                f.set("kv_dtype", dtype_word(m.group(1)), "the allocation line's dtype")
            if m.group(2):
                f.printed.append(Printed(i, "kv_tokens", Decimal(tokens), worker=tag))
            if m.group(3):
                f.printed.append(Printed(i, "k_size", number(m.group(3)), GiB, at=tokens, worker=tag))
                f.printed.append(Printed(i, "v_size", number(m.group(4)), GiB, at=tokens, worker=tag))
            else:
                f.printed.append(Printed(i, "kv_total", number(m.group(5)), GiB, at=tokens, worker=tag))
        m = _SWA.search(line)
        if m:
            f.printed.append(Printed(i, "pool_bytes", number(m.group(1)), GiB, at=int(m.group(3)), worker=worker_tag(line)))
        m = _TOTAL.search(line)
        if m and not any(p.what == "kv_tokens" for p in f.printed):
            f.printed.append(Printed(i, "kv_tokens", Decimal(int(m.group(1))), worker=f"{worker_tag(line) or 'pool'} #1"))
        m = _LOAD.search(line)
        if m:
            f.printed.append(Printed(i, "weights", number(m.group(1)), GiB, worker=worker_tag(line)))
        for what, rx in (("free_before_load", _BEGIN), ("free_after_load", _END_FREE)):
            m = rx.search(line)
            if m:
                f.printed.append(Printed(i, what, number(m.group(1)), GiB, worker=worker_tag(line)))
        if _NO_ROOM.search(line):
            f.printed.append(Printed(i, "kv_budget", Decimal(0), GiB))
        m = _MAMBA.search(line)
        if m:
            slots, tag = int(m.group(1)), worker_tag(line)
            f.printed.append(Printed(i, "mamba_slots", Decimal(slots), worker=tag))
            f.printed.append(Printed(i, "conv_state_size", number(m.group(2)), GiB, at=slots, worker=tag))
            f.printed.append(Printed(i, "ssm_state_size", number(m.group(3)), GiB, at=slots, worker=tag))
        m = _MAMBA_CAP.search(line)
        if m:
            f.printed.append(Printed(i, "mamba_request_cap", Decimal(int(m.group(1))), at=int(m.group(2)),
                                     worker=worker_tag(line)))
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
    if p.what in ("conv_state_size", "ssm_state_size", "mamba_request_cap"):
        return _mamba_figure(c, p)
    if p.what == "weights":
        r = c.fit(kv_budget=1 << 40)
        return Finding(p, ESTIMATED, f"{r.weight_bytes:,} B ({gib(r.weight_bytes)})",
                       "checkpoint weights per GPU; SGLang's 'mem usage' is the memory the load took",
                       rel_error(r.weight_bytes, float(p.value) * p.unit))
    if p.what == "mamba_slots":
        return _mamba_slots(c, p)
    first_pool = not several_pools or (p.worker or "").endswith("#1")  # a second pool is not the served model's
    if p.what == "kv_tokens" and first_pool and (measured := _measured_budget(c)) is not None:
        return _tokens_from_measured(c, p, measured)
    if not c.gpu_known:
        why = ("the pool's token count comes from memory SGLang measured after loading; kvplan estimates it from the "
               "GPU: give --gpu")
        return Finding(p, NOT_REPRODUCED, "", why)
    r = c.fit(kv_budget=None, ctx=None)
    if p.what in ("free_before_load", "free_after_load"):
        pre = r.budgets[0].part("free_at_start").bytes
        value = pre if p.what == "free_before_load" else pre - r.weight_bytes
        how = ("kvplan's estimate: CUDA total less the CUDA context (and NCCL buffers under parallelism)"
               + ("" if p.what == "free_before_load" else ", less the checkpoint's weights per GPU"))
        return Finding(p, ESTIMATED, f"{value:,} B ({gib(value)})", how, rel_error(value, float(p.value) * p.unit))
    if p.what == "kv_budget":
        b = r.kv_budget_bytes
        verdict = ESTIMATED
        return Finding(p, verdict, f"{b:,} B ({gib(b)})",
                       "kvplan's budget model: " + ("no room either" if b <= 0 else "it would leave room (the log says none)"))
    tokens = r.capacity.kv_capacity_tokens
    return Finding(p, ESTIMATED, f"{tokens:,}", f"kvplan's budget model on {c.gpu.gpu.name}",
                   rel_error(tokens, float(p.value)) if tokens is not None else None)


_NO_POOL = "kvplan's {} rules keep no Mamba state pool for this model"


def _mamba_figure(c, p: Printed) -> Finding:
    """MambaPool's conv / SSM buffers at the printed slot count (K + 1 slots: slot 0 pads), and the running-request
    cap K // state slots a request; exact, no budget needed."""
    from kvplan.explain.reproduce import gib, rel_error

    if p.what == "mamba_request_cap":
        ratio = c.fit(kv_budget=1 << 40, ctx=None).capacity.details.get("mamba_slots_per_request")
        if not ratio:
            return Finding(p, NOT_REPRODUCED, "", _NO_POOL.format(c.engine))
        cap = p.at // ratio
        how = f"max_mamba_cache_size {p.at} // {ratio} state slots a running request ({c.engine})"
        return Finding(p, REPRODUCED if cap == int(p.value) else DIFFERS, f"{cap:,}", how)
    _, plan = c.size(1)
    name = "conv_state" if p.what == "conv_state_size" else "ssm_state"
    per_slot = sum(t.total_bytes for g in plan.groups for t in g.tensors if t.name == name)
    if not per_slot:
        return Finding(p, NOT_REPRODUCED, "", f"kvplan's {c.engine} layout has no {name} for this model")
    v = per_slot * (p.at + 1)
    lo, hi = p.bounds()
    how = f"{p.at} + 1 slots (slot 0 pads) x {per_slot:,} B of {name} a request (tp {c.facts.tp})"
    if lo <= v < hi:
        return Finding(p, REPRODUCED, f"{v:,} B ({gib(v)})", how)
    return Finding(p, DIFFERS, f"{v:,} B ({gib(v)})", how, rel_error(v, float(p.value) * p.unit))


def _mamba_slots(c, p: Printed) -> Finding:
    """max_mamba_cache_size: from the budget SGLang measured where the log prints it (exact), else kvplan's estimate."""
    from kvplan.explain.reproduce import rel_error, within

    measured = _measured_budget(c)
    if measured is not None:
        lo, hi, fraction, where = measured
        a, b = (c.fit(kv_budget=max(0, v), ctx=None).capacity.details.get("max_mamba_cache_size") for v in (lo, hi))
        if a is None:
            return Finding(p, NOT_REPRODUCED, "", _NO_POOL.format(c.engine))
        how = (f"r / (1 + r) of SGLang's measured budget {lo / GiB:.3f} .. {hi / GiB:.3f} GiB (mem_fraction_static "
               f"{where}) over kvplan's state bytes a slot")
        shown = f"{a:,}" if a == b else f"{a:,} .. {b:,}"
        if within(float(p.value), a, b):
            return Finding(p, REPRODUCED, shown, how)
        verdict = DIFFERS if "mem_fraction_static" in c.facts.knobs else ESTIMATED
        return Finding(p, verdict, shown, how, rel_error((a + b) / 2, float(p.value)))
    if not c.gpu_known:
        return Finding(p, NOT_REPRODUCED, "", "the slot count comes from memory SGLang measured after loading, which "
                       "the log does not print; kvplan estimates it from the GPU: give --gpu")
    k = c.fit(kv_budget=None, ctx=None).capacity.details.get("max_mamba_cache_size")
    if k is None:
        return Finding(p, NOT_REPRODUCED, "", _NO_POOL.format(c.engine))
    return Finding(p, ESTIMATED, f"{k:,}", f"kvplan's budget model on {c.gpu.gpu.name}", rel_error(k, float(p.value)))


def _measured_budget(c):
    """SGLang's own KV memory, from the free memory it printed before and after the load (profile_max_num_token:
    rest = post - pre x (1 - mem_fraction_static), min over ranks): (low, high) bytes at the printed precision and
    the fraction with where it came from; None when the log lacks either figure or the fraction cannot be known."""
    from kvplan.engines import sglang
    from kvplan.planner import gpu_context

    f = c.facts
    pre = [p for p in f.printed if p.what == "free_before_load"]
    post = [p for p in f.printed if p.what == "free_after_load"]
    if not pre or not post:
        return None
    if "mem_fraction_static" in f.knobs:
        fraction, where = float(f.knobs["mem_fraction_static"]), "as the log states it"
    elif c.gpu_known:
        r = c.fit(kv_budget=1 << 40, ctx=None)
        fraction = sglang.mem_fraction(r.setup.prepared, r.setup.spec, gpu_context(c.gpu), {})[0]
        where = f"SGLang's default for {c.gpu.gpu.name} (not printed)"
    else:
        return None
    pre_lo, pre_hi = min(p.bounds() for p in pre)
    post_lo, post_hi = min(p.bounds() for p in post)
    keep = Decimal(1) - Decimal(str(fraction))
    lo, hi = int(post_lo - pre_hi * keep), int(post_hi - pre_lo * keep)
    return lo, hi, fraction, where


def _tokens_from_measured(c, p: Printed, measured) -> Finding:
    from kvplan.explain.reproduce import rel_error, within

    lo, hi, fraction, where = measured
    a, b = (c.fit(kv_budget=max(0, v), ctx=None).capacity.kv_capacity_tokens for v in (lo, hi))
    how = (f"SGLang's rule on the free memory it printed before and after the load: post - pre x (1 - "
           f"{fraction}) = {lo / GiB:.3f} .. {hi / GiB:.3f} GiB (mem_fraction_static {where}), over kvplan's bytes "
           "per token")
    shown = f"{a:,}" if a == b else f"{a:,} .. {b:,}"
    if within(float(p.value), a, b):
        return Finding(p, REPRODUCED, shown, how)
    # a fraction the log does not print is kvplan's rule for SGLang's default: a miss is an estimate's, not a rule's
    verdict = DIFFERS if "mem_fraction_static" in c.facts.knobs else ESTIMATED
    return Finding(p, verdict, shown, how, rel_error((a + b) / 2, float(p.value)))


# ---------------------------------------------------------------------------------------------- calibration
def calibration(c, log_name: str, text_sha256: str):
    """What this log measured: the free memory before the weights load and what the load took (both min over the
    ranks that printed them, as SGLang reduces them), the same for every stage. SGLang's budget is a fraction of the
    first less the second, so the pair carries over to any mem_fraction_static and context length. Refused (one
    line) where the log does not pin the key or lacks either figure."""
    from kvplan import calibration as cal_mod
    from kvplan.errors import InputError

    f = c.facts
    c.require_calibration_key("SGLang")
    pre = [p for p in f.printed if p.what == "free_before_load"]
    post = [p for p in f.printed if p.what == "free_after_load"]
    if not pre or not post:
        raise InputError("cannot save a calibration: the log prints no free memory before and after the weights load "
                         "('Load weight begin. avail mem=' and 'Load weight end. ... avail mem=')")
    before = min(int(p.value * p.unit) for p in pre)
    after = min(int(p.value * p.unit) for p in post)
    half = min(int((p.bounds()[1] - p.bounds()[0]) / 2) for p in pre)
    r = c.fit(kv_budget=1 << 40, ctx=None)
    s = r.setup
    return cal_mod.Calibration(cal_mod.key_for(s, c.gpu.gpu.name), (before - after,) * f.pp, 2 * half, 0, 0,
                               s.engine.selected.asked, s.ref.id, log_name,
                               text_sha256, (before,) * f.pp)
