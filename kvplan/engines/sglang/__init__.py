"""SGLang token pools (engines.md §2): per layer K [(N + page), H_kv, D_k] and V [(N + page), H_kv, D_v]
(MLA: one [(N + page), 1, kv_lora_rank + rope] buffer), N = tokens in the pool rounded to the page size.

Only the architectures configs/model_config.py is_hybrid_swa_model lists get a separate sliding-window pool
(0.5.10: Llama-4, GPT-OSS, MiMo-V2-Flash, Step-3.5; 0.5.23 adds Gemma 4 and Step-3.7); Gemma-2/3 sliding layers
get full-length cache. A Mamba hybrid's state pool (MambaPool: max_mamba_cache_size slots of a request's conv window
kernel-1 in bf16 and SSM state in fp32) takes r / (1 + r) of the budget before the token pool is sized, and a
running request takes 1, 3 or 5 of its slots (Rules.mamba_pool; tests/oracle_sglang_mamba.py runs SGLang's own code).

rules.py holds the version rows, pools.py the pool of each cache kind, models.py the per-class tables, dsv4.py
DeepSeek-V4's pools, budget.py the budget and capacity; `prepare` below is the order SGLang decides things in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvplan import dtypes
from kvplan.engines import base, layout
from kvplan.engines.base import KVDtypes
from kvplan.engines.sglang import dsv4, models
from kvplan.engines.sglang.budget import (budget, calibrated_budget, capacity, dsv4_pools, fits,  # noqa: F401
                                              hybrid_pool_tokens, max_batch, mem_fraction)
from kvplan.engines.sglang.pools import KIND_RULES, config_ssm_dtype, rule_of
from kvplan.engines.sglang.prepared import Prepared
from kvplan.engines.sglang.rules import (DSA_PAGE, DSA_ROCM_PAGE, ENGINE, KNOBS, KV_DTYPES,  # noqa: F401
                                             MAMBA_FULL_MEMORY_RATIO, MAMBA_RUNNING_RATIO, VERSIONS, Rules,
                                             default_kv_dtype, default_mem_fraction, is_amd, select_version)
from kvplan.engines.versions import Selected
from kvplan.errors import InputError
from kvplan.spec import (ChunkedLocal, CrossAttention, ModelSpec, RecurrentState, SharedKV, SlidingLatent,
                         SlidingWindow, SparseLatentAttention)


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            gpu: base.GpuContext | None = None) -> Prepared:
    models.refuse(spec, selected)
    own_layers = {i for i, c in spec.caches if not isinstance(c, SharedKV)}
    shared_in_pool = spec.architecture in models.SHARED_LAYERS_IN_POOL
    shared = len(spec.caches) - len(own_layers) if shared_in_pool else 0
    if shared_in_pool:
        spec = models.gemma3n_pool(spec, pp)
    layout.check_rules(ENGINE.name, KIND_RULES, spec.caches)
    base.check_tp_heads(spec, tp)
    kinds = {type(c) for _, c in spec.caches}
    sparse = SparseLatentAttention in kinds
    arch = base.gpu_arch(gpu.name) if gpu is not None else "hopper"
    stages = layout.stages(spec, pp)
    if SlidingLatent in kinds:
        return _prepare_dsv4(spec, stages, tp, pp, kvd, selected, opts, gpu)
    stages, hybrid_swa, notes = _sliding_pools(spec, stages)
    page, page_notes = _page(spec, selected, opts, gpu, arch, sparse, hybrid_swa)
    notes = [*page_notes[:1], *notes, *page_notes[1:]]
    if selected.note:
        notes.append(selected.note)
    if shared:
        first = next(i for i, c in spec.caches if i not in own_layers)
        kv_params = sum(w.params for w in spec.weights if w.layer == 0 and w.name.startswith(
            ("self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm")))
        notes.append(f"Gemma-3n's {shared} KV-shared layers (from layer {first}) write no K/V but keep their buffers "
                     "in the token pool (SGLang sizes it for every layer); SGLang also builds their k/v projections "
                     f"(qkv_proj on every layer): {shared * kv_params:,} parameters more than the weights shown")
    plain_fp8 = sparse and selected.rules.dsa_blackwell_plain_fp8 and arch == "blackwell"
    if sparse:
        where = arch if gpu is not None else "Hopper (size assumes a Hopper GPU)"
        notes.append(f"DeepSeek sparse attention on {where}: an fp8 latent is "
                     + ("stored plain (576 B; the trtllm DSA backends)" if plain_fp8 else
                        "a 656 B record (fp8 latent + fp32 scales + bf16 RoPE)")
                     + "; indexer keys fp8 + fp32 scales (132 B) per layer, in the cell size")
        if kvd.source == "engine default" and arch == "blackwell":
            notes.append("SGLang's auto KV dtype for DSA models is fp8_e4m3 on SM >= 10 (arg_groups/overrides.py "
                         "_dsa_kv_cache_dtype_default); this plan uses the model dtype: --kv-dtype fp8 plans SGLang's default")
    if kinds & {SlidingWindow, ChunkedLocal}:
        notes.append("sliding/chunked layers hold min(ctx, window) tokens (SGLang hybrid-SWA pool)" if hybrid_swa
                     else "SGLang gives this model's sliding-window layers full-length cache (not a hybrid-SWA model)")
    # conv state in SGLANG_MAMBA_CONV_DTYPE (bfloat16 by default, whatever the model dtype), SSM state float32 or
    # the config's mamba_ssm_dtype (configs/mamba_utils.py mamba2_state_dtype; environ.py)
    ssm, ssm_from = config_ssm_dtype(spec)
    state = (kvd.state or dtypes.KV_DTYPES["bf16"], kvd.state or ssm)
    if any(issubclass(k, RecurrentState) for k in kinds):
        notes.append(f"Mamba state per request: conv kernel-1 in {state[0].name}, SSM in {state[1].name}"
                     + (f" ({ssm_from})" if ssm_from and not kvd.state else ""))
    stages, encoder_tokens, context_len = _encoder_rows(spec, stages, tp, pp, notes)
    cap = opts.get("max_total_tokens")
    prepared = Prepared(selected, spec, stages, kvd, page, tp, pp, hybrid_swa, state, tuple(notes),
                        int(cap) if cap else None, plain_fp8, encoder_tokens, context_len)
    if any(issubclass(k, RecurrentState) for k in kinds):
        prepared = _mamba_pool(prepared, spec, opts)
    elif opts.get("mamba_full_memory_ratio") or opts.get("max_mamba_cache_size") or opts.get("disable_radix_cache"):
        prepared = replace(prepared, assumptions=prepared.assumptions + (
            "--mamba-full-memory-ratio / --max-mamba-cache-size / --disable-radix-cache change nothing here: this "
            "model keeps no Mamba state (the radix cache does not change a token pool's size)",))
    return prepared


def _sliding_pools(spec: ModelSpec, stages: tuple[layout.Caches, ...]):
    """(stages, whether sliding layers get their own pool, notes): the 0.5.23 layer-type pools of Gemma 4 /
    Step-3.7, else is_hybrid_swa_model's classes (GPT-OSS with window - 1)."""
    notes: list[str] = []
    hybrid_swa = spec.architecture in models.HYBRID_SWA_ARCHITECTURES
    by_layer_type = models.LAYER_TYPE_POOLS.get(spec.architecture)
    if by_layer_type is not None:  # older rule sets refuse these classes (models.READ_SINCE)
        stages, notes = models.hybrid_swa_0_5_23(spec, stages, by_layer_type)
        hybrid_swa = True
    if hybrid_swa and spec.architecture in models.WINDOW_MINUS_ONE:
        windows = {c.window for _, c in spec.caches if type(c) is SlidingWindow}
        stages = tuple(tuple((i, replace(c, window=c.window - 1) if type(c) is SlidingWindow else c) for i, c in st)
                       for st in stages)
        notes.append("SGLang's GPT-OSS window is sliding_window - 1 = "
                     f"{', '.join(str(w - 1) for w in sorted(windows))} (models/gpt_oss.py "
                     "get_attention_sliding_window_size)")
    return stages, hybrid_swa, notes


