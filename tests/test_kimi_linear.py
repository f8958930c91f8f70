"""Kimi Linear / Kimi-K3 (model_type kimi_linear): KDA linear-attention state + MLA latents, laid out as vLLM does.

Expected figures are written here from the config fields and vLLM's formulas (layers/mamba/mamba_utils.py
kda_state_shape / kda_state_dtype, platforms/interface.py _align_hybrid_block_size, 0.12/0.13
HybridAttentionMambaModelConfig), not read back from kvplan.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import kvjson, run_cli

K3 = str(Path(__file__).with_name("data") / "aic-configs" / "moonshotai--Kimi-K3_config.json")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def k3_text() -> dict:
    return json.loads(Path(K3).read_text())["text_config"]


def kda_state_bytes(text: dict, tp: int, recurrent_bytes: int = 4) -> int:
    """conv (kernel - 1) x 3 x heads x head_dim / tp in bf16 + (heads / tp) x head_dim^2 in the recurrent dtype."""
    lac = text["linear_attn_config"]
    heads, hd, k = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    return (k - 1) * 3 * heads * hd // tp * 2 + heads // tp * hd * hd * recurrent_bytes


def test_layer_lists_are_one_based():
    """vLLM is_kda_layer: (layer_idx + 1) in kda_layers. Kimi-K3's full_attn_layers 4, 8, ..., 92, 93 are layers
    3, 7, ..., 91, 92 (0-based): 24 MLA layers, 69 KDA, the last layer MLA."""
    out = kvjson("size", K3, "--ctx", "4k")
    groups = {g["kind"]: g for g in out["groups"]}
    full = k3_text()["linear_attn_config"]["full_attn_layers"]
    assert groups["mla"]["layer_ids"] == [i - 1 for i in full] and groups["mla"]["layers"] == 24
    assert groups["linear_state"]["layers"] == 69 and 0 in groups["linear_state"]["layer_ids"]
    assert 92 not in groups["linear_state"]["layer_ids"]


def test_k3_vllm_032_pages_and_bytes_follow_the_engine_formula():
    """tp 8, Hopper (size's assumption), prefix caching on: the hybrid block is raised to a multiple of 128 whose MLA
    page (576 bf16 per token) holds one KDA state; the KDA layers fill 3 groups of 24 slots beside the 24 MLA layers;
    a KDA group keeps 2 pages per request in 'align' mode plus Kimi-K3's FlashKDA prefill checkpoint."""
    text, tp, ctx = k3_text(), 8, 100_000
    state = kda_state_bytes(text, tp)
    assert state == 814_080
    per_token = (text["kv_lora_rank"] + text["qk_rope_head_dim"]) * 2
    block = 128 * cdiv(state, 128 * per_token)
    page = block * per_token
    out = kvjson("size", K3, "--ctx", str(ctx), "--tp", str(tp), "--engine", "vllm@0.32")
    assert out["kv_bytes"] == (cdiv(ctx, block) + 3 * 3) * 24 * page
    assert out["kv_bytes_per_token"] == 24 * per_token
    mla = next(g for g in out["groups"] if g["kind"] == "mla")
    assert mla["tokens"] == cdiv(ctx, block) * block
    assert any("raised to 768 tokens" in a for a in out["assumptions"])
    assert any("3 padding layer slot(s)" in a for a in out["assumptions"])


def test_k3_flashkda_checkpoint_page_depends_on_the_gpu():
    """resolve_kda_prefill_backend: FlashKDA on SM 9/10/12 only; on an A100 the KDA groups keep 2 pages, not 3."""
    h100 = kvjson("fit", "--model", K3, "--gpu", "8xH200", "--tp", "8", "--ctx", "32k", "--kv-budget", "40GiB")
    a100 = kvjson("fit", "--model", K3, "--gpu", "8xA100-80GB", "--tp", "8", "--ctx", "32k", "--kv-budget", "40GiB")
    blocks = [r["results"][0]["engine_details"]["blocks_per_request"] for r in (h100, a100)]
    assert blocks[0] - blocks[1] == 3  # one page fewer in each of the 3 KDA groups


def test_k3_recurrent_dtype_flag():
    """Kimi-K3's layer honours --mamba-ssm-cache-dtype bfloat16 (half the recurrent bytes) and refuses float16."""
    text = k3_text()
    out = kvjson("size", K3, "--ctx", "4k", "--tp", "8", "--mamba-ssm-cache-dtype", "bfloat16")
    assert any(f"({kda_state_bytes(text, 8, 2):,} B" in a for a in out["assumptions"])
    r = run_cli("size", K3, "--ctx", "4k", "--tp", "8", "--mamba-ssm-cache-dtype", "float16")
    assert r.code == 2 and r.err.count("\n") == 1 and "bfloat16" in r.err


def test_kda_heads_must_divide_by_tp():
    r = run_cli("size", K3, "--ctx", "4k", "--tp", "64")
    assert r.code == 2 and r.err.count("\n") == 1


@pytest.mark.parametrize("engine", ["sglang", "hf", "trtllm", "vllm@0.24"])
def test_engines_not_read_refuse_in_one_line(engine):
    r = run_cli("size", K3, "--ctx", "4k", "--engine", engine)
    assert r.code == 2 and r.err.count("\n") == 1 and ("Kimi" in r.err or "KDA" in r.err), r.err


# Kimi-Linear-48B-A3B-Instruct's architecture fields, as a public model report quotes its config.json next to a
# safetensors header listing of the checkpoint (20 files, 20,493 tensors, 49,122,681,728 parameters). The report's
# repository could not be pinned, so the file is not bundled as a genuine config; the fields are the ones the
# layout needs, and the parameter total below checks them against the checkpoint listing.
KL48 = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "dtype": "bfloat16",
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 27, "vocab_size": 163840,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 72, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128, "num_heads": 32,
                           "short_conv_kernel_size": 4,
                           "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)]},
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "model_max_length": 1048576, "tie_word_embeddings": False,
}


