"""`kvplan verify --fit` on CPU: the weights are charged to --memory-limit, the KV budget is the rest, and a child
interpreter whose address space is capped with RLIMIT_AS finds the largest batch (or context) whose plan really
allocates. It must land within one request (one allocation step of context) of the prediction."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from conftest import kvjson, run_cli  # noqa: E402
from kvplan.sizing import EngineOptions, ModelOptions, setup, size  # noqa: E402
from kvplan.verify import fitcheck  # noqa: E402

pytestmark = pytest.mark.slow  # bisections in subprocesses under RLIMIT_AS

MiB = 1 << 20


def _limit(model: str, engine: str, extra: int) -> int:
    return size(ModelOptions(model), EngineOptions(engine), 64, 1).weight_bytes + extra


BATCH_CASES = [
    ("gpt2", "vllm", 1024, 700 * MiB),
    ("llama-3.2-1b", "sglang", 2048, 900 * MiB),
    ("gemma-3-1b", "hf", 2000, 600 * MiB),
    ("qwen2.5-7b", "llamacpp", 4096, 1500 * MiB),
    ("deepseek-v2-lite", "trtllm", 3000, 800 * MiB),
]


@pytest.mark.parametrize("model,engine,ctx,extra", BATCH_CASES, ids=[f"{m}-{e}" for m, e, _, _ in BATCH_CASES])
def test_max_batch_lands_within_one_request(model, engine, ctx, extra):
    limit = _limit(model, engine, extra)
    d = kvjson("verify", model, "--ctx", str(ctx), "--fit", "--memory-limit", f"{limit}B", "--engine", engine,
               "--device", "cpu")
    f = d["fit"]
    assert f["kv_budget_bytes"] == limit - f["weight_bytes"] == extra
    s = setup(ModelOptions(model), EngineOptions(engine))
    plan_of = lambda b: s.prepared.plan(ctx, b).kv_bytes  # noqa: E731
    # the prediction is the largest batch whose plan fits the budget, from the same plans size reports
    p = d["predicted_max_batch"]
    assert p >= 2 and plan_of(p) <= extra < plan_of(p + 1)
    assert abs(d["difference"]) <= 1 and d["difference"] == d["measured_max_batch"] - p
    assert d["passed"] and f["within_one_step"]
    # the operating system refused the first batch that did not fit (errno 12), it was not kvplan's bookkeeping
    refused = [t for t in f["trials"] if not t["ok"]]
    assert refused and all("Cannot allocate memory" in t["error"] or "can't allocate" in t["error"] for t in refused)
    assert min(t["n"] for t in refused) == d["measured_max_batch"] + 1
    # the allocation check ran on the plan at the measured limit
    assert d["batch"] == d["measured_max_batch"] and d["measured_bytes"] == d["predicted_bytes"] == plan_of(d["batch"])
    assert 0 <= f["os_overhead_bytes"] <= 64 * 1024 * sum(g["tensors"] for g in d["groups"])


CTX_CASES = [
    ("llama-3.2-1b", "vllm", 2, 1800 * MiB),
    ("llama-3.1-8b", "trtllm", 1, 700 * MiB),
    ("mistral-7b", "llamacpp", 3, 900 * MiB),
]


@pytest.mark.parametrize("model,engine,batch,extra", CTX_CASES, ids=[f"{m}-{e}" for m, e, _, _ in CTX_CASES])
def test_max_ctx_lands_within_one_block(model, engine, batch, extra):
    limit = _limit(model, engine, extra)
    d = kvjson("verify", model, "--batch", str(batch), "--fit", "--memory-limit", f"{limit}B", "--engine", engine,
               "--device", "cpu")
    assert d["fit"]["mode"] == "max_ctx" and d["predicted_max_batch"] is None
    p, m = d["predicted_max_ctx"], d["measured_max_ctx"]
    s = setup(ModelOptions(model), EngineOptions(engine))
    plan_of = lambda c: s.prepared.plan(c, batch).kv_bytes  # noqa: E731
    assert plan_of(p) <= extra < plan_of(p + 1)
    lo, hi = min(p, m), max(p, m)
    assert plan_of(lo + 1) >= plan_of(hi), "more than one allocation step of context apart"
    assert d["passed"] and d["ctx"] == m and d["batch"] == batch


def test_a_budget_of_a_few_bytes_fails_the_trial_not_the_child():
    w = _limit("gpt2", "vllm", 0)
    d = kvjson("verify", "gpt2", "--ctx", "1024", "--fit", "--memory-limit", f"{w + 1}B", "--device", "cpu")
    f = d["fit"]
    assert f["kv_budget_bytes"] == 1 and f["memory_limit_bytes"] == w + 1
    assert d["predicted_max_batch"] == d["measured_max_batch"] == 0
    assert [t["ok"] for t in f["trials"]] == [False] and d["passed"]


class _Undercounting:
    """A layout whose byte figures are half of what its tensors take: the prediction is wrong by 2x."""

    def __init__(self, prepared):
        self.prepared = prepared

    def plan(self, ctx, batch, stage=None):
        p = self.prepared.plan(ctx, batch)
        return replace(p, groups=tuple(replace(g, bytes=g.bytes // 2) for g in p.groups))


def test_a_wrong_prediction_fails_the_fit_check():
    s = setup(ModelOptions("gpt2"), EngineOptions("vllm"))
    pred = fitcheck.PredictedFit(0, 300 * MiB, "memory limit")
    fc = fitcheck.cpu_fit(_Undercounting(s.prepared), "batch", 1024, 1, pred, s.max_ctx)
    assert fc.predicted >= 2 * fc.measured - 1 and fc.measured >= 3
    assert not fc.within_one and not fc.passed
    honest = fitcheck.cpu_fit(s.prepared, "batch", 1024, 1, pred, s.max_ctx)
    assert honest.passed and abs(honest.difference) <= 1


def test_fit_on_cpu_needs_a_memory_limit():
    r = run_cli("verify", "gpt2", "--ctx", "64", "--fit", "--device", "cpu")
    assert r.code == 2 and "--memory-limit" in r.err


# ---------------------------------------------------------------------------------------------- search
@pytest.mark.parametrize("threshold", [0, 1, 2, 7, 100, 1023, 5000])
@pytest.mark.parametrize("hint", [1, 2, 7, 64, 99, 100, 101, 4000])
def test_largest_ok_finds_the_threshold(threshold, hint):
    calls = []

    def ok(n):
        calls.append(n)
        return n <= threshold

    got = fitcheck.largest_ok(ok, hint, 1, 10_000)
    assert got == max(0, threshold)
    assert len(calls) <= 2 * 15 + 2
    if hint in (threshold, threshold + 1) and threshold >= 1:
        assert len(calls) <= 3  # a right prediction costs its own trial and the next


def test_largest_ok_respects_the_cap():
    assert fitcheck.largest_ok(lambda n: True, 5, 1, 40) == 40
    assert fitcheck.largest_ok(lambda n: False, 5, 1, 40) == 0


def test_within_one_step():
    s = setup(ModelOptions("llama-3.2-1b"), EngineOptions("vllm"))
    assert fitcheck.within_one_step(s.prepared, "batch", 64, 1, 10, 11)
    assert not fitcheck.within_one_step(s.prepared, "batch", 64, 1, 10, 12)
    # vLLM blocks of 16 tokens: ctx 17..32 hold the same blocks, 33 the next
    assert fitcheck.within_one_step(s.prepared, "ctx", 0, 1, 17, 48)
    assert not fitcheck.within_one_step(s.prepared, "ctx", 0, 1, 16, 49)


def test_fit_with_no_room_for_the_weights_is_bad_input_not_a_pass():
    """Llama-2-7B's 12.55 GiB of weights in a 1 GiB limit: nothing can be bisected, so no PASS after 0 allocations."""
    r = run_cli("verify", "llama-2-7b", "--ctx", "1k", "--memory-limit", "1GiB", "--fit", "--device", "cpu")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "leave no KV budget" in r.err and "12.55 GiB" in r.err
