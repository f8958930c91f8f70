"""Reading a vLLM start-up log: settings (the non-default args dict first, then vLLM's resolved values, then the
command line) and every KV-related number it printed (V1 and V0 wordings, the start-up refusal included)."""

from __future__ import annotations

import re

from kvplan.errors import KvplanError
from kvplan.explain.common import (GiB, LogFacts, Printed, dtype_word, find_all, flag_values, lines, literal_dict,
                                   unread_kv_lines)

_VERSION = [
    (re.compile(r"vLLM API server version v?(\S+)"), "the API server banner"),
    (re.compile(r"[▄█].*\bversion v?(\d+\.\d+\S*)"), "the start-up banner"),
    (re.compile(r"Initializing a V1 LLM engine \(v(\S+?)\)"), "the engine config line"),
    (re.compile(r"\*\*vLLM:?\*\*:?\s*`?v?(\d+\.\d+[\w.+]*)"), "the report's vLLM line"),
    (re.compile(r"\bvllm[ =/]v?(\d+\.\d+\.\d+[\w.+]*)", re.I), "a version in the text"),
]
_MODEL_CMD = [
    re.compile(r"\bvllm serve\s+(?:\\\s*)?(?!-)(\S+)"),
    re.compile(r"--model[= ]\s*[\"']?([^\s\"']+)"),
    re.compile(r"\bmodel\s*=\s*[\"'\u201c\u201d]([^\"'\u201c\u201d]+)"),
]
_GPU_NAME = re.compile(r"\b(NVIDIA[ _][\w -]*?(?:\d{2,4}\w*|[A-Z]\d{1,3}\w*)(?:[ _](?:PCIe|SXM\d?|NVL|80GB|40GB|24GB|48GB|Ti|Ada))*)\b")

_AVAIL = r"Available KV cache memory:?\**:?\s*(-?[\d.]+) GiB"
_TABLE = {  # what -> [(pattern, unit, group, at_group)]
    "kv_budget": [(_AVAIL, GiB, 1, None), (r"kv_cache_size=([\d.]+)GiB", GiB, 1, None),
                  (r"Current kv cache memory in use is ([\d.]+) GiB", GiB, 1, None),
                  (r"larger than the available KV cache memory \(([\d.]+) GiB\)", GiB, 1, None)],
    "kv_tokens": [(r"GPU KV cache size:?\**:?\s*([\d,]+) tokens", 1, 1, None),
                  (r"maximum number of tokens that can be stored in KV cache \((\d+)\)", 1, 1, None)],
    "concurrency": [(r"Maximum concurrency for ([\d,]+) tokens per request:?\**:?\s*([\d.]+)x", 1, 2, 1),
                    (r"Maximum concurrency @\s*([\d,]+):\s*([\d.]+)x", 1, 2, 1)],
    "num_blocks": [(r"num_gpu_blocks is: (\d+)", 1, 1, None), (r"\(([\d,]+) blocks x \d+ tokens/block\)", 1, 1, None),
                   (r"(?:# )?GPU blocks: (\d+)", 1, 1, None)],
    "weights": [(r"Model loading took:?\**:?\s*([\d.]+) Gi?B", GiB, 1, None),
                (r"Loading model weights took ([\d.]+) GB", GiB, 1, None)],
    "non_kv": [(r"Total non KV cache memory: ([\d.]+)\s*GiB", GiB, 1, None)],
    # weight_utils.py (0.22+): the safetensors files it is about to load, summed (the whole checkpoint, any TP)
    "checkpoint_size": [(r"Checkpoint size: ([\d.]+) GiB", GiB, 1, None)],
    "activation_peak": [(r"torch peak memory increase: ([\d.]+)\s*GiB", GiB, 1, None)],
    "non_torch": [(r"non-torch forward increase memory: ([\d.]+)\s*GiB", GiB, 1, None)],
    "cudagraph_estimate": [(r"Estimated CUDA graph memory: ([\d.]+) GiB total", GiB, 1, None)],
    "kv_needed": [(r"([\d.]+) GiB KV cache is needed", GiB, 1, None)],
    "suggested_max_len": [(r"estimated maximum model length is (\d+)", 1, 1, None)],
    "mamba_blocks": [(r"exceeds available Mamba cache blocks \((\d+)\)", 1, 1, None)],
    "block_size": [(r"Setting kv cache block size to (\d+)", 1, 1, None)],
    # a hybrid's page fitting (platforms/interface.py _align_hybrid_block_size, kv_cache_utils.py get_kv_cache_groups)
    "hybrid_block_size": [(r"Setting attention block size to (\d+) tokens", 1, 1, None)],
    "mamba_padding_pct": [(r"Padding mamba page size by ([\d.]+)%", 1, 1, None)],
    "padding_layers": [(r"Add (\d+) padding layers", 1, 1, None)],
    "padding_waste_pct": [(r"Add \d+ padding layers, may waste at most ([\d.]+)%", 1, 1, None)],
}

