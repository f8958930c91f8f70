"""What the command line must know of every engine without importing it: names, aliases, a summary, and the
knobs (flags) each accepts.

The engine modules carry the layout and budget rules and cost a few milliseconds each to import; a run imports
only the engine it uses (engines.REGISTRY loads them on first use), while `--engine` help, alias resolution and
every knob flag come from this table. Each engine module builds its ENGINE from its row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KNOB_KINDS = ("count", "tokens", "fraction", "ratio", "bool", "dtype")


@dataclass(frozen=True)
class Knob:
    """An engine flag that changes the layout or budget: CLI --name, YAML name with '_'.

    kind: how a value is written (count: a positive integer; tokens: 8192, 8k; fraction: 0.9 or 90%; ratio: a
    positive number such as 0.9 or 1.5; bool;
    dtype: auto or a dtype name).
    layout: True when it changes the cache layout (size, verify and fit take it), False for budget-only knobs
    (fit and check only).

    The command line's option is generated from the row (kvplan/cli/options.py), so a new knob is this row alone:
    cli_help: its --help line, the owning engine named first; aliases: further spellings (the engine's own short
    flag); negatable: a bool that also has --no-NAME; plan: `kvplan plan` takes it (the knobs of the engines it
    replays that its replay reads); plan_help / plan_aliases: plan's own help line and extra spellings where they
    differ (plan has no --ctx, so -c is free there)."""

    name: str
    kind: str
    help: str
    layout: bool = True
    cli_help: str = ""
    aliases: tuple[str, ...] = ()
    negatable: bool = False
    plan: bool = False
    plan_help: str = ""
    plan_aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.kind in KNOB_KINDS, self.kind

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, value: Any) -> Any:
        """A value as written on the command line (or already typed) -> the engine's option; one line if wrong."""
        from kvplan.units import parse_count, parse_fraction, parse_ratio, parse_tokens

        if value is None or self.kind == "bool":
            return value
        if self.kind == "dtype":
            from kvplan.dtypes import kv_dtype

            text = str(value).strip()
            return "auto" if text.lower() == "auto" else kv_dtype(text).name
        parser = {"count": parse_count, "tokens": parse_tokens, "fraction": parse_fraction, "ratio": parse_ratio}[self.kind]
        return parser(value, self.flag)


def knob_table(*knobs: Knob) -> dict[str, Knob]:
    return {k.name: k for k in knobs}


@dataclass(frozen=True)
class Listing:
    """What the CLI needs of an engine without importing its module: names, help line, knob flags."""
    name: str
    module: str  # imported on first use
    aliases: tuple[str, ...]
    summary: str  # one line for --engine help
    knobs: dict[str, Knob]
    # what `kvplan plan` (and check's traffic keys) replay for this engine: the scheduler's name in messages, or ""
    # where no replay is modelled
    replays: str = ""
    replay_pool: str = ""  # how serving/ replays it: "blocks" (a scheduler over a block pool) or "slots" (server slots)
    calibrates: bool = False  # `explain --save-calibration` can measure its non-KV memory (calibrated_budget)


