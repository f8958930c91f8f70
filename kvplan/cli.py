"""The `kvplan` command line: thin typer commands that parse, call the library and render.

Every library error becomes ONE line on stderr and an exit code here (CONTRACTS.md): 0 success, 1 a check
that ran and failed, 2 bad input or environment.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Annotated, Any, Optional

import typer

try:  # typer >= 0.26 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on real click
    from click import exceptions as click_exc

from kvplan import catalog, engines
from kvplan.errors import EnvironmentProblem, InputError, KvplanError
from kvplan.units import parse_count, parse_tokens

class GroupedCommand(typer.core.TyperCommand):
    """Plain (never cut) click help, with the options grouped under their panel names: Options, Workload, Engine and
    layout, the engine knobs, Budget, Output, Model."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        args, groups = [], {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append(record)
            else:
                groups.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        order = ["Options", "Workload (plan)", "Engine and layout", _KNOBS_PANEL, "Budget", "Output", "Model"]
        for name in sorted(groups, key=lambda g: order.index(g) if g in order else len(order)):
            with formatter.section(name):
                formatter.write_dl(groups[name])


app = typer.Typer(
    name="kvplan",
    help="Exact KV-cache and weight memory for LLM inference, and what fits on a GPU.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 success, 1 a check that ran and failed, 2 bad input or environment, 3 internal error, "
           "130 interrupted.",
)


def _version_line() -> str:
    """kvplan's version and what a bug report needs beside it (torch only when installed; never imported here)."""
    from importlib import metadata
    import platform

    from kvplan import __version__

    parts = [f"kvplan {__version__}", f"Python {platform.python_version()}"]
    for dist in ("typer", "rich", "huggingface_hub", "torch", "transformers"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            if dist in ("typer", "rich", "huggingface_hub"):
                parts.append(f"{dist} (not installed)")
    return ", ".join(parts)


def complete_model(incomplete: str) -> list[str]:
    """Shell completion for MODEL: the bundled aliases and Hub ids (no network)."""
    try:
        names = [n for m in catalog.bundled_models() for n in (*m.aliases, m.repo_id)]
    except Exception:  # noqa: BLE001 - completion never fails loudly
        return []
    return sorted(n for n in names if n.lower().startswith(incomplete.lower()))


def complete_gpu(incomplete: str) -> list[str]:
    """Shell completion for --gpu: catalog names and aliases (sizes and NxGPU are typed)."""
    from kvplan import gpus

    try:
        names = [n for g in gpus.load_catalog() for n in (g.name, *g.aliases) if " " not in n]
    except Exception:  # noqa: BLE001
        return []
    return sorted({n for n in names if n.lower().startswith(incomplete.lower())})


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(_version_line() + "\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="print the versions of kvplan and what it runs on, then exit",
                                          callback=_show_version, is_eager=True)] = False,
) -> None:
    """Exact KV-cache and weight memory for LLM inference, and what fits on a GPU."""