_KNOBS = {  # vLLM argument -> (kvplan knob, how to read it)
    "max_model_len": ("max_model_len", int),
    "gpu_memory_utilization": ("gpu_memory_utilization", float),
    "max_num_seqs": ("max_num_seqs", int),
    "max_num_batched_tokens": ("max_num_batched_tokens", int),
    "block_size": ("block_size", int),
    "mamba_ssm_cache_dtype": ("mamba_ssm_cache_dtype", str),
    "decode_context_parallel_size": ("decode_context_parallel_size", int),
    "dcp": ("decode_context_parallel_size", int),
}
_BOOL_KNOBS = ("enable_prefix_caching", "disable_hybrid_kv_cache_manager", "async_scheduling")


def looks_like(text: str) -> bool:
    return bool(re.search(r"vLLM|vllm|Available KV cache memory|GPU KV cache size|GPU blocks:|kv_cache_size=|Mamba cache blocks", text))


def read(text: str) -> LogFacts:
    ls = lines(text)
    f = LogFacts("vllm")
    _version(text, f)
    nda_line = next((ln for ln in ls if "non-default args:" in ln), None)
    nda = literal_dict(nda_line.split("non-default args:", 1)[1].strip()) if nda_line else {}
    flags = flag_values(text)
    _settings(nda, "the non-default args line", f)
    f.set_from(text, r"Using max model len (\d+)", "max_model_len", int, "vLLM's resolved max model len")
    f.set_from(text, r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)", "max_num_batched_tokens", int,
               "vLLM's chunked-prefill line")
    _settings(flags, "the command line", f)
    runner = re.search(r"VLLM_USE_V2_MODEL_RUNNER=([01])\b", text)
    if runner:
        f.set("use_v2_model_runner", runner.group(1) == "1", "the environment on the command line")
    if re.search(r"--no-enable-prefix-caching", text):
        f.set("enable_prefix_caching", False, "the command line")
    if re.search(r"--enable[-_]prefix[-_]caching(?![\w=-])", text):
        f.set("enable_prefix_caching", True, "the command line")
    f.set_from(text, r"The current --gpu-memory-utilization=([\d.]+)", "gpu_memory_utilization", float,
               "vLLM's CUDA-graph profiling advice")
    f.set_from(text, r"increase --gpu-memory-utilization from ([\d.]+) to", "gpu_memory_utilization", float,
               "vLLM's CUDA-graph profiling advice")
    f.set_from(text, r"blocks x (\d+) tokens/block", "block_size", int, "vLLM's KV cache size line")
    stored = re.search(r"Using (fp8(?:_e4m3|_e5m2)?) data type to store kv cache|(fp8)_ds_mla KV cache format", text)
    if stored:
        f.set("kv_dtype", stored.group(1) or stored.group(2), "vLLM's KV-dtype line")
    _model(text, nda, f)
    _gpu(text, f)
    for what, rows in _TABLE.items():
        for pattern, unit, group, at_group in rows:
            f.printed.extend(find_all(ls, pattern, what, unit, group=group, at_group=at_group, worker=True))
    needed_at = re.search(r"max seq len \((\d+)\)", text)
    if needed_at:
        f.printed = [Printed(p.line, p.what, p.value, p.unit, int(needed_at.group(1)), p.worker)
                     if p.what in ("kv_needed", "suggested_max_len") else p for p in f.printed]
    _dedupe(f)
    unread_kv_lines(ls, f)
    return f


