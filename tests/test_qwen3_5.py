"""Qwen3.5 / Qwen3.6 (qwen3_5, qwen3_5_moe): Gated DeltaNet linear attention with every fourth layer full attention.

Oracles, none written here: vLLM start-up logs from the wild (tests/data/wild-logs.yaml, figures read from the log
text), transformers' model code (tests/test_oracle_hf.py covers the three bundled configs: parameters on meta,
vision tower included, and the cache of a real forward) and llama.cpp (tests/oracle_llamacpp.py, the qwen35 cases).
vLLM's CPU build cannot import its Qwen3.5 module here (torchvision), so the logs carry the vLLM rules:
the SSM state in the dtype the config names (mamba_ssm_dtype float32) and prefix caching's 'align' state blocks.
"""

from __future__ import annotations

import copy
import json
import math
import re
from decimal import Decimal

import pytest
import yaml

from conftest import DATA, kvjson, run_cli, write_config
from test_engine_logs import interval, printed

GiB = 1 << 30
ROOT = DATA.parent.parent / "model_configs"


@pytest.fixture(scope="module")
def wild() -> dict:
    return {c["id"]: c for c in yaml.safe_load((DATA / "wild-logs.yaml").read_text())}


def bundled(dirname: str) -> dict:
    return json.loads((ROOT / dirname / "config.json").read_text())


def fit_ends(model: str, budget: Decimal, *args: str) -> list[dict]:
    """kvplan at both ends of the budget a log printed to 2 decimals: the log's figures must lie between."""
    lo, hi = interval(budget, GiB)
    return [kvjson("fit", "--model", model, *args, "--kv-budget", f"{b}B")["results"][0]
            for b in (math.ceil(lo), math.ceil(hi) - 1)]


def assert_between(ends: list[dict], tokens: int, concurrency: float) -> None:
    assert ends[0]["kv_capacity_tokens"] <= tokens <= ends[1]["kv_capacity_tokens"], (tokens, ends)
    assert ends[0]["concurrency"] <= concurrency <= ends[1]["concurrency"], (concurrency, ends)


