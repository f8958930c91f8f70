"""Property tests (hypothesis): monotone in ctx and batch, sliding layers stop growing past their window,
state-only models have no per-token growth. Library calls on the same code path as `kvplan size`."""

from __future__ import annotations

from functools import lru_cache

from hypothesis import HealthCheck, assume, given, settings, strategies as st

from conftest import declined
from kvplan import catalog
from kvplan.engines import llamacpp
from kvplan.sizing import EngineOptions, ModelOptions, load_spec, size

MODELS = sorted(m.aliases[0] for m in catalog.bundled_models())
ENGINES = ["vllm", "sglang", "llamacpp", "trtllm", "hf"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@lru_cache(maxsize=None)
def loaded(alias: str):
    return load_spec(ModelOptions(alias))


def kv(alias: str, engine: str, ctx: int, batch: int = 1):
    return size(ModelOptions(alias), EngineOptions(engine=engine), ctx, batch, loaded=loaded(alias))


@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(ENGINES), st.integers(1, 40_000), st.integers(1, 5000),
       st.integers(1, 8), st.integers(1, 3))
def test_kv_never_decreases_with_ctx_or_batch(alias, engine, ctx, extra, batch, more):
    assume(not declined(alias, engine))
    # transformers' DeepSeek-V4 cache shrinks when a compression window closes (its buffered tokens become one entry;
    # tests/test_oracle_hf.py shows it in a real forward): more ctx can hold fewer bytes there
    assume(not (engine == "hf" and loaded(alias)[1].family == "deepseek-v4"))
    # llama.cpp b11434 cannot run T5 with several sequences in per-slot streams: a one-line refusal at batch > 1
    assume(not (engine == "llamacpp" and loaded(alias)[1].model_type in llamacpp.T5_MODEL_TYPES))
    a = kv(alias, engine, ctx, batch).plan.kv_bytes
    assert kv(alias, engine, ctx + extra, batch).plan.kv_bytes >= a
    assert kv(alias, engine, ctx, batch + more).plan.kv_bytes >= a


def _sliding_models():
    out = []
    for alias in MODELS:
        spec = loaded(alias)[1]
        if any(c.kind in ("sliding", "chunked") for _, c in spec.caches):
            out.append(alias)
    return out


SLIDING = _sliding_models()


@SETTINGS
@given(st.sampled_from(SLIDING), st.sampled_from(["vllm", "llamacpp", "trtllm", "hf", "sglang"]), st.integers(0, 100_000))
def test_sliding_layers_stop_growing_past_their_window(alias, engine, beyond):
    assume(not declined(alias, engine))  # a one-line refusal (TensorRT-LLM's Gemma 4 / Step-3.7) has no plan
    spec = loaded(alias)[1]
    if engine == "sglang" and spec.family not in ("llama4", "gpt-oss", "mimo-v2-flash", "gemma4", "step-3.7"):
        return  # SGLang gives non-hybrid-SWA models (Gemma-2/3) full-length cache on purpose (engines.md 2.1)
    if engine == "vllm" and spec.family == "llama4":
        return  # vLLM turns the hybrid manager off for chunked attention: every layer full length
    windows = [getattr(c, "window", 0) or getattr(c, "chunk", 0) for _, c in spec.caches if c.kind in ("sliding", "chunked")]
    start = max(windows) + 2 * 16384 + 1024  # past window + any engine's in-flight reservation and padding
    a = kv(alias, engine, start).plan
    b = kv(alias, engine, start + beyond).plan
    for ga, gb in zip(a.groups, b.groups):
        if ga.kind not in ("sliding", "chunked"):
            continue
        if engine == "trtllm":  # the V1 manager takes windows only from max_attention_window, unset by default
            assert gb.bytes_per_token > 0 and gb.bytes >= ga.bytes, (ga.kind, ga.bytes, gb.bytes)
        else:
            assert ga.bytes == gb.bytes and gb.bytes_per_token == 0, (ga.kind, ga.bytes, gb.bytes)


STATE_ONLY = [a for a in MODELS if all(c.kind in ("mamba_state", "linear_state", "none") for _, c in loaded(a)[1].caches)]


@SETTINGS
@given(st.sampled_from(STATE_ONLY), st.sampled_from(ENGINES), st.integers(1, 1_000_000), st.integers(1, 8))
def test_state_only_model_has_no_per_token_growth(alias, engine, ctx, batch):
    r = kv(alias, engine, ctx, batch)
    assert r.plan.kv_bytes_per_token == 0
    assert r.plan.kv_bytes == kv(alias, engine, ctx + 12345, batch).plan.kv_bytes


def test_there_are_sliding_and_state_only_models():
    assert "gemma-2-9b" in SLIDING and "gpt-oss-20b" in SLIDING and "llama-4-scout" in SLIDING
    assert STATE_ONLY == ["mamba-2.8b"]
