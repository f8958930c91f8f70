"""vLLM's decisions by version, GPU and flags that the layout depends on: the scheduling defaults (batched tokens,
async scheduling, the V2 model runner, tokens in flight), the state dtypes, mamba_cache_mode, the GDN checkpoint,
and the checks of decode context parallelism and float cache dtypes.

Each function returns values (and, where a default was chosen, the Note saying so); none writes to a list of
sentences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan import dtypes
from kvplan.dtypes import DType
from kvplan.engines import base
from kvplan.engines.base import KVDtypes, Note
from kvplan.engines.versions import Selected, version_key
from kvplan.engines.vllm import notes
from kvplan.engines.vllm.models import MAMBA1_CHUNK, SSM_DTYPE_FROM_CONFIG, SUPPORTS_MAMBA_PREFIX_CACHING
from kvplan.engines.vllm.rules import Rules, default_kv_dtype, default_max_num_batched_tokens
from kvplan.errors import ConfigError, InputError
from kvplan.spec import (FullAttention, IndexerKeys, KimiDeltaState, LatentAttention, LinearAttentionState,
                         ModelSpec, NoCache, RecurrentState, SparseLatentAttention)


@dataclass(frozen=True)
class Scheduling:
    """What the scheduler settings make of a request's reservation: batched tokens per step and batches in flight."""

    max_num_batched_tokens: int
    default_batched: str | None  # where the default came from, None when --max-num-batched-tokens gave it
    v2: bool
    async_on: bool
    batches: int  # max_num_batched_tokens reserved per window: 1, or pp (+ 1 with async) from Rules.in_flight_reserve
    pp: int
    extra: bool  # async scheduling adds a batch in flight

    @property
    def inflight(self) -> int:
        return self.max_num_batched_tokens * self.batches

    @property
    def inflight_why(self) -> str:
        if self.batches == 1:
            return "max_num_batched_tokens"
        return f"{self.batches} x max_num_batched_tokens: " + (
            "async scheduling" if self.pp == 1 else f"pp {self.pp}" + (" + 1, async scheduling" if self.extra else ""))


def scheduling(spec: ModelSpec, selected: Selected[Rules], opts: dict[str, Any], gpu: base.GpuContext | None,
               pp: int) -> Scheduling:
    rules = selected.rules
    mbt, where = opts.get("max_num_batched_tokens"), None
    if mbt is None:
        mbt = default_max_num_batched_tokens(gpu.gib if gpu is not None else None, (gpu.name or "") if gpu else "", rules)
        where = "size knows no GPU" if gpu is None else "vllm serve default for this GPU"
    v2 = v2_model_runner(spec, rules, opts.get("use_v2_model_runner"))
    # config/vllm.py max_concurrent_batches: with pp > 1 only the V2 model runner overlaps batches asynchronously
    overlaps = pp == 1 or v2
    async_on = opts.get("async_scheduling")
    if async_on is None:
        async_on = rules.async_scheduling and overlaps
    # config/vllm.py max_concurrent_batches: pp + 1 with async scheduling where it overlaps batches, else pp
    extra = bool(async_on and overlaps)
    batches = pp + extra if rules.in_flight_reserve else 1
    return Scheduling(int(mbt), where, v2, bool(async_on), batches, pp, extra)


def v2_model_runner(spec: ModelSpec, rules: Rules, flag: bool | None) -> bool:
    """Whether vLLM runs this model on the V2 model runner (VLLM_USE_V2_MODEL_RUNNER, else the row's default)."""
    if flag is not None:
        return bool(flag)
    if rules.v2_default == "all":
        return True
    if not rules.v2_default:
        return False
    listed = spec.architecture in rules.v2_default
    moe = spec.widths.experts_per_token > 0
    states = any(isinstance(c, RecurrentState) for _, c in spec.caches)
    attention = any(isinstance(c, (FullAttention, LatentAttention)) for _, c in spec.caches)
    if rules.v2_rule == "dense-unquantized":
        return listed and not moe and spec.quantization is None
    if rules.v2_rule == "listed":
        return listed
    if states and not attention:  # attention-free
        return False
    if states and not (rules.v2_rule == "listed-hybrid" and listed):  # hybrid
        return False
    return listed or not moe


