"""MiniMax-M3 (tests/data/aic-configs/MiniMaxAI--MiniMax-M3_config.json): 60 layers of full GQA K/V (4 KV heads x
128), and on the 57 sparse layers (sparse_attention_freq 1) one 128-wide index key per token.

Expected figures are written from vLLM 0.32's code and the config, never read back from kvplan:
- vLLM (models/minimax_m3/nvidia/model.py MiniMaxM3SparseAttention.get_kv_cache_spec: FullAttentionSpec of
  max(1, 4 // tp) heads x 128 in the KV dtype; common/indexer.py MiniMaxM3IndexerCache: MLAAttentionSpec of 1 head x
  sparse_index_dim in bf16, whatever the KV dtype); block 128 (the sparse backends' only kernel block); both spec
  types form one UniformTypeKVCacheSpecs group (MLAAttentionSpec's uniform base is FullAttentionSpec).
- PAGE_SUMS: the bytes of one 128-token block of all layers, from vLLM 0.32's own spec classes (FullAttentionSpec,
  MLAAttentionSpec, UniformTypeKVCacheSpecs.from_specs(...).page_size_bytes) built for this config, no model:
  `VLLM_PYTHON dev/minimax_m3_vllm_specs.py CONFIG TP bf16|fp8` (a vLLM 0.32 interpreter).
- parameters: transformers 5.24's MiniMaxM3VLForCausalLM on meta, built from the same fields
  (MiniMaxM3VLTextConfig(**config)): 426,174,565,632 parameters and a 7,296-element e_score_correction_bias buffer
  (57 x 128), which vLLM loads as an fp32 nn.Parameter.
"""

from __future__ import annotations

import json

import pytest

from conftest import DATA, kvjson, run_cli, write_config

CONFIG = DATA / "aic-configs" / "MiniMaxAI--MiniMax-M3_config.json"
PATH = str(CONFIG)
LAYERS, SPARSE, KV, HD, IDX = 60, 57, 4, 128, 128

# (tp, kv dtype) -> bytes of one 128-token block over all layers, printed by vLLM 0.32's spec classes
PAGE_SUMS = {(1, "bf16"): 17_596_416, (8, "bf16"): 5_799_936, (1, "fp8"): 9_732_096, (8, "fp8"): 3_833_856}


