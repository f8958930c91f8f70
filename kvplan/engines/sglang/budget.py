"""SGLang's KV budget (profile_max_num_token: mem_fraction_static of the free memory less the load) and what its
pools hold: the token pool, the hybrid-SWA split, DeepSeek-V4's pools, the running-request cap, the largest batch."""

from __future__ import annotations

from typing import Any

from kvplan.engines import base, overhead
from kvplan.engines.base import BudgetPart as Part
from kvplan.engines.sglang import dsv4
from kvplan.engines.sglang.pools import pooled, rule_of
from kvplan.engines.sglang.prepared import Prepared
from kvplan.engines.sglang.rules import SWA_FULL_TOKENS_RATIO, default_mem_fraction
from kvplan.spec import LatentAttention, ModelSpec


def budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, weights: int,
           opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> base.Budget:
    """profile_max_num_token: pre = free memory after NCCL init, post = pre - what the load took (weights and the
    rotary tables); rest = post - pre x (1 - mem_fraction_static), i.e. KV = mem_fraction_static x pre - load."""
    f, note = mem_fraction(prepared, spec, gpu, opts)
    pre = gpu.cuda_total - overhead.CUDA_CONTEXT_BYTES - (overhead.NCCL_BYTES if prepared.tp * prepared.pp > 1 else 0)
    if reserve is not None:
        pre = gpu.cuda_total - reserve
    parts = [Part("free_at_start", "free after NCCL init (estimate)", pre),
             Part("fraction", "x mem_fraction_static", int(pre * f) - pre), Part("weights", "weights", -weights)]
    # SGLang keeps the rotary cos/sin tables in fp32 on CUDA (layers/rotary_embedding/base.py, 0.5.10)
    rope = sum(t.nbytes(4) for t in spec.rope_tables)
    if rope and reserve is None:
        parts.append(Part("rotary", "rotary cos/sin tables, fp32 (built with the model)", -rope))
    return base.summed(parts, (note,))


def mem_fraction(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, opts: dict[str, Any]) -> tuple[float, str]:
    """mem_fraction_static as given, else SGLang's default for this GPU, parallelism and version; and a note."""
    given = opts.get("mem_fraction_static")
    if given:
        return float(given), f"mem_fraction_static {float(given)}"
    mla = any(isinstance(c, LatentAttention) for _, c in spec.caches)
    nvml_mib = (gpu.nvml_total or gpu.cuda_total) >> 20
    f = default_mem_fraction(nvml_mib, prepared.tp, prepared.pp, prepared.selected.rules, mla)
    return f, f"mem_fraction_static {f} (SGLang default for this GPU)"


def calibrated_budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, opts: dict[str, Any],
                      dtype_bytes: int, cal) -> base.Budget:
    """The budget from the free memory SGLang measured (calibration.py): KV = mem_fraction_static x pre - (pre -
    post), pre and post the free memory its log printed before and after the weights load. Neither depends on
    mem_fraction_static or the context length, so a calibration carries over to any of them."""
    f, note = mem_fraction(prepared, spec, gpu, opts)
    pre, load = cal.free_at_start_bytes[stage], cal.non_kv_bytes[stage]
    parts = (Part("free_at_start", f"free after NCCL init (calibrated: {cal.log})", pre),
             Part("fraction", "x mem_fraction_static", int(pre * f) - pre),
             Part("weights", f"weights as loaded (calibrated: {cal.log})", -load))
    notes = (note, f"free memory measured by {cal.describe()} (kvplan explain --save-calibration); "
             f"± {cal.half_width_bytes:,} B as printed")
    return base.Budget(int(pre * f) - load, parts, notes)


