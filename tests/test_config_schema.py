"""The config schema step (kvplan/architectures/schema.py): every genuine config passes it unchanged, every field
the family code reads has a rule, and each rule refuses what it should (one line naming field and value)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import ROOT
from kvplan.architectures import schema
from kvplan.errors import ConfigError

GENUINE = sorted((ROOT / "model_configs").glob("*/config.json"))
FAMILY_CODE = [p for p in (ROOT / "kvplan" / "architectures").glob("*.py") if p.name not in ("schema.py", "gguf_spec.py")]
# string constants in those calls that are values, not field names (dict.get defaults, model_type defaults)
NOT_FIELDS = {"", "e4m3", "gemma", "default"}


@pytest.mark.parametrize("path", GENUINE, ids=lambda p: p.parent.name)
def test_every_bundled_config_passes_unchanged(path):
    raw = json.loads(path.read_text())
    assert schema.validate(raw) == raw


def _read_keys() -> dict[str, set[str]]:
    """Field names the family modules read: string arguments of need/need_int/need_all/get/has/sub calls and
    constant subscripts."""
    keys: dict[str, set[str]] = {}
    for path in FAMILY_CODE:
        for node in ast.walk(ast.parse(path.read_text())):
            args: list[ast.AST] = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "need_int", "need", "get", "has", "need_all", "sub"):
                args = list(node.args)
            elif isinstance(node, ast.Subscript):
                args = [node.slice]
            for arg in args:
                for c in ast.walk(arg):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        keys.setdefault(c.value, set()).add(path.name)
    return keys


def test_every_field_the_family_code_reads_has_a_rule():
    """A new family reading a new field must give it a rule, or the field reaches int()/bool() unchecked."""
    scoped = {k for table in schema.SCOPED.values() for k in table}
    keys = _read_keys()
    assert len(keys) > 100  # the scan sees the family code
    missing = {k: sorted(v) for k, v in keys.items() if k not in schema.FIELDS and k not in scoped and k not in NOT_FIELDS}
    assert not missing, f"fields read without a schema rule: {missing}"


@pytest.mark.parametrize("key,good,bad", [
    ("num_hidden_layers", [1, 32, 4096, 32.0], [0, -1, 4097, 1.5, True, "32", float("nan"), [32], 10**1000]),
    ("num_key_value_heads", [1, 8], [0, -8, 2.5, False, "8"]),
    ("intermediate_size", [0, 14336, [1, 2]], [-1, 1e30, "x", [1.5]]),
    ("max_position_embeddings", [1, 2**40], [0, 2**40 + 1, float("inf"), "131072"]),
    ("sliding_window", [0, 4096], [-4096, 1.5, "4096", True]),
    ("tie_word_embeddings", [True, False], ["false", 0, 1, [True]]),
    ("architectures", [["LlamaForCausalLM"], []], ["LlamaForCausalLM", [5], 5]),
    ("model_type", ["llama"], [False, 5, ["llama"]]),
    ("quantization_config", [{}, {"quant_method": "fp8"}], ["fp8", [1], 5]),
    ("block_configs", [[{}], []], [{}, [1], "x"]),
    ("weight_block_size", [[128, 128]], ["128", [0], [1.5]]),
])
def test_each_rule_accepts_and_refuses(key, good, bad):
    for value in good:
        schema.validate({key: value})
    for value in bad:
        with pytest.raises(ConfigError) as e:
            schema.validate({key: value})
        assert key in str(e.value) and "\n" not in str(e.value)


def test_rules_apply_in_nested_configs_and_scoped_fields_only_in_their_container():
    with pytest.raises(ConfigError, match=r"config\.text_config\.head_dim"):
        schema.validate({"text_config": {"head_dim": -1}})
    with pytest.raises(ConfigError, match=r"config\.rope_scaling\.factor"):
        schema.validate({"rope_scaling": {"factor": 0}})
    schema.validate({"initializer": {"factor": "anything"}})  # "factor" outside rope_scaling is not read
    with pytest.raises(ConfigError, match=r"block_configs\[1\]\.ffn\.ffn_mult"):
        schema.validate({"block_configs": [{"ffn": {"ffn_mult": 1.3}}, {"ffn": {"ffn_mult": -1}}]})


def test_integral_floats_become_integers_and_the_input_is_left_alone():
    raw = {"num_hidden_layers": 32.0, "text_config": {"head_dim": 128.0}}
    out = schema.validate(raw)
    assert out == {"num_hidden_layers": 32, "text_config": {"head_dim": 128}}
    assert isinstance(out["num_hidden_layers"], int) and isinstance(raw["num_hidden_layers"], float)


def test_depth_and_long_values_stay_one_short_line():
    deep: dict = {}
    node = deep
    for _ in range(40):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(ConfigError, match="nested deeper"):
        schema.validate(deep)
    with pytest.raises(ConfigError) as e:
        schema.validate({"model_type": ["x" * 10_000]})
    assert len(str(e.value)) < 200
    with pytest.raises(ConfigError) as e:
        schema.validate({"vocab_size": 10**5000})
    assert "bits" in str(e.value) and len(str(e.value)) < 200
