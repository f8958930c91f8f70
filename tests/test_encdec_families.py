"""Encoder-decoders beyond T5-large: Flan-T5 / T5 v1.1 (gated-gelu, untied lm_head), mT5, BART and mBART.

Oracles, none written here: transformers' model code (tests/test_oracle_hf.py: the cache of a real forward and the
parameters for the scaled configs below; here, what from_pretrained builds from a checkpoint with its own lm_head)
and llama.cpp b11434 (tests/oracle_llamacpp.py: scaled T5 GGUFs, cases t5-*). The genuine configs are copies found
on GitHub (tests/data/wild-configs/SOURCES.yaml). What is left here: their figures against arithmetic written from
the config, and the one-line refusals of engines that cannot run them (vLLM, SGLang) or whose layout kvplan has not
read (TensorRT-LLM's separate cross-attention pool).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conftest import DATA, kvjson, run_cli, write_config

WILD = DATA / "wild-configs"


def genuine(name: str) -> dict:
    return json.loads((WILD / name / "config.json").read_text())


def path_of(name: str) -> str:
    return str(WILD / name / "config.json")


def _scaled(name: str, **change) -> dict:
    d = copy.deepcopy(genuine(name))
    d.update(change)
    return {k: v for k, v in d.items() if v is not None}


# Scaled copies for the transformers oracle (tests/test_oracle_hf.py): heads and d_kv / head_dim as the real model,
# small widths, two or three layers a side (unequal where the family allows it), a 256-token vocabulary.
ENCDEC_SCALED = {
    "flan-t5-base": _scaled("google--flan-t5-base", d_model=64, d_ff=64, num_layers=2, num_decoder_layers=2,
                            vocab_size=256),
    "mt5-base-3enc-2dec": _scaled("google--mt5-base", d_model=64, d_ff=64, num_layers=3, num_decoder_layers=2,
                                  vocab_size=256),
    "flan-t5-large-tied-relu": _scaled("google--flan-t5-large", d_model=64, d_ff=64, num_layers=2,
                                       num_decoder_layers=3, vocab_size=256, tie_word_embeddings=None,
                                       feed_forward_proj="relu"),
    "bart-large-cnn": _scaled("facebook--bart-large-cnn", d_model=256, encoder_ffn_dim=64, decoder_ffn_dim=64,
                              encoder_layers=2, num_hidden_layers=2, decoder_layers=3, vocab_size=256,
                              max_position_embeddings=128),
    "bart-large-untied": _scaled("facebook--bart-large", architectures=["BartForConditionalGeneration"], d_model=256,
                                 encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=3, num_hidden_layers=3,
                                 decoder_layers=2, vocab_size=256, max_position_embeddings=128, tie_word_embeddings=False),
    "mbart-8enc-4dec-heads": _scaled("facebook--bart-large-cnn", model_type="mbart",
                                     architectures=["MBartForConditionalGeneration"], d_model=256,
                                     encoder_attention_heads=8, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, encoder_layers=2, num_hidden_layers=2, decoder_layers=2,
                                     vocab_size=256,
                                     max_position_embeddings=128),
}


def loaded_param_count(config: dict, tmp: Path) -> int:
    """The parameters transformers holds after from_pretrained of a checkpoint whose lm_head differs from `shared`
    (as every T5 v1.1 / Flan-T5 / mT5 release stores it): a small random model of `config` is saved with its own
    lm_head and loaded back. transformers 5.x builds the class tied (T5Config forces tie_word_embeddings) and then
    unties on load: "both are present in the checkpoints with different values, so we will NOT tie them"."""
    import torch
    from safetensors.torch import save_file

    import oracle_hf

    hf = oracle_hf.make_hf_config(config)
    cls = oracle_hf.model_class(config)
    model = cls(hf)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if not config.get("tie_word_embeddings", True):
        sd["lm_head.weight"] = sd["shared.weight"] + 1.0
    folder = tmp / "checkpoint"
    folder.mkdir()
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    with oracle_hf._quiet():
        loaded = cls.from_pretrained(str(folder), dtype=torch.float32)
    return sum(p.numel() for p in loaded.parameters())


# ---------------------------------------------------------------------------------------------- the genuine configs
def test_flan_t5_base_hf_cache_and_params_from_the_config():
    """12 decoder layers x (K, V) x 12 heads x d_kv 64 in fp16 per token, the same over the 512 encoder positions
    (n_positions) for cross attention; parameters = transformers' meta count 222,903,552 (lm_head tied by
    T5Config) + the checkpoint's own lm_head 32,128 x 768."""
    d = kvjson("size", path_of("google--flan-t5-base"), "--engine", "hf", "--kv-dtype", "fp16", "--ctx", "300")
    per_token = 12 * 2 * 12 * 64 * 2
    assert d["kv_bytes_per_token"] == per_token
    assert d["kv_bytes"] == 300 * per_token + 512 * per_token
    assert d["params"] == 222_903_552 + 32128 * 768


