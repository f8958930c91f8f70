"""`kvplan fit`: the boundary is exact, the catalog view, the contract's keys, and bad input."""

from __future__ import annotations

from functools import lru_cache

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from conftest import declined, kvjson, run_cli
from kvplan import catalog
from kvplan.engines.base import cdiv
from kvplan.gpus import resolve_gpu
from kvplan.planner import fit_model
from kvplan.sizing import EngineOptions, ModelOptions, load_spec

MODELS = sorted(m.aliases[0] for m in catalog.bundled_models())


@lru_cache(maxsize=None)
def loaded(alias: str):
    return load_spec(ModelOptions(alias))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MODELS), st.sampled_from(["vllm", "vllm@0.10", "sglang", "llamacpp", "trtllm", "hf"]),
       st.integers(8, 400), st.sampled_from([256, 1000, 4096, 32768]))
def test_boundary_is_exact(alias, engine, gib, ctx):
    """At max_batch the plan fits the budget; one more request does not."""
    assume(not declined(alias, engine))
    gpu = resolve_gpu(f"{gib}GiB")
    r = fit_model(ModelOptions(alias), EngineOptions(engine=engine), gpu, ctx, loaded=loaded(alias))
    module, prep = r.setup.engine.module, r.setup.prepared
    kv = [b.kv_bytes for b in r.budgets]
    uncapped = r.capacity.max_batch
    if min(kv) <= 0:
        assert not r.fits and r.max_batch == 0
        return
    if uncapped >= 1:
        assert module.fits(prep, r.ctx, uncapped, kv)
        plan = prep.plan(r.ctx, uncapped)
        slack, in_pool = 0, plan.kv_bytes
        if r.setup.engine.name == "trtllm":  # TRT-LLM rounds max_tokens UP to whole blocks (engine log, July 2025)
            slack = prep.tpb * prep.bytes_per_token(0)
            # a hybrid's Mamba state buffers are allocated for max_batch_size before the pool is sized (a part of the
            # budget, engines/trtllm.py StateBuffers), not out of the pool the requests' KV fills
            in_pool -= sum(g.bytes for g in plan.groups if g.kind in ("mamba_state", "linear_state"))
        if r.setup.engine.name == "sglang":  # SGLang sizes the pool, then allocates one padding page beyond it
            slack = plan.details["padding_bytes"] if prep.dsv4 else prep.page * plan.details["cell_size"]
        assert in_pool <= kv[plan.limiting_stage] + slack
    assert not module.fits(prep, r.ctx, uncapped + 1, kv)
    assert r.max_batch == min(uncapped, r.capacity.engine_batch_cap or uncapped)


def test_catalog_fit_covers_every_model_and_sorts_fitting_first():
    d = kvjson("fit", "--gpu", "24GB")
    names = [r["model"]["requested"] for r in d["results"]] + [e["model"] for e in d["errors"]]
    assert sorted(names) == MODELS
    fits = [r["fits"] for r in d["results"]]
    assert fits == sorted(fits, reverse=True) and any(fits) and not all(fits)
    row = next(r for r in d["results"] if r["model"]["requested"] == "llama-3.1-70b")
    assert not row["weights_fit"] and not row["fits"] and row["max_batch"] == 0
    assert d["gpu"]["total_bytes"] == 24 * (1 << 30) and d["gpu"]["count"] == 1
    for key in ("schema", "gpu", "engine", "tp", "pp", "results"):
        assert key in d
    for key in ("model", "ctx", "weight_bytes", "kv_budget_bytes", "kv_capacity_tokens", "max_batch",
                "engine_batch_cap", "concurrency", "max_ctx", "fits", "engine_would_start"):
        assert key in d["results"][0]


def test_one_model_frontier_is_monotone_and_ends_at_model_max():
    r = kvjson("fit", "--gpu", "L4", "--model", "llama-3.1-8b")["results"][0]
    ctxs = [p["ctx"] for p in r["frontier"]]
    batches = [p["max_batch"] for p in r["frontier"]]
    assert ctxs[0] == 1024 and ctxs[-1] == r["model_max_ctx"] == 131072
    assert batches == sorted(batches, reverse=True)
    # the L4 cannot start vLLM at the default max_model_len (131,072) and says what would work
    assert not r["engine_would_start"] and 0 < r["suggested_max_model_len"] < 131072
    assert r["max_ctx"] <= r["suggested_max_model_len"] + 16


def test_deepseek_v3_on_8xh100_fp8_32k_does_not_fit():
    r = kvjson("fit", "--gpu", "8xH100", "--model", "deepseek-v3", "--kv-dtype", "fp8", "--ctx", "32k")["results"][0]
    assert r["fits"] is False and r["weights_fit"] is False
    assert r["weight_bytes"] > r["kv_budget_bytes"] + r["weight_bytes"] - 80 * (1 << 30)


def test_nxgpu_sets_tensor_parallel_and_replicas():
    d = kvjson("fit", "--gpu", "8xH100", "--model", "llama-3.1-8b", "--tp", "2")
    assert d["tp"] == 2 and d["results"][0]["replicas"] == 4
    d = kvjson("fit", "--gpu", "2xA10G", "--model", "qwen2.5-7b")
    assert d["tp"] == 2


