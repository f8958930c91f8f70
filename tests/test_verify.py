"""`kvplan verify` on CPU: the CachePlan that `size` reports is allocated with torch and its storage bytes equal
the prediction, for every bundled model under every engine layout; the RSS check in a fresh process; the JSON
contract; and the one-line exit-2 errors. (CUDA: test_verify_cuda.py; --fit: test_verify_fit.py; --with-model:
test_verify_model.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import declined, kvjson, run_cli  # noqa: E402
from kvplan import catalog  # noqa: E402
from kvplan.engines.base import CachePlan, PlanGroup, Request, TensorAlloc  # noqa: E402
from kvplan.sizing import EngineOptions, ModelOptions, size  # noqa: E402
from kvplan.verify import allocate, core  # noqa: E402
from kvplan.verify.measure import open_backend  # noqa: E402

MiB = 1 << 20
MODELS = [m.repo_id for m in catalog.bundled_models()]
ENGINES = ["vllm", "sglang", "llamacpp", "trtllm", "hf"]
CPU = core.VerifyOptions(device="cpu", rss=False)


def _verify(model: str, engine: str, ctx: int = 64, batch: int = 2, **eo) -> core.VerifyResult:
    return core.run(ModelOptions(model), EngineOptions(engine, **eo), ctx, batch, CPU)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_every_bundled_model_allocates_exactly_its_plan(engine):
    """Storage bytes of the tensors torch allocated == the CachePlan `size` reports for the same arguments, per
    group and in total, and as many tensors as it lists."""
    from kvplan.engines.llamacpp import T5_MODEL_TYPES
    from kvplan.sizing import setup

    for model in MODELS:
        if declined(model, engine):
            continue  # sizing refuses in one line (tests/test_size_cli.py); nothing to allocate
        # llama.cpp runs one T5 sequence unless --kv-unified (tests/test_encdec_families.py)
        batch = 1 if engine == "llamacpp" and setup(ModelOptions(model), EngineOptions(engine)).spec.model_type in T5_MODEL_TYPES else 2
        r = _verify(model, engine, batch=batch)
        sized = size(ModelOptions(model), EngineOptions(engine), 64, batch)
        assert r.alloc.measured_bytes == sized.plan.kv_bytes, model
        assert [g.measured_bytes for g in r.alloc.groups] == [g.bytes for g in sized.plan.groups], model
        assert r.alloc.tensors == sum(t.count for t in sized.plan.tensors), model
        assert r.passed, (model, r.failure_line())


LAYOUT_VARIANTS = [
    ("llama-3.1-8b", "vllm", {"kv_dtype": "fp8"}),  # torch.float8_e4m3fn pools
    ("llama-3.1-8b", "vllm", {"kv_dtype": "fp8_e5m2"}),
    ("llama-3.1-8b", "sglang", {"kv_dtype": "fp8"}),
    ("llama-3.1-8b", "trtllm", {"kv_dtype": "fp8"}),
    ("llama-3.1-8b", "llamacpp", {"kv_dtype": "q8_0"}),  # GGUF blocks as uint8 buffers of the exact size
    ("llama-3.1-8b", "llamacpp", {"k_dtype": "q4_0", "v_dtype": "q5_1"}),
    ("llama-3.1-8b", "llamacpp", {"kv_dtype": "iq4_nl"}),
    ("deepseek-v3", "vllm", {"kv_dtype": "fp8"}),  # MLA latent pools
    ("deepseek-v3", "sglang", {}),
    ("deepseek-v3", "llamacpp", {"kv_dtype": "q8_0"}),
    ("deepseek-v3", "hf@5.14", {}),  # decompressed K/V before transformers 5.15
    ("qwen3-next-80b-a3b", "vllm", {"state_dtype": "fp32"}),  # recurrent state
    ("nemotron-h-56b", "trtllm", {}),  # Mamba state buffers beside block pools
    ("gemma-3-4b", "vllm@0.10", {}),
    ("gemma-2-9b", "llamacpp", {"knobs": {"swa_full": True}}),
    ("llama-3.1-70b", "vllm", {"tp": 4, "pp": 2}),  # one GPU's share
    ("mixtral-8x7b", "sglang", {"tp": 2, "knobs": {"page_size": 64}}),
    ("t5-large", "hf", {"kv_dtype": "fp32"}),  # cross attention
]


@pytest.mark.parametrize("model,engine,eo", LAYOUT_VARIANTS, ids=[f"{m}-{e}-{'-'.join(map(str, o.values()))}"
                                                                  for m, e, o in LAYOUT_VARIANTS])
def test_layout_variants_allocate_exactly(model, engine, eo):
    r = _verify(model, engine, 300, 3, **eo)
    assert r.alloc.measured_bytes == r.plan.kv_bytes > 0
    assert all(g.measured_bytes == g.predicted_bytes for g in r.alloc.groups)
    assert r.passed, r.failure_line()


def test_fp8_and_gguf_tensors_use_the_planned_dtypes():
    """The allocation really is in torch's float8 dtypes, and GGUF block types are byte buffers of the exact
    row size (q8_0: 34 B per 32 elements)."""
    backend = open_backend("cpu")
    fp8 = size(ModelOptions("llama-3.1-8b"), EngineOptions("sglang", kv_dtype="fp8_e5m2"), 128, 1).plan
    tensors = allocate.allocate_plan(backend, fp8)
    import torch

    assert {x.dtype for ts in tensors for x in ts} == {torch.float8_e5m2}
    q8 = size(ModelOptions("llama-3.1-8b"), EngineOptions("llamacpp", kv_dtype="q8_0"), 256, 1).plan
    k = [t for t in q8.tensors if t.name.startswith("K")][0]
    assert k.dtype == "uint8" and k.shape == (q8.details["cells"] * 8 * 128 // 32 * 34,)
    tensors = allocate.allocate_plan(backend, q8)
    assert allocate.storage_bytes([x for ts in tensors for x in ts]) == q8.kv_bytes


def _lying_plan(real_dtype: str, claimed_elem: int, n: int = 3, elems: int = 1 << 20) -> CachePlan:
    """A plan whose byte figure is wrong: tensors in `real_dtype` claimed at `claimed_elem` bytes each."""
    t = TensorAlloc("keys", (elems,), real_dtype, n, claimed_elem)
    g = PlanGroup("full", (0,), 1, 1, 1, None, 1, real_dtype, t.total_bytes, 0, (t,))
    return CachePlan("test", Request(1), (g,), t.total_bytes, ())


def test_a_wrong_prediction_fails_the_storage_check():
    check = allocate.check_cpu(open_backend("cpu"), _lying_plan("float32", 2))
    assert check.measured_bytes == 2 * check.predicted_bytes
    assert not check.passed and not check.groups[0].passed


def test_rss_growth_matches_touched_tensors():
    plan = size(ModelOptions("gemma-3-1b"), EngineOptions("vllm"), 2000, 2).plan
    rss = allocate.rss_check(plan)
    big = sum(t.total_bytes for t in plan.tensors if t.nbytes >= MiB)
    assert rss.expected_bytes == big > 100 * MiB
    assert rss.error is None and rss.measured_bytes is not None
    assert rss.passed, rss.to_json()
    # the tolerance is max(1 %, 2 MiB per tensor): the measurement is close, not merely inside a wide band
    assert abs(rss.measured_bytes - big) <= rss.tolerance_bytes


def test_rss_check_fails_when_the_plan_undercounts():
    rss = allocate.rss_check(_lying_plan("float32", 2, n=4, elems=4 << 20))  # 4 x 16 MiB touched, 32 MiB claimed
    assert rss.measured_bytes is not None and rss.measured_bytes >= 60 * MiB
    assert not rss.passed


def test_rss_tolerance_rule():
    assert allocate.rss_tolerance(1 << 30, 1) == (1 << 30) // 100
    assert allocate.rss_tolerance(10 * MiB, 3) == 6 * MiB


# ---------------------------------------------------------------------------------------------- CLI and JSON
CONTRACT_KEYS = {"schema", "device", "predicted_bytes", "measured_bytes", "measured_reserved_bytes",
                 "measured_device_bytes", "rss_delta_bytes", "groups", "passed"}


def test_cli_json_contract_and_size_agreement():
    d = kvjson("verify", "gemma-2-9b", "--ctx", "2000", "--batch", "1", "--device", "cpu", "--engine", "sglang")
    assert CONTRACT_KEYS <= set(d)
    s = kvjson("size", "gemma-2-9b", "--ctx", "2000", "--engine", "sglang")
    assert d["predicted_bytes"] == s["kv_bytes"] == d["measured_bytes"]
    assert [g["kind"] for g in d["groups"]] == [g["kind"] for g in s["groups"]]
    assert [g["predicted_bytes"] for g in d["groups"]] == [g["bytes"] for g in s["groups"]]
    assert all({"kind", "predicted_bytes", "measured_bytes"} <= set(g) for g in d["groups"])
    assert d["device"]["kind"] == "cpu" and d["device"]["total_bytes"] > 0
    assert d["measured_reserved_bytes"] is None and d["measured_device_bytes"] is None  # CUDA-only figures
    assert d["rss_delta_bytes"] > 0 and d["rss"]["passed"]
    assert d["passed"] is True and d["engine"] == s["engine"] and d["ctx"] == 2000


def test_cli_table_output():
    r = run_cli("verify", "llama-3.2-1b", "--ctx", "4k", "--device", "cpu", "--no-rss")
    assert r.code == 0, r.err
    assert "PASS allocation" in r.out and "storage bytes" in r.out


def test_cli_mismatch_exits_1_with_one_line(monkeypatch):
    real = allocate.storage_bytes
    monkeypatch.setattr(allocate, "storage_bytes", lambda ts: real(ts) + 512)
    r = run_cli("verify", "llama-3.2-1b", "--ctx", "64", "--device", "cpu", "--no-rss", "--json")
    assert r.code == 1
    assert r.json()["passed"] is False
    assert r.err.count("\n") == 1 and r.err.startswith("kvplan: error: verify failed: allocation")


def test_refuses_a_plan_larger_than_memavailable(monkeypatch):
    from kvplan.verify import measure

    monkeypatch.setattr(measure, "mem_available", lambda: 10 * MiB)
    calls = []
    monkeypatch.setattr(allocate, "allocate_plan", lambda *a: calls.append(a))
    r = run_cli("verify", "llama-3.1-8b", "--ctx", "8k", "--batch", "4", "--device", "cpu")
    assert r.code == 2 and not calls
    assert "available" in r.err and "nothing was allocated" in r.err and r.err.count("\n") == 1


def _no_cuda_reason() -> str:
    """What verify says without a usable CUDA device: the CPU wheel (CI) has no CUDA build; the CUDA wheel a bare
    `pip install -e ".[test]"` takes (the README's quick start) sees no device."""
    import torch

    return "sees no CUDA device" if torch.version.cuda else "without CUDA"


@pytest.mark.parametrize("args,needle", [
    (["--device", "cuda"], "no CUDA"),
    (["--device", "cuda:1"], "no CUDA"),
    (["--device", "tpu"], "accepted auto, cpu, cuda, cuda:N"),
    (["--device", "cuda:x"], "cuda:N"),
    (["--fit"], "--fit on CPU needs --memory-limit"),
    (["--fit", "--memory-limit", "lots"], "--memory-limit"),
    (["--batch", "0"], "--batch"),
])
def test_bad_input_and_environment_exit_2(args, needle):
    if needle == "no CUDA":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
        needle = _no_cuda_reason()
    r = run_cli("verify", "gpt2", "--ctx", "64", *args)
    assert r.code == 2, (r.out, r.err)
    assert needle in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


def test_torch_missing_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    r = run_cli("verify", "gpt2", "--ctx", "64")
    assert r.code == 2
    assert 'pip install "kvplan[verify]"' in r.err and r.err.count("\n") == 1
    r = run_cli("gpus", "--local")
    assert r.code == 2 and 'pip install "kvplan[verify]"' in r.err


def test_transformers_missing_for_with_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    r = run_cli("verify", "gpt2", "--ctx", "64", "--with-model", "--device", "cpu")
    assert r.code == 2 and "transformers" in r.err and "pip install" in r.err and r.err.count("\n") == 1


def test_gpus_local_without_cuda_exits_2():
    r = run_cli("gpus", "--local")
    assert r.code == 2 and "no CUDA device" in r.err


# ---------------------------------------------------------------------------------------------- torch isolation
VERIFY_SCRIPT = """
import io, sys, contextlib
import kvplan.cli, kvplan.verify, kvplan.verify.core, kvplan.verify.allocate, kvplan.verify.fitcheck
import kvplan.verify.measure, kvplan.verify.model_check, kvplan.verify.local_gpu
before = "torch" in sys.modules
from kvplan.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        main(["verify", "gpt2", "--ctx", "64", "--device", "cpu", "--no-rss", "--json"])
    except SystemExit as e:
        assert not e.code, e.code
print(before, "torch" in sys.modules)
"""


def test_verify_imports_torch_only_when_it_runs():
    out = subprocess.run([sys.executable, "-c", VERIFY_SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]