# ---------------------------------------------------------------------------------------------- shared options
_ENGINE_HELP = ", ".join(f"{n} (default)" if n == engines.DEFAULT_ENGINE else n for n in engines.names())
Engine = Annotated[Optional[str], typer.Option("--engine", "-e", metavar="ENGINE", help=f"{_ENGINE_HELP}; optionally name@version", rich_help_panel="Engine and layout")]
KvDtype = Annotated[Optional[str], typer.Option("--kv-dtype", "--kv-cache-dtype", metavar="DTYPE", help="auto (default), fp16, bf16, fp32, fp8 (fp8_e4m3), fp8_e5m2, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl", rich_help_panel="Engine and layout")]
KDtype = Annotated[Optional[str], typer.Option("--k-dtype", metavar="DTYPE", help="K cache dtype (overrides --kv-dtype for K)", rich_help_panel="Engine and layout")]
VDtype = Annotated[Optional[str], typer.Option("--v-dtype", metavar="DTYPE", help="V cache dtype (overrides --kv-dtype for V)", rich_help_panel="Engine and layout")]
StateDtype = Annotated[Optional[str], typer.Option("--state-dtype", metavar="DTYPE", help="Mamba/linear-attention state dtype (engine default otherwise)", rich_help_panel="Engine and layout")]
WeightDtype = Annotated[Optional[str], typer.Option("--weight-dtype", metavar="DTYPE", help="fp32, fp16, bf16, fp8, int8, int4 (default: the checkpoint's)", rich_help_panel="Engine and layout")]
Tp = Annotated[str, typer.Option("--tp", "--tensor-parallel-size", metavar="N", help="tensor-parallel GPUs", rich_help_panel="Engine and layout")]
Pp = Annotated[str, typer.Option("--pp", "--pipeline-parallel-size", metavar="N", help="pipeline-parallel stages", rich_help_panel="Engine and layout")]
EncoderLen = Annotated[Optional[str], typer.Option("--encoder-len", metavar="TOKENS", help="encoder positions for cross attention (T5 default n_positions, Whisper 1500)", rich_help_panel="Model")]
Mmproj = Annotated[Optional[str], typer.Option("--mmproj", metavar="GGUF", help="GGUF vision projector (llama.cpp --mmproj): a .gguf path or org/name:file.gguf; its bytes join the weights", rich_help_panel="Model")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object (CONTRACTS.md keys) instead of tables", rich_help_panel="Output")]
Revision = Annotated[Optional[str], typer.Option("--revision", metavar="REV", help="Hub revision (branch, tag or commit)", rich_help_panel="Model")]
Offline = Annotated[bool, typer.Option("--offline", help="never touch the network: bundled catalog and HF cache only", rich_help_panel="Model")]
Refresh = Annotated[bool, typer.Option("--refresh", help="ask the Hub even for bundled or cached models", rich_help_panel="Model")]
Hub = Annotated[bool, typer.Option("--hub", help="resolve a bundled Hub id on the Hub instead of the bundled file", rich_help_panel="Model")]
Token = Annotated[Optional[str], typer.Option("--token", metavar="TOKEN", help="Hugging Face token (default: HF_TOKEN or the stored login)", rich_help_panel="Model")]
Timeout = Annotated[Optional[float], typer.Option("--timeout", metavar="SECONDS", help="seconds to wait for the Hub per lookup (default 10, env KVPLAN_HUB_TIMEOUT)", rich_help_panel="Model")]
Calibrations = Annotated[Optional[str], typer.Option("--calibrations", metavar="FILE", help="calibration file (default $KVPLAN_CALIBRATIONS or ~/.config/kvplan/calibrations.yaml): non-KV memory measured by engine logs, saved by kvplan explain --save-calibration", rich_help_panel="Budget")]
NoCalibration = Annotated[bool, typer.Option("--no-calibration", help="ignore saved calibrations: the budget model's estimate", rich_help_panel="Budget")]
# engine knobs (each engine accepts only its own; engines/*.py KNOBS declare them, a test keeps these flags equal
# to that table both ways). Values are read as text and parsed by the knob's kind (Knob.parse), so every command
# gives the same one-line error for a bad value.
_KNOBS_PANEL = "Engine knobs (each applies to the engine named first in its help)"


_KIND_METAVAR = {"count": "N", "tokens": "TOKENS", "fraction": "FRACTION", "ratio": "RATIO", "bool": None,
                 "dtype": "DTYPE"}


def _knob(flags: str, help: str, short: tuple[str, ...] = ()):
    """short: the engine's own short spellings (llama-server's -np, -c) where the command has no other use for them."""
    name = flags.split("/")[0].removeprefix("--").replace("-", "_")
    metavar = _KIND_METAVAR[engines.all_knobs()[name].kind]
    return typer.Option(*flags.split(), *short, help=help, metavar=metavar, rich_help_panel=_KNOBS_PANEL)


BlockSize = Annotated[Optional[str], _knob("--block-size", "vllm: tokens per KV block")]
MaxBatchedTokens = Annotated[Optional[str], _knob("--max-num-batched-tokens", "vllm: chunked-prefill budget (sliding-window reservation)")]
AsyncSched = Annotated[Optional[bool], _knob("--async-scheduling/--no-async-scheduling", "vllm: async scheduling (on by default; from 0.32 windows reserve 2 batches in flight)")]
V2Runner = Annotated[Optional[bool], _knob("--use-v2-model-runner/--no-use-v2-model-runner", "vllm: VLLM_USE_V2_MODEL_RUNNER (default: the version's choice for the model; every model from 0.29)")]
DisableHybrid = Annotated[Optional[bool], _knob("--disable-hybrid-kv-cache-manager", "vllm: size every layer for the full length")]
PrefixCaching = Annotated[Optional[bool], _knob("--enable-prefix-caching/--no-enable-prefix-caching", "vllm: prefix caching (default on; for hybrids from vLLM 0.28; hybrids keep 2-3 state pages per request)")]
MambaSsmDtype = Annotated[Optional[str], _knob("--mamba-ssm-cache-dtype", "vllm: SSM/recurrent state dtype: auto (the conv state's; NemotronH fp32, Qwen3.5 its config's), fp32, bf16, fp16")]
DecodeCP = Annotated[Optional[str], _knob("--decode-context-parallel-size", "vllm: spread each request's KV tokens over this many TP ranks (DCP)")]
PageSize = Annotated[Optional[str], _knob("--page-size", "sglang: tokens per page")]
Ubatch = Annotated[Optional[str], _knob("--ubatch", "llamacpp: physical batch -ub (default 512)")]
KvUnified = Annotated[Optional[bool], _knob("--kv-unified/--no-kv-unified", "llamacpp: one cell stream for all slots")]
SwaFull = Annotated[Optional[bool], _knob("--swa-full", "llamacpp: full-size cache for sliding-window layers")]
FlashAttn = Annotated[Optional[bool], _knob("--flash-attn/--no-flash-attn", "llamacpp: flash attention (older builds pad n_ctx by it)")]
Parallel = Annotated[Optional[str], _knob("--parallel", "llamacpp: llama-server slots -np (fit: caps the batch)", ("-np",))]
CtxSize = Annotated[Optional[str], _knob("--ctx-size", "llamacpp: llama-server -c, all slots together (plan only)")]
# plan has no --ctx, so there -c is llama-server's own -c
PlanCtxSize = Annotated[Optional[str], _knob("--ctx-size", "llamacpp: llama-server -c, the context of all slots together (default: slots x the longest request)", ("-c",))]
PlanParallel = Annotated[Optional[str], _knob("--parallel", "llamacpp: llama-server slots -np (default: the most slots of the longest request the KV budget holds)", ("-np",))]
TokensPerBlock = Annotated[Optional[str], _knob("--tokens-per-block", "trtllm: tokens per KV block")]
# budget-only knobs (fit and check)
GpuMemUtil = Annotated[Optional[str], _knob("--gpu-memory-utilization", "vllm: fraction of CUDA total (0.92 / 0.90 by version)")]
MaxNumSeqs = Annotated[Optional[str], _knob("--max-num-seqs", "vllm: running-request limit")]
MaxModelLen = Annotated[Optional[str], _knob("--max-model-len", "vllm: the engine's max_model_len for its start-up check (default: the model max)")]
MemFractionStatic = Annotated[Optional[str], _knob("--mem-fraction-static", "sglang: fraction for weights + KV")]
MaxTotalTokens = Annotated[Optional[str], _knob("--max-total-tokens", "sglang: token pool cap")]
MaxRunningRequests = Annotated[Optional[str], _knob("--max-running-requests", "sglang: running-request limit")]
ContextLength = Annotated[Optional[str], _knob("--context-length", "sglang: the engine's context length (default: the model max)")]
MambaFullMemRatio = Annotated[Optional[str], _knob("--mamba-full-memory-ratio", "sglang, hybrids: Mamba state pool / token pool memory (0.9)")]
MaxMambaCacheSize = Annotated[Optional[str], _knob("--max-mamba-cache-size", "sglang, hybrids: Mamba state slots (default: from the memory ratio)")]
DisableRadixCache = Annotated[Optional[bool], _knob("--disable-radix-cache", "sglang, hybrids: one Mamba slot a request; with --max-running-requests that many slots")]
FreeGpuMemFraction = Annotated[Optional[str], _knob("--free-gpu-memory-fraction", "trtllm: fraction of free memory for KV (0.9)")]
MaxTokens = Annotated[Optional[str], _knob("--max-tokens", "trtllm: KvCacheConfig.max_tokens")]
MaxBatchSize = Annotated[Optional[str], _knob("--max-batch-size", "trtllm: running-request limit")]


def _parse_knobs(**given: Any) -> dict[str, Any]:
    """Engine knob flags -> engine options, each parsed by its declared kind; None = the engine's default."""
    from kvplan import engines

    table = engines.all_knobs()
    return {name: table[name].parse(value) for name, value in given.items()}


def _options(model: str, *, revision, offline, refresh, hub, token, timeout, encoder_len, mmproj=None):
    from kvplan.sizing import ModelOptions

    if timeout is not None or os.environ.get("KVPLAN_HUB_TIMEOUT"):  # checked now, not first when the Hub is asked
        from kvplan import hub as hub_mod

        hub_mod.resolve_timeout(timeout)
    return ModelOptions(model, revision, offline or None, refresh, hub, token, timeout,
                        parse_tokens(encoder_len, "--encoder-len") if encoder_len else None, mmproj)


def _engine_options(*, engine, kv_dtype, k_dtype, v_dtype, state_dtype, weight_dtype, tp, pp, knobs):
    from kvplan import dtypes
    from kvplan.sizing import EngineOptions

    for flag, name in (("--kv-dtype", kv_dtype), ("--k-dtype", k_dtype), ("--v-dtype", v_dtype)):
        if name is not None and dtypes.canonical(name) != "auto":  # a name no engine knows: bad input for every model
            try:
                dtypes.kv_dtype(name)
            except KvplanError as e:
                raise type(e)(f"{flag}: {e}") from None
    return EngineOptions(engine, kv_dtype, k_dtype, v_dtype, state_dtype, weight_dtype,
                         parse_count(tp, "--tp"), parse_count(pp, "--pp"), knobs)


def _layout_knobs(block_size, max_num_batched_tokens, async_scheduling, disable_hybrid_kv_cache_manager,
                  enable_prefix_caching, mamba_ssm_cache_dtype, page_size, ubatch, kv_unified, swa_full, flash_attn,
                  tokens_per_block, decode_context_parallel_size=None, use_v2_model_runner=None) -> dict[str, Any]:
    """The engine knobs that change the cache layout (size, fit and verify share them); None = engine default."""
    return _parse_knobs(block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
                        async_scheduling=async_scheduling, disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
                        enable_prefix_caching=enable_prefix_caching, mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
                        page_size=page_size, ubatch=ubatch, kv_unified=kv_unified, swa_full=swa_full,
                        flash_attn=flash_attn, tokens_per_block=tokens_per_block,
                        decode_context_parallel_size=decode_context_parallel_size,
                        use_v2_model_runner=use_v2_model_runner)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------- size
@app.command(cls=GroupedCommand, short_help="KV cache, weights and their sum, exactly.",
             help="KV cache per token and for batch x ctx, weights and the total, exactly.\n\n"
              "Examples: kvplan size llama-3.1-8b --ctx 32k --batch 8;  kvplan size deepseek-v3 --tp 8 --kv-dtype fp8 --json")
def size(
    model: Annotated[str, typer.Argument(metavar="MODEL", autocompletion=complete_model, help="alias (kvplan models), Hub id org/name, a path to config.json or a .gguf, or org/name:file.gguf")],
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", metavar="TOKENS", help="tokens per sequence: 4096, 32k, 1M (default: the model maximum)")] = None,
    batch: Annotated[str, typer.Option("--batch", "-b", metavar="N", help="concurrent sequences")] = "1",
    engine: Engine = None, kv_dtype: KvDtype = None, k_dtype: KDtype = None, v_dtype: VDtype = None,
    state_dtype: StateDtype = None, weight_dtype: WeightDtype = None, tp: Tp = "1", pp: Pp = "1",
    encoder_len: EncoderLen = None, mmproj: Mmproj = None,
    block_size: BlockSize = None, max_num_batched_tokens: MaxBatchedTokens = None, async_scheduling: AsyncSched = None,
    use_v2_model_runner: V2Runner = None,
    disable_hybrid_kv_cache_manager: DisableHybrid = None, enable_prefix_caching: PrefixCaching = None,
    mamba_ssm_cache_dtype: MambaSsmDtype = None, decode_context_parallel_size: DecodeCP = None,
    page_size: PageSize = None, ubatch: Ubatch = None,
    kv_unified: KvUnified = None, swa_full: SwaFull = None, flash_attn: FlashAttn = None,
    tokens_per_block: TokensPerBlock = None,
    json_out: Json = False, revision: Revision = None, offline: Offline = False, refresh: Refresh = False,
    hub: Hub = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan import sizing

    knobs = _layout_knobs(block_size, max_num_batched_tokens, async_scheduling, disable_hybrid_kv_cache_manager,
                          enable_prefix_caching, mamba_ssm_cache_dtype, page_size, ubatch, kv_unified, swa_full, flash_attn, tokens_per_block,
                          decode_context_parallel_size, use_v2_model_runner)
    mo = _options(model, revision=revision, offline=offline, refresh=refresh, hub=hub, token=token, timeout=timeout,
                  encoder_len=encoder_len, mmproj=mmproj)
    eo = _engine_options(engine=engine, kv_dtype=kv_dtype, k_dtype=k_dtype, v_dtype=v_dtype, state_dtype=state_dtype,
                         weight_dtype=weight_dtype, tp=tp, pp=pp, knobs=knobs)
    result = sizing.size(mo, eo, parse_tokens(ctx, "--ctx") if ctx is not None else None, parse_count(batch, "--batch"))
    if json_out:
        _print_json(result.to_json())
    else:
        from kvplan import render

        render.console().print(render.size_view(result))


# ---------------------------------------------------------------------------------------------- fit
@app.command(cls=GroupedCommand, short_help="What fits on a GPU: batch x context limits.",
             help="What fits on a GPU: max batch at a context, max context at a batch, the frontier; or the whole catalog.\n\n"
              "Examples: kvplan fit llama-3.1-8b --gpu L4 --ctx 8k;  kvplan fit --gpu 24GB;  kvplan fit qwen3-32b --gpu 2xH100 --kv-budget 60GiB")
def fit(
    gpu: Annotated[str, typer.Option("--gpu", "-g", metavar="GPU", autocompletion=complete_gpu, help="catalog name (kvplan gpus), a size such as 24GB, or NxGPU such as 8xH100")],
    model_arg: Annotated[Optional[str], typer.Argument(metavar="[MODEL]", autocompletion=complete_model, help="one model, as --model (either form)", show_default=False)] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", autocompletion=complete_model, help="one model (alias, Hub id or path); default: the whole bundled catalog")] = None,
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", metavar="TOKENS", help="tokens per request for max batch (default 4096 for the catalog, 4096 or the model max for one model)")] = None,
    batch: Annotated[str, typer.Option("--batch", "-b", metavar="N", help="requests for max ctx")] = "1",
    engine: Engine = None, kv_dtype: KvDtype = None, k_dtype: KDtype = None, v_dtype: VDtype = None,
    state_dtype: StateDtype = None, weight_dtype: WeightDtype = None,
    tp: Annotated[Optional[str], typer.Option("--tp", "--tensor-parallel-size", metavar="N", help="tensor-parallel GPUs (default: all GPUs of NxGPU)", rich_help_panel="Engine and layout")] = None,
    pp: Annotated[Optional[str], typer.Option("--pp", "--pipeline-parallel-size", metavar="N", help="pipeline-parallel stages", rich_help_panel="Engine and layout")] = None,
    mmproj: Mmproj = None, encoder_len: EncoderLen = None,
    kv_budget: Annotated[Optional[str], typer.Option("--kv-budget", metavar="SIZE", help="KV memory per GPU the engine reported (skips the budget model), e.g. 5.01GiB", rich_help_panel="Budget")] = None,
    reserve: Annotated[Optional[str], typer.Option("--reserve", metavar="SIZE", help="non-KV, non-weight memory per GPU (replaces the estimate), e.g. 1.5GiB", rich_help_panel="Budget")] = None,
    headroom: Annotated[Optional[str], typer.Option("--headroom", metavar="FRACTION", help="share of the KV budget held back before solving, e.g. 10%", rich_help_panel="Budget")] = None,
    calibrations: Calibrations = None, no_calibration: NoCalibration = False,
    gpu_memory_utilization: GpuMemUtil = None, max_num_seqs: MaxNumSeqs = None, max_model_len: MaxModelLen = None,
    mem_fraction_static: MemFractionStatic = None, max_total_tokens: MaxTotalTokens = None,
    max_running_requests: MaxRunningRequests = None, context_length: ContextLength = None,
    mamba_full_memory_ratio: MambaFullMemRatio = None, max_mamba_cache_size: MaxMambaCacheSize = None,
    disable_radix_cache: DisableRadixCache = None,
    free_gpu_memory_fraction: FreeGpuMemFraction = None, max_tokens: MaxTokens = None,
    max_batch_size: MaxBatchSize = None,
    block_size: BlockSize = None, max_num_batched_tokens: MaxBatchedTokens = None, async_scheduling: AsyncSched = None,
    use_v2_model_runner: V2Runner = None,
    disable_hybrid_kv_cache_manager: DisableHybrid = None, enable_prefix_caching: PrefixCaching = None,
    mamba_ssm_cache_dtype: MambaSsmDtype = None, decode_context_parallel_size: DecodeCP = None,
    page_size: PageSize = None, ubatch: Ubatch = None,
    kv_unified: KvUnified = None, swa_full: SwaFull = None, flash_attn: FlashAttn = None,
    parallel: Parallel = None, ctx_size: CtxSize = None,
    tokens_per_block: TokensPerBlock = None,
    json_out: Json = False, revision: Revision = None, offline: Offline = False, refresh: Refresh = False,
    hub: Hub = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan import gpus as gpu_catalog, planner
    from kvplan.units import parse_bytes, parse_headroom

    if model_arg is not None:
        if model is not None and model != model_arg:
            raise InputError(f"fit: the model is given twice ({model_arg!r} and --model {model!r}); give one")
        model = model_arg

    selection = gpu_catalog.resolve_gpu(gpu)
    knobs = dict(
        **_layout_knobs(block_size, max_num_batched_tokens, async_scheduling, disable_hybrid_kv_cache_manager,
                        enable_prefix_caching, mamba_ssm_cache_dtype, page_size, ubatch, kv_unified, swa_full, flash_attn, tokens_per_block,
                          decode_context_parallel_size, use_v2_model_runner),
        **_parse_knobs(gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
                       max_model_len=max_model_len, mem_fraction_static=mem_fraction_static,
                       max_total_tokens=max_total_tokens, max_running_requests=max_running_requests,
                       context_length=context_length, free_gpu_memory_fraction=free_gpu_memory_fraction,
                       max_tokens=max_tokens, max_batch_size=max_batch_size, parallel=parallel, ctx_size=ctx_size,
                       mamba_full_memory_ratio=mamba_full_memory_ratio, max_mamba_cache_size=max_mamba_cache_size,
                       disable_radix_cache=disable_radix_cache),
    )
    if encoder_len and not model:
        raise InputError("--encoder-len sizes one model's cross attention; give the model (MODEL or --model), the "
                         "catalog holds models without it")
    mo = _options(model or "", revision=revision, offline=offline, refresh=refresh, hub=hub, token=token, timeout=timeout,
                  encoder_len=encoder_len, mmproj=mmproj)
    eo = _engine_options(engine=engine, kv_dtype=kv_dtype, k_dtype=k_dtype, v_dtype=v_dtype, state_dtype=state_dtype,
                         weight_dtype=weight_dtype, tp="1", pp="1", knobs=knobs)
    report = planner.fit(
        [model] if model else None, eo, selection, parse_tokens(ctx, "--ctx") if ctx else None, parse_count(batch, "--batch"),
        mo_template=mo, kv_budget=parse_kv_budget(kv_budget) if kv_budget else None,
        reserve=_parse_reserve(reserve), tp=parse_count(tp, "--tp") if tp else None, pp=parse_count(pp, "--pp") if pp else None,
        headroom=parse_headroom(headroom, "--headroom") if headroom else 0.0,
        calibrations=_calibrations(calibrations, no_calibration),
    )
    if json_out:
        _print_json(report.to_json())
        return
    from kvplan import render

    view = render.fit_one_view(report) if model else render.fit_catalog_view(report)
    render.console().print(view)


def parse_kv_budget(text: str) -> int:
    """--kv-budget: a size; a bare number is bytes, and one too small for a KV block is taken as a missing unit."""
    from kvplan.units import parse_bytes

    value = parse_bytes(text, "--kv-budget")
    if value < (1 << 20) and str(text).strip().replace(",", "").isdigit():
        raise InputError(f"--kv-budget {text}: {value:,} bytes cannot hold a KV block; give a unit, e.g. {text}GiB "
                         "(a bare number is bytes)")
    return value


def _parse_reserve(text: str | None) -> int | None:
    if text is None:
        return None
    from kvplan.units import parse_bytes

    if text.strip() in ("0", "0B", "0GiB", "0GB"):
        return 0
    return parse_bytes(text, "--reserve")


# ---------------------------------------------------------------------------------------------- plan
@app.command(cls=GroupedCommand, short_help="A traffic mix: requests at once, speed, GPUs.",
             help="Capacity for a traffic mix: requests running at once under the engine's scheduler (vLLM's, or "
                  "llama-server's slots with --engine llamacpp), a decode-speed bound, and GPUs for N users at a time "
                  "per output token.\n\n"
                  "Example: kvplan plan llama-3.1-8b --gpu H100 --prompt 500-3000 --output 100-800 --users 2000 --tpot 30ms")
def plan(
    model: Annotated[str, typer.Argument(metavar="MODEL", autocompletion=complete_model, help="alias (kvplan models), Hub id org/name, or a path to config.json")],
    gpu: Annotated[str, typer.Option("--gpu", "-g", metavar="GPU", autocompletion=complete_gpu, help="catalog name (kvplan gpus), a size such as 24GB, or NxGPU such as 8xH100")],
    prompt: Annotated[Optional[str], typer.Option("--prompt", metavar="TOKENS", help="prompt length: 1000, or a range 500-3000 (uniform)", rich_help_panel="Workload (plan)")] = None,
    output: Annotated[Optional[str], typer.Option("--output", metavar="TOKENS", help="output length: 300, or a range 100-800 (uniform)", rich_help_panel="Workload (plan)")] = None,
    requests_file: Annotated[Optional[str], typer.Option("--requests-file", metavar="FILE", help="real request lengths: CSV with a header or JSONL (prompt_tokens/input_tokens, output_tokens/completion_tokens; OpenAI usage objects)", rich_help_panel="Workload (plan)")] = None,
    requests: Annotated[Optional[str], typer.Option("--requests", "-n", metavar="N", help="requests drawn from the ranges (default 1,000)", rich_help_panel="Workload (plan)")] = None,
    shared_prefix: Annotated[Optional[str], typer.Option("--shared-prefix", metavar="TOKENS", help="leading prompt tokens every request shares (a system prompt), cached once with prefix caching", rich_help_panel="Workload (plan)")] = None,
    users: Annotated[Optional[str], typer.Option("--users", "-u", metavar="N", help="concurrent users to serve (closed loop); sizes the fleet", rich_help_panel="Workload (plan)")] = None,
    tpot: Annotated[Optional[str], typer.Option("--tpot", metavar="TIME", help="target time per output token: 30ms, 0.05s (needs --users)", rich_help_panel="Workload (plan)")] = None,
    ttft: Annotated[Optional[str], typer.Option("--ttft", metavar="TIME", help="target time to first token: 500ms, 2s (needs --users; checked against the longest prompt's prefill bound)", rich_help_panel="Workload (plan)")] = None,
    interconnect: Annotated[Optional[str], typer.Option("--interconnect", metavar="GB/S", help="tensor parallelism: each GPU's link bandwidth in GB/s, one direction (e.g. 450 for NVLink 4); adds all-reduce time to the bounds", rich_help_panel="Workload (plan)")] = None,
    bandwidth: Annotated[Optional[str], typer.Option("--bandwidth", metavar="GB/S", help="memory bandwidth of one GPU in GB/s (default: the catalog's)", rich_help_panel="Workload (plan)")] = None,
    rate: Annotated[Optional[str], typer.Option("--rate", metavar="REQ/S", help="requests per second arriving (Poisson, fixed seed) instead of a closed loop of users; latencies and the instances that sustain it", rich_help_panel="Workload (plan)")] = None,
    burst: Annotated[bool, typer.Option("--burst", help="every request arrives at once (a benchmark run) instead of a closed loop", rich_help_panel="Workload (plan)")] = False,
    engine: Engine = None, kv_dtype: KvDtype = None, weight_dtype: WeightDtype = None,
    tp: Annotated[Optional[str], typer.Option("--tp", "--tensor-parallel-size", metavar="N", help="tensor-parallel GPUs (default: all GPUs of NxGPU)", rich_help_panel="Engine and layout")] = None,
    pp: Annotated[Optional[str], typer.Option("--pp", "--pipeline-parallel-size", metavar="N", help="pipeline-parallel stages", rich_help_panel="Engine and layout")] = None,
    kv_budget: Annotated[Optional[str], typer.Option("--kv-budget", metavar="SIZE", help="KV memory per GPU the engine reported (skips the budget model), e.g. 5.01GiB", rich_help_panel="Budget")] = None,
    reserve: Annotated[Optional[str], typer.Option("--reserve", metavar="SIZE", help="non-KV, non-weight memory per GPU (replaces the estimate), e.g. 1.5GiB", rich_help_panel="Budget")] = None,
    calibrations: Calibrations = None, no_calibration: NoCalibration = False,
    gpu_memory_utilization: GpuMemUtil = None, max_num_seqs: MaxNumSeqs = None, max_model_len: MaxModelLen = None,
    block_size: BlockSize = None, max_num_batched_tokens: MaxBatchedTokens = None,
    enable_prefix_caching: PrefixCaching = None, async_scheduling: AsyncSched = None,
    use_v2_model_runner: V2Runner = None, parallel: PlanParallel = None, ctx_size: PlanCtxSize = None, kv_unified: KvUnified = None,
    ubatch: Ubatch = None, swa_full: SwaFull = None, flash_attn: FlashAttn = None,
    json_out: Json = False, revision: Revision = None, offline: Offline = False, refresh: Refresh = False,
    hub: Hub = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan import gpus as gpu_catalog, serving, workload as wl
    from kvplan.units import parse_bandwidth, parse_bytes, parse_rate, parse_seconds

    selection = gpu_catalog.resolve_gpu(gpu)
    knobs = _parse_knobs(gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
                         max_model_len=max_model_len, block_size=block_size,
                         max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=enable_prefix_caching,
                         async_scheduling=async_scheduling, use_v2_model_runner=use_v2_model_runner,
                         parallel=parallel, ctx_size=ctx_size,
                         kv_unified=kv_unified, ubatch=ubatch, swa_full=swa_full, flash_attn=flash_attn)
    prefix = parse_tokens(shared_prefix, "--shared-prefix") if shared_prefix else 0
    count = parse_count(requests, "--requests") if requests else None
    if requests_file:
        if prompt or output:
            raise InputError("--requests-file gives the lengths; leave out --prompt and --output")
        work = wl.from_file(requests_file, prefix, count)
    else:
        if not prompt or not output:
            raise InputError("plan needs the request lengths: --prompt TOKENS and --output TOKENS (each a number or "
                             "a range such as 500-3000), or --requests-file FILE")
        work = wl.sampled(count or 1000, wl.parse_lengths(prompt, "--prompt"), wl.parse_lengths(output, "--output"), prefix)
    mo = _options(model, revision=revision, offline=offline, refresh=refresh, hub=hub, token=token, timeout=timeout,
                  encoder_len=None)
    eo = _engine_options(engine=engine, kv_dtype=kv_dtype, k_dtype=None, v_dtype=None, state_dtype=None,
                         weight_dtype=weight_dtype, tp="1", pp="1", knobs=knobs)
    from kvplan.progress import waiting

    from kvplan.engines import split_engine

    through = "llama-server's slots" if split_engine(engine or "vllm")[0] == "llamacpp" else "vLLM's scheduler"
    with waiting(f"replaying {len(work.requests):,} requests through {through}"):
        report = serving.plan(
            mo, eo, selection, work, users=parse_count(users, "--users") if users else None,
            tpot=parse_seconds(tpot, "--tpot") if tpot else None, ttft=parse_seconds(ttft, "--ttft") if ttft else None,
            rate=parse_rate(rate, "--rate") if rate else None,
            bandwidth=parse_bandwidth(bandwidth, "--bandwidth") if bandwidth else None,
            interconnect=parse_bandwidth(interconnect, "--interconnect") if interconnect else None,
            kv_budget=parse_kv_budget(kv_budget) if kv_budget else None, reserve=_parse_reserve(reserve),
            tp=parse_count(tp, "--tp") if tp else None, pp=parse_count(pp, "--pp") if pp else None, burst=burst,
            calibrations=_calibrations(calibrations, no_calibration),
        )
    if json_out:
        _print_json(report.to_json())
        return
    from kvplan import render

    render.console().print(render.plan_view(report))


# ---------------------------------------------------------------------------------------------- explain
@app.command(cls=GroupedCommand, short_help="Reproduce the KV figures of an engine's log.",
             help="Read an engine's start-up log (vLLM, SGLang, llama.cpp, TensorRT-LLM) and reproduce every "
                  "KV-related number it printed, or say why not. Exit 1 when an exact figure differs.\n\n"
                  "Examples: kvplan explain vllm.log;  docker logs vllm 2>&1 | kvplan explain - --gpu H100;  "
                  "kvplan explain server.log --model ./model.gguf")
def explain(
    log: Annotated[str, typer.Argument(metavar="LOG", help="a log file, or - for stdin")],
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", autocompletion=complete_model, help="the model, where the log names none kvplan can load (alias, Hub id, config.json or .gguf)")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", metavar="GPU", autocompletion=complete_gpu, help="the GPU, where the log names none (needed for kvplan's budget estimate)")] = None,
    engine: Engine = None, kv_dtype: KvDtype = None,
    tp: Annotated[Optional[str], typer.Option("--tp", "--tensor-parallel-size", metavar="N", help="tensor-parallel GPUs, where the log does not say", rich_help_panel="Engine and layout")] = None,
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", metavar="TOKENS", help="the context the engine sized for, where the log prints none (llama.cpp -c)")] = None,
    save_calibration: Annotated[bool, typer.Option("--save-calibration", help="save what this vLLM or SGLang log measured besides the cache (per GPU) to the calibration file, for later fit / check / plan runs on that GPU, engine version and model shape", rich_help_panel="Budget")] = False,
    calibrations: Calibrations = None,
    json_out: Json = False, offline: Offline = False, timeout: Timeout = None,
) -> None:
    from kvplan import explain as ex

    text = _read_log(log)
    o = ex.Overrides(model=model, gpu=gpu, engine=engine, kv_dtype=kv_dtype,
                     ctx=parse_tokens(ctx, "--ctx") if ctx else None, tp=parse_count(tp, "--tp") if tp else None,
                     offline=offline or None, timeout=timeout)
    result = ex.explain(text, o)
    if save_calibration:
        ex.save_calibration(result, text, "stdin" if log == "-" else os.path.basename(log), calibrations)
    if json_out:
        _print_json({"schema": 1, **result.to_json()})
    else:
        from kvplan import render

        render.console().print(render.explain_view(result))
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _calibrations(path: str | None, off: bool) -> tuple:
    """The saved calibrations a fit uses: none with --no-calibration; a named file must exist."""
    from kvplan import calibration

    if off:
        if path:
            raise InputError("--calibrations and --no-calibration contradict each other; give one")
        return ()
    return calibration.load(path, must_exist=bool(path))


def _read_log(path: str) -> str:
    from kvplan.explain import MAX_LOG_BYTES

    if path == "-":
        data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
        where = "stdin"
    else:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_LOG_BYTES + 1)
        except OSError as e:
            raise InputError(f"cannot read {path}: {e.strerror or e}; give a log file or - for stdin") from None
        where = path
    if len(data) > MAX_LOG_BYTES:
        raise InputError(f"{where}: more than {MAX_LOG_BYTES >> 20} MiB; give the engine's start-up part of the log")
    return data.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------- check
@app.command(cls=GroupedCommand, short_help="CI capacity checks from YAML (exit 0/1/2).",
             help="CI capacity checks: deployments in YAML must fit (exit 0 all pass, 1 any fails, 2 a file is invalid).\n\n"
              "Examples: kvplan check kvplan.yaml;  kvplan check a.yaml b.yaml --format junit --output kvplan.xml")
def check(
    files: Annotated[list[str], typer.Argument(metavar="FILE...", help="kvplan.yaml files (defaults + deployments; README: CI capacity checks)")],
    fmt: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="table (default), json, junit, github (::error annotations)", rich_help_panel="Output")] = "table",
    output: Annotated[Optional[str], typer.Option("--output", "-o", metavar="FILE", help="write the --format report to FILE (the console still gets the table)", rich_help_panel="Output")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", metavar="NAME", help="check only the deployment NAME (repeatable)", rich_help_panel="Output")] = None,
    offline: Offline = False,
    timeout: Timeout = None,
    calibrations: Calibrations = None, no_calibration: NoCalibration = False,
    json_out: Annotated[bool, typer.Option("--json", help="the same as --format json", rich_help_panel="Output")] = False,
) -> None:
    from kvplan import check as checks, render
    from kvplan.errors import InputError

    if timeout is not None or os.environ.get("KVPLAN_HUB_TIMEOUT"):  # checked now, as every command does
        from kvplan import hub as hub_mod

        hub_mod.resolve_timeout(timeout)

    fmt = "json" if json_out else fmt.strip().lower()
    if fmt not in checks.FORMATS:
        raise InputError(f"--format {fmt!r} is not known; accepted: {', '.join(checks.FORMATS)}")
    from kvplan.progress import waiting

    with waiting("checking deployments"):
        report = checks.run(files, only=only, offline=offline, timeout=timeout,
                            calibrations=_calibrations(calibrations, no_calibration))
    if fmt == "json":
        text = json.dumps(report.to_json(), indent=2) + "\n"
    elif fmt == "junit":
        text = render.check_junit(report)
    elif fmt == "github":
        text = render.check_github(report)
    else:
        text = None
    if output:
        try:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(text if text is not None else render.plain_text(render.check_view(report)))
        except OSError as e:
            raise InputError(f"--output {output}: cannot write: {e.strerror or e}") from None
    if text is None or output:
        render.print_check(report)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    for problem in report.problems:  # every problem as FILE:LINE:COLUMN: message, then the one summary line
        sys.stderr.write(f"{problem}\n")
    if report.exit_code:
        raise checks.outcome_error(report)


