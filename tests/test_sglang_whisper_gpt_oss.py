"""Engine-source fixes to two existing SGLang rules and one TensorRT-LLM rule; every expected figure below is the
engine's own formula written out over the bundled config.json, never kvplan's output.

Whisper on SGLang (0.5.10.post1 and 0.5.23 wheels, read alike): configs/model_config.py sets num_attention_layers =
encoder_layers + 2 x decoder_layers ("Even though cross-attention doesn't save KV cache, attention backend needs
buffer to exist"); ModelRunner's num_effective_layers = max(num_hidden_layers, num_attention_layers) sizes the one
MHATokenToKVPool and get_cell_size_per_token = num_kv_heads x (head_dim + v_head_dim) x layers x dtype bytes, with
num_key_value_heads / num_attention_heads / hidden_size mapped by WhisperConfig.attribute_map to
encoder_attention_heads and d_model. models/whisper.py pad_input_ids prepends max_source_positions pad ids that
prepare_encoder_info_extend (managers/schedule_batch.py) hands to the cross-attention layers: a request holds
ctx + max_source_positions pool rows. get_context_length finds no context key in WhisperConfig: context_len 2048,
which _resolve_max_num_reqs reads.

GPT-OSS on SGLang: models/gpt_oss.py get_attention_sliding_window_size = sliding_window - 1, ModelRunner's
sliding_window_size (the SWA eviction window and 0.5.23's validate_swa_pool_size floor: window + page).

Whisper on TensorRT-LLM: trtGptModelInflightBatching.cpp gives an encoder-decoder's cross K/V a second KV cache
manager with cross_kv_cache_fraction of the memory; kvplan refuses it as it refuses T5 / BART.
"""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, kvjson, run_cli, write_config

WHISPER = json.loads((ROOT / "model_configs" / "openai--whisper-large-v3" / "config.json").read_text())
GPT_OSS = json.loads((ROOT / "model_configs" / "openai--gpt-oss-20b" / "config.json").read_text())
FP16 = BF16 = 2
SGLANG_VERSIONS = ["sglang@0.5", "sglang@0.5.23"]


