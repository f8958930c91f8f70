"""llama.cpp (b11434) for the families kvplan sized for other engines first: LFM2 / LFM2-MoE, MiniMax-M2 and M3,
Step-3.5/3.7, MiMo-V2-Flash, Gemma 4.

The engine oracle is llama.cpp itself: tests/oracle_llamacpp.py holds scaled GGUFs of the archs lfm2, lfm2moe,
minimax-m2, minimax-m3, step35, mimo2 and gemma4 and tests/test_engine_llamacpp.py compares every size line b11434
prints with kvplan's plan for the same GGUF (`pytest -m engine tests/test_engine_llamacpp.py -k "lfm2 or minimax or
step35 or mimo2 or gemma4"`). What is checked here, without the binaries:

- a config.json and the GGUF llama.cpp's converter writes from it (conversion/lfm2.py, minimax.py, gemma.py,
  step3.py, mimo.py of the b11434 sdist: the metadata each writes is spelled out below, from the config's own fields)
  give the same llama.cpp plan, so the oracle's verdict on the GGUF route carries to the config route;
- the GGUF reader's rules for these archs (src/models/<arch>.cpp load_arch_hparams) and their one-line refusals;
- the byte counts of the new llama.cpp rules, written out from llama.cpp's formulas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import ROOT, kvjson, run_cli, write_config, write_gguf_file
from test_gemma4 import e2b_shaped
from test_lfm2 import LFM2_1B2

from kvplan.architectures import gguf_spec
from kvplan.gguf import read_header_from_path
from kvplan.spec import FullAttention, MsaIndexerKeys, SharedKV, ShortConvState, SlidingWindow
from kvplan.verify.llamacpp_run import kvplan_lines

AIC = ROOT / "tests" / "data" / "aic-configs"


def config(name: str) -> dict[str, Any]:
    path = ROOT / "model_configs" / name / "config.json"
    return json.loads(path.read_text())


def gguf(tmp: Path, name: str, arch: str, kv: dict[str, Any]) -> str:
    """A GGUF of the given metadata (keys without the `<arch>.` prefix) and one tiny tensor."""
    meta = {f"{arch}.{k}": v for k, v in kv.items()}
    path = tmp / f"{name}.gguf"
    write_gguf_file(path, arch, meta, [("token_embd.weight", np.zeros((4, 8), dtype=np.float32), None)])
    return str(path)


def spec_of(path: str):
    return gguf_spec.from_header(read_header_from_path(Path(path)))


FLAGS = [
    ("--ctx", "8192"),
    ("--ctx", "3000", "--batch", "3"),
    ("--ctx", "2000", "--batch", "2", "--kv-unified", "--no-flash-attn"),
    ("--ctx", "4096", "--k-dtype", "q8_0", "--v-dtype", "q8_0"),
]


def same_plan(config_path: str, gguf_path: str) -> None:
    for flags in FLAGS:
        a = kvjson("size", config_path, "--engine", "llamacpp", *flags)
        b = kvjson("size", gguf_path, "--engine", "llamacpp", *flags)
        assert kvplan_lines(a) == kvplan_lines(b), flags
        assert a["kv_bytes"] == b["kv_bytes"] and a["engine_details"] == b["engine_details"], flags


# ---------------------------------------------------------------------------------------------- config = GGUF
def lfm2_types(c: dict[str, Any]) -> list[str]:
    return ["full_attention" if i in c["full_attn_idxs"] else "conv" for i in range(c["num_hidden_layers"])]


def test_lfm2_config_and_its_gguf_plan_alike(tmp_path):
    # conversion/lfm2.py LFM2Model.set_gguf_parameters: head_count_kv per layer, 0 on the "conv" layers
    c = LFM2_1B2
    kv = {"block_count": 16, "context_length": c["max_position_embeddings"], "embedding_length": c["hidden_size"],
          "attention.head_count": c["num_attention_heads"], "shortconv.l_cache": c["conv_L_cache"],
          "attention.head_count_kv": [0 if t == "conv" else c["num_key_value_heads"] for t in lfm2_types(c)]}
    path = gguf(tmp_path, "lfm2", "lfm2", kv)
    same_plan(write_config(tmp_path, "lfm2", c), path)
    assert {type(x) for _, x in spec_of(path).caches} == {FullAttention, ShortConvState}


def test_lfm2_moe_config_and_its_gguf_plan_alike(tmp_path):
    # LFM2-8B-A1B's layout (24 layers, attention on 6) as lfm2_moe; conversion/lfm2.py LFM2MoeModel: kv heads where
    # layer_types is "full_attention", leading_dense_block_count = num_dense_layers
    types = ["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)]
    c = {"architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "vocab_size": 65536, "hidden_size": 2048,
         "intermediate_size": 7168, "moe_intermediate_size": 1792, "num_hidden_layers": 24, "num_attention_heads": 32,
         "num_key_value_heads": 8, "conv_L_cache": 3, "num_dense_layers": 2, "num_experts": 32,
         "num_experts_per_tok": 4, "layer_types": types, "max_position_embeddings": 128000}
    kv = {"block_count": 24, "context_length": 128000, "embedding_length": 2048, "attention.head_count": 32,
          "attention.head_count_kv": [8 if t == "full_attention" else 0 for t in types], "shortconv.l_cache": 3,
          "leading_dense_block_count": 2, "expert_count": 32, "expert_used_count": 4,
          "expert_feed_forward_length": 1792}
    same_plan(write_config(tmp_path, "lfm2moe", c), gguf(tmp_path, "lfm2moe", "lfm2moe", kv))


def test_minimax_m2_config_and_its_gguf_plan_alike(tmp_path):
    c = config("MiniMaxAI--MiniMax-M2.5")  # MiniMaxM2Model: the generic keys, head_dim as key/value length
    kv = {"block_count": c["num_hidden_layers"], "context_length": c["max_position_embeddings"],
          "embedding_length": c["hidden_size"], "attention.head_count": c["num_attention_heads"],
          "attention.head_count_kv": c["num_key_value_heads"], "attention.key_length": c["head_dim"],
          "attention.value_length": c["head_dim"], "rope.dimension_count": c["rotary_dim"]}
    path = gguf(tmp_path, "m2", "minimax-m2", kv)
    same_plan(str(ROOT / "model_configs" / "MiniMaxAI--MiniMax-M2.5" / "config.json"), path)
    assert not any("not in kvplan's table" in n for n in spec_of(path).notes)


def test_minimax_m3_config_and_its_gguf_plan_alike(tmp_path):
    src = AIC / "MiniMaxAI--MiniMax-M3_config.json"
    c = json.loads(src.read_text())
    s = c["sparse_attention_config"]
    # MiniMaxM3Model: the leading zeros of moe_layer_freq as leading_dense_block_count, sparse_index_dim as the
    # indexer key length; llama.cpp then keeps index keys where il >= that count
    lead = next(i for i, v in enumerate(c["moe_layer_freq"]) if v)
    assert [i for i, f in enumerate(s["sparse_attention_freq"]) if f] == list(range(lead, c["num_hidden_layers"]))
    kv = {"block_count": c["num_hidden_layers"], "context_length": c["max_position_embeddings"],
          "embedding_length": c["hidden_size"], "attention.head_count": c["num_attention_heads"],
          "attention.head_count_kv": c["num_key_value_heads"], "attention.key_length": c["head_dim"],
          "attention.value_length": c["head_dim"], "leading_dense_block_count": lead,
          "attention.indexer.head_count": s["sparse_num_index_heads"],
          "attention.indexer.key_length": s["sparse_index_dim"]}
    path = gguf(tmp_path, "m3", "minimax-m3", kv)
    same_plan(str(src), path)
    idx = [i for i, x in spec_of(path).caches if isinstance(x, MsaIndexerKeys)]
    assert idx == list(range(3, 60))


def test_gemma4_config_and_its_gguf_plan_alike(tmp_path):
    c = config("google--gemma-4-26B-A4B")["text_config"]
    swa = [t == "sliding_attention" for t in c["layer_types"]]
    # Gemma4Model.set_gguf_parameters: key/value length global_head_dim, the _swa ones head_dim, head_count_kv per
    # layer (num_key_value_heads sliding, num_global_key_value_heads full), the layer_types flags, shared_kv_layers
    kv = {"block_count": c["num_hidden_layers"], "context_length": c["max_position_embeddings"],
          "embedding_length": c["hidden_size"], "attention.head_count": c["num_attention_heads"],
          "attention.head_count_kv": [c["num_key_value_heads"] if s else c["num_global_key_value_heads"] for s in swa],
          "attention.key_length": c["global_head_dim"], "attention.value_length": c["global_head_dim"],
          "attention.key_length_swa": c["head_dim"], "attention.value_length_swa": c["head_dim"],
          "attention.sliding_window": c["sliding_window"], "attention.sliding_window_pattern": swa,
          "attention.shared_kv_layers": c["num_kv_shared_layers"], "embedding_length_per_layer_input": 0}
    same_plan(str(ROOT / "model_configs" / "google--gemma-4-26B-A4B" / "config.json"), gguf(tmp_path, "g4", "gemma4", kv))


def test_gemma4_shared_kv_config_and_its_gguf_plan_alike(tmp_path):
    c = e2b_shaped()["text_config"]
    swa = [t == "sliding_attention" for t in c["layer_types"]]
    # no num_global_key_value_heads: the converter writes no per-layer array, the generic scalar stays
    kv = {"block_count": 35, "context_length": c["max_position_embeddings"], "embedding_length": c["hidden_size"],
          "attention.head_count": 8, "attention.head_count_kv": c["num_key_value_heads"],
          "attention.key_length": 512, "attention.value_length": 512, "attention.key_length_swa": 256,
          "attention.value_length_swa": 256, "attention.sliding_window": 512,
          "attention.sliding_window_pattern": swa, "attention.shared_kv_layers": 20,
          "embedding_length_per_layer_input": 256}
    path = gguf(tmp_path, "e2b", "gemma4", kv)
    same_plan(write_config(tmp_path, "e2b", e2b_shaped()), path)
    shared = {i: x.target for i, x in spec_of(path).caches if isinstance(x, SharedKV)}
    # llama.cpp's reuse: n_layer_kv_from_start - (is_swa ? 2 : 1) = 13 (sliding) or 14 (full)
    assert shared == {i: 13 if swa[i] else 14 for i in range(15, 35)}


def test_step_config_and_its_gguf_plan_alike(tmp_path):
    c = config("stepfun-ai--Step-3.7-Flash")
    n, mtp = c["num_hidden_layers"], c["num_nextn_predict_layers"]
    # Step35Model: MTP blocks appended (block_count n + mtp, nextn_predict_layers mtp), their layer types padded
    # with full attention; head counts / kv heads per layer kind (this curated file names one kv count for both:
    # the release's num_attention_groups 8 and attention_other_setting's 8)
    types = c["layer_types"][:n] + ["full_attention"] * mtp
    swa = [t == "sliding_attention" for t in types]
    kv = {"block_count": n + mtp, "context_length": c["max_position_embeddings"], "embedding_length": c["hidden_size"],
          "attention.head_count": [96 if s else c["num_attention_heads"] for s in swa],
          "attention.head_count_kv": c["num_key_value_heads"], "attention.key_length": c["head_dim"],
          "attention.value_length": c["head_dim"], "attention.sliding_window": c["sliding_window"],
          "attention.sliding_window_pattern": swa, "nextn_predict_layers": mtp}
    same_plan(str(ROOT / "model_configs" / "stepfun-ai--Step-3.7-Flash" / "config.json"), gguf(tmp_path, "s", "step35", kv))


def test_mimo2_config_and_its_gguf_plan_alike(tmp_path):
    c = config("XiaomiMiMo--MiMo-V2-Flash")
    swa = [bool(x) for x in c["hybrid_layer_pattern"]]
    # MimoV2Model: head_count_kv per layer (swa_num_key_value_heads on hybrid_layer_pattern 1), key length head_dim,
    # value length v_head_dim, the pattern as the sliding flags
    kv = {"block_count": c["num_hidden_layers"], "context_length": c["max_position_embeddings"],
          "embedding_length": c["hidden_size"], "attention.head_count": c["num_attention_heads"],
          "attention.head_count_kv": [c["swa_num_key_value_heads"] if s else c["num_key_value_heads"] for s in swa],
          "attention.key_length": c["head_dim"], "attention.value_length": c["v_head_dim"],
          "attention.sliding_window": c["sliding_window"], "attention.sliding_window_pattern": swa}
    same_plan(str(ROOT / "model_configs" / "XiaomiMiMo--MiMo-V2-Flash" / "config.json"), gguf(tmp_path, "mimo", "mimo2", kv))


# ---------------------------------------------------------------------------------------------- llama.cpp's formulas
def test_lfm2_conv_rows_and_attention_cells(tmp_path):
    """llama_memory_recurrent r rows n_embd x (L - 1) f32 per sequence, no s row; llama_kv_cache K/V on the 6
    attention layers only."""
    d = kvjson("size", write_config(tmp_path, "m", LFM2_1B2), "--engine", "llamacpp", "--ctx", "1000", "--batch", "4")
    state = [g for g in d["groups"] if g["kind"] == "conv_state"]
    assert sum(g["bytes"] for g in state) == 10 * 4 * 2048 * 2 * 4
    assert [t["name"] for g in state for t in g["tensors"]] == ["r (conv state)"]
    attn = [g for g in d["groups"] if g["kind"] == "full"]
    assert sum(g["bytes"] for g in attn) == 6 * 4 * 1024 * 8 * 64 * 2 * 2  # 4 streams of PAD(1000, 256) cells


def test_minimax_m3_index_cache_has_a_one_head_v_row(tmp_path):
    """llama_kv_cache_msa's index cache is a llama_kv_cache of hparams with n_head_kv 1 and n_embd_head_k = the
    index key length: K of 128 and a V of one 128-wide head per cell, both f16 here, on the 57 sparse layers."""
    d = kvjson("size", str(AIC / "MiniMaxAI--MiniMax-M3_config.json"), "--engine", "llamacpp", "--ctx", "8192")
    idx = [g for g in d["groups"] if g["kind"] == "indexer"]
    assert sum(g["bytes"] for g in idx) == 57 * 8192 * (128 + 128) * 2
    assert d["kv_bytes"] == 60 * 8192 * 4 * 128 * 2 * 2 + 57 * 8192 * 256 * 2


# ---------------------------------------------------------------------------------------------- the GGUF reader
def test_lfm2_with_a_sliding_window_is_refused(tmp_path):
    kv = {"block_count": 2, "context_length": 4096, "embedding_length": 64, "attention.head_count": 4,
          "attention.head_count_kv": [0, 2], "shortconv.l_cache": 3, "attention.sliding_window": 512}
    r = run_cli("size", gguf(tmp_path, "w", "lfm2", kv), "--engine", "llamacpp")
    assert r.code == 2 and "hybrid iSWA" in r.err and r.err.count("\n") == 1, r.err
    # lfm2moe's load_arch_hparams reads no window: the key is ignored there
    spec = spec_of(gguf(tmp_path, "wm", "lfm2moe", kv))
    assert {type(x) for _, x in spec.caches} == {FullAttention, ShortConvState}


@pytest.mark.parametrize("arch", ["gemma4", "step35", "mimo2"])
def test_pattern_array_is_required(tmp_path, arch):
    kv = {"block_count": 4, "context_length": 4096, "embedding_length": 64, "attention.head_count": 4,
          "attention.head_count_kv": 2, "attention.key_length": 64, "attention.value_length": 64,
          "attention.sliding_window": 128, "attention.sliding_window_pattern": 2}
    r = run_cli("size", gguf(tmp_path, arch, arch, kv), "--engine", "llamacpp")
    assert r.code == 2 and "sliding_window_pattern" in r.err and r.err.count("\n") == 1, r.err


def test_gemma4_too_many_shared_layers_is_refused(tmp_path):
    kv = {"block_count": 4, "context_length": 4096, "embedding_length": 64, "attention.head_count": 4,
          "attention.head_count_kv": 1, "attention.key_length": 64, "attention.value_length": 64,
          "attention.sliding_window": 128, "attention.sliding_window_pattern": [True, False, True, False],
          "attention.shared_kv_layers": 3}
    r = run_cli("size", gguf(tmp_path, "g", "gemma4", kv), "--engine", "llamacpp")
    assert r.code == 2 and "shared_kv_layers" in r.err and r.err.count("\n") == 1, r.err


def test_minimax_m3_index_layers_follow_the_leading_dense_count(tmp_path):
    kv = {"block_count": 6, "context_length": 4096, "embedding_length": 64, "attention.head_count": 4,
          "attention.head_count_kv": 2, "attention.key_length": 64, "attention.value_length": 64,
          "leading_dense_block_count": 4, "attention.indexer.key_length": 32}
    spec = spec_of(gguf(tmp_path, "m3", "minimax-m3", kv))
    assert [(i, x.head_dim) for i, x in spec.caches if isinstance(x, MsaIndexerKeys)] == [(4, 32), (5, 32)]
    assert all(isinstance(x, FullAttention) and not isinstance(x, SlidingWindow)
               for _, x in spec.caches if not isinstance(x, MsaIndexerKeys))
