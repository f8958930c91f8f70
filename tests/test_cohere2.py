"""Cohere2 (model_type cohere2: Command-R7B, Command-A): three sliding-window RoPE layers, then one full NoPE layer.

Oracles, none written here: transformers' model code (tests/test_oracle_hf.py: parameters on meta and the cache of a
real forward, three scaled configs) and vLLM 0.32's CPU build (tests/oracle_vllm.py models cohere2 and cohere2-odd,
seven cases, and their rotary tables). No genuine config.json could be found (the Hub is unreachable here and no
public copy turned up), so the shape below is Command-R7B's as the module print of a public 4-bit copy shows it
(q_proj 4096 -> 4096, k/v_proj 4096 -> 1024, MLP 14336, embedding 256000 x 4096, 32 layers), with the window and
pattern of transformers' Cohere2Config. What is left here: the layer pattern, figures from the engines' formulas
written out, and one-line refusals.
"""

from __future__ import annotations

import pytest

from conftest import kvjson, run_cli, write_config

R7B = {
    "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "vocab_size": 256000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "sliding_window": 4096, "sliding_window_pattern": 4, "max_position_embeddings": 131072, "logit_scale": 0.25,
    "rope_theta": 50000.0, "torch_dtype": "bfloat16",
}
SLIDING = [i for i in range(32) if (i + 1) % 4]  # Cohere2Config: (i + 1) % sliding_window_pattern != 0 slides


def layers(d: dict) -> dict[str, list[int]]:
    return {g["kind"]: g["layer_ids"] for g in d["groups"]}


def test_pattern_and_layer_types_give_the_same_layers_and_no_unknown_family_warning(tmp_path):
    types = ["sliding_attention" if i in SLIDING else "full_attention" for i in range(32)]
    no_key = {k: v for k, v in R7B.items() if k != "sliding_window_pattern"}  # the class default 4
    runs = [kvjson("size", write_config(tmp_path, name, cfg), "--ctx", "8192", "--engine", "hf", "--kv-dtype", "fp16")
            for name, cfg in (("a", R7B), ("b", {**R7B, "layer_types": types}), ("c", no_key))]
    for d in runs:
        assert layers(d) == {"sliding": SLIDING, "full": [3, 7, 11, 15, 19, 23, 27, 31]}
        assert d["family"] == "cohere2" and d["warnings"] == []
    assert runs[0]["kv_bytes"] == runs[1]["kv_bytes"] == runs[2]["kv_bytes"]


def test_params_are_the_parallel_block_with_one_layernorm_and_tied_embeddings(tmp_path):
    per_layer = (4096 * 4096 * 2 + 4096 * 1024 * 2  # q, o; k, v (8 KV heads x 128)
                 + 3 * 4096 * 14336  # gate, up, down
                 + 4096)  # input_layernorm (weight only; no post-attention norm: attention and MLP side by side)
    params = 256000 * 4096 + 32 * per_layer + 4096  # embedding (tied: no lm_head), layers, final norm
    assert params == 8_028_033_024
    d = kvjson("size", write_config(tmp_path, "m", R7B), "--ctx", "1000", "--engine", "hf")
    assert d["params"] == params


def test_hf_keeps_window_minus_one_tokens_on_the_sliding_layers(tmp_path):
    d = kvjson("size", write_config(tmp_path, "m", R7B), "--ctx", "8192", "--engine", "hf", "--kv-dtype", "fp16")
    row = 2 * 8 * 128 * 2  # K and V x 8 KV heads x head_dim 4096 / 32 x fp16
    assert d["kv_bytes"] == 24 * 4095 * row + 8 * 8192 * row


