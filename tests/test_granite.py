"""Granite 3.x (model_type granite): a family built of existing cache kinds, added as one row of
architectures/decoder.py's QUIRKS and nothing in the engines (issue 37's measure of a family's cost).

The config is IBM's genuine granite-3.3-8b-instruct (tests/data/wild-configs, SOURCES.yaml); the parameter count is
transformers' own GraniteForCausalLM built on the meta device."""

from __future__ import annotations

import json

import pytest

from conftest import DATA, kvjson
from kvplan import engines

CONFIG = DATA / "wild-configs" / "ibm-granite--granite-3.3-8b-instruct" / "config.json"


def test_a_known_family_sizes_without_the_unknown_family_warning():
    d = kvjson("size", str(CONFIG), "--ctx", "4096")
    assert d["family"] == "decoder" and d["architecture"] == "GraniteForCausalLM"
    assert not [w for w in d.get("warnings", []) if "not a family kvplan knows" in w]
    # 40 layers x 8 KV heads x head_dim 128 x K and V x 2 B x 4096 tokens
    assert d["kv_bytes"] == 40 * 8 * 128 * 2 * 2 * 4096


@pytest.mark.parametrize("engine", engines.names())
def test_every_engine_sizes_it_with_no_row_of_its_own(engine):
    """Plain attention in every engine's own rule: 163,840 B a token (40 layers x 8 KV heads x 128 x K and V x 2 B);
    4,096 tokens fill whole vLLM blocks, llama.cpp cells and TensorRT-LLM blocks, and SGLang's pool keeps one page
    (one row) of padding."""
    d = kvjson("size", str(CONFIG), "--ctx", "4096", "--engine", engine)
    per_token = 40 * 8 * 128 * 2 * 2
    assert d["kv_bytes_per_token"] == per_token
    assert d["kv_bytes"] == per_token * (4096 + (1 if engine == "sglang" else 0))


def test_params_equal_transformers_meta():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = json.loads(CONFIG.read_text())
    config = transformers.AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "architectures"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == "GraniteForCausalLM"
    assert kvjson("size", str(CONFIG), "--ctx", "1024")["params"] == sum(p.numel() for p in model.parameters())