def _token_pool(prepared: Prepared, budgets: list[int]) -> int:
    """max_total_num_tokens: int(rest) // cell, min over stages, --max-total-tokens cap, floored to the page; a Mamba
    hybrid's rest is what its state pool leaves (Prepared.mamba_split)."""
    counts = []
    for s in range(len(prepared.stages)):
        cell = prepared.cell_size(s)
        if cell:
            rest = prepared.mamba_split(budgets[s])[1] if prepared.mamba_per_req else budgets[s]
            counts.append(max(0, rest) // cell)
    n = min(counts) if counts else 0
    if prepared.max_total_tokens:
        n = min(n, prepared.max_total_tokens)
    return n // prepared.page * prepared.page


def dsv4_pools(prepared: Prepared, budgets: list[int]) -> dsv4.PoolSizes:
    return dsv4.pool_sizes(prepared.dsv4, budgets, prepared.dsv4_requests, prepared.max_total_tokens)


def _dsv4_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    """Requests of ctx tokens both pools hold: ctx of the full pool, min(ctx, window) of the SWA pool, each rounded
    to the 256-token page; at most max_running_requests, the request slots the c128 state rings and the req-to-token
    pool are allocated for (a request beyond them has no state ring, whatever the token pools hold)."""
    s = dsv4_pools(prepared, budgets)
    page = dsv4.PAGE
    return min(s.full // base.pad_to(ctx, page), s.swa // base.pad_to(min(ctx, prepared.dsv4_window), page),
               s.max_running_requests)


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    if prepared.dsv4:
        return _dsv4_batch(prepared, ctx, budgets)
    if prepared.hybrid_swa:
        return _hybrid_swa_batch(prepared, ctx, budgets)
    if prepared.has_fixed_state():
        # fixed-size per-request state (cross K/V): charge whole requests against the budget
        return base.max_batch_by_bytes(prepared.stage_bytes, budgets, ctx)
    per = base.pad_to(ctx + prepared.encoder_tokens, prepared.page)
    n = _token_pool(prepared, budgets) // per if per else 0
    if prepared.mamba_per_req:  # each running request holds a state slot of the Mamba pool
        n = min(n, min(prepared.mamba_split(b)[0] for b in budgets))
    return n


def _swa_cells(prepared: Prepared, stage: int) -> tuple[int, int]:
    """(F, S): bytes one token takes in the stage's full-pool layers and in its SWA-pool layers."""
    caches = prepared.stages[stage]
    full = sum(prepared._token_bytes(c) for _, c in caches if pooled(c) and rule_of(c).pool == "full")
    swa = sum(prepared._token_bytes(c) for _, c in caches if pooled(c) and rule_of(c).pool == "swa")
    return full, swa


def hybrid_pool_tokens(prepared: Prepared, budgets: list[int]) -> tuple[int, int]:
    """(full pool tokens, SWA pool tokens) of a hybrid-SWA model; SGLang's max_total_num_tokens is the first (the
    SWA pool alone when the model has no full layer), r = --swa-full-tokens-ratio.

    0.5.10 (model_runner_kv_cache_mixin.py): capacity = rest // (F + S) floored to the page (min over pipeline
    stages, --max-total-tokens), then full = int(capacity x (F + S) / (F + r S)) floored to the page, F and S of the
    first stage (the model's layer lists). 0.5.23 (pool_configurator.py HybridSWAPoolConfigurator.calculate_pool_sizes,
    kv_cache_configurator.py _apply_token_constraints): full = int(rest // (F + r S)) per stage, min over stages and
    --max-total-tokens, floored to the page. Both: swa = int(full x r) floored to the page."""
    page, r = prepared.page, SWA_FULL_TOKENS_RATIO
    if not prepared.selected.rules.swa_ratio_cell:
        full, swa = _swa_cells(prepared, 0)
        cap = _token_pool(prepared, budgets)
        if not full:
            return 0, cap
        full_tokens = int(cap * (full + swa) / (full + r * swa)) // page * page
        return full_tokens, int(full_tokens * r) // page * page
    counts, all_swa = [], False
    for s in range(len(prepared.stages)):
        full, swa = _swa_cells(prepared, s)
        all_swa = all_swa or not full
        cell = full + r * swa if full else swa
        if cell:
            counts.append(int(max(0, budgets[s]) // cell))
    n = min(counts) if counts else 0
    if prepared.max_total_tokens:
        n = min(n, prepared.max_total_tokens)
    n = n // page * page
    if all_swa:
        return 0, n
    return n, int(n * r) // page * page


def _hybrid_swa_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    """A request needs ctx full-pool tokens and min(ctx, window) SWA-pool tokens, each rounded to the page."""
    full_tokens, swa_tokens = hybrid_pool_tokens(prepared, budgets)
    caches = prepared.stages[0]
    windows = [c.span for _, c in caches if pooled(c) and rule_of(c).pool == "swa"]
    need_full = base.pad_to(ctx, prepared.page) if any(
        pooled(c) and rule_of(c).pool == "full" for st in prepared.stages for _, c in st) else 0
    need_swa = base.pad_to(min(ctx, max(windows)), prepared.page) if windows else 0
    fits_ = [t // need for t, need in ((full_tokens, need_full), (swa_tokens, need_swa)) if need]
    return min(fits_) if fits_ else 0


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    if not prepared.dsv4 and not prepared.hybrid_swa and prepared.has_fixed_state():
        return all(prepared.stage_bytes(ctx, batch, s) <= budgets[s] for s in range(len(prepared.stages)))
    return batch <= max_batch(prepared, ctx, budgets)


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu: base.GpuContext, max_model_len: int | None) -> base.Capacity:
    if prepared.dsv4:
        return _dsv4_capacity(prepared, ctx, budgets, opts, max_model_len)
    n = _token_pool(prepared, budgets)
    extra: dict[str, Any] = {}
    refusal = None
    if prepared.hybrid_swa:
        full_tokens, swa_tokens = hybrid_pool_tokens(prepared, budgets)
        n = full_tokens or swa_tokens
        extra = {"full_max_total_num_tokens": full_tokens, "swa_max_total_num_tokens": swa_tokens}
        windows = [c.span for st in prepared.stages for _, c in st if pooled(c) and rule_of(c).pool == "swa"]
        # 0.5.23 MemoryPoolConfigurator.validate_swa_pool_size: an SWA pool at or below window + page never admits
        floor = max(windows) + prepared.page if windows else 0
        if prepared.selected.rules.swa_ratio_cell and full_tokens and windows and floor >= swa_tokens:
            refusal = (f"SWA pool ({swa_tokens} tokens) cannot hold even one request: the prefill admission floor "
                           f"is sliding_window_size ({max(windows)}) + page_size ({prepared.page}) "
                           "(SGLang refuses to start)")
    context_len = int(opts.get("context_length") or prepared.context_len or max_model_len or ctx)
    est = min(max(int(n / context_len * 512), 2048), 4096) if context_len else 2048
    user = opts.get("max_running_requests")
    cap = min(int(user), est) if user else min(est, n // 2)  # _resolve_max_num_reqs
    if prepared.mamba_per_req:  # _resolve_max_num_reqs: at most max_mamba_cache_size // state slots a request
        k = min(prepared.mamba_split(b)[0] for b in budgets)
        cap = min(cap, k // prepared.mamba_ratio)
        extra = {"max_mamba_cache_size": k, "mamba_cache_per_req": prepared.mamba_per_req,
                 "mamba_slots_per_request": prepared.mamba_ratio}
        if k <= 0 or cap <= 0:
            refusal = (f"Not enough GPU memory for the hybrid state cache (max_mamba_cache_size {k}, "
                           f"{prepared.mamba_ratio} slots a running request; SGLang refuses to start)")
    start = n > 0 and refusal is None
    message = refusal if n > 0 else ("Not enough memory. Please try to increase --mem-fraction-static. "
                                         "(SGLang refuses to start)")
    held = ctx + prepared.encoder_tokens
    return base.Capacity(max_batch(prepared, ctx, budgets), n, round(n / held, 2) if ctx else None, cap, start, message,
                         None, {"max_total_num_tokens": n, **extra, "page_size": prepared.page,
                                "context_len": context_len})


def _dsv4_capacity(prepared: Prepared, ctx: int, budgets: list[int], opts: dict[str, Any],
                   max_model_len: int | None) -> base.Capacity:
    """DeepSeek-V4 (0.5.23): max_total_num_tokens is the full pool (MemoryPoolConfig.max_total_num_tokens);
    max_running_requests = min(--max-running-requests or 256, full // 2) (resolve_max_num_reqs)."""
    s = dsv4_pools(prepared, budgets)
    message = dsv4.swa_floor_message(s, prepared.dsv4_window)
    context_len = int(opts.get("context_length") or max_model_len or ctx)
    details = {"max_total_num_tokens": s.full, **s.to_json(), "max_running_requests": s.max_running_requests,
               "page_size": prepared.page, "context_len": context_len,
               "bytes_per_full_token": [st.bytes_per_full_token() for st in prepared.dsv4],
               "c128_state_fixed_bytes": [st.c128_state_fixed_bytes(prepared.dsv4_requests) for st in prepared.dsv4]}
    return base.Capacity(_dsv4_batch(prepared, ctx, budgets), s.full, round(s.full / ctx, 2) if ctx else None,
                         s.max_running_requests, message is None, message, None, details)
