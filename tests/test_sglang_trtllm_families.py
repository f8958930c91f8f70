"""Gemma 4, Step-3.7 and DeepSeek-V4 as SGLang and TensorRT-LLM lay them out, read in their own source.

- SGLang 0.5.23 (the wheel from PyPI; kvplan's newest SGLang rule row): Gemma 4 (models/gemma4_causal.py) and
  Step-3.7 (models/step3p7.py, its text model models/step3p5.py) are hybrid-SWA architectures
  (configs/model_config.py is_hybrid_swa_model / get_hybrid_layer_ids), pooled by SWAKVPool
  (mem_cache/swa_memory_pool.py, mem_cache/kv_cache_configurator.py _build_hybrid_swa_kv_pool) and split by
  HybridSWAPoolConfigurator (model_executor/pool_configurator.py): full pool tokens = int(rest // (F + r S)),
  SWA pool tokens = int(full x r), r = 0.8, both floored to the page. Gemma 4's full pool takes the per_layer_config
  shape transformers builds from global_head_dim / num_global_key_value_heads and its SWA pool the sliding shape
  (utils/hf_transformers/config.py _apply_gemma4_attention_overrides), its window is sliding_window - 1
  (get_attention_sliding_window_size) and its KV-shared layers keep their own rows. DeepSeek-V4 runs on
  DSV4PoolConfigurator, laid out in tests/test_dsv4_sglang023.py (a bf16 cache is refused). The 0.5.10.post1 wheel (the `sglang@0.5` row) has none of the three
  models: refused.
- TensorRT-LLM (main, the index's copy: _torch/models/modeling_gemma4.py, modeling_step3p7.py,
  modeling_deepseekv4.py, docs/source/features/kvcache.md): Gemma 4 and DeepSeek-V4 run on KVCacheManagerV2 only,
  Step-3.7 names FlashInfer on KVCacheManagerV2 its production path: all refused.

Every figure below is arithmetic on the config's own fields, written out here; no engine ran (no GPU, and neither
engine installs on this machine).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conftest import ROOT, kvjson, run_cli, write_config
from test_gemma4 import e2b_shaped, text_only_variant
from test_step3p7 import release_shaped

GEMMA_26B = ROOT / "model_configs" / "google--gemma-4-26B-A4B" / "config.json"
STEP_FLASH = ROOT / "model_configs" / "stepfun-ai--Step-3.7-Flash" / "config.json"
DSV4_FLASH = ROOT / "model_configs" / "deepseek-ai--DeepSeek-V4-Flash" / "config.json"
MIMO = ROOT / "model_configs" / "XiaomiMiMo--MiMo-V2-Flash" / "config.json"
BUDGET = 10 << 30
R = 0.8  # --swa-full-tokens-ratio default (arg_groups/fields/schedule.py fallback)
BF16 = 2


def _load(path: Path) -> dict:
    return json.loads(path.read_text())



def _fit(path: str, engine: str, gpu: str = "H100", *extra: str, budget: int = BUDGET) -> dict:
    out = kvjson("fit", path, "--engine", engine, "--gpu", gpu, "--kv-budget", str(budget), "--ctx", "8192", *extra)
    return out["results"][0]


def _groups(out: dict) -> dict[str, tuple]:
    return {g["kind"]: (g["layers"], g["kv_heads"], g["head_dim_k"], g["window"], g["tokens"], g["bytes"])
            for g in out["groups"]}


# ---------------------------------------------------------------------------------------------- Gemma 4, SGLang
def _gemma_26b_cells() -> tuple[int, int, int, int, int]:
    """(full layers, SWA layers, F, S, window) of the released 26B-A4B as SGLang 0.5.23 reads it."""
    t = _load(GEMMA_26B)["text_config"]
    types = t["layer_types"]
    n_full, n_swa = types.count("full_attention"), types.count("sliding_attention")
    full_kv = t["num_global_key_value_heads"] if t["attention_k_eq_v"] else t["num_key_value_heads"]
    f = n_full * full_kv * (t["global_head_dim"] + t["global_head_dim"]) * BF16  # K and V both cached
    s = n_swa * t["num_key_value_heads"] * (t["head_dim"] + t["head_dim"]) * BF16
    return n_full, n_swa, f, s, t["sliding_window"] - 1


def test_gemma4_sglang_pools_full_512_and_sliding_256():
    n_full, n_swa, f, s, window = _gemma_26b_cells()
    assert (n_full, n_swa, f, s, window) == (5, 25, 20_480, 204_800, 1023)
    out = kvjson("size", str(GEMMA_26B), "--engine", "sglang@0.5.23", "--ctx", "8192")
    assert out["engine"] == "sglang@0.5.23"
    # each pool allocates its tokens + one page of rows (page 1); the SWA pool holds min(ctx, window) per request
    assert _groups(out) == {
        "sliding": (25, 8, 256, window, window, (window + 1) * s),
        "full": (5, 2, 512, None, 8192, (8192 + 1) * f),
    }
    assert out["kv_bytes_per_token"] == f  # beyond the window only the full layers grow
    assert any("sliding_window - 1" in a for a in out["assumptions"])


def test_gemma4_sglang_splits_the_budget_as_hybrid_swa_pool_configurator():
    _, _, f, s, window = _gemma_26b_cells()
    r = _fit(str(GEMMA_26B), "sglang@0.5.23")
    full = int(BUDGET // (f + R * s))
    swa = int(full * R)
    assert (full, swa) == (58_254, 46_603)
    assert r["engine_details"]["full_max_total_num_tokens"] == r["engine_details"]["max_total_num_tokens"] == full
    assert r["engine_details"]["swa_max_total_num_tokens"] == swa
    assert r["kv_capacity_tokens"] == full
    assert r["max_batch"] == min(full // 8192, swa // window) == 7


def test_gemma4_sglang_refuses_an_swa_pool_below_its_admission_floor():
    """pool_configurator.py validate_swa_pool_size: window + page >= SWA tokens never admits a request."""
    _, _, f, s, window = _gemma_26b_cells()
    budget = int((f + R * s) * 1200)  # full pool 1,200 tokens, SWA pool 960 <= 1,023 + 1
    r = _fit(str(GEMMA_26B), "sglang@0.5.23", budget=budget)
    assert r["engine_details"]["full_max_total_num_tokens"] == 1200
    assert r["engine_details"]["swa_max_total_num_tokens"] == int(1200 * R) == 960 <= window + 1
    assert r["engine_would_start"] is False and "cannot hold even one request" in r["engine_start_message"]


def test_gemma4_on_sm100_runs_64_token_pages():
    """arg_groups/model_overrides/gemma4.py: trtllm_mha on SM100; arg_groups/overrides.py: that backend moves a
    page size outside 16/32/64/128 to 64."""
    _, _, f, s, _ = _gemma_26b_cells()
    full = int(BUDGET // (f + R * s)) // 64 * 64
    r = _fit(str(GEMMA_26B), "sglang@0.5.23", "B200")
    assert r["engine_details"]["page_size"] == 64
    assert r["engine_details"]["full_max_total_num_tokens"] == full == 58_240
    assert r["engine_details"]["swa_max_total_num_tokens"] == int(full * R) // 64 * 64 == 46_592
    r = _fit(str(GEMMA_26B), "sglang@0.5.23", "B200", "--page-size", "32")
    assert r["engine_details"]["page_size"] == 32
    assert _fit(str(GEMMA_26B), "sglang@0.5.23")["engine_details"]["page_size"] == 1  # H100: triton, page 1


def test_gemma4_kv_shared_layers_keep_their_pool_rows_in_sglang(tmp_path):
    """get_hybrid_layer_ids lists every layer_types entry, so SWAKVPool gives the 20 KV-shared layers rows too
    (their RadixAttention reads the target's layer id, models/gemma4_causal.py)."""
    cfg = e2b_shaped()
    t = cfg["text_config"]
    types = t["layer_types"]
    n_full, n_swa = types.count("full_attention"), types.count("sliding_attention")
    assert (n_full, n_swa) == (7, 28) and t["num_kv_shared_layers"] == 20
    kv = t["num_key_value_heads"]  # attention_k_eq_v false: the full layers keep num_key_value_heads
    window = t["sliding_window"] - 1
    out = kvjson("size", write_config(tmp_path, "e2b", cfg), "--engine", "sglang@0.5.23", "--ctx", "4096")
    assert _groups(out) == {
        "sliding": (n_swa, kv, 256, window, window, n_swa * (window + 1) * kv * 2 * t["head_dim"] * BF16),
        "full": (n_full, kv, 512, None, 4096, n_full * (4096 + 1) * kv * 2 * t["global_head_dim"] * BF16),
    }
    assert any("20 KV-shared layer(s)" in a for a in out["assumptions"])


def test_gemma4_shapes_sglang_cannot_carry_are_refused(tmp_path):
    # no sliding layer at all: HybridSWAPoolConfigurator asserts one
    cfg = text_only_variant()
    cfg["layer_types"] = ["full_attention"] * cfg["num_hidden_layers"]
    out = run_cli("size", write_config(tmp_path, "all-full", cfg), "--engine", "sglang@0.5.23")
    assert out.code == 2 and out.err.count("\n") == 1 and "needs a sliding layer" in out.err
    # two full-layer shapes: _gemma4_attention_shapes carries one per layer type
    cfg = e2b_shaped()
    cfg["text_config"]["per_layer_config"] = {"4": {"head_dim": 512}}  # layers 9, 14, ... stay at head_dim 256
    out = run_cli("size", write_config(tmp_path, "two-shapes", cfg), "--engine", "sglang@0.5.23")
    assert out.code == 2 and out.err.count("\n") == 1 and "_gemma4_attention_shapes" in out.err


# ---------------------------------------------------------------------------------------------- Step-3.7, SGLang
def test_step37_sglang_hybrid_pools_of_the_flash_file():
    c = _load(STEP_FLASH)
    types = c["layer_types"][:c["num_hidden_layers"]]  # MTP layers hold nothing without speculative decoding
    n_full, n_swa = types.count("full_attention"), types.count("sliding_attention")
    per_layer = c["num_key_value_heads"] * 2 * c["head_dim"] * BF16
    f, s, window = n_full * per_layer, n_swa * per_layer, c["sliding_window"]
    assert (n_full, n_swa, f, s, window) == (12, 33, 49_152, 135_168, 512)
    out = kvjson("size", str(STEP_FLASH), "--engine", "sglang@0.5.23", "--ctx", "8192")
    assert _groups(out) == {"full": (12, 8, 128, None, 8192, (8192 + 1) * f),
                            "sliding": (33, 8, 128, window, window, (window + 1) * s)}
    assert any("Step3p7ForConditionalGeneration" in a for a in out["assumptions"])
    r = _fit(str(STEP_FLASH), "sglang@0.5.23")
    full = int(BUDGET // (f + R * s))
    assert r["engine_details"]["full_max_total_num_tokens"] == full == 68_266
    assert r["engine_details"]["swa_max_total_num_tokens"] == int(full * R) == 54_612
    assert r["max_batch"] == min(full // 8192, int(full * R) // window) == 8


def test_step37_sglang_release_config_pools_only_the_decoder_layers(tmp_path):
    cfg = release_shaped()
    t = cfg["text_config"]
    types = t["layer_types"][:t["num_hidden_layers"]]
    per_layer = t["num_attention_groups"] * 2 * t["head_dim"] * BF16
    n_full, n_swa = types.count("full_attention"), types.count("sliding_attention")
    out = kvjson("size", write_config(tmp_path, "release", cfg), "--engine", "sglang@0.5.23", "--ctx", "1000")
    w = t["sliding_window"]
    assert _groups(out) == {"full": (n_full, 2, 32, None, 1000, n_full * 1001 * per_layer),
                            "sliding": (n_swa, 2, 32, w, w, n_swa * (w + 1) * per_layer)}
    assert (n_full, n_swa) == (2, 6)


# ---------------------------------------------------------------------------------------------- the hybrid split
def test_hybrid_swa_split_0_5_10_versus_0_5_23():
    """MiMo-V2-Flash, a hybrid-SWA architecture in both wheels. 0.5.10 (model_runner_kv_cache_mixin.py): capacity =
    rest // (F + S), full = int(capacity x (F + S) / (F + r S)); 0.5.23: full = int(rest // (F + r S))."""
    c = _load(MIMO)
    pattern = c["hybrid_layer_pattern"]
    f = pattern.count(0) * c["num_key_value_heads"] * (c["head_dim"] + c["v_head_dim"]) * BF16
    s = pattern.count(1) * c["swa_num_key_value_heads"] * (c["swa_head_dim"] + c["swa_v_head_dim"]) * BF16
    budget = 24 << 30
    cap = budget // (f + s)
    old = int(cap * (f + s) / (f + R * s))
    new = int(budget // (f + R * s))
    assert (old, new) == (140_983, 140_985)
    for engine, full in (("sglang@0.5", old), ("sglang@0.5.23", new)):
        d = _fit(str(MIMO), engine, budget=budget)["engine_details"]
        assert (d["max_total_num_tokens"], d["swa_max_total_num_tokens"]) == (full, int(full * R)), engine


# ---------------------------------------------------------------------------------------------- refusals
REFUSALS = [
    # (config, engine, a phrase of the one line)
    (GEMMA_26B, "sglang@0.5", "SGLang 0.5.10 has no Gemma 4 model"),
    (GEMMA_26B, "sglang@0.4", "SGLang 0.5.10 has no Gemma 4 model"),
    (STEP_FLASH, "sglang@0.5", "no Step3p7ForConditionalGeneration"),
    (DSV4_FLASH, "sglang@0.5", "SGLang 0.5.10 has no DeepSeek-V4 model"),
    (DSV4_FLASH, "sglang@0.5.23 --kv-dtype bf16", "fp8_e4m3 only"),  # laid out otherwise: test_dsv4_sglang023.py
    (GEMMA_26B, "trtllm", "KVCacheManagerV2 unconditionally"),
    (STEP_FLASH, "trtllm", "KVCacheManagerV2"),
    (DSV4_FLASH, "trtllm", "KVCacheManagerV2"),
]


@pytest.mark.parametrize("config,engine,phrase", REFUSALS, ids=[f"{p.parent.name}-{e}" for p, e, _ in REFUSALS])
def test_refused_in_one_line(config, engine, phrase):
    out = run_cli("size", str(config), "--engine", *engine.split())
    assert out.code == 2 and out.err.count("\n") == 1 and phrase in out.err and "Traceback" not in out.err