def _version(text: str, f: LogFacts) -> None:
    for rx, where in _VERSION:
        m = rx.search(text)
        if not m:
            continue
        v = m.group(1).rstrip(".,;`")
        if re.match(r"0\.1\.dev", v):
            f.notes.append(f"the log's vLLM version {v} is a development build without a release number: the newest "
                           "rules are used (give --engine vllm@X.Y to choose)")
            return
        if re.match(r"\d+\.\d+", v):
            f.set("version", v, where)
            return


def _settings(values: dict, where: str, f: LogFacts) -> None:
    for key in ("tensor_parallel_size", "tp"):
        if key in values:
            f.set("tp", _int(values[key]), where)
    for key in ("pipeline_parallel_size", "pp"):
        if key in values:
            f.set("pp", _int(values[key]), where)
    for key, (knob, cast) in _KNOBS.items():
        if key in values and values[key] is not None:
            try:
                f.set(knob, cast(values[key]), where)
            except (TypeError, ValueError):
                f.notes.append(f"{key} {values[key]!r} in {where} not read")
    for key in _BOOL_KNOBS:
        if isinstance(values.get(key), bool):
            f.set(key, values[key], where)
    kv = values.get("kv_cache_dtype")
    if kv is not None and str(kv).lower() != "auto":
        f.set("kv_dtype", dtype_word(kv) or str(kv), where)
    quant = str(values.get("quantization") or "").lower()
    dtype = str(values.get("dtype") or "").lower()
    if quant == "fp8":
        f.set("weight_dtype", "fp8", where + " (quantization fp8: online fp8 weights)")
    elif quant.startswith("online_"):  # weights quantized at load time from an unquantized checkpoint
        f.notes.append(f"quantization {quant} in {where}: the weights are quantized as they load, which kvplan does "
                       "not model; its weight figure is the checkpoint's")
    elif quant in ("", "none") and re.match(r"(torch\.)?(float32|float16|half)\b", dtype):
        d = "fp32" if "32" in dtype else "fp16"
        f.set("weight_dtype", d, where)
        if "kv_dtype" not in f.stated:
            f.set("kv_dtype", d, where + " (dtype; the KV cache follows it under auto)")


def _int(value) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def _model(text: str, nda: dict, f: LogFacts) -> None:
    name = nda.get("model") or nda.get("model_tag")
    if name:
        f.set("model", str(name), "the non-default args line")
        return
    for rx in _MODEL_CMD:
        m = rx.search(text)
        if m:
            f.set("model", m.group(1).rstrip("\\,"), "the command line")
            return


def _gpu(text: str, f: LogFacts) -> None:
    ls = lines(text)
    totals = (find_all(ls, r"total_memory=([\d.]+)GiB", "gpu_total", GiB)
              or find_all(ls, r"Free memory on device \([\d.]+/([\d.]+) GiB\)", "gpu_total", GiB)
              or find_all(ls, r"total_gpu_memory=([\d.]+)GiB", "gpu_total", GiB))
    if totals:
        f.gpu_total = totals[0]
        f.stated["gpu_total"] = "vLLM's memory snapshot"
    m = _GPU_NAME.search(text.replace("device_name=", " "))
    if m:
        f.set("gpu_name", m.group(1).replace("_", " ").strip(), "a device name in the log")


