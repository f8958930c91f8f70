"""The decode-speed side of `kvplan plan`: bytes one GPU reads per step over its bandwidth (weights, the routed
experts a batch touches, the cache held), all-reduce time over the interconnect, a prefill FLOP bound. Bounds:
compute, communication and kernel efficiency are left out, so step times are lower bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class SpeedModel:
    """Bytes one GPU reads per decode step, against its bandwidth."""

    bandwidth: int  # bytes/s of one GPU
    bandwidth_source: str
    weight_bytes: int  # on one GPU
    expert_bytes: tuple[tuple[int, int], ...]  # (experts in the tensor set, bytes on one GPU) of routed experts
    experts_per_token: int
    bytes_per_block: int
    # tensor parallelism: bytes one GPU moves per token through its all-reduces (ring), and its link's bytes/s
    allreduce_bytes_per_token: float = 0.0
    link: float = 0.0

    def comm_seconds(self, tokens: int) -> float:
        return tokens * self.allreduce_bytes_per_token / self.link if self.link else 0.0

    def weight_read(self, batch: int) -> float:
        """Weights read by a step of `batch` decoding requests: everything but the routed experts, and of those the
        share a batch touches, E x (1 - (1 - k/E)^batch) experts expected under uniform, independent routing."""
        total = float(self.weight_bytes)
        k = self.experts_per_token
        for experts, b in self.expert_bytes:
            if k and experts > k:
                total -= b * (1 - k / experts) ** batch
        return total

    def step_seconds(self, batch: int, cache_bytes: float) -> float:
        """The longer of the memory read and the step's all-reduces (they may overlap, so not their sum)."""
        return max((self.weight_read(batch) + cache_bytes) / self.bandwidth, self.comm_seconds(batch))

    def to_json(self) -> dict[str, Any]:
        return {"bandwidth_bytes_per_s": self.bandwidth, "bandwidth_source": self.bandwidth_source,
                "weight_bytes": self.weight_bytes, "routed_expert_bytes": sum(b for _, b in self.expert_bytes),
                "experts_per_token": self.experts_per_token,
                "interconnect_bytes_per_s": round(self.link) if self.link else None,
                "allreduce_bytes_per_token": round(self.allreduce_bytes_per_token) if self.link else None}


ACTIVATION_BYTES = 2  # bf16 / fp16 activations on the wire


def allreduce_bytes_per_token(setup, stage: int) -> float:
    """Megatron-style tensor parallelism: two all-reduces per decoder layer (after attention and after the MLP) of
    hidden x 2 B per token; a ring all-reduce moves 2 (tp - 1) / tp of that through each GPU's link."""
    from kvplan.parallel import pp_partition

    tp = setup.tp
    if tp <= 1:
        return 0.0
    layers = len(pp_partition(setup.spec.num_layers, setup.pp)[stage])
    return 2 * layers * setup.spec.widths.hidden * ACTIVATION_BYTES * 2 * (tp - 1) / tp