def test_vllm_0_32_slides_over_window_plus_one_and_older_rule_sets_over_the_window(tmp_path):
    """vLLM 0.32 models/commandr.py: per_layer_sliding_window = sliding_window + 1; the vLLM oracle's cohere2-odd
    model (window 1025) shows the extra block this costs on the CPU build."""
    path = write_config(tmp_path, "m", R7B)
    new = kvjson("size", path, "--ctx", "32768", "--engine", "vllm@0.32")
    old = kvjson("size", path, "--ctx", "32768", "--engine", "vllm@0.25")
    assert {g["kind"]: g["window"] for g in new["groups"]} == {"sliding": 4097, "full": None}
    assert {g["kind"]: g["window"] for g in old["groups"]} == {"sliding": 4096, "full": None}
    assert any("sliding_window + 1" in a for a in new["assumptions"])


def test_sglang_gives_the_sliding_layers_full_length_cache(tmp_path):
    """SGLang 0.5.10: Cohere2ForCausalLM is not in model_config.py is_hybrid_swa_model, one token pool for all."""
    d = kvjson("size", write_config(tmp_path, "m", R7B), "--ctx", "8192", "--engine", "sglang@0.5", "--kv-dtype", "bf16")
    row = 2 * 8 * 128 * 2
    assert d["kv_bytes_per_token"] == 32 * row
    assert {g["tokens"] for g in d["groups"]} == {8192}


def test_llamacpp_swa_cells_cover_window_plus_ubatch(tmp_path):
    """llama.cpp b11434 cohere2: layers il % 4 < 3 in the SWA cache of PAD(n_swa + n_ubatch, 256) cells."""
    d = kvjson("size", write_config(tmp_path, "m", R7B), "--ctx", "16384", "--engine", "llamacpp", "--kv-dtype", "fp16")
    cells = {g["kind"]: g["tokens"] for g in d["groups"]}
    assert cells == {"sliding": 4096 + 512, "full": 16384}


def test_rotary_table_spans_model_max_length_when_given(tmp_path):
    """commandr.py (vLLM and SGLang): max_position = model_max_length or max_position_embeddings, head_dim wide."""
    from kvplan.architectures import normalize

    assert [(t.rows, t.dim) for t in normalize(R7B).rope_tables] == [(131072, 128)]
    assert [(t.rows, t.dim) for t in normalize({**R7B, "model_max_length": 8192}).rope_tables] == [(8192, 128)]


def test_trtllm_keeps_every_layer_full_length(tmp_path):
    """TensorRT-LLM's modeling_cohere2.py passes the window per forward (attention_window_size); the V1 manager holds
    every layer at full length unless max_attention_window is set: 32 layers x 2 x 8 KV heads x 128 x 2 B per
    token, 8192 tokens = 256 blocks of 32 per request."""
    d = kvjson("size", write_config(tmp_path, "m", R7B), "--ctx", "8192", "--batch", "2", "--engine", "trtllm")
    assert d["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    assert d["kv_bytes"] == 2 * 256 * 32 * 32 * 2 * 8 * 128 * 2
    assert {g["tokens"] for g in d["groups"]} == {8192}


@pytest.mark.parametrize("change, says", [
    ({"head_dim": 64}, "head_dim 64 is not hidden_size // num_attention_heads"),
    ({"attention_bias": True}, "attention_bias true"),
    ({"use_qk_norm": True}, "use_qk_norm true"),
    ({"sliding_window": None}, "sliding_window is None"),
    ({"sliding_window_pattern": 0}, "sliding_window_pattern must be a positive"),
    ({"layer_types": ["sliding_attention"] * 31}, "layer_types must list one entry per layer (32)"),
])
def test_configs_the_engines_read_differently_are_refused_in_one_line(tmp_path, change, says):
    r = run_cli("size", write_config(tmp_path, "m", {**R7B, **change}), "--ctx", "1000")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("engine, change, says", [
    ("sglang@0.4", {}, "stub"),
    ("llamacpp", {"layer_types": ["sliding_attention", "full_attention"] * 16}, "il % 4 < 3"),
])
def test_engines_kvplan_has_not_read_or_that_run_another_model_refuse_in_one_line(tmp_path, engine, change, says):
    r = run_cli("size", write_config(tmp_path, "m", {**R7B, **change}), "--ctx", "1000", "--engine", engine)
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err