# ---------------------------------------------------------------------------------------------- Whisper, SGLang
def _whisper_cell(tp: int = 1) -> int:
    """get_cell_size_per_token over num_attention_layers, heads and head_dim as WhisperConfig maps them."""
    c = WHISPER
    layers = c["encoder_layers"] + 2 * c["decoder_layers"]  # model_config.py num_attention_layers
    kv_heads = max(1, c["encoder_attention_heads"] // tp)  # get_num_kv_heads (num_key_value_heads -> encoder heads)
    head_dim = c["d_model"] // c["encoder_attention_heads"]  # hidden_size // num_attention_heads
    return kv_heads * (head_dim + head_dim) * layers * FP16


PAD = WHISPER["max_source_positions"]  # pad_input_ids: max_source_positions pool slots per request


def test_whisper_cell_spans_encoder_and_both_decoder_attentions():
    assert _whisper_cell() == 20 * 128 * 96 * 2 == 491_520


@pytest.mark.parametrize("engine", SGLANG_VERSIONS)
def test_whisper_pool_rows_and_bytes(engine):
    """Each pool layer holds ctx + max_source_positions rows per request, plus one page of padding rows."""
    ctx, batch = 448, 2
    d = kvjson("size", "whisper-large-v3", "--engine", engine, "--ctx", str(ctx), "--batch", str(batch))
    assert d["kv_bytes_per_token"] == _whisper_cell()
    assert d["kv_bytes"] == (batch * (ctx + PAD) + 1) * _whisper_cell()
    assert {g["kind"]: g["layers"] for g in d["groups"]} == {
        "full": WHISPER["encoder_layers"] + WHISPER["decoder_layers"], "cross": WHISPER["decoder_layers"]}
    assert {g["tokens"] for g in d["groups"]} == {ctx + PAD}


@pytest.mark.parametrize("engine", SGLANG_VERSIONS)
@pytest.mark.parametrize("page", [1, 16])
def test_whisper_capacity_and_batch(engine, page):
    """profile_max_num_token: int(rest) // cell, floored to the page; a request takes pad(ctx + 1500) of it;
    _resolve_max_num_reqs: min(max(min(int(tokens / context_len x 512), 4096), 2048), tokens // 2), context_len 2048."""
    budget, ctx = 4_917_657_723, 448
    r = kvjson("fit", "whisper-large-v3", "--engine", engine, "--gpu", "H100", "--kv-budget", f"{budget}B",
               "--ctx", str(ctx), "--page-size", str(page))["results"][0]
    tokens = budget // _whisper_cell() // page * page
    assert r["kv_capacity_tokens"] == tokens == (10_005 if page == 1 else 10_000)
    per = -(-(ctx + PAD) // page) * page
    assert r["max_batch"] == tokens // per
    assert r["engine_details"]["context_len"] == 2048
    assert r["engine_batch_cap"] == min(max(min(int(tokens / 2048 * 512), 4096), 2048), tokens // 2)


def test_whisper_tp_divides_the_heads():
    d = kvjson("size", "whisper-large-v3", "--engine", "sglang", "--ctx", "100", "--tp", "4")
    assert d["kv_bytes_per_token"] == _whisper_cell(tp=4)


@pytest.mark.parametrize("args, says", [
    (["--engine", "sglang@0.4"], "0.4's is not read"),
    (["--engine", "sglang", "--encoder-len", "1000"], "every request takes max_source_positions (1500)"),
    (["--engine", "sglang", "--tp", "40"], "does not divide Whisper's 20 attention heads"),
    (["--engine", "sglang", "--pp", "2"], "SGLang cannot split Whisper into pipeline stages"),
    (["--engine", "trtllm"], "cross_kv_cache_fraction"),
])
def test_whisper_refusals_are_one_line(args, says):
    r = run_cli("size", "whisper-large-v3", "--ctx", "100", *args)
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_whisper_with_other_decoder_heads_is_refused_on_sglang(tmp_path):
    """The pool takes encoder_attention_heads for every layer; a decoder with other heads cannot write into it."""
    cfg = {**WHISPER, "decoder_attention_heads": 16}
    r = run_cli("size", write_config(tmp_path, "w", cfg), "--ctx", "100", "--engine", "sglang")
    assert r.code == 2 and "decoder_attention_heads (16)" in r.err and len(r.err.strip().splitlines()) == 1, r.err


# ---------------------------------------------------------------------------------------------- GPT-OSS, SGLang
def _gpt_oss_layers() -> tuple[int, int, int]:
    types = GPT_OSS["layer_types"]
    per_layer = GPT_OSS["num_key_value_heads"] * 2 * GPT_OSS["head_dim"] * BF16
    return types.count("full_attention"), types.count("sliding_attention"), per_layer


@pytest.mark.parametrize("engine", SGLANG_VERSIONS)
def test_gpt_oss_sliding_layers_hold_window_minus_one(engine):
    n_full, n_swa, per_layer = _gpt_oss_layers()
    window = GPT_OSS["sliding_window"] - 1  # get_attention_sliding_window_size
    d = kvjson("size", "gpt-oss-20b", "--engine", engine, "--ctx", "4096")
    g = {x["kind"]: x for x in d["groups"]}
    assert (g["sliding"]["window"], g["sliding"]["tokens"]) == (window, window) == (127, 127)
    assert g["sliding"]["bytes"] == n_swa * (window + 1) * per_layer  # pool rows: tokens + one page
    assert g["full"]["bytes"] == n_full * (4096 + 1) * per_layer


def test_gpt_oss_swa_floor_is_window_minus_one_plus_page():
    """0.5.23 HybridSWAPoolConfigurator: full = int(rest // (F + r S)), swa = int(full x r); validate_swa_pool_size
    refuses swa <= sliding_window_size + page. At full 162, swa = 129 > 127 + 1: SGLang starts (128 + 1 would not)."""
    n_full, n_swa, per_layer = _gpt_oss_layers()
    f, s, r = n_full * per_layer, n_swa * per_layer, 0.8
    budget = int(162 * (f + r * s)) + 1
    assert int(budget // (f + r * s)) == 162 and int(162 * r) == 129
    out = kvjson("fit", "gpt-oss-20b", "--engine", "sglang@0.5.23", "--gpu", "H100", "--kv-budget", f"{budget}B",
                 "--ctx", "128")["results"][0]
    assert out["engine_details"]["swa_max_total_num_tokens"] == 129
    assert out["engine_would_start"] is True
    assert out["max_batch"] == min(162 // 128, 129 // 127) == 1