def speed_model(setup, stage: int, bandwidth: float, source: str, bytes_per_block: int,
                link: float | None = None) -> SpeedModel:
    from kvplan import weights

    spec = setup.spec
    k = spec.widths.experts_per_token
    total = setup.weight_bytes(stage)
    cfg_total = weights.per_gpu_bytes(spec, setup.weight_format, setup.float_dtype, setup.tp, setup.pp, stage,
                                      include_mtp=setup.include_mtp) or 1
    experts = []
    if k:
        for count in sorted({w.count for w in spec.weights if w.role == "expert" and w.split == "expert"}):
            b = weights.per_gpu_bytes(spec, setup.weight_format, setup.float_dtype, setup.tp, setup.pp, stage,
                                      include_mtp=setup.include_mtp,
                                      only=lambda w, c=count: w.role in ("expert", "bias") and w.split == "expert" and w.count == c)
            if b:
                experts.append((count, b * total // cfg_total))
    ar = allreduce_bytes_per_token(setup, stage) if link else 0.0
    return SpeedModel(bandwidth, source, total, tuple(experts), k, bytes_per_block, ar, float(link or 0) if ar else 0.0)


@dataclass(frozen=True)
class SpeedRow:
    batch: int
    weight_read: float
    cache_read: float
    step_seconds: float

    @property
    def tokens_per_s_per_request(self) -> float:
        return 1.0 / self.step_seconds

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "weight_read_bytes": round(self.weight_read), "cache_read_bytes": round(self.cache_read),
                "step_seconds": self.step_seconds, "tokens_per_s_per_request": round(1.0 / self.step_seconds, 3),
                "tokens_per_s": round(self.batch / self.step_seconds, 3)}


def speed_rows(speed: SpeedModel, per_request_cache: float, top: int) -> list[SpeedRow]:
    batches, b = [], 1
    while b < top:
        batches.append(b)
        b *= 2
    batches.append(max(1, top))
    out = []
    for b in batches:
        cache = b * per_request_cache
        out.append(SpeedRow(b, speed.weight_read(b), cache, speed.step_seconds(b, cache)))
    return out


def crossover(speed: SpeedModel, per_request_cache: float, limit: int = 1 << 16) -> int | None:
    """The smallest batch whose cache reads exceed its weight reads (None: not below `limit`)."""
    if per_request_cache <= 0:
        return None
    b = max(1, math.ceil(speed.weight_bytes / per_request_cache))
    while b > 1 and (b - 1) * per_request_cache > speed.weight_read(b - 1):
        b -= 1
    while b <= limit and b * per_request_cache <= speed.weight_read(b):
        b += 1
    return b if b <= limit else None


@dataclass(frozen=True)
class PrefillModel:
    """A prompt's prefill cannot beat the GPU's dense tensor rate: 2 FLOPs per active linear parameter per prompt
    token (decoder-layer projections, MLPs and the routed experts a token uses; attention scores, embeddings and
    the LM head left out, so the FLOP count is a lower bound), nor read its weights faster than the bandwidth."""

    flops: float  # FLOP/s of one GPU
    dtype: str
    source: str
    active_params: float  # linear parameters one prompt token multiplies on one GPU

    def seconds(self, tokens: int, speed: SpeedModel) -> float:
        return max(2.0 * tokens * self.active_params / self.flops, speed.weight_read(tokens) / speed.bandwidth,
                   speed.comm_seconds(tokens))

    def to_json(self, mean_prompt_seconds: float, max_prompt_seconds: float) -> dict[str, Any]:
        return {"flops_per_s": self.flops, "flops_dtype": self.dtype, "flops_source": self.source,
                "active_params_per_token": round(self.active_params),
                "mean_prompt_seconds": mean_prompt_seconds, "max_prompt_seconds": max_prompt_seconds}


def prefill_model(setup, stage: int, gpu) -> PrefillModel | None:
    """None when the catalog has no dense TFLOPS for the GPU. 8-bit or narrower weights may run on the FP8 rate
    (the fastest the engine could use, so the time stays a bound); 16-bit weights on BF16 (FP16 where the chip has
    no BF16)."""
    from kvplan.parallel import pp_partition

    rates = dict(gpu.tflops)
    narrow = setup.weight_format.name not in ("bf16", "fp16", "fp32")
    dtype = "fp8" if narrow and "fp8" in rates else ("bf16" if "bf16" in rates else "fp16")
    if dtype not in rates:
        return None
    spec, tp = setup.spec, setup.tp
    k = spec.widths.experts_per_token
    layers = set(pp_partition(spec.num_layers, setup.pp)[stage])
    active = 0.0
    for w in spec.weights:
        if w.part != "text" or w.layer is None or w.layer not in layers or w.role not in ("linear", "expert"):
            continue
        n = float(w.params)
        if w.role == "expert" and w.split == "expert" and k and w.count > k:
            n *= k / w.count
        active += n if w.split == "replicated" else n / tp
    return PrefillModel(rates[dtype] * 1e12, dtype, f"{gpu.name} dense {dtype} {rates[dtype]:g} TFLOPS (sources: kvplan gpus --json, tflops_source)",
                        active)


def step_timer(speed: SpeedModel, prefill: PrefillModel | None, bytes_per_block: int):
    """An engine step's duration bound: the weights its tokens touch plus the cache blocks held, over the
    bandwidth, or its tokens' FLOPs over the dense rate, whichever is longer."""
    def seconds(tokens: int, decoding: int, held_blocks: int) -> float:
        memory = (speed.weight_read(max(tokens, 1)) + held_blocks * bytes_per_block) / speed.bandwidth
        compute = 2.0 * tokens * prefill.active_params / prefill.flops if prefill is not None else 0.0
        return max(memory, compute, speed.comm_seconds(tokens))
    return seconds


def decode_bound(setup, batch: int, context: int, bandwidth: int, *, weight_bytes: int | None = None) -> SpeedRow:
    """The decode-step bound for `batch` requests each holding `context` tokens (no block rounding: the tokens
    attention reads), on one GPU of the limiting stage. weight_bytes: the weights as a source states them (a GGUF
    file) instead of kvplan's count."""
    stage = setup.prepared.limiting_stage(max(1, context))
    speed = speed_model(setup, stage, bandwidth, "", 0)
    if weight_bytes is not None:
        speed = replace(speed, weight_bytes=weight_bytes, expert_bytes=())
    per_token = setup.prepared.plan(max(1, context), 1, stage).kv_bytes_per_token
    cache = batch * per_token * context
    return SpeedRow(batch, speed.weight_read(batch), cache, speed.step_seconds(batch, cache))