def _dedupe(f: LogFacts) -> None:
    """One figure per (what, value, worker): the same line repeated (two loggers, '[repeated 3x]') counts once."""
    seen, out = set(), []
    for p in f.printed:
        key = (p.what, p.value, p.at, p.worker)
        if key in seen:
            f.repeats.add(p.line)
            continue
        seen.add(key)
        out.append(p)
    f.printed = out



# ---------------------------------------------------------------------------------------------- reproduction
def reproduce(c) -> list:
    """Every printed figure -> a Finding. Exact figures are recomputed at both ends of the printed budget's
    interval; the budget itself, the weights and the non-KV terms are compared with kvplan's estimates."""
    from kvplan.explain.common import NOT_REPRODUCED, Finding

    f = c.facts
    if c.model is None:
        return [Finding(p, NOT_REPRODUCED, "", c.model_why) for p in f.printed]
    findings: dict[int, Finding] = {}
    try:
        exact, estimates = _runs(c)
        for i, p in enumerate(f.printed):
            if p.what in _EXACT:
                findings[i] = exact.finding(p)
        for i, p in enumerate(f.printed):
            if p.what not in _EXACT:
                findings[i] = estimates.finding(p)
    except KvplanError as e:
        for i, p in enumerate(f.printed):
            findings.setdefault(i, Finding(p, NOT_REPRODUCED, "", f"kvplan cannot size this model or setting: {e}"))
    return [findings[i] for i in range(len(f.printed))]


def _runs(c) -> tuple["_Exact", "_Estimates"]:
    """kvplan's runs at the printed budget and from the GPU alone, made once per log (explain, then a calibration)."""
    if "exact" not in c.work:
        exact = _Exact(c)
        c.work["exact"], c.work["estimates"] = exact, _Estimates(c, exact)
    return c.work["exact"], c.work["estimates"]


_EXACT = ("kv_tokens", "num_blocks", "concurrency", "kv_needed", "suggested_max_len", "mamba_blocks", "block_size",
          "hybrid_block_size", "mamba_padding_pct", "padding_layers", "padding_waste_pct", "checkpoint_size")
# figures of the layout alone (no budget needed): what -> (kvplan's values from a stage, how vLLM prints them)
_LAYOUT = {
    "hybrid_block_size": (lambda st: [st.block_size], "{:d}"),
    "mamba_padding_pct": (lambda st: [st.mamba_padding_pct] if st.mamba_page_padding else [], "{:.2f}"),
    "padding_layers": (lambda st: [n for n, _ in st.padding_layers], "{:d}"),
    "padding_waste_pct": (lambda st: [100 * n / of for n, of in st.padding_layers], "{:.2f}"),
}


def _stage(worker: str | None, tp: int) -> int | None:
    if not worker:
        return None
    kind, n = worker.split()
    return int(n) // max(1, tp) if kind == "rank" else (int(n) if kind == "pp" else None)