# ---------------------------------------------------------------------------------------------- models, gpus
@app.command(cls=GroupedCommand, short_help="List or search the models (bundled, Hub).",
             help="List the bundled catalog (every alias and its Hub id), or search it (--search, --hub for the Hub).\n\n"
              "Examples: kvplan models;  kvplan models --search qwen3;  kvplan models --search gemma --hub")
def models(
    search: Annotated[Optional[str], typer.Option("--search", "-s", metavar="TEXT", help="text to look for in aliases and Hub ids")] = None,
    hub: Annotated[bool, typer.Option("--hub", help="with --search: search the Hub's model list instead", rich_help_panel="Model")] = False,
    limit: Annotated[int, typer.Option("--limit", metavar="N", help="most Hub results")] = 20,
    json_out: Json = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan import render

    if hub and not search:
        raise KvplanError("--hub needs --search TEXT (the Hub's model list is searched, not listed)")
    if search:
        from kvplan import hub as hub_mod

        hits = hub_mod.search_models(search, hub=hub, limit=limit, token=token, timeout=timeout)
        rows = [(", ".join(h.aliases), h.repo_id, h.source + (f", {h.downloads:,} downloads" if h.downloads else "")
                 + (", gated" if h.gated else "")) for h in hits]
    else:
        rows = []
        for m in catalog.bundled_models():
            for alias in m.aliases or ("",):
                rows.append((alias, m.repo_id, m.note or ""))
    if json_out:
        _print_json({"schema": 1, "models": [{"alias": a or None, "id": r, "note": n or None} for a, r, n in rows]})
    elif not rows:
        where = "on the Hub" if hub else "in the bundled catalog"
        sys.stdout.write(f"no model matches {search!r} {where}" + ("" if hub else "; --hub searches the Hub") + "\n")
    else:
        title = f"Hub search: {search!r}" if hub else None
        render.console().print(render.models_view(rows, title))


@app.command(cls=GroupedCommand, short_help="Cache Hub configs for --offline runs.",
             help="Cache configs and safetensors headers of Hub models so later runs (and CI) work --offline.\n\n"
              "Example: kvplan pull Qwen/Qwen3-8B meta-llama/Llama-3.1-8B --token $HF_TOKEN")
def pull(
    models: Annotated[list[str], typer.Argument(help="Hub ids (org/name) or aliases")],
    to: Annotated[Optional[str], typer.Option("--to", metavar="DIR", help="also write a catalog folder (model_configs layout) here")] = None,
    revision: Revision = None, token: Token = None, timeout: Timeout = None, json_out: Json = False,
) -> None:
    from kvplan import hub as hub_mod

    pulled = hub_mod.pull(models, to=to, revision=revision, token=token, timeout=timeout)
    if json_out:
        _print_json({"schema": 1, "pulled": [
            {"requested": p.requested, "id": p.repo_id, "revision": p.revision, "commit": p.commit,
             "config_path": p.config_path, "weights_path": p.weights_path, "weight_bytes": p.weight_bytes,
             "note": p.note} for p in pulled]})
        return
    for p in pulled:
        weights = f", safetensors {p.weight_bytes:,} B" if p.weight_bytes is not None else ""
        sys.stdout.write(f"{p.repo_id}@{p.revision} ({(p.commit or '')[:12]}): config{weights}"
                         + (f"  [{p.note}]" if p.note else "") + "\n")


@app.command(cls=GroupedCommand, short_help="List the GPU catalog, or this machine's GPUs.",
             help="List the GPU catalog (names, aliases, nvidia-smi and CUDA totals, bandwidth); --local: this machine's GPUs.\n\n"
              "Examples: kvplan gpus;  kvplan gpus --local --json")
def gpus(
    json_out: Json = False,
    local: Annotated[bool, typer.Option("--local", help="the local CUDA devices (name, NVML and CUDA totals) in the catalog's form, and the entry each matches (needs torch)")] = False,
) -> None:
    from kvplan import gpus as gpu_catalog, render

    if local:
        from kvplan.verify.local_gpu import local_devices

        devices = local_devices()
        if json_out:
            _print_json({"schema": 1, "devices": devices})
        else:
            render.console().print(render.local_gpus_view(devices))
        return
    rows = gpu_catalog.catalog_rows()
    if json_out:
        _print_json({"schema": 1, "gpus": rows})
    else:
        render.console().print(render.gpus_view(rows))


# ---------------------------------------------------------------------------------------------- verify
@app.command(cls=GroupedCommand, short_help="Check predictions on a live allocation.",
             help="Check predictions against a live torch allocation (CUDA, or CPU without a GPU): allocate the "
                  "CachePlan and measure it; --fit finds the real limit; --with-model runs transformers' model code. "
                  "Exit 1 when a check fails. Needs torch: pip install \"kvplan[verify]\".\n\n"
                  "Examples: kvplan verify llama-3.2-1b --ctx 4096 --batch 2;  kvplan verify gemma-2-9b --with-model;  "
                  "kvplan verify llama-3.2-1b --run vllm")
def verify(
    model: Annotated[str, typer.Argument(metavar="MODEL", autocompletion=complete_model, help="alias (kvplan models), Hub id org/name, or a path to config.json")],
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", metavar="TOKENS", help="tokens per sequence (default: the model maximum; with --fit: search the largest ctx at --batch)")] = None,
    batch: Annotated[str, typer.Option("--batch", "-b", metavar="N", help="concurrent sequences")] = "1",
    device: Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto (CUDA when torch sees one, else CPU), cpu, cuda, cuda:N; with --with-model also runs a real forward there")] = "auto",
    fit_check: Annotated[bool, typer.Option("--fit", help="find the largest batch at --ctx (or the largest ctx at --batch) that really allocates within the engine budget, beside the prediction")] = False,
    memory_limit: Annotated[Optional[str], typer.Option("--memory-limit", metavar="SIZE", help="memory for weights + KV (e.g. 16GiB); KV budget = limit - predicted weights. Required for --fit on CPU")] = None,
    with_model: Annotated[bool, typer.Option("--with-model", help="run transformers' model code for the config (meta device; a scaled real forward with --device) and compare its cache with the hf layout")] = False,
    rss: Annotated[bool, typer.Option("--rss/--no-rss", help="CPU: touch tensors of >= 1 MiB in a fresh process and check its RSS growth")] = True,
    run_engine: Annotated[Optional[str], typer.Option("--run", metavar="ENGINE", help="start the installed engine on this machine and compare what it sizes with kvplan (exit 1 on a difference): vllm (the model's config, dummy weights: KV tokens, blocks, concurrency; KVPLAN_VLLM_PYTHON picks the Python that has vLLM) or llamacpp (a local .gguf with -np --batch -c batch*ctx: every cache size line)")] = None,
    kv_budget: Annotated[Optional[str], typer.Option("--kv-budget", metavar="SIZE", help="with --run on CPU: the KV budget handed to vLLM's CPU build, whole GiB (default 1GiB)", rich_help_panel="Budget")] = None,
    engine: Engine = None, kv_dtype: KvDtype = None, k_dtype: KDtype = None, v_dtype: VDtype = None,
    state_dtype: StateDtype = None, weight_dtype: WeightDtype = None, tp: Tp = "1", pp: Pp = "1",
    encoder_len: EncoderLen = None,
    block_size: BlockSize = None, max_num_batched_tokens: MaxBatchedTokens = None, async_scheduling: AsyncSched = None,
    use_v2_model_runner: V2Runner = None,
    disable_hybrid_kv_cache_manager: DisableHybrid = None, enable_prefix_caching: PrefixCaching = None,
    mamba_ssm_cache_dtype: MambaSsmDtype = None, decode_context_parallel_size: DecodeCP = None,
    page_size: PageSize = None, ubatch: Ubatch = None,
    kv_unified: KvUnified = None, swa_full: SwaFull = None, flash_attn: FlashAttn = None,
    tokens_per_block: TokensPerBlock = None,
    json_out: Json = False, revision: Revision = None, offline: Offline = False, refresh: Refresh = False,
    hub: Hub = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan.errors import CheckFailed
    from kvplan.units import parse_bytes
    from kvplan.verify import core

    knobs = _layout_knobs(block_size, max_num_batched_tokens, async_scheduling, disable_hybrid_kv_cache_manager,
                          enable_prefix_caching, mamba_ssm_cache_dtype, page_size, ubatch, kv_unified, swa_full, flash_attn, tokens_per_block,
                          decode_context_parallel_size, use_v2_model_runner)
    mo = _options(model, revision=revision, offline=offline, refresh=refresh, hub=hub, token=token, timeout=timeout,
                  encoder_len=encoder_len)
    eo = _engine_options(engine=engine, kv_dtype=kv_dtype, k_dtype=k_dtype, v_dtype=v_dtype, state_dtype=state_dtype,
                         weight_dtype=weight_dtype, tp=tp, pp=pp, knobs=knobs)
    if run_engine is not None:
        _verify_run(run_engine, mo, eo, ctx, parse_count(batch, "--batch"), kv_budget, device, json_out)
        return
    if kv_budget is not None:
        raise KvplanError("--kv-budget applies to verify --run (the budget handed to vLLM's CPU build)")
    opts = core.VerifyOptions(device=device, fit=fit_check, with_model=with_model, rss=rss,
                              memory_limit=parse_bytes(memory_limit, "--memory-limit") if memory_limit else None)
    from kvplan.progress import waiting

    with waiting("allocating the predicted cache" + (" and bisecting the real limit" if fit_check else "")):
        result = core.run(mo, eo, parse_tokens(ctx, "--ctx") if ctx is not None else None, parse_count(batch, "--batch"),
                      opts)
    if json_out:
        _print_json(result.to_json())
    else:
        from kvplan import render

        render.console().print(render.verify_view(result))
    if not result.passed:
        raise CheckFailed(result.failure_line())


def _verify_run(engine_name: str, mo: Any, eo: Any, ctx: str | None, batch: int, kv_budget: str | None, device: str,
                json_out: bool) -> None:
    from kvplan.errors import CheckFailed
    from kvplan.units import parse_bytes
    from kvplan.verify import engine_run

    from kvplan.progress import waiting

    with waiting(f"starting {engine_name} on the model (importing an engine takes a while)"):
        result = engine_run.run(engine_name, mo, eo, parse_tokens(ctx, "--ctx") if ctx is not None else None,
                            parse_kv_budget(kv_budget) if kv_budget is not None else None, device, batch)
    if json_out:
        _print_json(result.to_json())
    else:
        from kvplan import render

        render.console().print(render.engine_run_view(result))
    if not result.passed:
        raise CheckFailed(result.failure_line())


# ---------------------------------------------------------------------------------------------- entry point
INTERNAL_ERROR_EXIT = 3  # CONTRACTS.md: not 1 (a check result) nor 2 (bad input)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; one line on stderr and the contract's exit code for every failure (CONTRACTS.md)."""
    command = _click_command(sys.argv[1:] if argv is None else argv)
    stdout = sys.stdout
    sys.stdout = _ClosedPipeGuard(stdout)  # type: ignore[assignment]
    try:
        code = command.main(args=argv, prog_name="kvplan", standalone_mode=False)
        sys.stdout.flush()
        if code == 130:  # typer turns Ctrl-C into Exit(130) and returns it when not standalone
            _fail("interrupted", 130)
        if isinstance(code, int) and code:
            sys.exit(code)
    except KvplanError as e:
        _fail(str(e), e.exit_code)
    except click_exc.NoArgsIsHelpError as e:
        sys.stdout.write(e.ctx.get_help() + "\n" if e.ctx is not None else "")
        sys.exit(0)
    except click_exc.UsageError as e:
        hint = f" (see `kvplan {e.ctx.info_name} --help`)" if e.ctx is not None and e.ctx.info_name != "kvplan" else " (see `kvplan --help`)"
        _fail(e.format_message().replace("\n", " ") + hint, 2)
    except (typer.Exit, getattr(click_exc, "Exit", typer.Exit)) as e:
        sys.exit(getattr(e, "exit_code", 0))
    except (KeyboardInterrupt, getattr(click_exc, "Abort", KeyboardInterrupt)):
        _fail("interrupted", 130)
    except BrokenPipeError:
        _quiet_closed_pipe()
    except SystemExit:
        raise
    except Exception as e:  # the last resort: one line, never a traceback unless asked for
        if os.environ.get("KVPLAN_DEBUG"):
            raise
        _fail(f"internal error: {type(e).__name__}: {' '.join(str(e).split())[:300]}; set KVPLAN_DEBUG=1 for the "
              "traceback", INTERNAL_ERROR_EXIT)
    finally:
        sys.stdout = stdout
    sys.exit(0)


def _click_command(args: list[str]) -> Any:
    """The click group for this run. typer turns every command's signature into click parameters (about 40 ms for
    the eight); a run that names its command first gets a group holding that command alone, so only its own
    parameters are built. Help, completion and errors see the same command either way."""
    if args and not args[0].startswith("-"):
        for info in app.registered_commands:
            if (info.name or typer.main.get_command_name(info.callback.__name__)) == args[0]:
                one = copy.copy(app)  # the same settings and callback; a list of its own
                one.registered_commands = [info]
                return typer.main.get_command(one)
    return typer.main.get_command(app)


class _ClosedPipeGuard:
    """stdout whose reader may go away (`kvplan ... | head`): a write or flush into a closed pipe ends the run
    quietly with 0 instead of a traceback (typer would turn it into exit 1)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _quiet_closed_pipe()
            return 0
        except OSError as e:
            raise _unwritable(e) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _quiet_closed_pipe()
        except OSError as e:
            raise _unwritable(e) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_to_devnull() -> None:
    """Point stdout's descriptor at /dev/null, so the interpreter's last flush of what is still buffered succeeds
    (else Python prints 'Exception ignored ...' and exits 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _quiet_closed_pipe() -> None:
    """The reader went away (`| head`, `| true`): stop quietly, and keep Python from complaining at exit."""
    _stdout_to_devnull()
    sys.exit(0)


def _unwritable(e: OSError) -> EnvironmentProblem:
    """stdout refuses the bytes (a full disk, /dev/full): one line and exit 2, and nothing more at exit."""
    _stdout_to_devnull()
    return EnvironmentProblem(f"cannot write the output: {e.strerror or e}")


def _fail(message: str, code: int) -> None:
    try:
        sys.stderr.write(f"kvplan: error: {message}\n")
        sys.stderr.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