def _page(spec: ModelSpec, selected: Selected[Rules], opts: dict[str, Any], gpu: base.GpuContext | None, arch: str,
          sparse: bool, hybrid_swa: bool) -> tuple[int, list[str]]:
    """The page size (DSA's 64, or 1 on ROCm; Gemma 4's trtllm_mha pages on SM100; else --page-size or 1) and its
    notes: the first says which, the rest follow the model's pool notes."""
    given = int(opts.get("page_size") or 0)
    page = DSA_PAGE if sparse else given or 1
    why = " (DSA models run with 64)" if sparse else "" if given else " (SGLang default)"
    if sparse and is_amd(gpu):
        if selected.rules.dsa_rocm_page_by_stack:
            raise layout.UnsupportedKind(
                f"{selected.label} cannot size DeepSeek sparse attention on an AMD GPU: its page is 1 only where "
                "aiter's preshuffle paged-MQA kernel is unavailable, else the pooled-index page "
                "(arg_groups/model_overrides/deepseek_v2.py), which depends on the ROCm stack; sglang@0.5 sizes the "
                "0.5.10-era rule (page 1 on ROCm)")
        page, why = DSA_ROCM_PAGE, " (DSA on ROCm runs with 1: server_args.py)"
    sm100_pages = spec.architecture in models.TRTLLM_MHA_ON_SM100
    if sm100_pages and arch == "blackwell" and page not in models.TRTLLM_MHA_PAGES:
        page, why = 64, " (Gemma 4 on SM100 runs trtllm_mha, which needs 16/32/64/128-token pages: SGLang picks 64)"
    notes = [f"page size {page} token(s){why}; each pool allocates one extra page of padding rows"]
    if sm100_pages and gpu is None and not given and hybrid_swa:
        notes.append("Gemma 4 on SM100 (B200/B300) runs trtllm_mha with 64-token pages; this plan assumes another GPU "
                     "(triton, page 1): --gpu plans a given one")
    return page, notes