def test_kv_budget_gives_blocks_exactly():
    """5 GiB over Llama-2-7B's 8 MiB blocks: 640 blocks, 639 usable, 4096-token requests need 256 -> 2."""
    r = kvjson("fit", "--gpu", "H100", "--model", "llama-2-7b", "--ctx", "4096", "--kv-budget", "5GiB")["results"][0]
    assert r["engine_details"]["num_gpu_blocks"] == 5 * (1 << 30) // (8 << 20)
    assert r["max_batch"] == (640 - 1) // cdiv(4096, 16)


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "H101"], "unknown GPU"),
    (["--gpu", "GB"], "without a number"),
    (["--gpu", "0xH100"], "from 1 to"),
    (["--gpu", "GH200"], "ambiguous"),
    (["--gpu", "H100", "--gpu-memory-utilization", "1.5"], "outside (0, 1]"),
    (["--gpu", "H100", "--gpu-memory-utilization", "0"], "outside (0, 1]"),
    (["--gpu", "8xH100", "--model", "llama-3.1-8b", "--tp", "3"], "KV heads"),
    (["--gpu", "2xH100", "--model", "llama-3.1-8b", "--tp", "4"], "needs 4 GPUs"),
    (["--gpu", "H100", "--model", "llama-3.1-8b", "--page-size", "16"], "does not apply to engine vllm"),
    (["--gpu", "H100", "--model", "llama-3.1-8b", "--engine", "sglang", "--gpu-memory-utilization", "0.9"], "does not apply to engine sglang"),
    (["--gpu", "40xH100", "--model", "gpt-oss-20b", "--tp", "1", "--pp", "40"], "pipeline stages"),
    (["--gpu", "H100", "--kv-budget", "lots"], "not a size"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run_cli("fit", *args)
    assert r.code == 2, (r.code, r.out, r.err)
    assert needle in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


def test_ctx_above_model_max_is_clamped_and_flagged():
    r = kvjson("fit", "--gpu", "H100", "--model", "llama-2-7b", "--ctx", "8k")["results"][0]
    assert r["ctx"] == 4096 and r["ctx_clamped"] and any("clamped" in w for w in r["warnings"])


def test_fit_says_where_the_kv_budget_came_from():
    estimated = kvjson("fit", "--gpu", "L4", "--model", "llama-3.1-8b")["results"][0]
    given = kvjson("fit", "--gpu", "L4", "--model", "llama-3.1-8b", "--kv-budget", "5GiB")["results"][0]
    assert estimated["kv_budget_source"] == "estimated"
    assert given["kv_budget_source"] == "flag" and given["kv_budget_bytes"] == 5 << 30


def test_the_concurrency_row_names_the_length_it_is_for(monkeypatch):
    """vLLM's "Maximum concurrency" is for requests of max_model_len; printed on the `at ctx 4,096` row it says so
    (issue 14: a 0.38x beside max batch 12 read as a contradiction)."""
    monkeypatch.setenv("COLUMNS", "160")
    args = ("fit", "--gpu", "24GB", "--model", "llama-3.1-8b")
    r = kvjson(*args)["results"][0]
    mml = r["engine_details"]["max_model_len"]
    assert r["ctx"] == 4096 and mml == 131072 and r["concurrency"] < 1 <= r["max_batch"]
    text = " ".join(run_cli(*args).out.split())
    assert f"concurrency {r['concurrency']:.2f}x at max_model_len {mml:,}" in text
    same = run_cli("fit", "--gpu", "24GB", "--model", "llama-3.1-8b", "--ctx", "131072").out
    assert "concurrency" in same and "at max_model_len" not in same


def test_fit_takes_the_encoder_length_of_one_cross_attention_model():
    """--encoder-len reaches fit as it reaches size: transformers keeps cross K/V over every encoder position, so
    Whisper's 1,500 -> 3,000 positions cost 1,024 B x 32 layers x 2 x 1,500 more per request (fp16)."""
    args = ("fit", "whisper-large-v3", "--gpu", "L4", "--engine", "hf", "--kv-budget", "10GiB", "--ctx", "448")
    default = kvjson(*args)["results"][0]
    longer = kvjson(*args, "--encoder-len", "3000")["results"][0]
    per_request = size_kv("whisper-large-v3", 448, 1500), size_kv("whisper-large-v3", 448, 3000)
    assert per_request[1] - per_request[0] == 1500 * 2 * 32 * 1280 * 2
    # fit holds back transformers' activation peak too, so each batch stays at or below the cache-only quotient
    assert 0 < longer["max_batch"] < default["max_batch"] <= (10 << 30) // per_request[0]
    assert longer["max_batch"] <= (10 << 30) // per_request[1] < default["max_batch"]
    catalog = run_cli("fit", "--gpu", "L4", "--encoder-len", "3000")
    assert catalog.code == 2 and "--encoder-len" in catalog.err


def size_kv(model: str, ctx: int, encoder_len: int) -> int:
    return kvjson("size", model, "--engine", "hf", "--kv-dtype", "fp16", "--ctx", str(ctx),
                  "--encoder-len", str(encoder_len))["kv_bytes"]


@pytest.mark.parametrize("engine,gpu,expected", [
    ("vllm@0.27.1", "B200", 8192), ("vllm@0.28", "B200", 16384), ("vllm@0.32", "B200", 16384),
    ("vllm@0.33", "B300", 16384), ("vllm@0.32", "H100", 8192), ("vllm@0.32", "A100-80GB", 2048),
])
def test_vllm_serve_batched_token_default_follows_the_gpu_tier_of_its_version(engine, gpu, expected):
    """EngineArgs._set_default_args as the wheels read: >= 160 GiB (B200, B300) -> 16,384 from 0.28.0 (0.27.1 has no
    such tier), >= 70 GiB other than A100 -> 8,192, else 2,048. A sliding-window model shows it: its sliding layers
    reserve window + 2 x max_num_batched_tokens (async scheduling) per request."""
    r = kvjson("fit", "gemma-2-9b", "--gpu", gpu, "--engine", engine, "--ctx", "8k")["results"][0]
    said = [a for a in r["assumptions"] if a.startswith("max_num_batched_tokens ")]
    assert said and said[0].split()[1] == str(expected), said