def test_mt5_base_untied_head_is_most_of_the_difference():
    """mT5-base: 250,112 x 768 embeddings twice (shared + lm_head) -- the 580M of the mT5 paper, not the 390M of
    transformers' tied meta build."""
    d = kvjson("size", path_of("google--mt5-base"), "--engine", "hf", "--ctx", "16")
    assert d["params"] == 390_315_264 + 250112 * 768


def test_flan_t5_large_and_t5_large_differ_by_gating_and_head():
    """Flan-T5-large: 24 + 24 layers, d_ff 2816 gated (wi_0, wi_1, wo) against T5-large's 4096 relu (wi, wo), and an
    untied lm_head: params differ by exactly that."""
    flan = kvjson("size", path_of("google--flan-t5-large"), "--engine", "hf", "--ctx", "16")["params"]
    t5 = kvjson("size", "t5-large", "--engine", "hf", "--ctx", "16")["params"]
    d = 1024
    assert flan - t5 == 48 * (3 * 2816 * d - 2 * 4096 * d) + 32128 * d


def test_bart_large_cnn_cache_and_params_from_the_config():
    """BART-large-CNN: 16 decoder heads x 64 (1024 / 16), 12 decoder layers; cross attention over
    max_position_embeddings 1024 encoder positions; params = BartForConditionalGeneration's 406,290,432 + the
    final_logits_bias buffer of 50,264."""
    d = kvjson("size", path_of("facebook--bart-large-cnn"), "--engine", "hf", "--kv-dtype", "fp16", "--ctx", "142")
    per_token = 12 * 2 * 16 * 64 * 2
    assert d["kv_bytes_per_token"] == per_token
    assert d["kv_bytes"] == 142 * per_token + 1024 * per_token
    assert d["params"] == 406_290_432 + 50264


def test_bart_large_sizes_the_generation_class():
    """facebook/bart-large lists BartModel first (no head); kvplan sizes what generates: BartForConditionalGeneration
    (the tied head adds nothing, final_logits_bias 50,265 values), against BartModel's 406,291,456."""
    d = kvjson("size", path_of("facebook--bart-large"), "--engine", "hf", "--kv-dtype", "fp16", "--ctx", "16",
               "--encoder-len", "300")
    assert d["params"] == 406_291_456 + 50265
    assert d["kv_bytes"] == 12 * 2 * 16 * 64 * 2 * (16 + 300)


@pytest.mark.parametrize("name, limit, tokens", [("google--flan-t5-base", 512, 512), ("google--mt5-base", None, 512),
                                                 ("facebook--bart-large-cnn", 1024, 1024)])
def test_context_limit_and_encoder_length_come_from_the_config(name, limit, tokens):
    """T5: n_positions (512) when the file has it -- mT5-base's has none and relative positions set no limit -- and
    the encoder length defaults to it or 512; BART: max_position_embeddings for both."""
    d = kvjson("size", path_of(name), "--engine", "hf", "--ctx", "16")
    assert d["model_max_ctx"] == limit
    cross = [g for g in d["groups"] if g["kind"] == "cross"]
    assert cross and all(g["tokens"] == tokens for g in cross)


# ---------------------------------------------------------------------------------------------- engines
@pytest.mark.parametrize("name", ["google--flan-t5-base", "google--mt5-base", "facebook--bart-large-cnn"])
@pytest.mark.parametrize("engine, says", [
    ("vllm", "vLLM"), ("vllm@0.10", "vLLM"), ("sglang", "SGLang"), ("sglang@0.4", "SGLang"),
    ("trtllm", "cross_kv_cache_fraction")])