def _encoder_rows(spec: ModelSpec, stages, tp: int, pp: int, notes: list[str]):
    """(stages, encoder rows a request keeps in the token pool, SGLang's context_len where it is not the model's):
    Whisper's pool over its encoder layers too, Llama-3.2-Vision's vision tokens beside the text."""
    if spec.architecture in models.WHISPER:
        stages, encoder_tokens, note = models.whisper_pool(spec, tp, pp)
        notes.append(note)
        return stages, encoder_tokens, models.WHISPER_CONTEXT_LEN
    if spec.architecture in models.ENCODER_IN_POOL:
        encoder_tokens = max((c.encoder_len for _, c in spec.caches if isinstance(c, CrossAttention)), default=0)
        notes.append(f"SGLang keeps a request's {encoder_tokens:,} vision tokens in the token pool beside its text "
                     "(models/mllama.py pad_input_ids, schedule_batch.py prepare_encoder_info_extend): every layer, "
                     f"self- and cross-attention, holds ctx + {encoder_tokens:,} rows per request, and the padded "
                     "prompt counts against --context-length")
        return stages, encoder_tokens, None
    return stages, 0, None


def _mamba_pool(p: Prepared, spec: ModelSpec, opts: dict[str, Any]) -> Prepared:
    """A Mamba hybrid's state pool: mamba_cache_per_req (conv + SSM of every state layer in 0.5.10, of the largest
    pipeline stage in 0.5.23: _handle_max_mamba_cache's pp_layer_scale), the slots a running request takes
    (_calculate_mamba_ratio) and the share of the budget it gets (--mamba-full-memory-ratio)."""
    rules = p.selected.rules
    new = rules.mamba_padding_slot_charged
    per_stage = [sum(rule_of(c).group(c, [i], 1, 1, p).bytes for i, c in p.stages[s] if isinstance(c, RecurrentState))
                 for s in range(len(p.stages))]  # (a kind the rule set predates is refused here, by name)
    if not p.selected.rules.mamba_pool:
        raise layout.UnsupportedKind(f"{p.selected.label}: kvplan read how SGLang sizes its Mamba state pool in "
                                     "0.5.10-0.5.23 only (handle_max_mamba_cache); --engine sglang@0.5 or later "
                                     "plans this hybrid")
    per_req = max(per_stage) if new else sum(per_stage)
    radix_off = bool(opts.get("disable_radix_cache"))
    if radix_off or spec.architecture in rules.mamba_radix_off:
        ratio, why = 1, "radix cache off" + ("" if radix_off else " for this model")
    elif spec.architecture in rules.mamba_extra_buffer:
        ratio, why = MAMBA_RUNNING_RATIO + 2, "radix cache, mamba_radix_cache_strategy 'auto' -> extra_buffer: 2 tracking slots"
    else:
        ratio, why = MAMBA_RUNNING_RATIO, "radix cache, no extra buffer"
    r = float(opts.get("mamba_full_memory_ratio") or MAMBA_FULL_MEMORY_RATIO)
    given = opts.get("max_mamba_cache_size")
    if given is None and radix_off and opts.get("max_running_requests"):
        given = opts["max_running_requests"]  # handle_max_mamba_cache: the radix cache off, one slot a running request
    note = (f"Mamba state pool (MambaPool): {per_req:,} B a slot ({'the largest stage' if new else 'every state layer'}); "
            + (f"{int(given)} slots (--max-mamba-cache-size, or --max-running-requests with the radix cache off)"
               if given else
               f"r / (1 + r) of the KV budget, r = mamba_full_memory_ratio {r}")
            + (", plus the pool's padding slot" if new else "") + f"; the token pool gets the rest; {ratio} slot(s) a "
            f"running request ({why}), so max_running_requests <= max_mamba_cache_size // {ratio}")
    return replace(p, assumptions=p.assumptions + (note,), mamba_per_req=per_req, mamba_ratio=ratio,
                   mamba_memory_ratio=r, max_mamba_cache_size=int(given) if given else None)