def log_capacity(log: str) -> tuple[int, float]:
    return (int(printed(log, r"GPU KV cache size: ([\d,]+) tokens")),
            float(printed(log, r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x")))


# ---------------------------------------------------------------------------------------------- vLLM logs
def test_vllm_0_24_qwen3_6_35b_a3b_capacity(wild, tmp_path):
    """noonghunna/club-3090 (vLLM v0.24.0, Qwen3.6-35B-A3B on one RTX 5090, fp8 KV, prefix caching, max_model_len 131,072): from the
    printed 'Available KV cache memory', the printed tokens and concurrency. The SSM state in the config's float32
    makes a 2,146,304-byte state page, attention blocks of 2,096 tokens, and 63 + 3 x 2 blocks per request."""
    case = wild["vllm-qwen3.6-35b-a3b-nvfp4-1xrtx5090-len131072-fp8kv"]
    log, mml = case["log"], str(case["max_model_len"])
    assert "(v0.24.0)" in log and "'enable_prefix_caching': True" in log  # asked for: 0.24 leaves it off for hybrids
    args = ("--gpu", "RTX5090", "--kv-dtype", "fp8", "--engine", "vllm@0.24.0", "--ctx", mml, "--max-model-len", mml,
            "--enable-prefix-caching")
    budget = printed(log, r"Available KV cache memory: ([\d.]+) GiB")
    tokens, concurrency = log_capacity(log)
    ends = fit_ends("qwen3.5-35b-a3b", budget, *args)
    assert_between(ends, tokens, concurrency)
    assert ends[1]["engine_details"]["block_size"] == 2096
    assert ends[1]["engine_details"]["blocks_per_request"] == math.ceil(131072 / 2096) + 3 * 2

    # the log discriminates: read with the conv state's bf16 (a config without mamba_ssm_dtype), 4% too many tokens
    no_field = bundled("Qwen--Qwen3.5-35B-A3B")
    del no_field["text_config"]["mamba_ssm_dtype"]
    other = fit_ends(write_config(tmp_path, "no-ssm-dtype", no_field), budget, *args)
    assert other[0]["kv_capacity_tokens"] > tokens * 1.04


def test_vllm_0_18_qwen3_5_35b_a3b_prefix_caching_asked_for(wild):
    """guardkit/guardkit (vLLM 0.18.1rc1, Qwen3.5-35B-A3B-FP8 on a GB10, bf16 KV, --enable-prefix-caching,
    max_model_len 262,144): the printed block size, tokens and concurrency. From 0.17 the SSM state takes the config's
    float32 (a 2,146,304-byte state, block 1,056 where the conv dtype gives 544); prefix caching, asked for, puts the
    Gated DeltaNet groups in 'align' mode (2 pages each). Without the flag vLLM 0.18 leaves prefix caching off for
    hybrids (is_prefix_caching_supported), one page a group: more concurrency than the log shows."""
    case = wild["vllm-qwen3.5-35b-a3b-fp8-1xgb10-tp1-len262144-gmu0.8-prefix-align-v0.18.1rc1"]
    log, mml = case["log"], str(case["max_model_len"])
    assert "(v0.18.1rc1" in log and "'enable_prefix_caching': True" in log and "set to 'align'" in log
    block = int(printed(log, r"Setting attention block size to (\d+) tokens"))
    budget = printed(log, r"Available KV cache memory: ([\d.]+) GiB")
    tokens, concurrency = log_capacity(log)
    common = ("--gpu", "128GB", "--engine", "vllm@0.18.1rc1", "--ctx", mml, "--max-model-len", mml)
    ends = fit_ends("qwen3.5-35b-a3b", budget, *common, "--enable-prefix-caching")
    assert_between(ends, tokens, concurrency)
    assert ends[1]["engine_details"]["block_size"] == block == 1056
    assert ends[1]["engine_details"]["blocks_per_request"] == math.ceil(262144 / block) + 3 * 2

    default = fit_ends("qwen3.5-35b-a3b", budget, *common)
    assert default[1]["engine_details"]["blocks_per_request"] == math.ceil(262144 / block) + 3
    assert default[0]["concurrency"] > concurrency * 1.01
    # the same log read with 0.15's rules (SSM state in the conv state's bf16): another block, other figures
    old = fit_ends("qwen3.5-35b-a3b", budget, *common[:3], "vllm@0.15", *common[4:], "--enable-prefix-caching")
    assert old[1]["engine_details"]["block_size"] == 544 and old[1]["concurrency"] > concurrency * 1.01


def test_vllm_qwen3_8_27b_two_rtx3090_tp2(wild):
    """mitchross/talos-argocd-proxmox PR 1995 (2x RTX 3090, TP 2, fp8_e4m3 KV, max_model_len 131,072): the PR's
    '2 x 4.99 = 9.98 GiB pool' gives its printed 302,921 tokens and 2.31x. The PR text describes the Qwen3.5-27B
    layout (16 of 64 layers full attention, 4 KV heads x 256), which the bundled qwen3.5-27b has."""
    case = wild["vllm-qwen3.8-27b-fp8-2xrtx3090-tp2-len131072-fp8kv-gmu0.92"]
    budget = Decimal(re.search(r"(\d+\.\d+) = [\d.]+ GiB pool", case["notes"]).group(1))
    tokens, concurrency = log_capacity(case["log"])
    mml = str(case["max_model_len"])
    ends = fit_ends("qwen3.5-27b", budget, "--gpu", "2xRTX3090", "--tp", "2", "--kv-dtype", "fp8",
                    "--engine", "vllm@0.33", "--ctx", mml, "--max-model-len", mml)
    assert_between(ends, tokens, concurrency)


# ---------------------------------------------------------------------------------------------- the rules
def state_block(ssm_bytes: int, alignment: int = 16) -> int:
    """vLLM's hybrid page: attention blocks grow (in multiples of the alignment) until a block's K/V page holds one
    layer's state page. Qwen3.5-27B: conv state (2 x 16 x 128 + 48 x 128) x 3 in bf16, SSM state 48 x 128 x 128; K/V
    2 x 4 x 256 x 2 B. The alignment is 16 (the block size), or lcm(16, 64) = 64 in vLLM 0.33 when the Gated DeltaNet
    prefill runs on FlashInfer (Hopper, as size assumes) and prefix caching exports its checkpoints."""
    state = (2 * 16 * 128 + 48 * 128) * 3 * 2 + 48 * 128 * 128 * ssm_bytes
    return math.ceil(state / (2 * 4 * 256 * 2) / alignment) * alignment


@pytest.mark.parametrize("flag, ssm_bytes", [
    (None, 4),  # the config's mamba_ssm_dtype float32 (vLLM Qwen3_5ForConditionalGenerationConfig)
    ("bf16", 2),  # a flag wins over the config (vLLM warns and uses the flag)
])
@pytest.mark.parametrize("engine, alignment", [("vllm@0.32", 16), ("vllm@0.33", 64)])
def test_vllm_ssm_state_dtype_follows_the_config_unless_told(flag, ssm_bytes, engine, alignment):
    args = ["size", "qwen3.5-27b", "--ctx", "1024", "--engine", engine] + (["--mamba-ssm-cache-dtype", flag] if flag else [])
    assert kvjson(*args)["engine_details"]["block_size"] == state_block(ssm_bytes, alignment)


def test_the_config_field_is_what_decides(tmp_path):
    """Without mamba_ssm_dtype, Qwen3.5 keeps the conv state's dtype (bf16), as Qwen3-Next does."""
    cfg = bundled("Qwen--Qwen3.5-27B")
    del cfg["text_config"]["mamba_ssm_dtype"]
    d = kvjson("size", write_config(tmp_path, "q", cfg), "--ctx", "1024", "--engine", "vllm@0.32")
    assert d["engine_details"]["block_size"] == state_block(2)


# vLLM 0.33: layers/mamba/gdn/qwen_gdn_linear_attn.py picks FlashInfer for the GDN prefill on SM90, and on SM10x /
# SM12x when linear_key_head_dim is 128 (CUDA 13, the PyPI wheel's); with prefix caching ('align') each GDN spec then
# holds one prefill-checkpoint page more (2 + 1) and the hybrid block is a multiple of 64. Ampere keeps Triton.
@pytest.mark.parametrize("engine, gpu, alignment, pages", [
    ("vllm@0.32", "H100", 16, 2), ("vllm@0.33", "H100", 64, 3), ("vllm@0.33", "B200", 64, 3),
    ("vllm@0.33", "A100-80GB", 16, 2), ("vllm@0.33", "L40S", 16, 2),
])
def test_vllm_0_33_gdn_flashinfer_prefill_keeps_a_checkpoint_page(engine, gpu, alignment, pages):
    ctx = 32768
    r = kvjson("fit", "--model", "qwen3.5-27b", "--gpu", gpu, "--engine", engine, "--ctx", str(ctx),
               "--max-model-len", str(ctx), "--kv-budget", "40GiB")["results"][0]
    block = state_block(4, alignment)
    assert r["engine_details"]["block_size"] == block
    # 16 full-attention layers take cdiv(ctx, block) blocks, the 48 GDN layers `pages` each, in groups of 16 layers
    assert r["engine_details"]["blocks_per_request"] == math.ceil(ctx / block) + 3 * pages
    off = kvjson("fit", "--model", "qwen3.5-27b", "--gpu", gpu, "--engine", engine, "--ctx", str(ctx),
                 "--max-model-len", str(ctx), "--kv-budget", "40GiB", "--no-enable-prefix-caching")["results"][0]
    assert off["engine_details"]["blocks_per_request"] == math.ceil(ctx / state_block(4)) + 3  # one page, block 16s


def test_layer_pattern_and_kv_per_token():
    d = kvjson("size", "qwen3.5-397b-a17b", "--ctx", "4096")
    assert {g["kind"]: g["layers"] for g in d["groups"]} == {"linear_state": 45, "full": 15}
    full = next(g for g in d["groups"] if g["kind"] == "full")
    assert full["layer_ids"] == list(range(3, 60, 4))
    # 15 full-attention layers x 2 KV heads x 256 x 2 (K, V) x 2 bytes
    assert d["kv_bytes_per_token"] == 15 * 2 * 256 * 2 * 2


def test_newer_vision_model_type_names_are_the_same_tower(tmp_path):
    """transformers 5.7 writes vision_config.model_type qwen3_5_vision / qwen3_5_moe_vision (the Qwen3.6 configs)."""
    base = bundled("Qwen--Qwen3.5-35B-A3B")
    renamed = copy.deepcopy(base)
    renamed["vision_config"]["model_type"] = "qwen3_5_moe_vision"
    a = kvjson("size", write_config(tmp_path, "a", base), "--ctx", "1024")
    b = kvjson("size", write_config(tmp_path, "b", renamed), "--ctx", "1024")
    assert a["params"] == b["params"] and not any("vision tower" in w for w in b.get("warnings", []))


@pytest.mark.parametrize("drop, field", [("num_experts", "num_experts"), ("moe_intermediate_size", "moe_intermediate_size")])
def test_a_moe_config_missing_its_expert_fields_is_refused(tmp_path, drop, field):
    cfg = bundled("Qwen--Qwen3.5-35B-A3B")
    del cfg["text_config"][drop]
    r = run_cli("size", write_config(tmp_path, "m", cfg), "--ctx", "1024")
    assert r.code == 2 and field in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("value, says", [("float64", "must be float32, bfloat16, float16 or auto"), (5, "must be a string")])
def test_a_malformed_ssm_dtype_is_one_line(tmp_path, value, says):
    cfg = bundled("Qwen--Qwen3.5-27B")
    cfg["text_config"]["mamba_ssm_dtype"] = value
    r = run_cli("size", write_config(tmp_path, "d", cfg), "--ctx", "1024")
    assert r.code == 2 and says in r.err and "mamba_ssm_dtype" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_vllm_0_27_1_qwen3_8_27b_without_prefix_caching(wild):
    """A Qwen3_5ForConditionalGeneration start-up under vLLM 0.27.1 on a GB10 (tests/data/wild-logs.yaml; the
    qwen3.5-27b layout, bf16 KV, --no-enable-prefix-caching, max_model_len 32,768): the SSM state in the config's
    float32 (block 784, printed by the same command's first boot), one state page a group; 786,432 tokens, 24.00x."""
    case = wild["vllm-qwen3.8-27b-bf16-1xgb10-tp1-len32768-no-prefix-caching-v0.27.1"]
    log = case["log"]
    assert "version 0.27.1" in log and "'enable_prefix_caching': False" in log
    tokens, concurrency = log_capacity(log)
    ends = fit_ends("qwen3.5-27b", printed(log, r"Available KV cache memory: ([\d.]+) GiB"), "--gpu", "128GB",
                    "--engine", "vllm@0.27.1", "--no-enable-prefix-caching", "--ctx", "32768", "--max-model-len", "32768")
    assert_between(ends, tokens, concurrency)
    assert ends[1]["engine_details"]["block_size"] == int(printed(log, r"Setting attention block size to (\d+) tokens"))