class _Exact:
    """kvplan's fit at the low and high end of the printed KV budget, per request length asked."""

    def __init__(self, c) -> None:
        self.c = c
        f = c.facts
        self.mml = f.knobs.get("max_model_len")
        self.budgets = self._budgets(f)
        self._cache: dict = {}

    def _budgets(self, f):
        from kvplan.explain.reproduce import budget_bounds

        printed = [p for p in f.figures("kv_budget") if p.value > -1000]
        if not printed:
            return None
        if f.pp > 1:
            by_stage: dict[int, tuple[int, int]] = {}
            for p in printed:
                stage = _stage(p.worker, f.tp)
                if stage is not None and stage < f.pp:
                    by_stage.setdefault(stage, budget_bounds(p))
            if len(by_stage) == f.pp:
                lo = tuple(by_stage[s][0] for s in range(f.pp))
                hi = tuple(by_stage[s][1] for s in range(f.pp))
                f.notes.append("per-stage budgets from the workers that printed them (stage = rank // tp, or PPn)")
                return lo, hi
            if len({p.value for p in printed}) > 1:
                f.notes.append("pipeline stages printed different budgets without ranks: the smallest is used for every stage")
        smallest = min(printed, key=lambda p: p.value)
        if len({p.value for p in printed}) > 1 and f.pp == 1:
            f.notes.append(f"workers printed different KV budgets; vLLM sizes the pool by the smallest ({smallest.shown})")
        return budget_bounds(smallest)

    def run(self, end: int, length: int | None):
        key = (end, length)
        if key not in self._cache:
            knobs = {"max_model_len": length} if length else {}
            self._cache[key] = self.c.fit(kv_budget=self.budgets[end], ctx=length, **knobs)
        return self._cache[key]

    def finding(self, p):
        from kvplan.explain.common import DIFFERS, NOT_REPRODUCED, REPRODUCED, Finding
        from kvplan.explain.reproduce import gib, rel_error, within

        length = p.at or self.mml
        if p.what in _LAYOUT:
            return self._layout_finding(p, length)
        if p.what == "checkpoint_size":
            return self._checkpoint_finding(p, length)
        if p.what == "kv_needed":
            r = self.run(0, length) if self.budgets else self.c.fit(kv_budget=1 << 40, ctx=length, max_model_len=length)
            prepared = r.setup.prepared
            mml = r.capacity.details.get("max_model_len", length)
            needed = prepared.check_bytes(mml)
            lo, hi = p.bounds()
            ok = lo <= needed < hi
            return Finding(p, REPRODUCED if ok else DIFFERS, f"{needed:,} B ({gib(needed)})",
                           f"one request of {mml:,} tokens in vLLM's layout", None if ok else rel_error(needed, float(p.value) * p.unit))
        if self.budgets is None:
            return Finding(p, NOT_REPRODUCED, "", "the log prints no KV budget ('Available KV cache memory') to size "
                           "from; kvplan's estimate from the GPU is in the budget row" if self.c.gpu_known else
                           "the log prints no KV budget and names no GPU: give --gpu for kvplan's estimate")
        lo_r, hi_r = self.run(0, length), self.run(1, length)
        value = {"kv_tokens": lambda r: r.capacity.kv_capacity_tokens,
                 "num_blocks": lambda r: r.capacity.details.get("num_gpu_blocks"),
                 "concurrency": lambda r: r.capacity.concurrency,
                 "suggested_max_len": lambda r: r.capacity.suggested_max_ctx,
                 "mamba_blocks": lambda r: r.capacity.details.get("num_gpu_blocks"),
                 "block_size": lambda r: r.capacity.details.get("block_size")}[p.what]
        a, b = value(lo_r), value(hi_r)
        printed = float(p.value)
        how = f"at both ends of the printed budget ({self._lo_total() / GiB:.3f} .. {self._hi_total() / GiB:.3f} GiB)"
        if length:
            how += f", max_model_len {length:,}"
        shown = f"{a:,}" if a == b else f"{a:,} .. {b:,}"
        if a is None:
            return Finding(p, NOT_REPRODUCED, "", "kvplan's vLLM rules give no such figure for this layout")
        if within(printed, a, b):
            return Finding(p, REPRODUCED, shown, how)
        return Finding(p, DIFFERS, shown, how, rel_error((a + b) / 2, printed))

    def _layout_finding(self, p, length: int | None):
        """A figure of the page layout: equal as vLLM prints it, in the stage of the worker that printed it (or any)."""
        from kvplan.explain.common import DIFFERS, NOT_REPRODUCED, REPRODUCED, Finding

        r = self.run(0, length) if self.budgets else self.c.fit(kv_budget=1 << 40, ctx=length, max_model_len=length)
        stages = r.setup.prepared.stages
        stage = _stage(p.worker, self.c.facts.tp)
        values, fmt = _LAYOUT[p.what]
        shown = [fmt.format(v) for st in (stages[stage:stage + 1] if stage is not None else stages) for v in values(st)]
        printed = fmt.format(int(p.value) if fmt == "{:d}" else float(p.value))
        how = {"hybrid_block_size": "the attention block raised so one page holds a Mamba state",
               "mamba_padding_pct": "100 x (attention page - Mamba page) / Mamba page",
               "padding_layers": "slots left empty in the last KV group of a layer type",
               "padding_waste_pct": "empty slots / that type's layers"}[p.what]
        if not shown:
            return Finding(p, NOT_REPRODUCED, "", "kvplan's vLLM layout pads nothing here")
        if printed in shown:
            return Finding(p, REPRODUCED, printed, how)
        return Finding(p, DIFFERS, ", ".join(dict.fromkeys(shown)), how)

    def _checkpoint_finding(self, p, length: int | None):
        """The checkpoint as stored: every weight part (towers and the MTP layers kvplan counts too) in the
        checkpoint's own format, whatever vLLM quantizes at load; safetensors headers (kilobytes) not counted."""
        from kvplan import weights
        from kvplan.explain.common import DIFFERS, ESTIMATED, REPRODUCED, Finding
        from kvplan.explain.reproduce import gib, rel_error

        r = self.run(0, length) if self.budgets else self.c.fit(kv_budget=1 << 40, ctx=length, max_model_len=length)
        spec = r.setup.spec
        stored = spec.dtype if spec.dtype in weights.FLOAT_BYTES else r.setup.float_dtype
        total = weights.total_bytes(spec, weights.weight_format(spec, None, stored), stored, include_mtp=True)
        shown, printed = f"{total:,} B ({gib(total)})", float(p.value) * p.unit
        missing_mtp = spec.mtp_layers and not any(w.part == "mtp" for w in spec.weights)
        if missing_mtp:
            return Finding(p, ESTIMATED, shown, f"the checkpoint's weights without its {spec.mtp_layers} "
                           "multi-token-prediction layer(s), which kvplan does not lay out for this family",
                           rel_error(total, printed))
        lo, hi = p.bounds()
        how = f"every weight part in the checkpoint's format ({stored} for unquantized tensors)"
        if lo <= total < hi:
            return Finding(p, REPRODUCED, shown, how)
        return Finding(p, DIFFERS, shown, how, rel_error(total, printed))

    def _lo_total(self) -> int:
        lo = self.budgets[0]
        return min(lo) if isinstance(lo, tuple) else lo

    def _hi_total(self) -> int:
        hi = self.budgets[1]
        return min(hi) if isinstance(hi, tuple) else hi


