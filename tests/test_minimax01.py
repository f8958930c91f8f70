"""MiniMax-01 lightning attention (MiniMax-Text-01 / MiniMax-M1: model_type minimax_text_01 / minimax_m1, remote code;
transformers' native model_type minimax).

Oracles elsewhere: transformers' model code (tests/test_oracle_hf.py: parameters on meta and the cache of a real
forward, scaled copies of the genuine MiniMax-M1 config) and llama.cpp b11434 (tests/oracle_llamacpp.py models
minimax-01 and minimax-01-rl, four cases). vLLM cannot run it here: 0.32's CPU build no longer loads it (removed in
0.24), and 0.10.1-0.23 run its lightning attention with Triton kernels only (layers/lightning_attn.py), so the vLLM
figures below are the engine's own arithmetic written out from its 0.23 source. The genuine config is MiniMax's own
GitHub copy (tests/data/wild-configs/SOURCES.yaml, MiniMax-AI/MiniMax-M1).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import kvjson, run_cli, write_config

M1_PATH = Path(__file__).parent / "data" / "wild-configs" / "MiniMax-AI--MiniMax-M1" / "config.json"
M1 = json.loads(M1_PATH.read_text())
MiB = 1 << 20


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scaled(**change) -> dict:
    """The genuine M1 config cut to its first 8 layers (7 lightning, then softmax) with small widths; head_dim 64."""
    cfg = dict(M1, num_hidden_layers=8, attn_type_list=M1["attn_type_list"][:8], hidden_size=256,
               intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64, rotary_dim=32,
               vocab_size=512, num_local_experts=4, max_position_embeddings=4096)
    cfg.update(change)
    return cfg


def as_native(cfg: dict) -> dict:
    """The same model as transformers' native MiniMaxConfig states it (the -hf checkpoints): layer_types for
    attn_type_list, no auto_map."""
    out = {k: v for k, v in cfg.items() if k not in ("attn_type_list", "auto_map")}
    out.update(model_type="minimax", architectures=["MiniMaxForCausalLM"],
               layer_types=["linear_attention" if t == 0 else "full_attention" for t in cfg["attn_type_list"]])
    return out


def groups(d: dict) -> dict[str, dict]:
    return {g["kind"]: g for g in d["groups"]}


def one_line_error(r, *says: str) -> None:
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r.err
    for s in says:
        assert s in r.err, (s, r.err)


# ---------------------------------------------------------------------------------------------- the genuine config
def test_m1_layers_are_70_lightning_and_every_8th_softmax():
    d = kvjson("size", str(M1_PATH), "--ctx", "4096", "--engine", "hf")
    g = groups(d)
    assert g["lightning_state"]["layers"] == 70 and g["full"]["layers"] == 10
    assert g["full"]["layer_ids"] == [7, 15, 23, 31, 39, 47, 55, 63, 71, 79]
    assert d["family"] == "minimax-01"


def test_m1_weights_are_the_checkpoint_index_total():
    """MiniMax-AI/MiniMax-M1's model.safetensors.index.json (same commit as the config) says total_size
    912,210,767,872 B: every tensor bf16 but the 80 routers [32, 6144], stored fp32. Written out from the config:
    embed + lm_head 2 x 200,064 x 6,144; per layer 32 experts x 3 x 6,144 x 9,216 + 2 norms; 70 lightning layers
    qkv 6,144 x 3 x 8,192 + gate and out 2 x 6,144 x 8,192 + norm 8,192; 10 softmax layers q, o 6,144 x 8,192 and k, v
    6,144 x 1,024; final norm."""
    h, inner = 6144, 64 * 128
    params = (2 * 200_064 * h + 80 * (32 * 3 * h * 9216 + 32 * h + 2 * h) + 70 * (3 * h * inner + 2 * h * inner + inner)
              + 10 * (2 * h * inner + 2 * h * 8 * 128) + h)
    d = kvjson("size", str(M1_PATH), "--ctx", "4096", "--engine", "hf")
    assert d["params"] == params == 456_089_655_296
    assert d["weight_bytes"] == 2 * params + 2 * 80 * 32 * h == 912_210_767_872


def test_m1_hf_cache_is_kv_plus_one_state_matrix_per_head():
    """transformers (models/minimax MiniMaxCache): linear_cache [1, 64, 128, 128] in the compute dtype on each
    lightning layer, DynamicLayer K/V [1, 8, ctx, 128] on the 10 softmax layers."""
    d = kvjson("size", str(M1_PATH), "--ctx", "4096", "--engine", "hf", "--kv-dtype", "bf16")
    assert d["kv_bytes_per_token"] == 10 * 2 * 8 * 128 * 2 == 40_960
    assert d["kv_bytes"] == 4096 * 40_960 + 70 * 64 * 128 * 128 * 2


@pytest.mark.parametrize("ctx", [4096, 100_000])
def test_m1_vllm_023_tp8_pool_from_its_source(ctx):
    """vLLM 0.23 at tp 8: a lightning state of 64/8 heads x 128 x 128 x 2 B = 262,144 B (linear_attention_state_shape,
    bf16 = the model dtype, mamba_cache_dtype auto); one token of K/V 1 x 128 x 2 x 2 B = 512 B; the attention block
    raised to 16 x cdiv(262,144, 16 x 512) = 512 tokens (platforms/interface.py _align_hybrid_block_size), whose page
    is exactly the state; 70 and 10 layers -> groups of 10 (get_kv_cache_groups), 7 state groups + 1 attention
    group, a block of 10 x 262,144 B; a request cdiv(ctx, 512) attention blocks + 7 state blocks."""
    d = kvjson("size", str(M1_PATH), "--ctx", str(ctx), "--engine", "vllm@0.23", "--tp", "8")
    state, token = 8 * 128 * 128 * 2, 1 * 128 * 2 * 2
    block = 16 * cdiv(state, 16 * token)
    assert (block, block * token) == (512, state)
    e = d["engine_details"]
    assert (e["block_size"], e["bytes_per_block"], e["kv_groups"]) == (512, 10 * state, 8)
    assert e["blocks_per_request"] == cdiv(ctx, 512) + 7
    assert d["kv_bytes"] == (cdiv(ctx, 512) + 7) * 10 * state


def test_m1_vllm_fp32_state_doubles_the_page_from_021():
    """--state-dtype fp32 (vLLM's --mamba-cache-dtype float32): 0.21+ keeps the state in fp32 (524,288 B at tp 8),
    the attention block doubles to 1,024 tokens; 0.10.1-0.20 refuse it."""
    d = kvjson("size", str(M1_PATH), "--ctx", "4096", "--engine", "vllm@0.21", "--tp", "8", "--state-dtype", "fp32")
    assert (d["engine_details"]["block_size"], d["engine_details"]["bytes_per_block"]) == (1024, 10 * 524_288)
    one_line_error(run_cli("size", str(M1_PATH), "--ctx", "4096", "--engine", "vllm@0.19", "--tp", "8",
                           "--state-dtype", "fp32"), "fp32 state for minimax is not yet supported")


@pytest.mark.parametrize("engine, says", [
    ("vllm", "supported until v0.23.0"),  # the default, newest rules
    ("vllm@0.32", "supported until v0.23.0"),
    ("vllm@0.24", "vllm@0.23.0 or earlier"),
    ("vllm@0.10.0", "V0 engine only"),
    ("sglang", "SGLang 0.5.10 has no MiniMax-Text-01"),
    ("trtllm", "TensorRT-LLM has no MiniMax-Text-01"),
])
def test_engines_that_cannot_run_it_refuse_in_one_line(engine, says):
    one_line_error(run_cli("size", str(M1_PATH), "--ctx", "4096", "--engine", engine), says)


def test_vllm_rotary_table_is_fp32_and_capped_by_max_model_len():
    """vLLM builds MiniMax-01's rotary table over min(max_position_embeddings, max_model_len) positions x rotary_dim
    64 in fp32 (get_rope(dtype=torch.float32)): 65,536 x 64 x 4 B with --max-model-len 65536."""
    d = kvjson("fit", "--gpu", "8xH200", "--model", str(M1_PATH), "--engine", "vllm@0.23", "--ctx", "65536",
               "--max-model-len", "65536")
    parts = {p["what"]: p["bytes"] for p in d["results"][0]["budget"][0]["parts"]}
    assert parts["rotary cos/sin tables (built with the model)"] == -65_536 * 64 * 4


def test_llamacpp_from_the_config_is_f32_state_rows_and_kv():
    """llama.cpp (src/models/minimax-01.cpp, src/llama-hparams.cpp n_embd_s): an f32 s row of 128^2 x 64 per
    sequence on each lightning layer, no r row; f16 K/V on the 10 softmax layers; n_ctx padded to 256."""
    d = kvjson("size", str(M1_PATH), "--ctx", "4000", "--engine", "llamacpp", "--batch", "2")
    g = groups(d)
    assert g["lightning_state"]["bytes"] == 70 * 2 * 128 * 128 * 64 * 4
    assert g["full"]["bytes"] == 10 * 2 * 4096 * 8 * 128 * 2 * 2


def test_llamacpp_refuses_what_its_converter_cannot_express(tmp_path):
    """convert_hf_to_gguf writes no layer pattern (llama.cpp then makes every 8th layer softmax) and maps only the
    remote-code architectures."""
    other = dict(M1, attn_type_list=[0, 1] * 40)
    one_line_error(run_cli("size", write_config(tmp_path, "a", other), "--ctx", "4096", "--engine", "llamacpp"),
                   "every 8th")
    one_line_error(run_cli("size", write_config(tmp_path, "b", as_native(M1)), "--ctx", "4096", "--engine",
                           "llamacpp"), "MiniMaxForCausalLM")


# ---------------------------------------------------------------------------------------------- config forms
def test_attn_type_list_and_layer_types_give_the_same_model(tmp_path):
    a = kvjson("size", write_config(tmp_path, "a", scaled()), "--ctx", "1000", "--engine", "hf", "--kv-dtype", "fp16")
    b = kvjson("size", write_config(tmp_path, "b", as_native(scaled())), "--ctx", "1000", "--engine", "hf",
               "--kv-dtype", "fp16")
    assert {k: g["layers"] for k, g in groups(a).items()} == {"lightning_state": 7, "full": 1}
    assert (a["kv_bytes"], a["params"]) == (b["kv_bytes"], b["params"])


def test_native_config_without_layer_types_alternates(tmp_path):
    """MiniMaxConfig.__post_init__: layer i is full attention when (i + 1) % 2, else linear."""
    cfg = {k: v for k, v in as_native(scaled()).items() if k != "layer_types"}
    d = kvjson("size", write_config(tmp_path, "m", cfg), "--ctx", "1000", "--engine", "hf", "--kv-dtype", "fp16")
    g = groups(d)
    assert g["full"]["layer_ids"] == [0, 2, 4, 6] and g["lightning_state"]["layer_ids"] == [1, 3, 5, 7]


def test_native_config_defaults_fill_omitted_fields(tmp_path):
    """A re-saved MiniMaxConfig omits fields equal to the class defaults (num_key_value_heads 8, 8 experts)."""
    cfg = {k: v for k, v in as_native(scaled(num_attention_heads=16, head_dim=16)).items()
           if k not in ("num_key_value_heads", "num_local_experts")}
    d = kvjson("size", write_config(tmp_path, "m", cfg), "--ctx", "1000", "--engine", "hf", "--kv-dtype", "fp16")
    assert d["kv_bytes_per_token"] == 1 * 2 * 8 * 16 * 2


@pytest.mark.parametrize("change, says", [
    ({"shared_intermediate_size": 512}, "shared_intermediate_size 512"),
    ({"num_local_experts": 1}, "num_local_experts 1"),
    ({"head_dim": None}, "lacks head_dim"),
    ({"attn_type_list": None}, "needs attn_type_list"),
    ({"attn_type_list": [0, 1]}, "one 0 (lightning) or 1"),
    ({"attn_type_list": [0, 2, 0, 0, 0, 0, 0, 1]}, "attn_type_list must be a list of integers in 0..1"),
    ({"layer_types": ["linear_attention"] * 8}, "different lightning layers"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings true"),
])
def test_configs_the_engines_read_differently_are_refused_in_one_line(tmp_path, change, says):
    one_line_error(run_cli("size", write_config(tmp_path, "m", scaled(**change)), "--ctx", "1000"), says)


def test_vllm_tp_must_divide_the_lightning_heads(tmp_path):
    cfg = scaled(num_attention_heads=6, num_key_value_heads=2)
    one_line_error(run_cli("size", write_config(tmp_path, "m", cfg), "--ctx", "1000", "--engine", "vllm@0.23",
                           "--tp", "4"), "does not divide")


def test_an_unknown_model_type_with_attn_type_list_is_refused(tmp_path):
    cfg = dict(scaled(), model_type="zebra", num_local_experts=None)
    one_line_error(run_cli("size", write_config(tmp_path, "m", cfg), "--ctx", "1000"), "attn_type_list",
                   "linear-attention state")


# ---------------------------------------------------------------------------------------------- vLLM 0.23's planner
VLLM023 = json.loads((Path(__file__).parent / "data" / "minimax01-vllm023.json").read_text())


@pytest.mark.parametrize("cid", sorted(VLLM023["cases"]))
def test_vllm_023_pool_equals_its_own_planner(cid, tmp_path):
    """tests/data/minimax01-vllm023.json: what vLLM 0.23.0's own code (dev/minimax01_vllm023_plan.py: the model's state
    shape/dtype classmethods, Platform._align_hybrid_block_size, get_kv_cache_configs, get_max_concurrency_for_kv_cache_
    config) made of MiniMax-M1 and a scaled copy whose state page needs padding, for given KV memory: block size, blocks,
    'GPU KV cache size' tokens and concurrency as it prints them, or its start-up refusal."""
    c = VLLM023["cases"][cid]
    path = write_config(tmp_path, "m", {**M1, **c["config_overrides"]})
    gpu = f"{c['tp']}xH200" if c["tp"] > 1 else "H200"
    args = ["fit", "--gpu", gpu, "--model", path, "--engine", "vllm@0.23", "--tp", str(c["tp"]),
            "--ctx", str(c["max_model_len"]), "--max-model-len", str(c["max_model_len"]),
            "--kv-budget", str(c["available_kv_bytes"])]
    if c["mamba_cache_dtype"] == "float32":
        args += ["--state-dtype", "fp32"]
    if c["block_size_flag"] != 16:
        args += ["--block-size", str(c["block_size_flag"])]
    r = kvjson(*args)["results"][0]
    assert r["engine_details"]["block_size"] == c["block_size"]
    if "error" in c:  # "... the estimated maximum model length is N."
        assert not r["engine_would_start"]
        assert r["suggested_max_model_len"] == int(c["error"].rstrip(".").rsplit(" ", 1)[1])
        assert c["error"].split("(")[2].split(" KV")[0] in r["engine_start_message"]  # "195.38 GiB"
        return
    assert r["engine_details"]["num_gpu_blocks"] == c["num_blocks"]
    assert r["kv_capacity_tokens"] == c["kv_cache_tokens"]
    assert r["concurrency"] == round(c["concurrency"], 2)
