"""The worked examples of engines.md (the engine-sizing reference), each through the CLI's JSON.

The figures below are copied from that document's worked examples (sections 1.7, 2.5, 3.4, 4.2, 5.3); the
Gemma-3-27B examples use its published config facts (62 layers, 16 KV heads, head_dim 128, window 1024,
pattern 6), written as a config here because that model is not bundled.
"""

from __future__ import annotations

import pytest

from conftest import kvjson, write_config

GiB, MiB = 1 << 30, 1 << 20


def fit1(*args: str) -> dict:
    return kvjson("fit", *args)["results"][0]


# ---------------------------------------------------------------------------------------------- vLLM (1.7)
def test_llama2_7b_blocks_tokens_concurrency():
    s = kvjson("size", "llama-2-7b", "--ctx", "4096")
    assert s["kv_bytes_per_token"] == 524_288 and s["engine_details"]["bytes_per_block"] == 8 * MiB
    r = fit1("--gpu", "H100", "--model", "llama-2-7b", "--ctx", "4096", "--kv-budget", "20GiB", "--engine", "vllm@0.19")
    assert r["engine_details"]["num_gpu_blocks"] == 2560
    assert r["kv_capacity_tokens"] == 40_960 and r["concurrency"] == 10.00


@pytest.mark.parametrize("version,mml,tokens,concurrency", [
    ("0.19", 131072, 163_840, 1.25),
    ("0.19", 8001, 163_840, 20.44),
    ("0.22", 8001, 163_533, 20.44),
])
def test_llama31_8b_old_and_new_token_formula(version, mml, tokens, concurrency):
    r = fit1("--gpu", "H100", "--model", "llama-3.1-8b", "--kv-budget", "20GiB", "--engine", f"vllm@{version}",
             "--ctx", str(mml), "--max-model-len", str(mml))
    assert r["engine_details"]["bytes_per_block"] == 2 * MiB and r["engine_details"]["num_gpu_blocks"] == 10_240
    assert r["kv_capacity_tokens"] == tokens and r["concurrency"] == concurrency


@pytest.mark.parametrize("engine,gpu,block,blocks,tokens", [
    ("vllm@0.11", "H100", 64, 9_549, 611_136),
    ("vllm@0.33", "H100", 16, 38_199, 611_184),
    ("vllm@0.33", "B200", 32, 19_099, 611_168),
])
def test_deepseek_v3_mla_blocks_by_backend(engine, gpu, block, blocks, tokens):
    r = fit1("--gpu", gpu, "--model", "deepseek-v3", "--kv-budget", "40GiB", "--engine", engine, "--ctx", "4096",
             "--max-model-len", "4096")
    d = r["engine_details"]
    assert d["block_size"] == block and d["bytes_per_block"] == 61 * block * 1152 and d["num_gpu_blocks"] == blocks
    assert d["num_gpu_blocks"] * block == tokens
    assert r["kv_bytes_per_token"] == 70_272


def test_deepseek_v3_fp8_kv_bytes_per_token():
    assert kvjson("size", "deepseek-v3", "--ctx", "4k", "--kv-dtype", "fp8")["kv_bytes_per_token"] == 35_136


@pytest.fixture()
def gemma3_27b(tmp_path):
    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_hidden_layers": 62,
           "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "hidden_size": 5376,
           "intermediate_size": 21504, "vocab_size": 262208, "sliding_window": 1024, "sliding_window_pattern": 6,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
    return write_config(tmp_path, "gemma-3-27b", cfg)


@pytest.mark.parametrize("engine,extra,tokens,concurrency", [
    ("vllm@0.19", [], 56_160, None),
    ("vllm@0.25", ["--max-num-batched-tokens", "8192"], 276_405, 2.11),
    ("vllm@0.33", ["--max-num-batched-tokens", "8192"], 218_744, 1.67),
])
def test_gemma3_27b_hybrid_groups(gemma3_27b, engine, extra, tokens, concurrency):
    r = fit1("--gpu", "H100", "--model", gemma3_27b, "--kv-budget", "30GiB", "--engine", engine, *extra,
             "--ctx", "131072", "--max-model-len", "131072")
    d = r["engine_details"]
    assert d["bytes_per_block"] == 10 * 131_072 and d["num_gpu_blocks"] == 24_576
    assert r["kv_capacity_tokens"] == tokens
    if concurrency is not None:
        assert r["concurrency"] == concurrency
    s = kvjson("size", gemma3_27b, "--ctx", "131072", "--engine", engine, *extra)
    assert s["engine_details"]["kv_groups"] == 7
    assert any("8 padding layer slot(s)" in a and "15.38%" in a for a in s["assumptions"])