@dataclass(frozen=True)
class StateDtypes:
    """The conv and SSM / recurrent state dtypes, and whether Kimi-K3's KDA prefill runs on FlashKDA here."""

    conv: DType
    ssm: DType
    flashkda: bool = False


def state_dtypes(spec: ModelSpec, kvd: KVDtypes, opts: dict[str, Any], selected: Selected[Rules],
                 arch: str) -> StateDtypes:
    model_dt = dtypes.KV_DTYPES[spec.dtype] if spec.dtype in ("fp16", "bf16", "fp32") else base.serving_dtype(spec)
    conv = kvd.state or (model_dt if model_dt.name != "fp32" else base.serving_dtype(spec))
    flag = opts.get("mamba_ssm_cache_dtype")
    ssm = _ssm_state_dtype(spec, conv, flag, version_key(selected.asked))
    kda = next((c for _, c in spec.caches if isinstance(c, KimiDeltaState)), None)
    if kda is None:
        return StateDtypes(conv, ssm)
    ssm = _kda_recurrent_dtype(kda, flag)
    flashkda = arch in ("hopper", "blackwell", "sm120") and model_dt.name == "bf16" and ssm.name in ("bf16", "fp32")
    return StateDtypes(conv, ssm, flashkda)


def _ssm_state_dtype(spec: ModelSpec, conv: DType, flag: str | None, version: tuple[int, ...]) -> DType:
    """mamba_ssm_cache_dtype (layers/mamba/mamba_utils.py MambaStateDtypeCalculator): auto = the conv state's dtype,
    unless the architecture takes it from its config in this version (SSM_DTYPE_FROM_CONFIG)."""
    if flag and flag.strip().lower() != "auto":
        return dtypes.kv_dtype(flag)
    rule = SSM_DTYPE_FROM_CONFIG.get(spec.architecture)
    if rule is not None and version >= rule.since:
        declared = rule.declared(spec, version)
        if declared and declared != "auto":
            if declared not in ("float32", "bfloat16", "float16"):
                raise ConfigError(f"config.{rule.field} must be float32, bfloat16, float16 or auto (vLLM reads it as "
                                  f"the SSM state dtype), found {declared[:40]!r}")
            return dtypes.kv_dtype(declared)
    return conv


def _kda_recurrent_dtype(c: KimiDeltaState, flag: str | None) -> DType:
    """MambaStateDtypeCalculator.kda_state_dtype: the recurrent matrix is fp32 for `auto`. Kimi-K3's layer passes
    --mamba-ssm-cache-dtype on (float32 or bfloat16; anything else is refused), Kimi-Linear's shared layer
    (kimi_gdn_linear_attn.py get_state_dtype) never passes it."""
    if not c.full_rank_gate or not flag or flag.strip().lower() == "auto":
        return dtypes.KV_DTYPES["fp32"]
    chosen = dtypes.kv_dtype(flag)
    if chosen.name not in ("fp32", "bf16"):
        raise InputError(f"--mamba-ssm-cache-dtype {flag}: vLLM's Kimi Delta Attention state accepts auto, float32 or "
                         "bfloat16 only ('KDA recurrent state supports only auto, float32, and bfloat16')")
    return chosen


