"""LFM2 (model_type lfm2): gated short-convolution layers and attention layers.

Oracles, none written here: transformers' model code (tests/test_oracle_hf.py: parameters on meta and the cache of a
real forward for scaled configs) and vLLM 0.32's CPU build (tests/oracle_vllm.py models lfm2 and lfm2-wide, nine
cases); and a vLLM 0.26.0 start-up log from the wild (below). The bundled lfm2-1.2b is LiquidAI/LFM2-1.2B's config.json
from a GitHub mirror of the Hub repo (model_configs/SOURCES.md). What is left: the layer pattern from the two config
forms, figures written from the engines' formulas, and one-line refusals.
"""

from __future__ import annotations

import pytest
import yaml

from conftest import DATA, kvjson, run_cli, write_config
from test_engine_logs import printed
from test_qwen3_5 import assert_between, fit_ends, log_capacity

# LiquidAI/LFM2-1.2B's cache-relevant fields (16 layers, full_attn_idxs [2, 5, 8, 10, 12, 14], hidden 2048, 32 heads,
# 8 KV heads, conv_L_cache 3) as a public test quotes its config.json; the MLP fields are transformers' defaults
LFM2_1B2 = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "conv_L_cache": 3,
    "conv_bias": False, "conv_dim": 2048, "block_dim": 2048, "full_attn_idxs": [2, 5, 8, 10, 12, 14],
    "max_position_embeddings": 128000, "torch_dtype": "bfloat16",
}


def groups(d: dict) -> dict[str, int]:
    return {g["kind"]: g["layers"] for g in d["groups"]}


def test_full_attn_idxs_and_layer_types_give_the_same_layers(tmp_path):
    types = ["full_attention" if i in LFM2_1B2["full_attn_idxs"] else "conv" for i in range(16)]
    a = kvjson("size", write_config(tmp_path, "a", LFM2_1B2), "--ctx", "1000", "--engine", "hf", "--kv-dtype", "fp16")
    b = kvjson("size", write_config(tmp_path, "b", {**LFM2_1B2, "full_attn_idxs": None, "layer_types": types}),
               "--ctx", "1000", "--engine", "hf", "--kv-dtype", "fp16")
    assert groups(a) == groups(b) == {"conv_state": 10, "full": 6}
    assert a["kv_bytes"] == b["kv_bytes"]


def test_hf_cache_is_attention_kv_plus_a_full_kernel_conv_window(tmp_path):
    """transformers: DynamicLayer K/V on the 6 attention layers, LinearAttentionLayer conv_states [1, 2048, 3] fp16
    on the 10 conv layers (cache_utils.py lazy_initialization keeps the whole kernel width)."""
    d = kvjson("size", write_config(tmp_path, "m", LFM2_1B2), "--ctx", "1000", "--engine", "hf", "--kv-dtype", "fp16")
    per_token = 6 * 2 * 8 * 64 * 2  # layers x (K, V) x KV heads x head_dim (2048 / 32) x fp16
    assert d["kv_bytes_per_token"] == per_token
    assert d["kv_bytes"] == 1000 * per_token + 10 * 2048 * 3 * 2


def test_no_layer_list_means_every_layer_is_attention(tmp_path):
    """Lfm2Config: full_attn_idxs defaults to every layer when neither list is given."""
    cfg = {k: v for k, v in LFM2_1B2.items() if k != "full_attn_idxs"}
    d = kvjson("size", write_config(tmp_path, "m", cfg), "--ctx", "1000", "--engine", "hf", "--kv-dtype", "fp16")
    assert groups(d) == {"full": 16}


@pytest.mark.parametrize("change, says", [
    ({"conv_dim": 1024}, "conv_dim 1024 differs from hidden_size"),
    ({"block_dim": 1024}, "block_dim 1024 differs from hidden_size"),
    ({"head_dim": 128}, "head_dim 128 differs"),
    ({"full_attn_idxs": None, "layer_types": ["conv"] * 15}, "layer_types must list"),
    ({"full_attn_idxs": None, "layer_types": ["mamba"] * 16}, "layer_types must list"),
    ({"block_ffn_dim_multiplier": None, "block_ff_dim": 1000}, "block_ffn_dim_multiplier null"),
])
def test_configs_the_engines_read_differently_are_refused_in_one_line(tmp_path, change, says):
    r = run_cli("size", write_config(tmp_path, "m", {**LFM2_1B2, **change}), "--ctx", "1000")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("engine", ["trtllm", "sglang@0.4"])