def test_engines_that_cannot_run_it_or_are_not_read_refuse_in_one_line(name, engine, says):
    r = run_cli("size", path_of(name), "--ctx", "256", "--engine", engine)
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_llamacpp_refuses_bart():
    r = run_cli("size", path_of("facebook--bart-large-cnn"), "--ctx", "256", "--engine", "llamacpp")
    assert r.code == 2 and "not a llama.cpp architecture" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_llamacpp_t5_caches_self_attention_of_encoder_blocks_only():
    """llama.cpp (conversion/t5.py writes block_count = num_layers; llama_kv_cache allocates block_count layers):
    Flan-T5-base at 512 tokens = 12 layers x 512 cells x (K + V) x 12 x 64 x fp16, no cross-attention K/V. With
    num_decoder_layers 6 the cache still has 12 layers (checked on a GGUF: oracle case t5-deep-encoder-c512)."""
    d = kvjson("size", path_of("google--flan-t5-base"), "--engine", "llamacpp@b11434", "--ctx", "512")
    assert d["kv_bytes"] == 12 * 512 * 2 * 12 * 64 * 2
    assert {g["kind"] for g in d["groups"] if g["tensors"]} == {"full"}


def test_llamacpp_t5_encoder_deeper_than_decoder(tmp_path):
    cfg = {**genuine("google--flan-t5-base"), "num_decoder_layers": 6}
    d = kvjson("size", write_config(tmp_path, "m", cfg), "--engine", "llamacpp@b11434", "--ctx", "512")
    assert d["kv_bytes"] == 12 * 512 * 2 * 12 * 64 * 2
    hf = kvjson("size", write_config(tmp_path, "h", cfg), "--engine", "hf", "--kv-dtype", "fp16", "--ctx", "512")
    assert hf["kv_bytes"] == 6 * 2 * 2 * 12 * 64 * 2 * 512  # transformers: 6 self + 6 cross layers


def test_llamacpp_t5_decoder_deeper_than_encoder_is_refused(tmp_path):
    cfg = {**genuine("google--flan-t5-base"), "num_decoder_layers": 13}
    r = run_cli("size", write_config(tmp_path, "m", cfg), "--engine", "llamacpp", "--ctx", "512")
    assert r.code == 2 and "decoder has 13 layers" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_llamacpp_t5_runs_one_sequence_without_kv_unified():
    """b11434 aborts building T5's graph for -np 2 in per-slot streams (oracle case t5-np2-c512); with --kv-unified
    the cache is one stream of 2 x 512 cells; fit stops at one request."""
    r = run_cli("size", path_of("google--flan-t5-base"), "--engine", "llamacpp", "--ctx", "512", "--batch", "2")
    assert r.code == 2 and "--kv-unified" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    d = kvjson("size", path_of("google--flan-t5-base"), "--engine", "llamacpp", "--ctx", "512", "--batch", "2",
               "--kv-unified")
    assert d["kv_bytes"] == 12 * 1024 * 2 * 12 * 64 * 2
    f = kvjson("fit", path_of("google--flan-t5-base"), "--engine", "llamacpp", "--ctx", "512", "--gpu", "24GB")
    assert f["results"][0]["max_batch"] == 1


def test_t5_gguf_is_sized_from_its_encoder_blocks(tmp_path):
    """A t5 GGUF (the oracle's scaled Flan-T5): block_count 4 layers of 12 x 64 K/V; decoder_block_count above
    block_count is refused as llama.cpp refuses it (oracle case t5-deep-decoder-c512)."""
    pytest.importorskip("gguf")
    import oracle_llamacpp as oracle

    d = kvjson("size", str(oracle.write_model("t5", tmp_path)), "--engine", "llamacpp@b11434", "--ctx", "512")
    assert d["kv_bytes"] == 4 * 512 * 2 * 12 * 64 * 2
    r = run_cli("size", str(oracle.write_model("t5-deep-decoder", tmp_path)), "--engine", "llamacpp", "--ctx", "512")
    assert r.code == 2 and "decoder_block_count 4 exceeds block_count 2" in r.err, r.err


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("change, says", [
    ({"feed_forward_proj": "gelu-gated"}, "feed_forward_proj"),
    ({"feed_forward_proj": "gated-gelu-x"}, "feed_forward_proj"),
])
def test_t5_feed_forward_proj_transformers_refuses_is_refused(tmp_path, change, says):
    r = run_cli("size", write_config(tmp_path, "m", {**genuine("google--flan-t5-base"), **change}), "--ctx", "16",
                "--engine", "hf")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("change, says", [
    ({"decoder_attention_heads": 12}, "decoder_attention_heads 12"),
    ({"encoder_layers": None}, "encoder_layers"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ({"encoder_layers": 6}, "num_hidden_layers 12 and encoder_layers 6 disagree"),
])
def test_bad_bart_configs_are_refused_in_one_line(tmp_path, change, says):
    cfg = {k: v for k, v in {**genuine("facebook--bart-large-cnn"), **change}.items() if v is not None}
    r = run_cli("size", write_config(tmp_path, "m", cfg), "--ctx", "16", "--engine", "hf")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err