@pytest.fixture
def kl48(tmp_path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(KL48))
    return str(path)


def test_kimi_linear_48b_parameters_match_the_checkpoint_listing(kl48):
    assert kvjson("size", kl48, "--ctx", "4k")["params"] == 49_122_681_728


def test_kimi_linear_ignores_the_ssm_dtype_flag(kl48):
    """Kimi-Linear's KDA layer (kimi_gdn_linear_attn.py get_state_dtype) never passes mamba_ssm_cache_dtype on."""
    a = kvjson("size", kl48, "--ctx", "4k", "--tp", "2")
    b = kvjson("size", kl48, "--ctx", "4k", "--tp", "2", "--mamba-ssm-cache-dtype", "bfloat16")
    assert a["kv_bytes"] == b["kv_bytes"]


@pytest.mark.parametrize("budget, concurrency", [(2_464_237_650, 2.48), (2_469_519_359, 2.48), (2_469_519_360, 2.49)])
def test_wild_log_2x3090_tp2_reproduces(kl48, budget, concurrency):
    """vllm-kimi-linear-48b-a3b-awq-2xrtx3090-tp2-len120000 (vLLM ~0.11.1): "Available KV cache memory: 2.30 GiB",
    "Add 1 padding layers", "GPU KV cache size: 75,840 tokens", "Maximum concurrency for 120,000 tokens per request:
    2.48x". KDA state at tp 2: 3 x 6144 bf16 conv + 16 x 128 x 128 fp32 = 1,085,440 B; the MLA block is raised to
    64 x cdiv(1,085,440, 64 x 1152) = 960 tokens (page 1,105,920 B); 7 MLA + 20 KDA layers make 4 groups of 7 slots
    (1 padding slot). 2.30 GiB printed is [2.295, 2.305) GiB: 318 blocks below 2,469,519,360 B -> 318 // 4 x 960 =
    75,840 tokens and 318 / (125 + 3) = 2.48x; from there 319 blocks, 2.49x (the log's 2.48 bounds the budget)."""
    assert kda_state_bytes(KL48, 2) == 1_085_440
    r = kvjson("fit", "--model", kl48, "--gpu", "2xRTX3090", "--tp", "2", "--ctx", "120000", "--max-model-len",
               "120000", "--engine", "vllm@0.11.1", "--kv-budget", f"{budget}B")["results"][0]
    assert r["kv_capacity_tokens"] == 75_840 and r["concurrency"] == concurrency
    assert r["engine_details"]["block_size"] == 960 and r["engine_details"]["bytes_per_block"] == 7 * 960 * 1152
    assert any("1 padding layer slot(s)" in a for a in r["assumptions"])


@pytest.mark.parametrize("batch", [1, 3])
def test_llamacpp_kda_rows_and_v_less_latent(batch):
    """llama.cpp (src/llama-hparams.cpp n_embd_r / n_embd_s, llama-memory-recurrent.cpp, llama-kv-cache.cpp): each
    KDA layer keeps f32 rows r = 3 x (kernel - 1) x heads x head_dim and s = head_dim^2 x heads for max(1, n_seq)
    sequences; each MLA layer one f16 K row of kv_lora_rank + rope per cell and no V (is_mla). Kimi-K3 at -np B
    -c B x 4096: B streams of 4096 cells. (tests/test_engine_llamacpp.py checks scaled GGUFs against llama.cpp.)"""
    text, ctx = k3_text(), 4096
    lac = text["linear_attn_config"]
    heads, hd, k = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    state = 4 * (3 * (k - 1) * heads * hd + hd * hd * heads)
    row = 2 * (text["kv_lora_rank"] + text["qk_rope_head_dim"])
    out = kvjson("size", K3, "--ctx", str(ctx), "--batch", str(batch), "--engine", "llamacpp")
    assert out["kv_bytes"] == batch * (69 * state + 24 * ctx * row)
    assert out["kv_bytes_per_token"] == 24 * row


@pytest.mark.parametrize("tp", [1, 2])
def test_sglang_state_slots_and_mla_pool(kl48, tp):
    """SGLang 0.5.10: KimiLinearStateShape gives each request conv (kernel - 1, 3 x heads x head_dim / tp) in bf16
    (SGLANG_MAMBA_CONV_DTYPE) and temporal (heads / tp, head_dim, head_dim) in fp32 per KDA layer; the MLA layers
    hold HybridLinearKVPool's MLATokenToKVPool rows of kv_lora_rank + rope (not split by TP), size + one page."""
    ctx, batch = 4096, 3
    lac = KL48["linear_attn_config"]
    heads, hd, k = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    state = (k - 1) * 3 * heads * hd // tp * 2 + heads // tp * hd * hd * 4
    row = (KL48["kv_lora_rank"] + KL48["qk_rope_head_dim"]) * 2
    out = kvjson("size", kl48, "--ctx", str(ctx), "--batch", str(batch), "--tp", str(tp), "--engine", "sglang")
    assert out["kv_bytes"] == 20 * batch * state + 7 * (batch * ctx + 1) * row
    assert out["kv_bytes_per_token"] == 7 * row


def test_kimi_linear_48b_other_engines_refuse_only_what_they_lack(kl48):
    """hf and SGLang run Kimi-Linear (not Kimi-K3); their older rule sets predate the model code."""
    for engine in ("hf@4.57", "sglang@0.4"):
        r = run_cli("size", kl48, "--ctx", "4k", "--engine", engine)
        assert r.code == 2 and r.err.count("\n") == 1 and "Kimi" in r.err, r.err
