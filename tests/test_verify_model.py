"""`kvplan verify --with-model`: transformers' own model code builds the cache, and kvplan's hf layout must hold
exactly its bytes -- on the meta device for every bundled config transformers can build (the independent figure
for the hf layout), beyond every sliding window for the window families, and in a real CPU forward of a scaled
copy for a handful of families."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import declined, kvjson, run_cli  # noqa: E402
from kvplan import catalog  # noqa: E402
from kvplan.sizing import EngineOptions, ModelOptions, size  # noqa: E402
from kvplan.verify import core  # noqa: E402
from kvplan.verify.model_check import check_model, scaled_config  # noqa: E402

pytestmark = pytest.mark.slow  # every bundled model built on the meta device and scaled real forwards

REMOTE_CODE = {"THUDM/chatglm3-6b", "Qwen/Qwen-7B"}
NATIVE = [m.repo_id for m in catalog.bundled_models() if m.repo_id not in REMOTE_CODE]
HF = f"hf@{transformers.__version__}"


def _sized(model: str, ctx: int, batch: int, engine: str = HF):
    return size(ModelOptions(model), EngineOptions(engine), ctx, batch)


def test_every_buildable_bundled_model_on_meta():
    """verify --with-model (meta) for every bundled config: the storage check and the model check both pass,
    group by group, and the model's cache bytes equal the plan's."""
    assert len(NATIVE) == len(catalog.bundled_models()) - 2
    opts = core.VerifyOptions(device=None, with_model=True, rss=False)
    for model in NATIVE:
        if declined(model, "hf"):  # transformers' cache for it is not modelled: the check cannot map it
            assert declined(model, "hf") in run_cli("verify", model, "--with-model", "--ctx", "64").err
            continue
        r = core.run(ModelOptions(model), EngineOptions(), 64, 2, opts)
        (meta,) = r.model.runs
        assert meta.device == "meta" and meta.status == "ran"
        assert meta.measured_bytes == r.plan.kv_bytes == r.alloc.measured_bytes, model
        assert [g.measured_bytes for g in meta.groups] == [g.bytes for g in r.plan.groups], model
        assert meta.unassigned_bytes == 0 and meta.extra_bytes == 0
        assert r.passed, (model, r.failure_line())


BEYOND_WINDOW = [
    ("gemma-2-9b", 5000, 2),  # sliding 4096 alternating with full
    ("gemma-3-1b", 1100, 2),  # 5 sliding (512) : 1 full
    ("gpt-oss-20b", 300, 3),  # sliding 128
    ("mistral-7b", 4200, 1),  # sliding 4096 on every layer
    ("llama-4-scout", 8300, 1),  # chunked 8192 on 3 of 4 layers
]


@pytest.mark.parametrize("model,ctx,batch", BEYOND_WINDOW)
def test_meta_cache_beyond_every_window(model, ctx, batch):
    r = _sized(model, ctx, batch)
    capped = [g for g in r.plan.groups if g.kind in ("sliding", "chunked")]
    assert capped and all(g.tokens < ctx for g in capped)  # the window really binds
    mc = check_model(r.setup, r.plan, ctx, batch, None)
    (meta,) = mc.runs
    assert meta.measured_bytes == r.plan.kv_bytes
    assert all(g.passed for g in meta.groups) and mc.passed
    for g in meta.groups:  # the shapes, not only the sums
        assert g.measured_shapes == g.predicted_shapes, g.kind


SCALED = [
    ("llama-3.1-8b", 64, 2),
    ("qwen3-8b", 64, 1),
    ("gemma-2-9b", 64, 2),
    ("gemma-3-1b", 600, 1),  # beyond the 512 window in a real forward
    ("deepseek-v2-lite", 48, 2),  # MLA latent
    ("mixtral-8x7b", 32, 1),  # MoE
    ("t5-large", 40, 1),  # cross attention
]


@pytest.mark.parametrize("model,ctx,batch", SCALED)
def test_scaled_real_forward_on_cpu(model, ctx, batch):
    r = _sized(model, ctx, batch)
    mc = check_model(r.setup, r.plan, ctx, batch, "cpu")
    meta, real = mc.runs
    assert real.device == "cpu" and real.status == "ran" and real.config_scaled, real.reason
    assert real.measured_bytes == meta.measured_bytes == r.plan.kv_bytes
    assert [g.measured_shapes for g in real.groups] == [g.predicted_shapes for g in real.groups]
    assert real.storage_bytes >= real.measured_bytes  # sliding layers keep views of the full step's tensors
    assert mc.passed


def test_scaled_copy_keeps_the_cache_geometry_and_shrinks_the_rest():
    raw = _sized("deepseek-v3", 8, 1).setup.resolved.config
    s = scaled_config(raw)
    assert s["num_hidden_layers"] == raw["num_hidden_layers"] and s["kv_lora_rank"] == raw["kv_lora_rank"]
    assert s["qk_rope_head_dim"] == raw["qk_rope_head_dim"] and s["num_attention_heads"] == raw["num_attention_heads"]
    assert s["hidden_size"] < 256 and s["vocab_size"] == 128 and s["n_routed_experts"] == 4
    assert all(s[k] < 128 for k in ("bos_token_id", "eos_token_id") if isinstance(s.get(k), int))


def test_families_whose_head_dim_follows_hidden_are_skipped_with_a_reason():
    r = _sized("gpt2", 32, 1)
    mc = check_model(r.setup, r.plan, 32, 1, "cpu")
    meta, real = mc.runs
    assert meta.passed and real.status == "skipped" and "hidden size" in real.reason
    assert mc.passed


def test_a_wrong_layout_fails_the_model_check():
    """transformers >= 5.15 caches DeepSeek's latent; the 5.14 layout (decompressed K/V) must not pass."""
    r = run_cli("verify", "deepseek-v2-lite", "--ctx", "64", "--engine", "hf@5.14", "--with-model", "--no-rss",
                "--json")
    assert r.code == 1
    d = r.json()
    assert d["model_check"]["passed"] is False and d["passed"] is False
    assert d["model_check"]["measured_bytes"] < d["predicted_bytes"]
    assert "model (meta)" in r.err and r.err.count("\n") == 1


def test_cli_with_model_issue_example():
    d = kvjson("verify", "gemma-2-9b", "--ctx", "5000", "--batch", "2", "--with-model", "--no-rss")
    m = d["model_check"]
    assert m["transformers"] == transformers.__version__ and m["passed"]
    assert m["measured_bytes"] == d["predicted_bytes"] == d["measured_bytes"]
    assert [g["kind"] for g in m["runs"][0]["groups"]] == ["sliding", "full"]


@pytest.mark.parametrize("model", sorted(REMOTE_CODE))
def test_remote_code_families_get_a_clear_line(model):
    r = run_cli("verify", model, "--ctx", "64", "--with-model")
    assert r.code == 2 and "remote code" in r.err and "without --with-model" in r.err and r.err.count("\n") == 1


def test_with_model_refuses_other_engines():
    r = run_cli("verify", "gpt2", "--ctx", "64", "--with-model", "--engine", "vllm")
    assert r.code == 2 and "hf layout" in r.err
