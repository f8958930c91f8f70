"""NVFP4 checkpoints (NVIDIA ModelOpt exports): weight bytes counted tensor by tensor as the export writes them.

The oracle is a public listing of nvidia/Qwen3-30B-A3B-NVFP4's safetensors headers (a preflight note in a public
repository, headers read with safetensors, not written here): per quantized linear `weight` U8 [out, in/2],
`weight_scale` F8_E4M3 [out, in/16], `weight_scale_2` and `input_scale` F32 []; experts stored per gate_proj /
up_proj / down_proj; 49 excluded modules (the 48 routers `model.layers.N.mlp.gate` and lm_head); the index holds
74,835 tensor keys. The config below is Qwen3-30B-A3B's genuine config.json with the export's quantization_config
(quant_method modelopt, quant_algo NVFP4, group_size 16, kv_cache_quant_algo FP8, exclude_modules) added.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from kvplan import weights
from kvplan.architectures import normalize

QWEN3_30B = Path(__file__).with_name("data") / "wild-configs" / "Qwen--Qwen3-30B-A3B" / "config.json"
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, MOE_INTER, VOCAB = 48, 2048, 32, 4, 128, 128, 768, 151936


def nvfp4_tensor(out_dim: int, in_dim: int) -> int:
    """One quantized linear as the header listing shows it: U8 [out, in/2] + F8_E4M3 [out, in/16] + two F32 []."""
    return out_dim * in_dim // 2 + out_dim * in_dim // 16 + 2 * 4


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    cfg = json.loads(QWEN3_30B.read_text())
    cfg["quantization_config"] = {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "FP8",
        "exclude_modules": [f"model.layers.{i}.mlp.gate" for i in range(LAYERS)] + ["lm_head"],
    }
    path = tmp_path_factory.mktemp("qwen3-30b-a3b-nvfp4") / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_the_listed_tensors_are_counted_as_the_header_stores_them(config):
    spec = normalize(json.loads(config.read_text()))
    fmt = weights.weight_format(spec, None, "bf16")
    parts = {(w.name, w.layer): weights.part_bytes(w, fmt, 2) for w in spec.weights}
    assert parts[("self_attn.k_proj", 0)] == 512 * 1024 + 512 * 128 + 8  # [512, 1024] U8, [512, 128] F8, 2 x F32
    assert parts[("mlp.experts.gate_up_proj", 0)] == EXPERTS * 2 * (768 * 1024 + 768 * 128 + 8)
    assert parts[("mlp.experts.down_proj", 0)] == EXPERTS * (2048 * 384 + 2048 * 48 + 8)
    assert parts[("mlp.gate", 0)] == EXPERTS * HIDDEN * 2  # excluded: the router stays bf16


def test_the_whole_checkpoint_is_the_sum_of_its_listed_tensors(config):
    """Every tensor the export writes, summed from the listing's layout (not from kvplan's parts)."""
    attention = (nvfp4_tensor(HEADS * HEAD_DIM, HIDDEN) + 2 * nvfp4_tensor(KV_HEADS * HEAD_DIM, HIDDEN)
                 + nvfp4_tensor(HIDDEN, HEADS * HEAD_DIM) + 2 * HEAD_DIM * 2)  # q, k, v, o; q_norm, k_norm
    kv_scales = 2 * 4  # self_attn.k_proj.k_scale, self_attn.v_proj.v_scale (kv_cache_quant_algo FP8)
    experts = EXPERTS * (2 * nvfp4_tensor(MOE_INTER, HIDDEN) + nvfp4_tensor(HIDDEN, MOE_INTER))
    layer = attention + kv_scales + experts + EXPERTS * HIDDEN * 2 + 2 * HIDDEN * 2  # router, two layer norms
    expected = LAYERS * layer + 2 * VOCAB * HIDDEN * 2 + HIDDEN * 2  # embed_tokens, lm_head (excluded), norm
    d = run_cli("size", str(config), "--ctx", "4096", "--json").json()
    assert d["weight_dtype"] == "nvfp4" and d["weight_bytes"] == expected
    assert not any("upper bound" in w for w in d["warnings"])
    assert d["kv_dtype"] == "fp8_e4m3" and d["kv_dtype_source"] == "quantization_config"


def test_the_excluded_patterns_match_as_modelopt_writes_them():
    from kvplan.spec import WeightPart

    def part(name: str, layer: int | None = 3) -> WeightPart:
        return WeightPart(name, (8, 16), "linear", "text", "column", layer)

    gemma_style = ("model.language_model.layers.3.self_attn*", "lm_head", "model.vision_tower*")
    assert weights.excluded_module(part("self_attn.q_proj"), gemma_style)
    assert not weights.excluded_module(part("self_attn.q_proj", 30), gemma_style)  # layers.3 is not layers.30
    assert not weights.excluded_module(part("mlp.gate_proj"), gemma_style)
    assert weights.excluded_module(part("lm_head", None), gemma_style)
    router = ("model.layers.3.mlp.gate",)
    assert weights.excluded_module(part("mlp.gate"), router)
    assert not weights.excluded_module(part("mlp.gate_proj"), router)  # a wildcard match, not a substring
    assert weights.excluded_module(part("self_attn.o_proj"), ("*self_attn*",))