class _Estimates:
    """kvplan's budget model from the GPU alone, and its weight count, against what vLLM measured."""

    # the log's figure -> (kvplan's budget part, what the finding calls it)
    _PARTS = {"activation_peak": ("activation", "activation peak"), "non_torch": ("non_torch", "non-torch memory"),
              "cudagraph_estimate": ("cuda_graphs", "CUDA graphs")}

    def __init__(self, c, exact: _Exact) -> None:
        self.c, self.exact = c, exact
        self.result, self.why = None, ""
        if not c.gpu_known:
            self.why = "the log names no GPU: give --gpu for kvplan's estimate"
            return
        try:
            self.result = c.fit(kv_budget=None, ctx=exact.mml, **({"max_model_len": exact.mml} if exact.mml else {}))
        except KvplanError as e:
            self.why = f"kvplan does not estimate this budget: {e}"

    def finding(self, p):
        from kvplan.explain.common import ESTIMATED, NOT_REPRODUCED, Finding
        from kvplan.explain.reproduce import gib, rel_error

        printed = float(p.value) * p.unit
        if p.what == "weights":
            r = self.result or self._any_run()
            if r is None:
                return Finding(p, NOT_REPRODUCED, "", self.why)
            w = r.weight_bytes
            return Finding(p, ESTIMATED, f"{w:,} B ({gib(w)})",
                           f"checkpoint weights per GPU ({r.setup.weight_source}); vLLM's figure also holds its buffers "
                           "(RoPE cache) and padding", rel_error(w, printed))
        if self.result is None:
            return Finding(p, NOT_REPRODUCED, "", self.why)
        stage = _stage(p.worker, self.c.facts.tp)
        budget = self.result.budgets[stage if stage is not None and stage < len(self.result.budgets) else 0]
        if p.what == "kv_budget":
            b = budget.kv_bytes
            tokens = self.result.capacity.kv_capacity_tokens
            return Finding(p, ESTIMATED, f"{b:,} B ({gib(b)})",
                           f"kvplan's budget model on {self.c.gpu.gpu.name} (tokens from it: {tokens:,})",
                           rel_error(b, printed))
        if p.what == "non_kv":
            requested = budget.part("requested").bytes
            non_kv = requested - budget.kv_bytes
            return Finding(p, ESTIMATED, f"{non_kv:,} B ({gib(non_kv)})",
                           "requested memory less kvplan's KV budget: weights + activation + non-torch (+ graphs)",
                           rel_error(non_kv, printed))
        key, label = self._PARTS.get(p.what, (None, None))
        found = budget.part(key) if key else None
        part = -found.bytes if found is not None else None
        if part is None:
            if p.what == "cudagraph_estimate":
                return Finding(p, NOT_REPRODUCED, "", f"kvplan's rules for {self.c.engine} do not charge CUDA-graph memory "
                               "to the KV budget (vLLM charges its estimate from 0.22 on)")
            return Finding(p, NOT_REPRODUCED, "", f"kvplan's budget for {self.c.engine} has no such term")
        return Finding(p, ESTIMATED, f"{part:,} B ({gib(part)})", f"kvplan's {label} term (engines/overhead.py)",
                       rel_error(part, printed))

    def _any_run(self):
        if self.exact.budgets is not None:
            return self.exact.run(0, self.exact.mml)
        try:
            return self.c.fit(kv_budget=1 << 40, ctx=self.exact.mml)
        except KvplanError:
            return None


