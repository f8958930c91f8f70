"""Llama-3.2-Vision (model_type mllama): cross-attention layers, interleaved among the self-attention layers, cache
K/V of the vision tower's output (images x max_num_tiles x ((image_size // patch_size)^2 + 1) positions, once per
request); the others cache the text.

Oracles, none written here: transformers' model code (tests/test_oracle_hf.py: parameters on meta and the cache of a
real forward with pixel_values, on the transformers-default 11B geometry and on MLLAMA_TINY below). What is left:
figures from the engines' formulas (transformers' DynamicCache, SGLang 0.5.10's shared token pool), the config-class
defaults, and the engines that refuse in one line (vLLM: V0-only then removed; TensorRT-LLM: text-only; llama.cpp:
no such architecture). No genuine config.json is bundled: no byte-exact copy of the Hub file was found with the
search tools (the Hub is unreachable here).
"""

from __future__ import annotations

import pytest

from conftest import kvjson, run_cli, write_config

# A scaled Llama-3.2-Vision: 6 text layers (cross attention at 1 and 4), GQA 4 / 2 heads of 16, a 3 + 1 layer tower
# of width 32 over 28-pixel tiles of 14-pixel patches (2 x 2 + 1 = 5 positions a tile), max_num_tiles 4
MLLAMA_TINY = {
    "architectures": ["MllamaForConditionalGeneration"], "model_type": "mllama", "image_token_index": 300,
    "text_config": {"model_type": "mllama_text_model", "vocab_size": 300, "hidden_size": 64,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 6,
                    "intermediate_size": 128, "cross_attention_layers": [1, 4], "max_position_embeddings": 4096,
                    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    "vision_config": {"model_type": "mllama_vision_model", "hidden_size": 32, "attention_heads": 4,
                      "num_hidden_layers": 3, "num_global_layers": 1, "intermediate_size": 64,
                      "vision_output_dim": 96, "intermediate_layers_indices": [0, 2], "image_size": 28,
                      "patch_size": 14, "max_num_tiles": 4},
    "torch_dtype": "bfloat16",
}
PER_IMAGE = 4 * ((28 // 14) ** 2 + 1)  # 20 vision positions per image
KV_ROW = 2 * 16 * 2 * 2  # K and V of 2 KV heads x 16, 2 bytes: 128 B per position per layer


def _with(text=None, vision=None, **top):
    return {**MLLAMA_TINY, **top, "text_config": {**MLLAMA_TINY["text_config"], **(text or {})},
            "vision_config": {**MLLAMA_TINY["vision_config"], **(vision or {})}}


def test_cross_layers_cache_one_image_of_vision_positions(tmp_path):
    """transformers: 4 self-attention layers hold the text, layers 1 and 4 the vision states of one image (the
    length _prepare_static_cache allocates without pixel_values): 4 tiles x 5 positions."""
    d = kvjson("size", write_config(tmp_path, "m", MLLAMA_TINY), "--ctx", "1000", "--batch", "2", "--engine", "hf",
               "--kv-dtype", "fp16")
    groups = {g["kind"]: g for g in d["groups"]}
    assert groups["full"]["layers"] == 4 and groups["cross"]["layers"] == 2
    assert groups["cross"]["tokens"] == PER_IMAGE
    assert d["kv_bytes"] == 2 * (1000 * 4 + PER_IMAGE * 2) * KV_ROW
    assert d["kv_bytes_per_token"] == 4 * KV_ROW  # cross attention does not grow with the text
    assert any("20 vision positions per sequence (1 image x 4 tiles x 5 patches" in a for a in d["assumptions"])


def test_encoder_len_sets_the_vision_positions(tmp_path):
    d = kvjson("size", write_config(tmp_path, "m", MLLAMA_TINY), "--ctx", "1000", "--engine", "hf", "--kv-dtype",
               "fp16", "--encoder-len", str(3 * PER_IMAGE))
    assert d["kv_bytes"] == (1000 * 4 + 3 * PER_IMAGE * 2) * KV_ROW
    assert any("(3 images x 4 tiles" in a for a in d["assumptions"])


def test_config_class_defaults(tmp_path):
    """MllamaTextConfig: cross_attention_layers [3, 8, ..., 38] when absent; MllamaVisionConfig: image_size 448,
    patch_size 14, max_num_tiles 4, so 4 x (32^2 + 1) = 4,100 positions; entries past the last layer select nothing
    (transformers tests `layer_idx in cross_attention_layers`)."""
    text = {k: v for k, v in MLLAMA_TINY["text_config"].items() if k != "cross_attention_layers"}
    cfg = {**MLLAMA_TINY, "text_config": {**text, "num_hidden_layers": 40},
           "vision_config": {k: v for k, v in MLLAMA_TINY["vision_config"].items()
                             if k not in ("image_size", "patch_size", "max_num_tiles")}}
    d = kvjson("size", write_config(tmp_path, "a", cfg), "--ctx", "16", "--engine", "hf", "--kv-dtype", "fp16")
    cross = [g for g in d["groups"] if g["kind"] == "cross"][0]
    assert cross["layers"] == 8 and cross["tokens"] == 4 * (32 ** 2 + 1)
    d = kvjson("size", write_config(tmp_path, "b", _with(text={"cross_attention_layers": [1, 4, 6, 99]})),
               "--ctx", "16", "--engine", "hf")
    assert {g["kind"]: g["layers"] for g in d["groups"]} == {"full": 4, "cross": 2}


def test_sglang_keeps_the_vision_tokens_in_the_shared_pool(tmp_path):
    """SGLang 0.5.10 (models/mllama.py pad_input_ids, schedule_batch.py prepare_encoder_info_extend): the image's
    pad tokens and the text share one MHATokenToKVPool of all 6 layers, so every layer holds ctx + 20 rows per
    request (plus the pool's page of padding rows)."""
    d = kvjson("size", write_config(tmp_path, "m", MLLAMA_TINY), "--ctx", "1000", "--batch", "2", "--engine",
               "sglang", "--kv-dtype", "fp16")
    assert {g["kind"]: g["tokens"] for g in d["groups"]} == {"full": 1000 + PER_IMAGE, "cross": 1000 + PER_IMAGE}
    assert d["kv_bytes"] == (2 * (1000 + PER_IMAGE) + 1) * 6 * KV_ROW
    assert d["kv_bytes_per_token"] == 6 * KV_ROW


def test_sglang_capacity_counts_the_vision_tokens(tmp_path):
    """max_total_num_tokens = budget // cell (6 layers x 128 B); a request of ctx text tokens takes ctx + 20 of them,
    and the longest text that fits one request is the pool less the 20."""
    budget = 768 * 3_000
    r = kvjson("fit", "--model", write_config(tmp_path, "m", MLLAMA_TINY), "--gpu", "24GB", "--engine", "sglang",
               "--ctx", "1000", "--kv-dtype", "fp16", "--kv-budget", f"{budget}B")["results"][0]
    assert r["kv_capacity_tokens"] == 3_000
    assert r["max_batch"] == 3_000 // (1000 + PER_IMAGE) == 2
    assert r["max_ctx"] == 3_000 - PER_IMAGE


@pytest.mark.parametrize("engine, says", [
    ("vllm", "vLLM 0.33 does not load MllamaForConditionalGeneration: supported until v0.10.2"),
    ("vllm@0.11.0", "vLLM 0.11.0 does not load MllamaForConditionalGeneration"),
    ("vllm@0.10.1.1", "runs MllamaForConditionalGeneration on its V0 engine only"),
    ("trtllm", "runs Llama-3.2-Vision text-only"),
    ("llamacpp", "llama.cpp has no mllama architecture"),
])
def test_engines_that_cannot_size_it_refuse_in_one_line(tmp_path, engine, says):
    r = run_cli("size", write_config(tmp_path, "m", MLLAMA_TINY), "--ctx", "1000", "--engine", engine)
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("change, says", [
    ({"vision": {"max_num_tiles": 3}}, "max_num_tiles 3 needs supported_aspect_ratios"),
    ({"vision": {"supported_aspect_ratios": [[1, 1], [2]]}},
     "supported_aspect_ratios must be a list of [integer, integer] pairs"),
    ({"vision": {"patch_size": 56}}, "image_size 28 must be at least patch_size 56"),
    ({"text": {"head_dim": 32}}, "head_dim 32 is not hidden_size / num_attention_heads (16)"),
    ({"text": {"cross_attention_layers": "1,4"}}, "cross_attention_layers must be a list of integers"),
    ({"text": {"num_key_value_heads": 3}}, "must be a positive multiple of num_key_value_heads 3"),
])
def test_bad_configs_are_refused_in_one_line(tmp_path, change, says):
    r = run_cli("size", write_config(tmp_path, "m", _with(**change)), "--ctx", "1000", "--engine", "hf")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_max_num_tiles_with_its_aspect_ratios(tmp_path):
    """max_num_tiles 2 with its own supported_aspect_ratios: 2 x 5 positions an image; the tile embeddings have
    len(supported_aspect_ratios) + 1 rows (checked against transformers in tests/test_oracle_hf.py)."""
    cfg = _with(vision={"max_num_tiles": 2, "supported_aspect_ratios": [[1, 1], [1, 2], [2, 1]]})
    d = kvjson("size", write_config(tmp_path, "m", cfg), "--ctx", "16", "--engine", "hf")
    assert [g["tokens"] for g in d["groups"] if g["kind"] == "cross"] == [2 * 5]


def test_encoder_len_on_a_model_without_cross_attention_is_refused(tmp_path):
    from conftest import llama_like

    r = run_cli("size", write_config(tmp_path, "l", llama_like(4, 8, 2, 64)), "--ctx", "100", "--encoder-len", "64")
    assert r.code == 2 and "--encoder-len applies to encoder-decoder and cross-attention models" in r.err, r.err


@pytest.mark.engine
def test_vllm_032_registry_refuses_it_as_kvplan_says():
    """vLLM 0.32's own registry (the CPU build, KVPLAN_VLLM_PYTHON): MllamaForConditionalGeneration is no supported
    architecture, and its refusal names the last release that had it -- the version kvplan's refusal names."""
    import os
    import subprocess

    from kvplan.engines.vllm.models import V0_ONLY

    python = os.environ.get("KVPLAN_VLLM_PYTHON")
    if not python:
        pytest.skip("KVPLAN_VLLM_PYTHON is not set (the vLLM CPU build's interpreter)")
    code = ("from vllm.model_executor.models.registry import ModelRegistry as R\n"
            "a = 'MllamaForConditionalGeneration'\n"
            "print(a in R.get_supported_archs())\n"
            "try:\n    R._raise_for_unsupported([a])\nexcept ValueError as e:\n    print(e)\n")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    supported, message = out.stdout.strip().splitlines()[-2:]
    arch = "MllamaForConditionalGeneration"
    last = V0_ONLY[arch]
    assert supported == "False" and f"{arch} was supported in vLLM until v{last}" in message, out.stdout
