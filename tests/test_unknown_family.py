"""A config of a family kvplan does not know (issue 12): an answer from its standard fields with a caveat in every
output, or one line naming the fields it cannot interpret — never a silent plain-attention figure for a config that
carries latent, linear-attention, state, sparse-index, shared-KV or cross-attention fields."""

from __future__ import annotations

import json

import pytest

from conftest import kvjson, run_cli, write_config
from kvplan import catalog
from kvplan.architectures import FOREIGN_CACHE_FIELDS

LLAMA = json.loads(next(m for m in catalog.bundled_models() if m.config_path.parent.name == "meta-llama--Llama-3.1-8B")
                   .config_path.read_text())


def unknown(**extra) -> dict:
    cfg = dict(LLAMA, model_type="zebra", architectures=["ZebraForCausalLM"])
    cfg.update(extra)
    return cfg


# one real-looking value per field (the schema step checks types before the family guard runs)
VALUES = {"hybrid_override_pattern": "M*M*", "layers_block_type": ["mamba", "attention"], "ssm_cfg": {"d_state": 16},
          "linear_attn_config": {"kda_layers": [1]}, "compress_ratios": [4, 4], "kv_sharing": {"layers": 2},
          "full_attn_idxs": [3], "cross_attention_layers": [3, 8], "conv_bias": False, "time_step_rank": "auto",
          "hybrid_layer_pattern": [0, 1, 1, 1], "sparse_attention_config": {"sparse_topk_blocks": 16},
          "attn_type_list": [0, 0, 0, 1], "decoder_attention_types": [0, 0, 0, 1]}
CASES = [(what, name) for what, names in FOREIGN_CACHE_FIELDS.items() for name in names]


@pytest.mark.parametrize("what,field", CASES, ids=[f for _, f in CASES])
def test_a_foreign_cache_field_is_refused_in_one_line(tmp_path, what, field):
    cfg = unknown(**{field: VALUES.get(field, 16)})
    for command in (["size", write_config(tmp_path, "m", cfg), "--ctx", "4096"],
                    ["fit", "--model", write_config(tmp_path, "m", cfg), "--gpu", "H100"]):
        r = run_cli(*command)
        assert r.code == 2, (field, r.out[-300:])
        assert field in r.err and what in r.err and "zebra" in r.err
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_plain_fields_give_an_answer_with_a_caveat_in_every_output(tmp_path):
    path = write_config(tmp_path, "m", unknown(sliding_window=4096))
    d = kvjson("size", path, "--ctx", "8192", "--engine", "hf")
    plain = kvjson("size", "llama-3.1-8b", "--ctx", "8192", "--engine", "hf")
    assert any("zebra" in w and "llama-style decoder" in w for w in d["warnings"])
    assert any("sliding_window" in w for w in d["warnings"])
    assert d["kv_bytes"] < plain["kv_bytes"]  # the window was read, not dropped
    text = run_cli("size", path, "--ctx", "8192")
    assert text.code == 0 and "zebra" in text.out + text.err


def test_known_families_carry_no_caveat():
    for name in ("llama-3.1-8b", "qwen3-8b", "deepseek-v3.2", "glm-5.2", "qwen3-next-80b-a3b", "jamba-v0.1"):
        d = kvjson("size", name, "--ctx", "4096")
        assert not any("not a family kvplan knows" in w for w in d["warnings"]), name