# ---------------------------------------------------------------------------------------------- calibration
def calibration(c, log_name: str, text_sha256: str):
    """What this log measured besides the cache, per GPU: requested memory (the log's gpu_memory_utilization of the
    catalog GPU's total) less the KV budget it printed, per pipeline stage. Refused (one line) where the log does
    not pin the key: no printed budget, no vLLM version, no GPU kvplan knows, no model kvplan can load."""
    from kvplan import calibration as cal_mod, planner
    from kvplan.engines import vllm
    from kvplan.errors import InputError

    f = c.facts
    c.require_calibration_key("vLLM")
    exact, estimates = _runs(c)
    if exact.budgets is None:
        raise InputError("cannot save a calibration: the log prints no KV budget ('Available KV cache memory')")
    r = estimates.result  # kvplan's own budget at the log's settings: its requested memory is the log's
    if r is None:
        raise InputError(f"cannot save a calibration: {estimates.why}")
    lo, hi = exact.budgets
    lo = lo if isinstance(lo, tuple) else (lo,) * f.pp
    hi = hi if isinstance(hi, tuple) else (hi,) * f.pp
    non_kv = []
    for stage, b in enumerate(r.budgets):
        requested = b.part("requested").bytes
        non_kv.append(requested - (lo[stage] + hi[stage]) // 2)
    s = r.setup
    batched, seqs = vllm.profile(s.prepared, planner.gpu_context(c.gpu), f.knobs)
    return cal_mod.Calibration(cal_mod.key_for(s, c.gpu.gpu.name), tuple(non_kv), (hi[0] - lo[0] + 1) // 2, batched, seqs,
                               s.engine.selected.asked, s.ref.id, log_name, text_sha256)
