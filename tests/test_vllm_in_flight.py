"""The tokens vLLM reserves in flight for a sliding-window layer, by version: from 0.26 one max_num_batched_tokens
per concurrent batch (config/vllm.py max_concurrent_batches: pp + 1 with async scheduling on the V2 model runner,
the default for dense models in 0.26-0.28 and for every model from 0.29; pp on the V1 runner); in 0.19 and
0.23 one max_num_batched_tokens whatever the scheduling or pp (kv_cache_interface.py
max_admission_blocks_per_request). Blocks per request: cdiv(min(window - 1 + in flight, max_len), block) + 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import kvjson

MODEL = "gemma-2-9b"  # sliding 4096 on every other layer
CTX, BLOCK, MBT = 8192, 16, 2048  # size assumes max_num_batched_tokens 2048 (it knows no GPU)


def window() -> int:
    from kvplan import catalog

    return json.loads(Path(catalog.lookup(MODEL).config_path).read_text())["sliding_window"]


def sliding_blocks(*args: str) -> int:
    out = kvjson("size", MODEL, "--ctx", str(CTX), *args)
    (tensor,) = [t for g in out["groups"] if g["kind"] == "sliding" for t in g["tensors"]]
    return int(tensor["name"].split(" x ")[1].split()[0])


def expected(in_flight: int) -> int:
    return -(-min(window() - 1 + in_flight, CTX) // BLOCK) + 1


@pytest.mark.parametrize("args, batches", [
    (("--engine", "vllm@0.23"), 1),
    (("--engine", "vllm@0.23", "--async-scheduling"), 1),  # on by default there too; the reserve ignores it
    (("--engine", "vllm@0.23", "--pp", "2"), 1),
    (("--engine", "vllm@0.19", "--pp", "2"), 1),
    (("--engine", "vllm@0.25"), 1),  # the 0.25.0 wheel: one max_num_batched_tokens
    (("--engine", "vllm@0.26"), 2),  # the 0.26.0 wheel: max_in_flight_tokens, async on by default
    (("--engine", "vllm@0.26", "--pp", "2"), 3),  # 0.26 runs a dense model on the V2 runner: async stays on, pp + 1
    (("--engine", "vllm@0.26", "--pp", "2", "--no-use-v2-model-runner"), 2),  # the V1 runner at pp 2: pp
    (("--engine", "vllm@0.23", "--pp", "2", "--use-v2-model-runner"), 1),  # no in-flight reserve before 0.26
    (("--engine", "vllm@0.32"), 2),  # async scheduling on by default
    (("--engine", "vllm@0.32", "--no-async-scheduling"), 1),
    (("--engine", "vllm@0.32", "--pp", "2"), 3),  # the V2 runner keeps async on at pp 2: pp + 1 batches
    (("--engine", "vllm@0.32", "--pp", "2", "--no-async-scheduling"), 2),
    (("--engine", "vllm@0.33", "--pp", "4"), 5),
])
def test_sliding_reserve_counts_batches_in_flight_only_from_0_26(args, batches):
    assert sliding_blocks(*args) == expected(batches * MBT)


@pytest.mark.parametrize("model, engine, v2", [
    ("llama-3.1-8b", "vllm@0.21", False),  # no V2 default before 0.22
    ("qwen3-8b", "vllm@0.22", True), ("llama-3.1-8b", "vllm@0.22", False),  # 0.22's list: Qwen3ForCausalLM only
    ("llama-3.1-8b", "vllm@0.23", True),
    ("gemma-2-9b", "vllm@0.24", False), ("llama-3.1-8b", "vllm@0.24", True),  # 0.24: the list alone
    ("gemma-2-9b", "vllm@0.25", True), ("mixtral-8x7b", "vllm@0.28", False),  # 0.25-0.28: dense, or listed
    ("qwen3.5-27b", "vllm@0.28", False),  # hybrids stay on V1
    ("mixtral-8x7b", "vllm@0.29", True), ("qwen3.5-27b", "vllm@0.32", True),  # 0.29: every model
])
def test_cuda_graphs_are_charged_on_the_v1_runner_and_on_v2_from_0_29(model, engine, v2):
    """config/vllm.py _is_default_v2_model_runner_model by version; the V2 runner's profile_cudagraph_memory
    returns 0 until 0.29, so its CUDA graphs are not taken from the KV budget."""
    parts = kvjson("fit", model, "--gpu", "H100", "--engine", engine)["results"][0]["budget"][0]["parts"]
    charged = any(p["what"].startswith("CUDA graphs") for p in parts)
    assert charged == (not v2 or engine in ("vllm@0.29", "vllm@0.32")), parts