def mamba_cache_mode(spec: ModelSpec, selected: Selected[Rules], opts: dict[str, Any],
                     hybrid_state: bool) -> tuple[str, Note | None]:
    """A hybrid's mamba_cache_mode (models/config.py MambaModelConfig): "none" without prefix caching (the flag, else
    the version's default for hybrids), else "all" for a model that SupportsMambaPrefixCaching where the version
    gives it that, else "align" where the version has it."""
    rules = selected.rules
    if not (hybrid_state and rules.mamba_align_mode):
        return "none", None
    flag = opts.get("enable_prefix_caching")
    if flag is None and not rules.hybrid_prefix_caching_default:
        return "none", notes.prefix_caching_off(selected.asked)
    if flag is False:
        return "none", None
    if rules.mamba_all_mode and spec.architecture in SUPPORTS_MAMBA_PREFIX_CACHING:
        return "all", notes.mamba_all_mode(selected.asked, spec.architecture, spec.mamba_chunk_size or MAMBA1_CHUNK,
                                           bool(spec.mamba_chunk_size))
    return "align", None


def gdn_prefill_on_flashinfer(spec: ModelSpec, arch: str) -> bool:
    """0.33 layers/mamba/gdn/qwen_gdn_linear_attn.py: the Gated DeltaNet prefill backend ("auto") is FlashInfer on
    CUDA SM90, and on SM10x / SM12x when linear_key_head_dim is 128 and the CUDA runtime is 13 or newer (the PyPI
    wheel's: it requires the cu13 builds); checkpoints are exported only when every state layer can (a Mamba layer
    of another kind keeps them off)."""
    states = [c for _, c in spec.caches if isinstance(c, RecurrentState)]
    if not states or not all(isinstance(c, LinearAttentionState) for c in states):
        return False
    return arch == "hopper" or (arch in ("blackwell", "sm120") and all(c.key_head_dim == 128 for c in states))


# the layer caches whose pages vLLM shards under DCP and kvplan models (exact types: windows, state and cross
# attention are not modelled)
DCP_SHARDED = (FullAttention, LatentAttention, SparseLatentAttention, IndexerKeys)


def check_dcp(spec: ModelSpec, tp: int, dcp: int) -> Note | None:
    """config/parallel.py and config/model.py: DCP reuses the TP ranks (tp % dcp == 0); for GQA/MQA it needs more TP
    ranks than KV heads and at most tp // kv_heads of them. Returns the assumption (None when DCP is off)."""
    if dcp == 1:
        return None
    if tp % dcp:
        raise InputError(f"--decode-context-parallel-size {dcp}: vLLM needs --tp divisible by it (tp {tp})")
    others = sorted({c.kind for _, c in spec.caches if not isinstance(c, NoCache) and type(c) not in DCP_SHARDED})
    if others:
        raise InputError(f"--decode-context-parallel-size with {', '.join(others)} layers is not modelled (kvplan "
                         "models DCP for full attention and MLA / DeepSeek sparse attention)")
    heads = {c.kv_heads for _, c in spec.caches if type(c) is FullAttention}
    if heads:
        kv = max(heads)
        if tp <= kv or dcp > tp // kv:
            raise InputError(f"--decode-context-parallel-size {dcp}: vLLM refuses it for GQA/MQA unless --tp exceeds the "
                             f"model's {kv} KV heads and DCP is at most tp // KV heads ({max(tp // kv, 1) if tp > kv else 'none'} here)")
    return notes.dcp(dcp)


def check_float_kv_dtype(spec: ModelSpec, kvd: KVDtypes, version: str) -> None:
    """0.33 _reject_mismatched_float_kv_cache: a float16 / bfloat16 cache dtype given explicitly must be the model's
    (the dtype `--dtype auto` loads); vLLM refuses to start otherwise."""
    model = default_kv_dtype(spec)
    if kvd.source != "flag" or model.name not in ("fp16", "bf16"):
        return
    for d in {kvd.k, kvd.v}:
        if d.name in ("fp16", "bf16") and d != model:
            raise InputError(f"vLLM {version} refuses --kv-cache-dtype {'float16' if d.name == 'fp16' else 'bfloat16'} "
                             f"for this {model.name} model (config/vllm.py _reject_mismatched_float_kv_cache: a float "
                             f"cache dtype must be the model's); use --kv-dtype auto or {model.name}")
