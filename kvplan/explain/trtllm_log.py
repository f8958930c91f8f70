"""Reading a TensorRT-LLM log: the paged pool it allocated ('Allocated X GiB for max tokens in paged KV cache
(N)'), its tokens per block, the pages per sequence, and the caps it was given (max_tokens, the memory fraction)."""

from __future__ import annotations

import re
from decimal import Decimal

from kvplan.errors import KvplanError
from kvplan.explain.common import (DIFFERS, GiB, NOT_REPRODUCED, REPRODUCED, Finding, LogFacts, Printed, lines, number,
                                   unread_kv_lines)

_ALLOC = re.compile(r"Allocated ([\d.]+) GiB for max tokens in paged KV cache \((\d+)\)")


def looks_like(text: str) -> bool:
    return bool(re.search(r"TensorRT-LLM|TRT-LLM|paged KV cache \(\d+\)", text))


def read(text: str) -> LogFacts:
    ls = lines(text)
    f = LogFacts("trtllm")
    f.set_from(text, r"(?i)tensorrt[_-]llm(?:==| version:? ?v?)(\d+\.\d+[\w.+]*)", "version", str, "a version in the text")
    m = re.search(r"free_gpu_memory_fraction and max_tokens are set \(to ([\d.]+) and (\d+)", text)
    if m:
        f.set("free_gpu_memory_fraction", round(float(m.group(1)), 6), "TRT-LLM's cap warning")
        f.set("max_tokens", int(m.group(2)), "TRT-LLM's cap warning")
    f.set_from(text, r"Number of tokens per block: (\d+)", "tokens_per_block", int, "TRT-LLM's block line")
    f.set_from(text, r"max_seq_len=(\d+)", "ctx", int, "TRT-LLM's runtime line")
    f.set_from(text, r"max_num_requests=(\d+)", "max_batch_size", int, "TRT-LLM's runtime line")
    for i, line in enumerate(ls, 1):
        m = _ALLOC.search(line)
        if m:
            tokens = int(m.group(2))
            f.printed.append(Printed(i, "kv_tokens", Decimal(tokens)))
            f.printed.append(Printed(i, "kv_total", number(m.group(1)), GiB, at=tokens))
        m = re.search(r"Estimated max memory in KV cache\s*:\s*([\d.]+) GiB", line)
        if m:  # KvCacheCreator's measured budget (1.x PyTorch backend)
            f.printed.append(Printed(i, "kv_budget", number(m.group(1)), GiB))
        # "pages" up to mid-2025, "blocks" since (1.x: "..., tokens per block=32, primary blocks=P, ...")
        m = re.search(r"Max KV cache (?:pages|blocks) per sequence: (\d+) \[window size=(\d+)\]", line)
        if m:
            f.printed.append(Printed(i, "blocks_per_request", number(m.group(1)), at=int(m.group(2))))
    unread_kv_lines(ls, f)
    return f


def reproduce(c) -> list[Finding]:
    from kvplan.explain.reproduce import gib, rel_error

    f = c.facts
    if c.model is None:
        return [Finding(p, NOT_REPRODUCED, "", c.model_why) for p in f.printed]
    windows = {p.at for p in f.printed if p.what == "blocks_per_request"}
    if len(windows) > 1:  # a pool per window: the launch set KvCacheConfig.max_attention_window (VSWA)
        why = (f"the log shows pools for {len(windows)} window sizes ({', '.join(map(str, sorted(windows)))}): "
               "max_attention_window was set (VSWA), whose per-window shares kvplan does not model")
        return [Finding(p, NOT_REPRODUCED, "", why) for p in f.printed]
    out = []
    for p in f.printed:
        try:
            if p.what == "kv_total":
                _, plan = c.size(p.at)
                value = plan.kv_bytes
                lo, hi = p.bounds()
                ok = lo <= value < hi
                out.append(Finding(p, REPRODUCED if ok else DIFFERS, f"{value:,} B ({gib(value)})",
                                   f"{p.at:,} tokens x {plan.kv_bytes_per_token:,} B per token",
                                   None if ok else rel_error(value, float(p.value) * p.unit)))
            elif p.what == "kv_tokens":
                out.append(_tokens(c, p))
            elif p.what == "kv_budget":
                out.append(Finding(p, NOT_REPRODUCED, "", "memory TensorRT-LLM measured (free after the model and its "
                                   "profiling peak, x free_gpu_memory_fraction); `kvplan fit --gpu` estimates it"))
            else:  # pages per sequence at the window (max_seq_len)
                _, plan = c.size(p.at)
                per = plan.details.get("tokens_per_block") or f.knobs.get("tokens_per_block") or 32
                pages = -(-p.at // per)
                ok = pages == int(p.value)
                out.append(Finding(p, REPRODUCED if ok else DIFFERS, f"{pages:,}", f"ceil({p.at:,} / {per} tokens per block)"))
        except KvplanError as e:
            out.append(Finding(p, NOT_REPRODUCED, "", f"kvplan cannot size this model or setting: {e}"))
    return out


def _tokens(c, p: Printed) -> Finding:
    f = c.facts
    if "max_tokens" not in f.knobs:
        return Finding(p, NOT_REPRODUCED, "", "the pool's size comes from memory TRT-LLM measured (no max_tokens cap "
                       "printed); `kvplan fit --gpu` estimates it")
    r = c.fit(kv_budget=1 << 44, ctx=f.ctx)
    tokens = r.capacity.kv_capacity_tokens
    ok = tokens == int(p.value)
    how = f"max_tokens {f.knobs['max_tokens']:,} rounded up to whole blocks of {f.knobs.get('tokens_per_block', 32)}"
    return Finding(p, REPRODUCED if ok else DIFFERS, f"{tokens:,}", how)