def per_token(tp: int, kv_bytes: int) -> int:
    """vLLM's bytes per token: K and V of max(1, 4 // tp) heads x 128 on every layer, a bf16 128-wide key on the
    sparse layers."""
    return LAYERS * 2 * max(1, KV // tp) * HD * kv_bytes + SPARSE * IDX * 2


@pytest.mark.parametrize("tp, dtype, elem", [(1, "bf16", 2), (8, "bf16", 2), (1, "fp8", 1), (8, "fp8", 1)])
def test_vllm_bytes_per_layer_kind(tp, dtype, elem):
    out = kvjson("size", PATH, "--ctx", "32k", "--tp", str(tp), "--kv-dtype", dtype, "--engine", "vllm@0.32")
    groups = {g["kind"]: g for g in out["groups"]}
    assert groups["full"]["layers"] == LAYERS and groups["indexer"]["layers"] == SPARSE
    assert groups["indexer"]["layer_ids"] == list(range(3, 60)) and groups["indexer"]["dtype"] == "bf16"
    assert groups["full"]["bytes"] == 32768 * LAYERS * 2 * max(1, KV // tp) * HD * elem
    assert groups["indexer"]["bytes"] == 32768 * SPARSE * IDX * 2  # bf16 whatever the KV dtype, not split by TP
    assert out["kv_bytes_per_token"] == per_token(tp, elem)
    assert 128 * per_token(tp, elem) == PAGE_SUMS[(tp, dtype)]  # the formula agrees with vLLM's own classes


def test_vllm_pages_one_pool_of_128_token_blocks():
    """One block of the pool is vLLM's UniformTypeKVCacheSpecs page sum; a request of 1,000 tokens holds
    cdiv(1000, 128) = 8 blocks of every layer."""
    assert kvjson("size", PATH, "--ctx", "128", "--engine", "vllm@0.32")["kv_bytes"] == PAGE_SUMS[(1, "bf16")]
    out = kvjson("size", PATH, "--ctx", "1000", "--engine", "vllm@0.32")
    assert out["kv_bytes"] == 8 * PAGE_SUMS[(1, "bf16")]
    assert {g["tokens"] for g in out["groups"]} == {1024}
    big = kvjson("size", PATH, "--ctx", "1000", "--block-size", "256", "--engine", "vllm@0.32")
    assert big["kv_bytes"] == 4 * 2 * PAGE_SUMS[(1, "bf16")]


def test_vllm_refusals_are_one_line():
    for args, words in ((["--block-size", "64"], "multiples of 128"), (["--engine", "vllm@0.25"], "vllm@0.32")):
        r = run_cli("size", PATH, "--ctx", "8k", *args)
        assert r.code == 2 and r.err.count("\n") == 1 and words in r.err, r.err


def test_parameters_and_weights():
    """Written from the config as vLLM builds the model; equal to transformers 5.24's meta count + the bias buffer."""
    c = json.loads(CONFIG.read_text())
    h, heads, vocab, experts, inter = c["hidden_size"], c["num_attention_heads"], c["vocab_size"], 128, 3072
    attn = h * heads * HD + 2 * h * KV * HD + heads * HD * h + 2 * HD  # q, k, v, o, q_norm, k_norm
    index = h * 4 * IDX + h * IDX + 2 * IDX  # index_q (4 heads), index_k (1 head), their norms
    dense_mlp = 3 * h * c["dense_intermediate_size"]
    moe = experts * 3 * h * inter + 3 * h * inter + experts * h + experts  # experts, shared expert, router, bias
    layers = LAYERS * (attn + 2 * h) + SPARSE * index + 3 * dense_mlp + SPARSE * moe
    params = layers + 2 * vocab * h + h
    assert params == 426_174_565_632 + 7_296  # transformers' meta count + e_score_correction_bias (57 x 128)
    out = kvjson("size", PATH, "--ctx", "8k", "--engine", "vllm@0.32")
    assert out["params"] == params
    fp32 = SPARSE * (experts * h + experts)  # GateLinear(params_dtype=float32) and the fp32 correction bias
    assert out["weight_bytes"] == 2 * params + 2 * fp32
    assert not out["warnings"]


def test_mtp_modules_are_outside_params():
    """MiniMaxM3MTP (num_mtp_modules 7): enorm, hnorm, eh_proj, one sparse-attention MoE layer and a norm each;
    outside params (CONTRACTS), counted in mtp_params."""
    out = kvjson("size", PATH, "--ctx", "8k")
    h = 6144
    attn = h * 64 * HD + 2 * h * KV * HD + 64 * HD * h + 2 * HD + h * 4 * IDX + h * IDX + 2 * IDX
    moe = 128 * 3 * h * 3072 + 3 * h * 3072 + 128 * h + 128
    module = 2 * h + 2 * h * h + attn + moe + 2 * h + h
    assert out["mtp_params"] == 7 * module and out["params"] == out["text_params"]


@pytest.mark.parametrize("engine, words", [
    ("sglang", "SGLang 0.5.10 has no MiniMax-M3 model"),
    ("trtllm", "TensorRT-LLM"),
    ("hf@4.57", "models/minimax_m3_vl"),
])
def test_other_engines_refuse_in_one_line(engine, words):
    r = run_cli("size", PATH, "--ctx", "8k", "--engine", engine)
    assert r.code == 2 and r.err.count("\n") == 1 and words in r.err, r.err


@pytest.mark.parametrize("ctx, batch", [(1, 1), (8192, 2), (300_000, 1)])
def test_hf_keeps_kv_and_index_keys_in_the_compute_dtype(ctx, batch):
    """transformers (models/minimax_m3_vl, MiniMaxM3VLSparseCacheLayer): K and V [batch, 4, ctx, 128] on all 60
    layers and idx_keys [batch, 1, ctx, 128] on the 57 sparse ones, all in the load dtype (bf16, the config's);
    checked against a real forward in tests/test_oracle_hf.py."""
    out = kvjson("size", PATH, "--ctx", str(ctx), "--batch", str(batch), "--engine", "hf")
    assert out["kv_bytes"] == batch * ctx * (LAYERS * 2 * KV * HD * 2 + SPARSE * IDX * 2)
    idx = next(g for g in out["groups"] if g["kind"] == "indexer")
    assert idx["layer_ids"] == list(range(3, 60)) and idx["tensors"][0]["shape"] == [batch, 1, ctx, IDX]


def test_index_value_projections_are_refused(tmp_path):
    c = json.loads(CONFIG.read_text())
    c["sparse_attention_config"]["sparse_disable_index_value"] = [0] * 60
    r = run_cli("size", write_config(tmp_path, "m3", c), "--ctx", "8k")
    assert r.code == 2 and r.err.count("\n") == 1 and "sparse_disable_index_value" in r.err, r.err


def test_fit_uses_the_same_pool():
    """fit: tokens = usable blocks x 128, blocks = budget // page sum (one null block excluded)."""
    out = kvjson("fit", "--gpu", "24GB", "--model", PATH, "--kv-budget", f"{1 << 30}B", "--engine", "vllm@0.32",
                 "--ctx", "4096", "--max-model-len", "4096", "--max-num-batched-tokens", "4096",
                 "--no-async-scheduling")["results"][0]
    blocks = (1 << 30) // PAGE_SUMS[(1, "bf16")] - 1
    assert out["max_batch"] == blocks // (4096 // 128)
