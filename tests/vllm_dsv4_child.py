"""The vLLM side of tests/test_deepseek_v4.py: runs in an interpreter with vLLM (KVPLAN_VLLM_PYTHON) and imports
nothing from kvplan.

vLLM's CPU build cannot run DeepSeek-V4 (its attention backends are CUDA kernels), so this child drives vLLM
0.32's own KV-cache planner (v1/core/kv_cache_utils.py get_kv_cache_configs, get_kv_cache_capacity and the
max-model-len estimate) with the KV cache specs DeepSeek-V4's layers register, built with vLLM's own spec classes
(v1/kv_cache_interface.py) and the arguments read in models/deepseek_v4/attention.py (indexer k_cache and its
compressor state on ratio-4 layers, the 128-token window, the compressed latent, the compressor state) and
v1/attention/backends/mla/sparse_swa.py (the window: block 64, packed_bytes_per_token 584). The grouping,
page padding, bytes per block, blocks per request and capacity are vLLM's code.

``python vllm_dsv4_child.py CASES.json OUT.json``: CASES is a list of {id, config, max_model_len,
max_num_batched_tokens, async_scheduling, available_bytes}; OUT gets one result per case.
"""

from __future__ import annotations

import json
import sys
import types


def specs_for(cfg: dict) -> dict:
    import torch
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec, get_kv_quant_mode

    ds, align = "fp8_ds_mla", 576  # auto and fp8 become fp8_ds_mla on FlashMLA (attention.py); pages padded to 576
    out = {}
    n = cfg["num_hidden_layers"]
    for i in range(n):
        r = max(1, cfg["compress_ratios"][i])
        p = f"model.layers.{i}.attn"
        if r == 4:
            d_i = cfg["index_head_dim"]
            out[p + ".indexer.k_cache"] = MLAAttentionSpec(
                block_size=256, num_kv_heads=1, max_tp_shards=1, head_size=d_i + d_i // 128 * 4, dtype=torch.uint8,
                tokens_per_state=4, alignment=align, block_stride_alignment=MultipleOf(256))
            out[p + ".indexer.compressor.state_cache"] = SlidingWindowMLASpec(
                block_size=4, num_kv_heads=1, max_tp_shards=1, head_size=2 * 2 * d_i, dtype=torch.float32,
                sliding_window=8, alignment=align)
        out[p + ".swa_cache"] = SlidingWindowMLASpec(
            bounded_replay=False, block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=cfg["head_dim"],
            dtype=torch.uint8, sliding_window=cfg["sliding_window"], cache_dtype_str=ds, state_content_bytes=584,
            alignment=align, model_version="deepseek_v4", kv_quant_mode=get_kv_quant_mode(ds))
        if r > 1:
            out[p] = MLAAttentionSpec(
                block_size=256, num_kv_heads=1, max_tp_shards=1, head_size=cfg["head_dim"], dtype=torch.uint8,
                tokens_per_state=r, cache_dtype_str=ds, alignment=align, model_version="deepseek_v4",
                kv_quant_mode=get_kv_quant_mode(ds), state_content_bytes=584, block_stride_alignment=MultipleOf(256))
            overlap = 2 if r == 4 else 1
            out[p + ".compressor.state_cache"] = SlidingWindowMLASpec(
                block_size=4 if r == 4 else 8, num_kv_heads=1, max_tp_shards=1, head_size=2 * overlap * cfg["head_dim"],
                dtype=torch.float32, sliding_window=overlap * r, alignment=align)
    return out


def vllm_config(max_model_len: int, mnbt: int, async_scheduling: bool):
    """The fields of VllmConfig the planner reads (config/vllm.py max_in_flight_tokens: async scheduling keeps
    2 batches in flight with one pipeline stage)."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    ns = types.SimpleNamespace
    cache = ns(get_resolved_kv_cache_layout=lambda: KVCacheLayout.BLHNC, num_gpu_blocks_override=None,
               prefix_cache_retention_interval=None, enable_prefix_caching=True, block_size=256,
               cache_dtype="fp8_ds_mla", prefix_match_unit=None)
    return ns(scheduler_config=ns(disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=mnbt,
                                  async_scheduling=async_scheduling),
              cache_config=cache,
              model_config=ns(max_model_len=max_model_len, original_max_model_len=max_model_len,
                              hf_config=ns(model_type="deepseek_v4")),
              parallel_config=ns(decode_context_parallel_size=1, tensor_parallel_size=1, pipeline_parallel_size=1),
              attention_config=ns(hisparse_config=None), speculative_config=None,
              max_in_flight_tokens=(2 if async_scheduling else 1) * mnbt, num_prefill_lookahead_tokens=0,
              device_config=ns(device_type="cuda"), use_v2_model_runner=True)


def run(case: dict) -> dict:
    from vllm.v1.core import kv_cache_utils as U
    from vllm.v1.kv_cache_layout import KVCacheLayout

    cfg = json.loads(open(case["config"]).read())
    vc = vllm_config(case["max_model_len"], case["max_num_batched_tokens"], case["async_scheduling"])
    specs = specs_for(cfg)
    groups = U.get_kv_cache_groups(vc, dict(specs))
    out = {
        "bytes_per_block": U._get_kv_cache_bytes_per_block(groups, KVCacheLayout.BLHNC),
        "group_pages": sorted(g.kv_cache_spec.page_size_bytes for g in groups),
        "blocks_per_request": sum(g.kv_cache_spec.max_memory_usage_pages(vc) for g in groups),
    }
    try:
        config = U.get_kv_cache_configs(vc, [specs], [case["available_bytes"]])[0]
        out["num_blocks"] = config.num_blocks
        out["capacity_tokens"], out["concurrency"] = U.get_kv_cache_capacity(vc, config)
    except ValueError as e:  # the start-up check: "... the estimated maximum model length is N"
        out["error"] = " ".join(str(e).split())
    return out


def main(cases_path: str, out_path: str) -> int:
    cases = json.loads(open(cases_path).read())
    results = {c["id"]: run(c) for c in cases}
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
