"""Reading a llama.cpp (or ik_llama.cpp / ollama) log: one run per context created, each with its n_ctx, cache
types and printed sizes (total, K, V, latent, per-device buffers, cells). A model kvplan can load comes from
--model; without one, a plain-attention model is rebuilt from the metadata the log printed (n_layer, n_head_kv,
head sizes), as llama.cpp sizes its cache from exactly those."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from kvplan.errors import KvplanError
from kvplan.explain.common import (DIFFERS, MiB, NOT_REPRODUCED, REPRODUCED, Finding, LogFacts, Printed, dtype_word,
                                   lines, number, unread_kv_lines)

_NCTX = re.compile(r"\bn_ctx\s*=\s*(\d+)")
_FORK = re.compile(r"llama_new_context_with_model|llama_kv_cache_init|llm_load_print_meta|c\^KV|ik_llama")
_FIGURES = [
    ("kv_total", re.compile(r"(?::\s+size|KV self size)\s*=\s*([\d.]+) MiB")),
    ("k_size", re.compile(r"\bK \((\w+)\):\s*([\d.]+) MiB")),
    ("v_size", re.compile(r"\bV \((\w+)\):\s*([\d.]+) MiB")),
    ("latent_size", re.compile(r"c\^KV \((\w+)\):\s*([\d.]+) MiB")),
    ("cells", re.compile(r"\(\s*(\d+) cells")),
]
_BUFFER = re.compile(r"KV buffer size\s*=\s*([\d.]+) MiB")
_RS_BUFFER = re.compile(r"RS buffer size\s*=\s*([\d.]+) MiB")
# llama_memory_recurrent (src/llama-memory-recurrent.cpp) prints its own size line, "R (f32)" / "S (f32)" for the
# conv and SSM rows and its cell count (one per sequence); hybrid models print it beside llama_kv_cache's line
_RS_FIGURES = [
    ("rs_total", re.compile(r":\s+size\s*=\s*([\d.]+) MiB")),
    ("r_size", re.compile(r"\bR \((\w+)\):\s*([\d.]+) MiB")),
    ("s_size", re.compile(r"\bS \((\w+)\):\s*([\d.]+) MiB")),
    ("rs_cells", re.compile(r"\(\s*(\d+) cells")),
]
_META = {"n_layer": "n_layer", "n_head": "n_head", "n_head_kv": "n_head_kv", "n_embd_head_k": "head_k",
         "n_embd_head_v": "head_v", "n_embd": "n_embd", "n_swa": "n_swa"}


@dataclass
class Run:
    """One context: what it was created with and what it printed."""

    first_line: int
    ctx: int | None = None
    k_type: str | None = None
    v_type: str | None = None
    mla: int | None = None
    fork: bool = False
    version: str | None = None
    printed: list[Printed] = field(default_factory=list)
    buffers: list[Printed] = field(default_factory=list)
    rs_buffers: list[Printed] = field(default_factory=list)

    def has_total(self) -> bool:
        return any(p.what == "kv_total" for p in self.printed)


def looks_like(text: str) -> bool:
    return bool(re.search(r"llama_kv_cache|llama_context|llama_new_context_with_model|print_info:|llm_load_print_meta"
                          r"|KV self size|ggml_", text))


def read(text: str) -> LogFacts:
    ls = lines(text)
    f = LogFacts("llamacpp")
    run = Run(1)
    runs = [run]
    build = None
    for i, line in enumerate(ls, 1):
        m = re.search(r"\bbuild: (\d+) \(", line)
        if m:
            build = m.group(1)
        new_ctx = _NCTX.search(line) or re.search(r"(?:^|\s)-c (\d+)\b", line) or line.startswith("---")
        if new_ctx and run.has_total():
            run = Run(i)
            runs.append(run)
        if _FORK.search(line):
            run.fork = True
        if build and not run.fork:
            run.version = "b" + build
        _read_line(line, i, run, f)
    f.runs = [r for r in runs if r.printed or r.buffers or r.rs_buffers]
    for r in f.runs:
        f.printed.extend(r.printed)
        for parts, what in ((r.buffers, "kv_buffers"), (r.rs_buffers, "rs_buffers")):
            if parts:
                total = sum(p.value for p in parts)
                f.printed.append(Printed(parts[0].line, what, total, MiB, terms=len(parts)))
                r.printed.append(f.printed[-1])
    if build:
        f.set("version", "b" + build, "the build line")
    taken = {p.line for r in f.runs for p in r.buffers + r.rs_buffers}
    unread_kv_lines(ls, f)
    f.unread = [(i, t) for i, t in f.unread if i not in taken]
    return f


def _read_line(line: str, i: int, run: Run, f: LogFacts) -> None:
    m = _NCTX.search(line) or re.search(r"\bkv_size = (\d+)", line)
    if m and run.ctx is None:
        run.ctx = int(m.group(1))
    m = re.search(r"(?:^|\s)-c (\d+)\b", line)
    if m and run.ctx is None:
        run.ctx = int(m.group(1))
    for pattern, attr in ((r"type_k = '(\w+)'", "k_type"), (r"type_v = '(\w+)'", "v_type"),
                          (r"(?:-ctk|--cache-type-k)\s+(\w+)", "k_type"), (r"(?:-ctv|--cache-type-v)\s+(\w+)", "v_type")):
        m = re.search(pattern, line)
        if m and getattr(run, attr) is None:
            setattr(run, attr, m.group(1))
    m = re.search(r"mla_attn\s*=\s*(\d)|(?:^|\s)-mla (\d)", line)
    if m:
        run.mla = int(m.group(1) or m.group(2))
    m = re.search(r"(?:print_info|llm_load_print_meta):\s*(\w+)\s*=\s*(.+)$", line)
    if m and m.group(1) in _META:
        f.model_facts.setdefault(_META[m.group(1)], m.group(2).strip())
    if "llama_memory_recurrent" in line:
        for what, rx in _RS_FIGURES:
            m = rx.search(line)
            if m:
                run.printed.append(Printed(i, what, number(m.group(m.lastindex)), 1 if what == "rs_cells" else MiB))
        m = _RS_BUFFER.search(line)
        if m:
            run.rs_buffers.append(Printed(i, "rs_buffer", number(m.group(1)), MiB))
        return
    for what, rx in _FIGURES:
        m = rx.search(line)
        if not m:
            continue
        if what in ("k_size", "v_size", "latent_size"):
            attr = {"k_size": "k_type", "v_size": "v_type", "latent_size": "k_type"}[what]
            if getattr(run, attr) is None:
                setattr(run, attr, m.group(1))
            run.printed.append(Printed(i, what, number(m.group(2)), MiB))
        elif what == "cells":
            run.printed.append(Printed(i, what, number(m.group(1))))
        else:
            run.printed.append(Printed(i, what, number(m.group(1)), MiB))
    m = _BUFFER.search(line)
    if m:
        run.buffers.append(Printed(i, "kv_buffer", number(m.group(1)), MiB))


# ---------------------------------------------------------------------------------------------- reproduction
def synthesized_model(f: LogFacts):
    """(ResolvedModel, ModelSpec) of a plain-attention model with the printed metadata, or (None, why)."""
    from kvplan.architectures import normalize
    from kvplan.model_ref import ModelRef, ResolvedModel

    mf = f.model_facts
    try:
        layers, kv_heads, head_k = int(mf["n_layer"]), int(mf["n_head_kv"]), int(mf["head_k"])
    except (KeyError, ValueError):
        return None, ("the log names no model kvplan can load and does not print n_layer, n_head_kv and n_embd_head_k "
                      "as single numbers: give --model (the .gguf, an alias or a config.json)")
    if any(p.what == "latent_size" for p in f.printed) or "n_embd_k_gqa" in mf:
        return None, "an MLA model (the log prints a latent cache): give --model (the .gguf, an alias or a config.json)"
    head_v = int(mf.get("head_v", head_k))
    if head_v != head_k:
        return None, (f"K and V heads differ ({head_k} / {head_v}: MLA or a model kvplan cannot rebuild from the "
                      "printed metadata): give --model")
    heads = int(mf.get("n_head", kv_heads)) if str(mf.get("n_head", "")).isdigit() else kv_heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_k,
              "hidden_size": heads * head_k, "intermediate_size": 4 * heads * head_k, "vocab_size": 32000,
              "max_position_embeddings": 1 << 20, "torch_dtype": "float16"}
    ref = ModelRef(requested="the log's metadata", id=None, source="log",
                   path=f"n_layer {layers}, n_head_kv {kv_heads}, head {head_k}")
    return (ResolvedModel(ref, config), normalize(config)), ""


def reproduce(c) -> list[Finding]:
    f = c.facts
    if c.model is None and c.loaded is None:
        loaded, why = synthesized_model(f)
        if loaded is None:
            return [Finding(p, NOT_REPRODUCED, "", why) for p in f.printed]
        c.loaded, c.model_why = loaded, "rebuilt from the metadata the log printed (plain attention; KV only)"
    out: list[Finding] = []
    for run in f.runs:
        out.extend(_run_findings(c, run))
    return out


def _run_findings(c, run: Run) -> list[Finding]:
    if run.ctx is None and c.ctx is not None:
        run.ctx = c.ctx
    if run.ctx is None:
        return [Finding(p, NOT_REPRODUCED, "", "no n_ctx (or -c) printed for this context: give --ctx") for p in run.printed]
    if run.fork and run.mla == 1 and any(p.what == "latent_size" for p in run.printed):
        return [Finding(p, NOT_REPRODUCED, "", "ik_llama.cpp -mla 1 keeps a transposed V copy beside the latent; "
                        "kvplan models llama.cpp's own layout (ik's -mla 0 and -mla 3 store the latent alone)")
                for p in run.printed]
    facts = c.facts
    saved = (facts.k_dtype, facts.v_dtype, facts.kv_dtype, c.engine)
    try:
        if "kv_dtype" not in facts.stated or facts.stated["kv_dtype"] != "--kv-dtype":
            facts.kv_dtype = None
            facts.k_dtype, facts.v_dtype = dtype_word(run.k_type) or run.k_type, dtype_word(run.v_type) or run.v_type
        if c.engine == "llamacpp" or c.engine.startswith("llamacpp@"):
            c.engine = f"llamacpp@{run.version}" if run.version else "llamacpp"
        _, plan = c.size(run.ctx)
    except KvplanError as e:
        return [Finding(p, NOT_REPRODUCED, "", f"kvplan cannot size this run: {e}") for p in run.printed]
    finally:
        facts.k_dtype, facts.v_dtype, facts.kv_dtype, c.engine = saved
    k = sum(t.total_bytes for t in plan.tensors if t.name.startswith("K"))
    v = sum(t.total_bytes for t in plan.tensors if t.name.startswith("V"))
    r = sum(t.total_bytes for t in plan.tensors if t.name.startswith("r ("))
    s = sum(t.total_bytes for t in plan.tensors if t.name.startswith("s ("))
    # llama_kv_cache's line covers the attention layers; llama_memory_recurrent's the r / s rows (hybrid memory,
    # src/llama-memory-hybrid.cpp, holds one of each)
    values = {"kv_total": plan.kv_bytes - r - s, "kv_buffers": plan.kv_bytes - r - s, "k_size": k, "v_size": v,
              "latent_size": k, "cells": plan.details.get("cells"), "rs_total": r + s, "rs_buffers": r + s,
              "r_size": r, "s_size": s, "rs_cells": max(1, plan.details.get("n_seq_max") or 1)}
    how = f"n_ctx {run.ctx:,}, K {run.k_type or 'f16'} / V {run.v_type or 'f16'}" + (" (ik_llama.cpp)" if run.fork else "")
    out = []
    for p in run.printed:
        value = values.get(p.what)
        if value is None:
            out.append(Finding(p, NOT_REPRODUCED, "", "kvplan's llama.cpp plan gives no such figure"))
            continue
        lo, hi = p.bounds()
        ok = lo <= value < hi if p.unit != 1 else value == int(p.value)
        shown = f"{value:,} B ({Decimal(value) / MiB:.2f} MiB)" if p.unit != 1 else f"{value:,}"
        out.append(Finding(p, REPRODUCED if ok else DIFFERS, shown, how,
                           None if ok else (value - float(p.value) * p.unit) / (float(p.value) * p.unit)))
    return out