def test_gemma3_27b_without_hybrid_manager_every_layer_full(gemma3_27b):
    s = kvjson("size", gemma3_27b, "--ctx", "4096", "--disable-hybrid-kv-cache-manager")
    assert s["kv_bytes_per_token"] == 62 * 8_192 == 507_904


def test_gpt_oss_20b_two_groups_of_twelve():
    s = kvjson("size", "gpt-oss-20b", "--ctx", "4096")
    assert s["engine_details"]["bytes_per_block"] == 393_216 and s["engine_details"]["kv_groups"] == 2


# ---------------------------------------------------------------------------------------------- SGLang (2.5)
def test_sglang_h100_default_fraction_and_llama_token_pool():
    from kvplan.engines import sglang

    assert sglang.default_mem_fraction(81559, 1, 1, sglang.VERSIONS[-1][1], mla=False) == 0.830
    # pre 79.2 GiB, weights 15 GiB -> rest = 0.83 x 79.2 - 15 = 50.736 GiB -> 415,629 tokens of 131,072 B
    rest = int((79.2 * 0.83 - 15) * GiB)
    r = fit1("--gpu", "H100", "--model", "llama-3.1-8b", "--engine", "sglang", "--kv-budget", f"{rest}B")
    assert r["kv_capacity_tokens"] == 415_629


# ---------------------------------------------------------------------------------------------- llama.cpp (3.4)
@pytest.mark.parametrize("dtype,k_mib", [("f16", 512), ("q8_0", 272), ("q4_0", 144)])
def test_llamacpp_llama31_8b_k_cache(dtype, k_mib):
    s = kvjson("size", "llama-3.1-8b", "--ctx", "8192", "--engine", "llamacpp", "--kv-dtype", dtype)
    k = sum(t["bytes"] for g in s["groups"] for t in g["tensors"] if t["name"] == "K")
    assert k == k_mib * MiB


def test_llamacpp_gemma3_27b_swa_cells(gemma3_27b):
    s = kvjson("size", gemma3_27b, "--ctx", "32768", "--engine", "llamacpp")
    assert s["engine_details"]["swa_cells"] == 1536 and s["kv_bytes"] == 3184 * MiB


def test_llamacpp_deepseek_v3_latent_only():
    s = kvjson("size", "deepseek-v3", "--ctx", "32768", "--engine", "llamacpp")
    assert s["kv_bytes"] == 576 * 2 * 32768 * 61 and round(s["kv_bytes"] / MiB) == 2196


# ---------------------------------------------------------------------------------------------- transformers (4.2)
def test_hf_deepseek_v3_decompressed_before_515_latent_after():
    assert kvjson("size", "deepseek-v3", "--ctx", "4k", "--engine", "hf@5.14")["kv_bytes_per_token"] == 4_997_120
    assert kvjson("size", "deepseek-v3", "--ctx", "4k", "--engine", "hf@5.23")["kv_bytes_per_token"] == 70_272


def test_hf_gpt_oss_full_layer_per_token():
    s = kvjson("size", "gpt-oss-20b", "--ctx", "4k", "--engine", "hf", "--kv-dtype", "bf16")
    full = next(g for g in s["groups"] if g["kind"] == "full")
    assert full["layers"] == 12 and full["bytes"] == 12 * 2_048 * 4096


# ---------------------------------------------------------------------------------------------- TensorRT-LLM (5.3)
def test_trtllm_bytes_per_token_examples(tmp_path):
    from conftest import llama_like

    assert kvjson("size", "llama-3.1-8b", "--ctx", "4k", "--engine", "trtllm")["kv_bytes_per_token"] == 131_072
    mixtral_8x22b = write_config(tmp_path, "m", llama_like(56, 48, 8, 128))
    assert kvjson("size", mixtral_8x22b, "--ctx", "4k", "--engine", "trtllm")["kv_bytes_per_token"] == 229_376
