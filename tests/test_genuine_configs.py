"""Genuine 2026 configs (tests/data/aic-configs, from NVIDIA's aiconfigurator): kvplan either sizes them exactly
or refuses in one line naming the fields it cannot interpret. Before stop 22, three were refused by the schema step
for shapes real configs use (moe_layer_freq per layer, hidden_size_per_layer_input 0, a ModelOpt string
kv_cache_scheme)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

DATA = Path(__file__).with_name("data") / "aic-configs"


def test_an_unknown_family_with_sparse_attention_fields_is_refused(tmp_path):
    """MiniMax-M3 is sized by its own family (tests/test_minimax_m3.py); the same fields under a model_type kvplan
    does not know are still refused in one line, never sized as plain attention."""
    config = json.loads((DATA / "MiniMaxAI--MiniMax-M3_config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "model_type": "minimax_m9"}))
    for command in (["size", str(path)], ["fit", "--gpu", "8xH200", "--model", str(path)]):
        r = run_cli(*command)
        assert r.code == 2 and r.err.count("\n") == 1, r.err
        assert "is not a family kvplan knows" in r.err and "sparse_attention_config" in r.err and "must be" not in r.err


def test_minimax_m3_is_sized_by_its_own_family():
    out = run_cli("size", str(DATA / "MiniMaxAI--MiniMax-M3_config.json"), "--ctx", "8k", "--json").json()
    assert {g["kind"] for g in out["groups"]} == {"full", "indexer"} and not out["warnings"]


def test_a_modelopt_fp8_export_reads_its_quantization():
    out = run_cli("size", str(DATA / "Qwen--Qwen3-32B-FP8-Static-PerTensor_config.json"), "--ctx", "8k", "--json").json()
    assert out["kv_dtype"] == "fp8_e4m3" and out["kv_dtype_source"] == "quantization_config"  # kv_cache_scheme "FP8"
    assert out["weight_dtype"] == "fp8"
    layers, hidden, heads, kv, hd, inter, vocab = 64, 5120, 64, 8, 128, 25600, 151936
    linear = [hidden * heads * hd, hidden * kv * hd, hidden * kv * hd, heads * hd * hidden] + [hidden * inter] * 3
    # fp8 values + an fp32 weight_scale and input_scale per tensor (vLLM 0.32 modelopt.py KFp8StaticTensor: W8A8
    # static), and the fp8 KV cache's k_scale + v_scale per layer
    per_layer = sum(linear) + 8 * len(linear) + 8
    norms = 2 * hidden + 2 * hd  # input/post-attention norms, q_norm, k_norm (bf16)
    expected = layers * (per_layer + 2 * norms) + 2 * (2 * vocab * hidden) + 2 * hidden
    assert out["weight_bytes"] == expected
    assert out["kv_bytes"] == 8192 * 2 * layers * kv * hd * 1


def test_mimo_v2_flash_is_sized_by_its_own_family():
    """hybrid_layer_pattern: 9 full layers (4 KV heads x (192 + 128)) and 39 sliding-128 layers (8 KV heads). vLLM
    gives both kinds one page (81,920 B: 32 full tokens or 16 sliding ones), puts the 39 sliding layers in 5 groups of
    9 slots (6 padding slots) and holds cdiv(window - 1 + 2 x 2048 in-flight, 16) + 1 = 265 blocks per sliding slot."""
    out = run_cli("size", str(DATA / "XiaomiMiMo--MiMo-V2-Flash_config.json"), "--ctx", "32k", "--json").json()
    groups = {g["kind"]: g for g in out["groups"]}
    assert groups["full"]["layers"] == 9 and groups["sliding"]["layers"] == 39
    assert out["kv_bytes_per_token"] == 9 * 4 * (192 + 128) * 2  # one more token adds to the full layers only
    assert groups["full"]["bytes"] == 32768 * 9 * 4 * (192 + 128) * 2
    assert groups["sliding"]["tokens"] == 4224 and groups["sliding"]["bytes"] == 5 * 9 * 265 * 81_920
    assert out["params"] == 308_778_768_832  # transformers 5.24 on meta, same config


def test_minimax_m2_is_a_moe_decoder_not_a_llama_guess():
    """Before stop 22 MiniMax-M2 was sized as a llama-style decoder (with a warning): 4.8 billion parameters for a
    229-billion MoE. Its KV was right; its weights were not."""
    out = run_cli("size", "minimax-m2.5", "--ctx", "8k", "--json").json()
    assert out["params"] == 228_689_748_992  # transformers 5.24 on meta, same config
    assert not any("not a family" in w for w in out["warnings"])
    assert out["kv_bytes_per_token"] == 62 * 2 * 8 * 128 * 2


def test_qwen3_vl_moe_counts_its_experts_and_its_tower():
    """qwen3_vl_moe_text was a llama-style guess without its experts, and its qwen3_vl_moe tower was not modelled."""
    out = run_cli("size", str(DATA / "Qwen--Qwen3-VL-30B-A3B-Instruct_config.json"), "--ctx", "8k", "--json").json()
    assert out["params"] == 31_070_754_032 and not out["warnings"]  # transformers 5.24 on meta, same config


def test_gemma4_26b_a4b_is_sized_by_its_own_family():
    """Refused (num_kv_shared_layers) until Gemma 4 had a family; tests/test_gemma4.py checks it against transformers
    and vLLM. At 8k only the 5 full layers (2 KV heads x 512, K and V) grow: the 25 sliding ones hold 1,023 + 4,096
    in-flight tokens."""
    out = run_cli("size", str(DATA / "google--gemma-4-26B-A4B_config.json"), "--ctx", "8k", "--json").json()
    assert out["params"] == 25_805_933_872 and not out["warnings"]  # transformers 5.24 on meta, same config
    assert out["kv_bytes_per_token"] == 5 * 2 * 512 * 2 * 2


def test_step_3_7_flash_is_sized_by_its_own_family():
    """Refused (num_experts) until Step-3.7 had a family; its llama-style guess was 10.7 billion parameters.
    tests/test_step3p7.py checks it against transformers and vLLM. 12 full + 33 sliding-512 layers, 8 KV heads x 128
    on both: at 8k the hf cache holds 511 tokens in the sliding layers, vLLM 512 + in-flight tokens (one more token
    at 8k adds to the full layers only)."""
    out = run_cli("size", str(DATA / "stepfun-ai--Step-3.7-Flash_config.json"), "--ctx", "8k", "--json").json()
    assert out["params"] == 195_844_496_640 and not out["warnings"]  # transformers 5.24 on meta, same fields
    assert out["kv_bytes_per_token"] == 12 * 2 * 8 * 128 * 2
    groups = {g["kind"]: g for g in out["groups"]}
    assert (groups["full"]["layers"], groups["sliding"]["layers"]) == (12, 33)
    hf = run_cli("size", str(DATA / "stepfun-ai--Step-3.7-Flash_config.json"), "--ctx", "8k", "--engine", "hf",
                 "--json").json()
    assert hf["kv_bytes"] == (12 * 8192 + 33 * 511) * 2 * 8 * 128 * 2


def test_a_weight_format_kvplan_does_not_count_is_said_not_hidden(tmp_path):
    """A quantization_config kvplan has no storage rule for (here ModelOpt's W4A8 AWQ algorithm on the NVFP4
    export's config) is counted unquantized and said to be an upper bound, never silently."""
    cfg = json.loads((DATA / "nvidia--Gemma-4-31B-IT-NVFP4_config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    d = run_cli("size", str(path), "--json").json()
    assert any("W4A8_AWQ" in w and "upper bound" in w for w in d["warnings"])


def test_the_nvfp4_export_counts_its_excluded_attention_in_16_bit():
    """nvidia/Gemma-4-31B-IT-NVFP4 excludes every layer's self_attn (63 patterns with lm_head and the vision tower):
    its attention stays bf16, its MLPs are NVFP4, and no unquantized upper-bound warning remains."""
    d = run_cli("size", str(DATA / "nvidia--Gemma-4-31B-IT-NVFP4_config.json"), "--json").json()
    assert d["weight_dtype"] == "nvfp4" and not any("upper bound" in w for w in d["warnings"])
    bf16 = run_cli("size", str(DATA / "nvidia--Gemma-4-31B-IT-NVFP4_config.json"), "--weight-dtype", "bf16",
                   "--json").json()
    assert d["weight_bytes"] < bf16["weight_bytes"]


# ------------------------------------------------------------------------------------------------------------------
# Genuine Hub configs of families added for issue 12 (tests/data/wild-configs, provenance in its SOURCES.yaml): each
# engine sizes them by their own family, and the figures equal arithmetic written from the file (and, where the source
# lists it, the checkpoint's own parameter total). transformers' meta count and a real forward cover them in
# tests/test_oracle_hf.py (the bundled ones through the catalog-wide checks).
WILD = Path(__file__).with_name("data") / "wild-configs"


def test_lfm2_1_2b_genuine_config_per_engine():
    """LiquidAI/LFM2-1.2B (July 2025 revision): 6 GQA layers (8 KV heads x 64) at full_attn_idxs, 10 short-conv layers
    of conv_dim 2048 and conv_L_cache 3; block_ff_dim 12288 auto-adjusted to int(2 x 12288 / 3) = 8192."""
    path = WILD / "LiquidAI--LFM2-1.2B" / "config.json"
    c = json.loads(path.read_text())
    assert c["full_attn_idxs"] == [2, 5, 8, 10, 12, 14] and c["conv_L_cache"] == 3 and c["transformers_version"] == "4.54.0.dev0"
    h, v, ff, attn, conv = 2048, 65536, 8192, 6, 10
    mixer_conv = 3 * h * h + h * 3 + h * h  # in_proj (B, C, x), depthwise conv weight [h, 1, 3], out_proj; no biases
    mixer_attn = h * h + 2 * (8 * 64) * h + h * h + 2 * 64  # q, k, v, o; q_layernorm, k_layernorm
    per_layer = 3 * h * ff + 2 * h  # SwiGLU w1, w3, w2; operator and ffn norms
    params = v * h + h + conv * mixer_conv + attn * mixer_attn + 16 * per_layer  # tied lm_head
    assert params == 1_170_340_608  # the mirror's model_files.json: model.safetensors total_parameters
    kv = 4096 * attn * 2 * 8 * 64  # elements of K and V at ctx 4096, one sequence
    for engine, kv_bytes, state in (("hf", 2 * kv, conv * h * 3 * 2),  # conv_states [1, h, L] in bf16
                                    ("llamacpp", 2 * kv, conv * h * 2 * 4)):  # r rows h x (L - 1) in f32
        out = run_cli("size", str(path), "--ctx", "4096", "--engine", engine, "--json").json()
        assert out["params"] == params and out["kv_bytes"] == kv_bytes + state, engine
    for engine in ("vllm", "sglang"):
        out = run_cli("size", str(path), "--ctx", "4096", "--engine", engine, "--json").json()
        assert out["params"] == params and out["kv_bytes_per_token"] == attn * 2 * 8 * 64 * 2, engine
        assert {g["kind"]: g["layers"] for g in out["groups"]} == {"conv_state": conv, "full": attn}, engine


def test_kimi_linear_48b_genuine_config_per_engine():
    """moonshotai/Kimi-Linear-48B-A3B-Instruct (grade B copy): 20 KDA layers (1-based kda_layers) of 32 heads x 128
    with a 4-tap short conv, 7 MLA layers (full_attn_layers 4, 8, ..., 27) caching the 512 latent + 64 rope key; its
    parameters are the checkpoint listing's 49,122,681,728 (the model report the file comes from)."""
    path = WILD / "moonshotai--Kimi-Linear-48B-A3B-Instruct" / "config.json"
    c = json.loads(path.read_text())
    lac = c["linear_attn_config"]
    assert len(lac["kda_layers"]) == 20 and lac["full_attn_layers"] == [4, 8, 12, 16, 20, 24, 27]
    mla = len(lac["full_attn_layers"]) * (c["kv_lora_rank"] + c["qk_rope_head_dim"])  # elements per token
    h, d, k = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    for engine, state in (("hf", 20 * (3 * h * d * k * 2 + h * d * d * 4)),  # conv [1, 3HD, k] bf16 + fp32 [H, D, D]
                          ("llamacpp", 20 * (3 * (k - 1) * h * d + d * d * h) * 4)):  # f32 r and s rows
        out = run_cli("size", str(path), "--ctx", "4096", "--engine", engine, "--json").json()
        assert out["params"] == 49_122_681_728, engine
        assert out["kv_bytes"] == 4096 * mla * 2 + state, engine
    for engine in ("vllm", "sglang"):
        out = run_cli("size", str(path), "--ctx", "4096", "--engine", engine, "--json").json()
        assert out["params"] == 49_122_681_728 and out["kv_bytes_per_token"] == mla * 2, engine
        assert {g["kind"]: g["layers"] for g in out["groups"]} == {"linear_state": 20, "mla": 7}, engine