def _prepare_dsv4(spec: ModelSpec, stages: tuple[layout.Caches, ...], tp: int, pp: int, kvd: KVDtypes,
                  selected: Selected[Rules], opts: dict[str, Any], gpu: base.GpuContext | None) -> Prepared:
    """DeepSeek-V4 on SGLang 0.5.23's DSV4PoolConfigurator / DeepSeekV4TokenToKVPool (dsv4.py)."""
    if is_amd(gpu):
        raise layout.UnsupportedKind("sglang cannot size this deepseek-v4 model on an AMD GPU: not modelled (kvplan "
                                     "read SGLang 0.5.23's NVIDIA flashmla pools; ROCm has the unified_kv_triton pool "
                                     "and aiter layouts)")
    if kvd.k.name != "fp8_e4m3" or kvd.v.name != "fp8_e4m3":
        raise InputError(f"SGLang 0.5.23 stores DeepSeek-V4's cache as fp8_e4m3 only, not {kvd.label}: its flashmla "
                         "pools hold uint8 V4 records (DeepSeekV4SingleKVPool.create_buffer asserts a uint8 store; "
                         "bfloat16 is the NPU pool's)")
    given = int(opts.get("page_size") or 0)
    if given and given != dsv4.PAGE:
        raise InputError(f"--page-size {given} does not apply to DeepSeek-V4 on SGLang 0.5.23: "
                         "model_overrides/deepseek_v4.py sets page_size 256 (_build_dsv4_kv_pool asserts it)")
    for st in stages:
        dsv4.check_geometry(st)
    per_stage = tuple(dsv4.stage_of(st) for st in stages)
    window = next(c.window for _, c in spec.caches if type(c) is SlidingLatent)
    requested = int(opts.get("max_running_requests") or dsv4.MAX_RUNNING_REQUESTS)
    st = per_stage[0]
    notes = [
        "SGLang 0.5.23 DeepSeek-V4 (DSV4PoolConfigurator, DeepSeekV4TokenToKVPool; NVIDIA flashmla, V4 layout, every "
        "SGLANG_DSV4_* switch at its default): page size 256; V4 records of 584 B (448 fp8 + 8 B of scales + 64 bf16 "
        "RoPE) in pages padded to 576 B (585 B per SWA or c4 slot, 864 B per c128 slot); c4 indexer keys fp8 + "
        "scale (132 B) sized c128 x 32; fp32 compress states: c4 rings of 8 rows per SWA page, c128 rings of 128 "
        "rows per request slot; each pool allocates one 256-token page of padding",
        f"pools from the budget: full = (budget - c128 state rings for {requested} requests) / bytes_per_full_token "
        f"({st.bytes_per_full_token()} = 0.1 x {st.bytes_per_swa_token()} per SWA slot + the c4 / c128 latents and "
        "indexer), floored to the page; swa = full x 0.1 (swa_full_tokens_ratio, model_overrides/deepseek_v4.py); "
        "c4 = full / 4, c128 = full / 128",
        f"a request holds ctx tokens of the full pool and min(ctx, {window}) of the SWA pool, each rounded to the "
        "256-token page (the steady state: SWA eviction lag and prefill chunks are the scheduler's)",
    ]
    if kvd.source == "engine default":
        notes.append("KV dtype fp8_e4m3: SGLang's auto for DeepSeek-V4 (arg_groups/overrides.py "
                     "_deepseek_v4_kv_cache_dtype)")
    if spec.rope_tables:
        notes.append("SGLang's DeepSeek-V4 rotary tables (complex64 freqs_cis per RoPE base, models/deepseek_v4.py, "
                     "and get_rope caches) are not laid out: the estimated budget subtracts kvplan's one table; "
                     "--kv-budget plans a measured budget exactly")
    if selected.note:
        notes.append(selected.note)
    cap = opts.get("max_total_tokens")
    return Prepared(selected, spec, stages, kvd, dsv4.PAGE, tp, pp, False, (kvd.k, kvd.k), tuple(notes),
                    int(cap) if cap else None, dsv4=per_stage, dsv4_window=window, dsv4_requests=requested)

