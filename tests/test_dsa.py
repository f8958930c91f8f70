"""DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5, GLM-5.2): the MLA latent plus the lightning indexer's keys.

Oracles, none written here: engine start-up logs from the wild (tests/data/wild-logs.yaml, figures read from the
log text), the transformers model code (tests/test_oracle_hf.py covers the three bundled configs: parameter count on
meta and the cache of a real forward, indexer keys included) and llama.cpp itself (tests/oracle_llamacpp.py cases
deepseek32-*, glm-dsa-*). What is left here: the rules the logs pin, and the per-layer indexer placement the three
engines' sources agree on.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
import yaml

from conftest import DATA, kvjson, run_cli, write_config
from test_engine_logs import interval, printed

GiB = 1 << 30


@pytest.fixture(scope="module")
def wild() -> dict:
    return {c["id"]: c for c in yaml.safe_load((DATA / "wild-logs.yaml").read_text())}


def tensor_bytes(d: dict, prefix: str) -> int:
    return sum(t["bytes"] for g in d["groups"] for t in g["tensors"] if t["name"].startswith(prefix))


def in_printed(value: int, text: Decimal, unit: int) -> bool:
    lo, hi = interval(text, unit)
    return lo <= value < hi


# ---------------------------------------------------------------------------------------------- SGLang
def test_sglang_v32_pool_with_and_without_the_indexer(wild):
    """sgl-project/sglang#11309 (8x B200, DeepSeek-V3.2-Exp): the pool sizes SGLang printed for a pool of N tokens,
    before the PR (latent only, and the author's total with the indexer) and after it (both). The 656 B fp8 record
    and the 132 B indexer key, with the pools' one extra page, give every printed figure to its last digit."""
    log = wild["sglang-deepseek-v3.2-exp-8xb200-tp8-dp8-dpattn"]["log"]
    after_tokens, before_tokens = (int(x) for x in [printed(log, r"#tokens: (\d+)", 0), printed(log, r"#tokens: (\d+)", 1)])
    after = kvjson("size", "deepseek-v3.2", "--engine", "sglang@0.5", "--kv-dtype", "fp8", "--ctx", str(after_tokens))
    assert after["engine_details"]["cell_size"] == 61 * (656 + 132)
    assert in_printed(after["kv_bytes"], printed(log, r"KV size: ([\d.]+) GB", 0), GiB)
    before = kvjson("size", "deepseek-v3.2", "--engine", "sglang@0.5", "--kv-dtype", "fp8", "--ctx", str(before_tokens))
    assert in_printed(tensor_bytes(before, "kv_buffer"), printed(log, r"KV size: ([\d.]+) GB", 1), GiB)
    assert in_printed(before["kv_bytes"], printed(log, r"index is actually ([\d.]+) GB"), GiB)


def test_sglang_0_5_23_reads_a_plain_fp8_latent_on_blackwell():
    """kv_cache_configurator.py calculate_mla_kv_cache_dim (0.5.23): the trtllm DSA backends, Blackwell's default
    for fp8, read the 576-byte latent; on Hopper flashmla_kv keeps the 656-byte record."""
    budget = 78 * 708 * 64 * 1000
    common = ["--model", "glm-5", "--kv-dtype", "fp8", "--engine", "sglang@0.5.23", "--ctx", "8k", "--tp", "8",
              "--kv-budget", f"{budget}B"]
    for gpu, latent in (("8xB200", 576), ("8xH200", 656)):
        r = kvjson("fit", "--gpu", gpu, *common)["results"][0]
        assert r["kv_capacity_tokens"] == budget // (78 * (latent + 132)) // 64 * 64, gpu


def test_sglang_rocm_glm5_log_takes_page_one(wild):
    """An SGLang v0.5.8.post1 ROCm start-up of GLM-5-FP8 on 8x MI355X (tests/data/wild-logs.yaml): 'Setting page size
    to 1 for DeepSeek DSA on ROCm' (0.5.10 server_args.py is_hip), fp8 KV. Its KV size, 186.77 GiB at 3,262,823
    tokens, is N + 1 rows of 78 x (656 + 132) B: the ROCm page; CUDA's page of 64 would print 186.78. 0.5.23 picks
    the ROCm page by its aiter kernels, which kvplan does not know: refused there."""
    log = wild["sglang-v0.5.8.post1-rocm-glm-5-fp8-8xmi355x-tp8-fp8e4m3kv-page1-triton"]["log"]
    assert "Setting page size to 1 for DeepSeek DSA on ROCm" in log
    tokens = int(printed(log, r"#tokens: (\d+)"))
    size = printed(log, r"KV size: ([\d.]+) GB")
    assert in_printed((tokens + 1) * 78 * (656 + 132), size, GiB)
    assert not in_printed((tokens + 64) * 78 * (656 + 132), size, GiB)
    budget = 78 * 788 * 1_000_003
    common = ("--model", "glm-5", "--kv-dtype", "fp8", "--engine", "sglang@0.5", "--ctx", "8k", "--tp", "8",
              "--kv-budget", f"{budget}B")
    amd = kvjson("fit", "--gpu", "8xMI355X", *common)["results"][0]
    cuda = kvjson("fit", "--gpu", "8xH200", *common)["results"][0]
    assert amd["engine_details"]["page_size"] == 1 and amd["kv_capacity_tokens"] == 1_000_003
    assert cuda["engine_details"]["page_size"] == 64 and cuda["kv_capacity_tokens"] == 1_000_003 // 64 * 64
    r = run_cli("fit", "--gpu", "8xMI355X", "--model", "glm-5", "--engine", "sglang@0.5.23")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "AMD" in r.err, r.err


# ---------------------------------------------------------------------------------------------- vLLM
def test_vllm_glm51_capacity_from_the_printed_budget(wild):
    """local-inference-lab/rtx6kpro GLM-5.1 on 8x RTX PRO 6000, TP 8, fp8 (fp8_ds_mla): given the printed
    'Available KV cache memory', kvplan's tokens and concurrency are the log's. One block pool, block 64, a page
    of 64 x (656 + 132) bytes per layer (UniformTypeKVCacheSpecs: latent and indexer pages side by side)."""
    case = wild["vllm-glm-5.1-nvfp4-8xrtxpro6000-tp8-dcp1-nomtp-len202752"]
    log, mml = case["log"], str(case["max_model_len"])
    avail = printed(log, r"Available KV cache memory: ([\d.]+) GiB")
    lo, hi = interval(avail, GiB)
    args = ["--model", "glm-5", "--gpu", "8xH100", "--tp", "8", "--kv-dtype", "fp8", "--engine", "vllm@0.20.2",
            "--ctx", mml, "--max-model-len", mml]
    ends = [kvjson("fit", *args, "--kv-budget", f"{b}B")["results"][0] for b in (math.ceil(lo), math.ceil(hi) - 1)]
    tokens = int(printed(log, r"GPU KV cache size: ([\d,]+) tokens"))
    conc = float(printed(log, r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"))
    assert ends[0]["kv_capacity_tokens"] <= tokens <= ends[1]["kv_capacity_tokens"]
    assert ends[0]["concurrency"] <= conc <= ends[1]["concurrency"]
    assert ends[0]["engine_details"]["bytes_per_block"] == 64 * 78 * (656 + 132)


@pytest.mark.parametrize("gpu,dtype,latent", [
    ("H100", "fp8", 656),      # FLASHMLA_SPARSE: fp8_ds_mla
    ("H100", "bf16", 1152),    # FLASH_ATTN_MLA_SPARSE: plain bf16
    ("B200", "fp8", 576),      # FLASHINFER_MLA_SPARSE refuses fp8_ds_mla: plain fp8
    ("RTX-5090", None, 656),   # FLASHINFER_MLA_SPARSE_SM120 turns auto into fp8_ds_mla
])
def test_vllm_latent_record_by_backend(gpu, dtype, latent):
    """platforms/cuda.py backend priorities and _canonicalize_sparse_mla_kv_cache_dtype (vLLM 0.32)."""
    args = ["--model", "deepseek-v3.2", "--gpu", gpu, "--ctx", "4k", "--kv-budget", "10GiB"]
    r = kvjson("fit", *args, *(["--kv-dtype", dtype] if dtype else []))["results"][0]
    assert r["engine_details"]["bytes_per_block"] == 64 * 61 * (latent + 132)


# ---------------------------------------------------------------------------------------------- placement
def _dsa_config(**extra) -> dict:
    cfg = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "num_hidden_layers": 10,
           "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
           "intermediate_size": 512, "moe_intermediate_size": 64, "n_routed_experts": 4, "n_shared_experts": 1,
           "num_experts_per_tok": 2, "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": 64,
           "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64, "index_topk": 2048,
           "index_n_heads": 4, "index_head_dim": 128, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    cfg.update(extra)
    return cfg


@pytest.mark.parametrize("extra,own", [
    ({}, list(range(10))),
    ({"index_topk_freq": 4, "index_skip_topk_offset": 3}, [0, 1, 2, 6]),  # GLM-5.2's fields
    ({"index_topk_freq": 2}, [0, 1, 3, 5, 7, 9]),  # the default offset 2
    ({"index_topk_pattern": "FFSFS"}, [0, 1, 3, 5, 6, 7, 8, 9]),  # vLLM: layers past the pattern keep theirs
    ({"indexer_types": ["full", "shared"] * 5, "index_topk_freq": 4}, [0, 2, 4, 6, 8]),  # indexer_types win
])
def test_which_layers_cache_indexer_keys(tmp_path, extra, own):
    d = kvjson("size", write_config(tmp_path, "m", _dsa_config(**extra)), "--ctx", "1024", "--engine", "hf")
    (indexer,) = [g for g in d["groups"] if g["kind"] == "indexer"]
    assert indexer["layer_ids"] == own
    (latent,) = [g for g in d["groups"] if g["kind"] == "mla"]
    assert latent["layer_ids"] == list(range(10))


@pytest.mark.parametrize("extra,what", [
    ({"indexer_types": ["full", "sparse"] * 5}, "indexer_types"),
    ({"indexer_types": ["full"]}, "indexer_types"),
    ({"index_topk_pattern": "FXS"}, "index_topk_pattern"),
    ({"index_head_dim": 0}, "index_head_dim"),
])
def test_malformed_indexer_fields_are_one_line(tmp_path, extra, what):
    r = run_cli("size", write_config(tmp_path, "m", _dsa_config(**extra)), "--ctx", "1024")
    assert r.code == 2 and what in r.err and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1


def test_indexer_is_replicated_across_tensor_parallel_ranks():
    """Every engine keeps one latent and one indexer key per token on each TP rank."""
    one = kvjson("size", "glm-5", "--ctx", "4k", "--kv-dtype", "fp8")
    eight = kvjson("size", "glm-5", "--ctx", "4k", "--kv-dtype", "fp8", "--tp", "8")
    assert one["kv_bytes_per_token"] == eight["kv_bytes_per_token"] == 78 * 788