LISTINGS: dict[str, Listing] = {row.name: row for row in (
    Listing("vllm", "kvplan.engines.vllm", (), "vLLM V1 paged blocks (default)", knob_table(
        Knob("block_size", "count", "tokens per KV block (vLLM default 16; MLA backends may force 32/64/128)",
             cli_help="vllm: tokens per KV block", plan=True),
        Knob("max_num_batched_tokens", "tokens", "chunked-prefill token budget (sliding-window reservation)",
             cli_help="vllm: chunked-prefill budget (sliding-window reservation)", plan=True),
        Knob("async_scheduling", "bool", "async scheduling (on by default; from 0.32 windows reserve 2 batches in flight)",
             cli_help="vllm: async scheduling (on by default; from 0.32 windows reserve 2 batches in flight)",
             negatable=True, plan=True),
        Knob("use_v2_model_runner", "bool", "VLLM_USE_V2_MODEL_RUNNER: the V2 model runner (default: the version's choice for the model; every model from 0.29)",
             cli_help="vllm: VLLM_USE_V2_MODEL_RUNNER (default: the version's choice for the model; every model "
                      "from 0.29)", negatable=True, plan=True),
        Knob("disable_hybrid_kv_cache_manager", "bool", "size every layer for the full length",
             cli_help="vllm: size every layer for the full length"),
        Knob("enable_prefix_caching", "bool", "prefix caching (default on; for hybrids from 0.28); on hybrids it keeps 2-3 state pages per request",
             cli_help="vllm: prefix caching (default on; for hybrids from vLLM 0.28; hybrids keep 2-3 state pages per "
                      "request)", negatable=True, plan=True),
        Knob("mamba_ssm_cache_dtype", "dtype", "SSM/recurrent state dtype: auto (the conv state's; NemotronH fp32, Qwen3.5 its config's mamba_ssm_dtype), fp32, bf16, fp16",
             cli_help="vllm: SSM/recurrent state dtype: auto (the conv state's; NemotronH fp32, Qwen3.5 its config's), "
                      "fp32, bf16, fp16"),
        Knob("decode_context_parallel_size", "count", "decode context parallel: each request's KV tokens spread over this many of the TP ranks",
             cli_help="vllm: spread each request's KV tokens over this many TP ranks (DCP)"),
        Knob("gpu_memory_utilization", "fraction", "fraction of CUDA total memory vLLM may use (0.92 / 0.90 by version)", layout=False,
             cli_help="vllm: fraction of CUDA total (0.92 / 0.90 by version)", plan=True),
        Knob("max_num_seqs", "count", "running-request limit", layout=False,
             cli_help="vllm: running-request limit", plan=True),
        Knob("max_model_len", "tokens", "the engine's max_model_len for its start-up check (default: the model max)", layout=False,
             cli_help="vllm: the engine's max_model_len for its start-up check (default: the model max)", plan=True),
    ), replays="vLLM's scheduler", replay_pool="blocks", calibrates=True),
    Listing("sglang", "kvplan.engines.sglang", (), "SGLang token pools", knob_table(
        Knob("page_size", "count", "tokens per page (SGLang default 1; some attention backends force 64/128)",
             cli_help="sglang: tokens per page"),
        Knob("mem_fraction_static", "fraction", "fraction of free memory for weights + KV pool", layout=False,
             cli_help="sglang: fraction for weights + KV"),
        Knob("max_total_tokens", "tokens", "cap on the token pool", layout=False,
             cli_help="sglang: token pool cap"),
        Knob("max_running_requests", "count", "running-request limit", layout=False,
             cli_help="sglang: running-request limit"),
        Knob("context_length", "tokens", "the engine's context length (default: the model max)", layout=False,
             cli_help="sglang: the engine's context length (default: the model max)"),
        Knob("mamba_full_memory_ratio", "ratio", "hybrids: Mamba state pool / token pool memory (default 0.9)",
             layout=False, cli_help="sglang, hybrids: Mamba state pool / token pool memory (0.9)"),
        Knob("max_mamba_cache_size", "count", "hybrids: Mamba state slots (default: from the memory ratio)",
             layout=False, cli_help="sglang, hybrids: Mamba state slots (default: from the memory ratio)"),
        Knob("disable_radix_cache", "bool", "hybrids: one Mamba state slot a running request, and with "
                                            "--max-running-requests that many slots", layout=False,
             cli_help="sglang, hybrids: one Mamba slot a request; with --max-running-requests that many slots"),
    ), calibrates=True),
    Listing("llamacpp", "kvplan.engines.llamacpp", ("llama.cpp", "llama-cpp", "llama_cpp"), "llama.cpp KV cells",
            knob_table(
        Knob("ubatch", "count", "-ub: physical batch (SWA cells = window + ubatch; default 512)",
             cli_help="llamacpp: physical batch -ub (default 512)", plan=True),
        Knob("kv_unified", "bool", "--kv-unified: one cell stream shared by all slots",
             cli_help="llamacpp: one cell stream for all slots", negatable=True, plan=True),
        Knob("swa_full", "bool", "--swa-full: sliding-window layers get full-size cache",
             cli_help="llamacpp: full-size cache for sliding-window layers", plan=True),
        Knob("flash_attn", "bool", "-fa (older builds pad n_ctx to 256 with it, 32 without)",
             cli_help="llamacpp: flash attention (older builds pad n_ctx by it)", negatable=True, plan=True),
        Knob("parallel", "count", "-np: llama-server slots, the requests decoded at once (fit: caps the batch; plan "
                                  "default: the most slots of the longest request the budget holds)", layout=False,
             cli_help="llamacpp: llama-server slots -np (fit: caps the batch)", aliases=("-np",), plan=True,
             plan_help="llamacpp: llama-server slots -np (default: the most slots of the longest request the KV budget "
                       "holds)"),
        Knob("ctx_size", "tokens", "-c: llama-server's context of all slots together (plan only; default slots x the "
                                   "longest request)", layout=False,
             cli_help="llamacpp: llama-server -c, all slots together (plan only)", plan=True, plan_aliases=("-c",),
             plan_help="llamacpp: llama-server -c, the context of all slots together (default: slots x the longest "
                       "request)"),
    ), replays="llama-server's slots", replay_pool="slots"),
    Listing("trtllm", "kvplan.engines.trtllm", ("tensorrt-llm", "tensorrt_llm", "trt-llm"), "TensorRT-LLM block pools",
            knob_table(
        Knob("tokens_per_block", "count", "tokens per KV block (LLM API default 32; trtllm-build 64)",
             cli_help="trtllm: tokens per KV block"),
        Knob("free_gpu_memory_fraction", "fraction", "fraction of free memory for the KV cache (0.9)", layout=False,
             cli_help="trtllm: fraction of free memory for KV (0.9)"),
        Knob("max_tokens", "tokens", "KvCacheConfig.max_tokens cap", layout=False,
             cli_help="trtllm: KvCacheConfig.max_tokens"),
        Knob("max_batch_size", "count", "running-request limit", layout=False,
             cli_help="trtllm: running-request limit"),
    )),
    Listing("hf", "kvplan.engines.hf", ("transformers", "huggingface"), "transformers DynamicCache", {}),
)}


def replaying() -> tuple[str, ...]:
    """The engines `kvplan plan` replays, in listing order."""
    return tuple(name for name, row in LISTINGS.items() if row.replays)