def test_engines_kvplan_has_not_read_refuse_in_one_line(tmp_path, engine):
    r = run_cli("size", write_config(tmp_path, "m", LFM2_1B2), "--ctx", "1000", "--engine", engine)
    assert r.code == 2 and "LFM2" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_vllm_tp_must_divide_the_conv_width(tmp_path):
    cfg = {**LFM2_1B2, "hidden_size": 2050, "conv_dim": 2050, "block_dim": 2050, "num_attention_heads": 4,
           "num_key_value_heads": 4}
    r = run_cli("size", write_config(tmp_path, "m", cfg), "--ctx", "1000", "--engine", "vllm", "--tp", "4")
    assert r.code == 2 and "conv_dim 2050" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_lfm2_moe_needs_layer_types(tmp_path):
    """Lfm2MoeConfig has no full_attn_idxs fallback: without layer_types transformers cannot build the layers."""
    cfg = {**{k: v for k, v in LFM2_1B2.items() if k != "full_attn_idxs"}, "model_type": "lfm2_moe",
           "architectures": ["Lfm2MoeForCausalLM"], "num_experts": 32, "moe_intermediate_size": 1792,
           "intermediate_size": 7168}
    r = run_cli("size", write_config(tmp_path, "m", cfg), "--ctx", "1000")
    assert r.code == 2 and "layer_types" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_lfm2_moe_dense_layers_then_experts(tmp_path):
    """Lfm2MoeDecoderLayer: Lfm2MoeMLP (w1, w3, w2 of intermediate_size) below num_dense_layers, then a router
    [experts, hidden], the fp32 expert_bias [experts] and experts gate_up [experts, 2 x moe_inter, hidden] + down."""
    types = ["full_attention" if i in LFM2_1B2["full_attn_idxs"] else "conv" for i in range(16)]
    base = {**{k: v for k, v in LFM2_1B2.items() if k != "full_attn_idxs"}, "model_type": "lfm2_moe",
            "architectures": ["Lfm2MoeForCausalLM"], "layer_types": types, "num_experts": 8,
            "moe_intermediate_size": 256, "intermediate_size": 1024, "num_dense_layers": 2}
    more = {**base, "num_dense_layers": 3}
    p = [kvjson("size", write_config(tmp_path, n, c), "--ctx", "16")["params"] for n, c in (("a", base), ("b", more))]
    h = 2048
    dense, sparse = 3 * h * 1024, 8 * h + 8 + 8 * 3 * 256 * h
    assert p[1] - p[0] == dense - sparse


def test_sglang_keeps_a_conv_window_and_no_temporal_state(tmp_path):
    """SGLang 0.5.10 configs/lfm2.py mamba2_cache_params: Mamba2StateShape(intermediate hidden_size, n_groups 1,
    state_size 0) -> conv (2048 / tp, 3 - 1) in bf16 per request on the 10 conv layers, temporal (1, 2048, 0): no bytes."""
    d = kvjson("size", write_config(tmp_path, "m", LFM2_1B2), "--ctx", "1000", "--engine", "sglang", "--batch", "2")
    state = [g for g in d["groups"] if g["kind"] == "conv_state"][0]
    assert state["bytes"] == 2 * 10 * 2048 * 2 * 2
    d2 = kvjson("size", write_config(tmp_path, "m2", LFM2_1B2), "--ctx", "1000", "--engine", "sglang", "--batch", "2",
                "--tp", "2")
    assert [g for g in d2["groups"] if g["kind"] == "conv_state"][0]["bytes"] == 2 * 10 * 1024 * 2 * 2


def test_vllm_0_26_lfm2_5_log_with_prefix_caching():
    """A vLLM 0.26.0 start-up of LFM2.5-1.2B-Instruct (tests/data/wild-logs.yaml; fp8 KV, --block-size 16,
    prefix caching with --mamba-cache-mode align, max_model_len 32,768; loaded from a local path): its 2.18 GiB bf16
    checkpoint is LFM2-1.2B's parameter count, and the bundled lfm2-1.2b layout gives what it printed. A conv state of
    2 x 2,048 x 2 B = 8,192 B padded to the 16-token fp8 attention page (16 x 8 x 64 x 2 = 16,384 B: "100.00%");
    10 short-conv layers in groups of the 6 attention layers (2 padding slots, "20.00%"); each request 2,048 attention
    blocks + 2 state pages in each of the 2 conv groups; 2,324,244 tokens and 70.93x at both ends of the printed
    13.33 GiB. With one state page per group (prefix caching off) the concurrency would be above what was printed."""
    case = {c["id"]: c for c in yaml.safe_load((DATA / "wild-logs.yaml").read_text())}[
        "vllm-lfm2.5-1.2b-instruct-1xsm90-tp1-len32768-fp8kv-gmu0.95-align-block16-v0.26.0"]
    log = case["log"]
    assert "Checkpoint size: 2.18 GiB" in log and "Resolved architecture: Lfm2ForCausalLM" in log
    params = kvjson("size", "lfm2-1.2b", "--ctx", "16")["params"]
    assert f"{params * 2 / 2**30:.2f}" == "2.18"
    tokens, concurrency = log_capacity(log)
    budget = printed(log, r"Available KV cache memory: ([\d.]+) GiB")
    common = ("--gpu", "H100", "--engine", "vllm@0.26.0", "--kv-dtype", "fp8", "--block-size", "16", "--ctx", "32768",
              "--max-model-len", "32768", "--max-num-batched-tokens", "1024", "--max-num-seqs", "256")
    ends = fit_ends("lfm2-1.2b", budget, *common, "--enable-prefix-caching")
    assert_between(ends, tokens, concurrency)
    assert ends[1]["engine_details"]["blocks_per_request"] == 32768 // 16 + 2 * 2
    off = fit_ends("lfm2-1.2b", budget, *common, "--no-enable-prefix-caching")
    assert off[0]["concurrency"] > concurrency
