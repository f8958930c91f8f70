"""Engine oracle: vLLM's own CPU build decides the KV cache of a scaled copy of a config (test-only helper).

For each case a scaled copy of a bundled config (same layer kinds, KV heads, head dims, windows, latent and state
dims, layer patterns; tiny width, FFN, vocabulary and expert count) is written to a folder; vLLM's CPU build starts
on it with dummy weights (``LLM(model=DIR, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True)``)
and this module records what vLLM decided: the KV budget it was handed, its block count, the KV cache groups
(spec kind, block size, page bytes, blocks one request needs), the resolved scheduler settings, and the printed
``CPU KV cache size: N tokens, Maximum concurrency for L tokens per request: X.XXx`` line. kvplan's ``fit`` is
then asked the same question on the very same config.json file (tests/test_engine_vllm.py).

All cases run in ONE child process (``python kvplan/verify/vllm_child.py SPEC.json OUT.jsonl``): importing vLLM costs far
more than starting an engine, and vLLM tolerates creating ``LLM`` objects one after another in one process (the KV
budget comes from ``VLLM_CPU_KVCACHE_SPACE``, which the CPU platform reads from ``os.environ`` on every start).
Results are written one JSON line per case as they finish, so a child that dies mid-way loses nothing but its
current case; the parent starts a new child for the cases left. The child only observes vLLM (wrapped functions
record and pass through), with three time savers that decide nothing about the cache: architecture inspection runs
in-process instead of in a fresh interpreter, the start ends once the engine core (KV config, allocation, scheduler)
exists, and the `*_once` log caches are cleared per case. ``KVPLAN_VLLM_PYTHON`` runs the child in another
interpreter (a venv with vLLM); the child imports nothing from kvplan.

``python tests/oracle_vllm.py WORKDIR [ID_PREFIX...]`` runs cases and prints the markdown table of
docs/research/VLLM_ORACLE_NOTES.md.

Findings about vLLM's CPU rules (budget, block sizes, scheduler defaults) and every disagreement with kvplan:
docs/research/VLLM_ORACLE_NOTES.md.

Public API
----------
MODELS, CASES, Case
scaled_config(model) -> dict
vllm_version() -> str | None            (installed distribution version, without importing vllm)
run_cases(cases, workdir, timeout) -> (results by case id, run info)
kvplan_fit_args(case, result, config_path) -> list[str]
table(results, models_dir, cases) -> markdown rows
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kvplan.verify import vllm_child  # noqa: E402  (the vLLM side; runs in the vLLM interpreter by its path)

CONFIG_ROOT = ROOT / "model_configs"

# ---------------------------------------------------------------------------------------------- scaling
SCALED_VOCAB = 256
SCALED_FFN = 64
SCALED_EXPERTS = 4
SCALED_TOPK = 2
FFN_KEYS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_dim", "d_ff",
            "n_inner", "intermediate_size_mlp", "decoder_ffn_dim", "encoder_ffn_dim", "ffn_hidden_size")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")
DROP_KEYS = ("quantization_config", "auto_map", "_name_or_path")


def _clamp_ids(d: dict[str, Any]) -> None:
    for k, v in list(d.items()):
        if not (k.endswith("token_id") or k.endswith("token_ids") or k.endswith("token_index")):
            continue
        if isinstance(v, int) and v >= SCALED_VOCAB:
            d[k] = SCALED_VOCAB - 1
        elif isinstance(v, list):
            d[k] = [min(x, SCALED_VOCAB - 1) if isinstance(x, int) else x for x in v]


def _shrink(d: dict[str, Any]) -> None:
    """Width-only shrinking that never touches what the KV cache is made of."""
    for k in DROP_KEYS:
        d.pop(k, None)
    for k in FFN_KEYS:
        if isinstance(d.get(k), int):
            d[k] = SCALED_FFN
    for k in EXPERT_KEYS:
        if isinstance(d.get(k), int) and d[k] > SCALED_EXPERTS:
            d[k] = SCALED_EXPERTS
    for k in TOPK_KEYS:
        if isinstance(d.get(k), int) and d[k] > SCALED_TOPK:
            d[k] = SCALED_TOPK
    for k in ("n_group", "topk_group"):
        if isinstance(d.get(k), int):
            d[k] = 1
    for k in ("vocab_size", "padded_vocab_size"):
        if isinstance(d.get(k), int):
            d[k] = SCALED_VOCAB
    _clamp_ids(d)


WILD_CONFIGS = ROOT / "tests" / "data" / "wild-configs"


def _smollm3(changes: dict[str, Any]) -> dict[str, Any]:
    """HuggingFaceTB/SmolLM3-3B's genuine config.json cut to 8 layers and a 512 width (4 heads of 128, 1 KV head)."""
    d = json.loads((WILD_CONFIGS / "HuggingFaceTB--SmolLM3-3B" / "config.json").read_text())
    _shrink(d)
    d.update({"num_hidden_layers": 8, "hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 1,
              "no_rope_layers": d["no_rope_layers"][:8], "layer_types": None})
    d.update(changes)
    return {k: v for k, v in d.items() if v is not None or k == "sliding_window"}


@dataclass(frozen=True)
class Model:
    """A scaled copy of model_configs/<base>/config.json: the generic shrink (vocabulary, FFN, experts) and then
    `overrides` (layer count, width, and -- only where the family derives head_dim from the width -- the head
    count; None deletes a key). `text_only` lifts a multimodal config's text_config to the top level under `text_arch`."""

    base: str | None
    overrides: dict[str, Any]
    what: str  # the cache shape this model stands for, one line
    text_only: str | None = None  # architectures[0] of the text model when lifting text_config
    raw: dict[str, Any] | None = None  # a hand-written config (no bundled file of the family)
    max_model_len: int = 4096  # the default case's max_model_len (the model's own limit where that is lower)
    llm_extra: tuple[tuple[str, Any], ...] = ()  # LLM(...) settings every case of this model gets
    tokenizer: str | None = None  # "whisper": write a minimal tokenizer + feature extractor (vLLM's processor needs one)


# Whisper's processor in vLLM needs a tokenizer (it refuses skip_tokenizer_init); the oracle writes a minimal one
# (256 byte tokens, one merge, Whisper's special tokens) and sizes the scaled vocabulary to it.
WHISPER_SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>",
                    "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>")
WHISPER_TOKEN_IDS = {"vocab_size": 257 + len(WHISPER_SPECIALS), "bos_token_id": 257, "eos_token_id": 257,
                     "pad_token_id": 257, "decoder_start_token_id": 258}


def _write_whisper_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import WhisperFeatureExtractor, WhisperTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab[alphabet[0] + alphabet[1]] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(alphabet[0], alphabet[1])]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(WHISPER_SPECIALS))
    eot = WHISPER_SPECIALS[0]
    fast = WhisperTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot, unk_token=eot, pad_token=eot)
    assert len(fast) == WHISPER_TOKEN_IDS["vocab_size"]
    fast.save_pretrained(str(folder))
    WhisperFeatureExtractor(feature_size=128).save_pretrained(str(folder))


# Mamba-family cases pin the SSM state to float32: that is what vLLM's CPU platform resets it to on hosts with
# AVX512-BF16 (platforms/cpu.py check_and_update_config) and NemotronH's own default everywhere; pinned, the outcome
# does not depend on the host's instruction set.
SSM32 = (("mamba_ssm_cache_dtype", "float32"),)


def _gemma3n(n: int, shared: int, heads: int, kv_heads: int, head_dim: int, window: int, *, layer_types: bool = True,
             intermediate: Any = SCALED_FFN) -> dict[str, Any]:
    """A Gemma3nForCausalLM text config (no genuine Gemma-3n config.json was found to scale): the E2B/E4B layer
    pattern (4 sliding : 1 full, `layer_types` written out or left to the class default), the last `shared` layers
    reusing KV, AltUp of 4, LAuReL, 16-wide per-layer inputs over the scaled vocabulary, two sparse-activation layers
    and gelu_pytorch_tanh (vLLM's Gemma3nMLP accepts no other)."""
    d: dict[str, Any] = {
        "architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text", "vocab_size": SCALED_VOCAB,
        "vocab_size_per_layer_input": SCALED_VOCAB, "hidden_size": 256, "hidden_size_per_layer_input": 16,
        "intermediate_size": intermediate, "num_hidden_layers": n, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "num_kv_shared_layers": shared,
        "sliding_window": window, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "altup_num_inputs": 4, "altup_active_idx": 0, "altup_coef_clip": 120.0,
        "altup_correct_scale": True, "laurel_rank": 8, "activation_sparsity_pattern": [0.95] * 2 + [0.0] * (n - 2),
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": head_dim, "attention_bias": False, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    if layer_types:
        d["layer_types"] = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(n)]
    return d


MODELS: dict[str, Model] = {
    # plain GQA / MHA / MQA decoders (4 or 2 layers: one full-attention group)
    "llama-3.1-8b": Model("meta-llama--Llama-3.1-8B", {"num_hidden_layers": 4, "hidden_size": 256, "head_dim": 128},
                          "GQA 32/8, head_dim 128, bf16"),
    "llama-2-7b": Model("meta-llama--Llama-2-7b-hf", {"num_hidden_layers": 2, "hidden_size": 256, "head_dim": 128},
                        "MHA 32/32, head_dim 128, fp16"),
    "qwen3-8b": Model("Qwen--Qwen3-8B", {"num_hidden_layers": 4, "hidden_size": 256}, "GQA 32/8, explicit head_dim 128, qk-norm"),
    "qwen2.5-7b": Model("Qwen--Qwen2.5-7B-Instruct", {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 4,
                                                       "num_key_value_heads": 2},
                        "GQA (head_dim = hidden/heads = 128), sliding_window 131072 with use_sliding_window false"),
    "qwen3-moe": Model("Qwen--Qwen3-235B-A22B", {"num_hidden_layers": 4, "hidden_size": 256}, "MoE, GQA 64/4, head_dim 128"),
    "mixtral-8x7b": Model("mistralai--Mixtral-8x7B-v0.1", {"num_hidden_layers": 4, "hidden_size": 256, "head_dim": 128},
                          "MoE, GQA 32/8, sliding_window null"),
    "gemma-2b": Model("google--gemma-2b", {"num_hidden_layers": 3, "hidden_size": 256}, "MQA 8/1, head_dim 256"),
    "gemma-7b": Model("google--gemma-7b", {"num_hidden_layers": 2, "hidden_size": 256}, "MHA 16/16, head_dim 256"),
    "phi-3.5-mini": Model("microsoft--Phi-3.5-mini-instruct", {"num_hidden_layers": 4, "hidden_size": 384, "num_attention_heads": 4,
                                                               "num_key_value_heads": 4},
                          "MHA, head_dim 96 (hidden/heads), sliding_window 262144 > max_position_embeddings"),
    "phi-4-mini": Model("microsoft--Phi-4-mini-instruct", {"num_hidden_layers": 4, "hidden_size": 384, "num_attention_heads": 3,
                                                           "num_key_value_heads": 1},
                        "GQA 3/1 (24/8 scaled), head_dim 128, partial rotary, sliding_window 262144"),
    "cohere-aya-23-8b": Model("CohereForAI--aya-23-8B", {"num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 4,
                                                         "num_key_value_heads": 1}, "GQA 4/1 (32/8 scaled), head_dim 128, fp16"),
    "gpt2": Model("openai-community--gpt2", {"n_layer": 2, "n_embd": 256, "n_head": 4, "n_positions": 8192},
                  "MHA, head_dim 64 (n_embd/n_head), no torch_dtype (fp32 checkpoint)"),
    "bloom-7b1": Model("bigscience--bloom-7b1", {"n_layer": 2, "hidden_size": 256, "n_head": 2}, "MHA, ALiBi, head_dim 128, fp16"),
    "opt-6.7b": Model("facebook--opt-6.7b", {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 2,
                                             "word_embed_proj_dim": 256, "max_position_embeddings": 8192},
                      "MHA, learned positions, head_dim 128, fp16"),
    "gpt-neox-20b": Model("EleutherAI--gpt-neox-20b", {"num_hidden_layers": 2, "hidden_size": 384, "num_attention_heads": 4,
                                                     "max_position_embeddings": 8192},
                          "MHA, head_dim 96, rotary_pct 0.25, float32 checkpoint dtype"),
    "falcon-7b": Model("tiiuae--falcon-7b", {"n_layer": 2, "hidden_size": 256, "n_head": 4},
                       "RefinedWebModel / RWForCausalLM names, multi_query (1 KV head), head_dim 64"),
    "falcon-7b-renamed": Model("tiiuae--falcon-7b", {"n_layer": None, "n_head": None, "num_hidden_layers": 2, "hidden_size": 256,
                                                     "num_attention_heads": 4, "model_type": "falcon",
                                                     "architectures": ["FalconForCausalLM"], "max_position_embeddings": 8192},
                               "the falcon-7b geometry under the names tiiuae/falcon-7b uses today (model_type falcon, "
                               "FalconForCausalLM, num_attention_heads), multi_query"),
    "mpt-7b": Model("mosaicml--mpt-7b-instruct", {"n_layers": 2, "d_model": 256, "n_heads": 2, "max_seq_len": 8192},
                    "MHA, ALiBi, head_dim 128"),
    "starcoder2-7b": Model("bigcode--starcoder2-7b", {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2},
                           "GQA, head_dim 128, sliding_window 4096 on every layer"),
    # sliding windows
    "mistral-7b-v0.1": Model("mistralai--Mistral-7B-v0.1", {"num_hidden_layers": 4, "hidden_size": 256, "head_dim": 128},
                             "sliding_window 4096 on every layer, GQA 32/8"),
    "gemma-2-9b": Model("google--gemma-2-9b", {"num_hidden_layers": 4, "hidden_size": 256},
                        "alternating sliding 4096 / full, GQA 16/8, head_dim 256"),
    "gemma-3-1b": Model("google--gemma-3-1b-it", {"hidden_size": 256},
                        "26 layers, 5:1 sliding 512 / full (sliding_window_pattern 6): 22 sliding + 4 full, MQA, head_dim 256"),
    "gemma-3-4b": Model("google--gemma-3-4b-it", {}, "multimodal Gemma3ForConditionalGeneration, text_config 34 layers 5:1, window 1024"),
    "gpt-oss-20b": Model("openai--gpt-oss-20b", {"hidden_size": 256},
                         "24 layers alternating sliding 128 / full (layer_types), sinks, GQA 64/8, head_dim 64"),
    "minimax-m2.5": Model("MiniMaxAI--MiniMax-M2.5", {"num_hidden_layers": 4, "hidden_size": 256},
                          "4 layers: GQA 48/8 x 128 with q/k norm over all heads, every layer MoE"),
    "mimo-v2-flash": Model("XiaomiMiMo--MiMo-V2-Flash", {
        "num_hidden_layers": 6, "hidden_size": 256, "hybrid_layer_pattern": [0, 1, 1, 1, 1, 0],
        "moe_layer_freq": [0, 1, 1, 1, 1, 1]},
        "6 layers: 2 full (64/4 heads, K 192 / V 128) + 4 sliding 128 (64/8 heads, sinks), MoE"),
    # chunked local attention
    "llama-4-scout": Model("meta-llama--Llama-4-Scout-17B-16E-Instruct", {"num_hidden_layers": 8, "hidden_size": 256,
                                                                          # 10,485,760 rotary positions cost ~15 s per
                                                                          # start; the cache never sees them
                                                                          "max_position_embeddings": 262144},
                           "text model: chunked local 8192 on 3 of 4 layers, NoPE full on every 4th, GQA 40/8",
                           text_only="Llama4ForCausalLM"),
    # MLA
    "deepseek-v2-lite": Model("deepseek-ai--DeepSeek-V2-Lite", {"num_hidden_layers": 4, "hidden_size": 256},
                              "MLA: kv_lora_rank 512 + qk_rope 64 latent, first layer dense"),
    "deepseek-v3": Model("deepseek-ai--DeepSeek-V3", {"num_hidden_layers": 4, "hidden_size": 256, "first_k_dense_replace": 1,
                                                      "q_lora_rank": 64},
                         "MLA 512 + 64 with q_lora, MTP layer in the config (not run by vLLM without speculation)"),
    # state / hybrid
    "jamba": Model("ai21labs--Jamba-v0.1", {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 1,
                                            "mamba_dt_rank": 16},
                   "32 layers: 4 attention (period 8, offset 4) + 28 Mamba (d_state 16, d_conv 4, expand 2), head_dim 64",
                   llm_extra=SSM32),
    "mamba": Model("state-spaces--mamba-2.8b-hf", {"num_hidden_layers": 4, "n_layer": 4, "hidden_size": 256,
                                                   "intermediate_size": 512, "time_step_rank": 16},
                   "Mamba-1 state only: conv (4-1) x 512, SSM 512 x 16", llm_extra=SSM32),
    "mamba2": Model(None, {}, "Mamba-2 state only: 8 heads x 64 x state 128, n_groups 1", raw={
        "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 256, "num_hidden_layers": 4,
        "state_size": 128, "expand": 2, "head_dim": 64, "num_heads": 8, "n_groups": 1, "conv_kernel": 4,
        "chunk_size": 256, "vocab_size": SCALED_VOCAB, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0,
        "layer_norm_epsilon": 1e-5, "rms_norm": True, "residual_in_fp32": True, "use_bias": False, "use_conv_bias": True,
        "tie_word_embeddings": False, "time_step_limit": [0.0, float("inf")], "torch_dtype": "bfloat16"},
        llm_extra=SSM32),
    "nemotron-h": Model("nvidia--Nemotron-H-56B-Base-8K", {
        "hidden_size": 256, "num_hidden_layers": 24, "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-",
        "mamba_num_heads": 16, "n_groups": 2},
        "24 layers of the real pattern: 11 Mamba-2 (16 heads x 64 x state 256, 2 groups) + 2 attention (64/8 x 128) + 11 MLP",
        llm_extra=SSM32),
    # Granite-4.0-H (no bundled config): Granite-4.0-H-Tiny's pattern and state geometry (5 Mamba-2 per attention
    # layer; 48 x 64 heads scaled to 8 x 64 at width 256, state 128, 1 group; attention 12/4 scaled to 4/2 x 64),
    # NoPE, MoE of 4 gated experts + the shared MLP, legacy layer_types names as the Hub files write them
    "granite-4.0-h": Model(None, {}, "8 layers: 6 Mamba-2 (8 heads x 64 x state 128, 1 group) + 2 NoPE attention "
                           "(4/2 x 64), MoE + shared MLP", raw={
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 256,
        "num_hidden_layers": 8, "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba", "attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": SCALED_FFN,
        "shared_intermediate_size": SCALED_FFN, "num_local_experts": SCALED_EXPERTS, "num_experts_per_tok": SCALED_TOPK,
        "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
        "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
        "position_embedding_type": "nope", "max_position_embeddings": 131072, "vocab_size": SCALED_VOCAB,
        "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "attention_bias": False, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125, "logits_scaling": 6.0, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"}, llm_extra=SSM32),
    # Granite-4.0 dense (micro's kind: model_type granitemoehybrid, every layer attention, no experts, the shared MLP
    # only, rope): vLLM's rotary table is built only for position_embedding_type 'rope'
    "granite-4.0-dense": Model(None, {}, "4 attention layers (4/2 x 64), rope, shared MLP only", raw={
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 256,
        "num_hidden_layers": 4, "layer_types": ["attention"] * 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": SCALED_FFN, "shared_intermediate_size": SCALED_FFN, "num_local_experts": 0,
        "num_experts_per_tok": 0, "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128,
        "mamba_d_conv": 4, "mamba_expand": 2, "position_embedding_type": "rope", "rope_theta": 10000000.0,
        "max_position_embeddings": 131072, "vocab_size": SCALED_VOCAB, "pad_token_id": 0, "bos_token_id": 0,
        "eos_token_id": 0, "rms_norm_eps": 1e-5, "hidden_act": "silu", "attention_bias": False,
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.015625,
        "logits_scaling": 8.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}),
    # Nemotron-3: MoE layers ('E', relu2 experts + shared expert) between Mamba-2 and attention; Ultra's latent MoE
    # and its layers_block_type list (no num_hidden_layers key)
    "nemotron-3-nano": Model("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", {
        "hidden_size": 256, "num_hidden_layers": 8, "hybrid_override_pattern": "MEM*EME*", "mamba_num_heads": 16,
        "moe_shared_expert_intermediate_size": SCALED_FFN},
        "8 layers: 3 Mamba-2 (16 heads x 64 x state 128, 8 groups) + 3 MoE + 2 attention (32/2 x 128)", llm_extra=SSM32),
    "nemotron-3-ultra": Model("nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", {
        "hidden_size": 256, "layers_block_type": ["mamba", "moe", "mamba", "attention", "moe", "mamba", "moe", "attention"],
        "mamba_num_heads": 16, "moe_latent_size": 128, "moe_shared_expert_intermediate_size": SCALED_FFN},
        "layers_block_type of 8: 3 Mamba-2 + 3 latent MoE + 2 attention (64/2 x 128)", llm_extra=SSM32),
    "qwen3-next": Model("Qwen--Qwen3-Next-80B-A3B-Thinking", {"num_hidden_layers": 8, "hidden_size": 256},
                        "8 layers: 6 Gated DeltaNet (16 k heads x 128, 32 v heads x 128, conv 4) + 2 full (16/2 x 256)",
                        llm_extra=SSM32),
    # LFM2 (no bundled config: the Hub is unreachable here): LFM2-1.2B's shape scaled -- its full_attn_idxs pattern
    # [2, 5, 8, 10, 12, 14] cut to 8 layers, conv_L_cache 3, conv_dim = hidden_size as its config.json states
    "lfm2": Model(None, {}, "8 layers: 5 short-conv (512 x (3-1)) + 3 full (8/2 x 64), SwiGLU 2/3 x 1536 -> 1024", raw={
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": SCALED_VOCAB, "hidden_size": 512,
        "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2, "full_attn_idxs": [2, 5, 7],
        "conv_L_cache": 3, "conv_bias": False, "conv_dim": 512, "block_dim": 512, "block_ff_dim": 1536,
        "intermediate_size": 1536, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": True, "max_position_embeddings": 128000, "norm_eps": 1e-5,
        "rope_theta": 1000000.0, "tie_embedding": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 7,
        "torch_dtype": "bfloat16"}),
    # a conv window as wide as a 32-token attention page (2,048 channels x (3-1) x 2 B = 32 x 1 KV head x 64 x 2 x 2 B):
    # with --block-size 32 the state sets the page (a full-width window, 3 taps, would need 64-token blocks; in fp32
    # 64 against 96); layer_types instead of full_attn_idxs, conv_bias on
    "lfm2-wide": Model(None, {}, "4 layers: 3 short-conv (2048 x (3-1)) + 1 full (32/1 x 64), layer_types", raw={
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": SCALED_VOCAB, "hidden_size": 2048,
        "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 1,
        "layer_types": ["conv", "full_attention", "conv", "conv"], "conv_L_cache": 3, "conv_bias": True,
        "conv_dim": 2048, "block_dim": 2048, "block_ff_dim": 384, "block_multiple_of": 64,
        "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True, "max_position_embeddings": 32768,
        "norm_eps": 1e-5, "rope_theta": 1000000.0, "tie_embedding": True, "pad_token_id": 0, "bos_token_id": 1,
        "eos_token_id": 7, "torch_dtype": "bfloat16"}),
    # LFM2-MoE (LFM2-8B-A1B's form: layer_types, num_dense_layers 2 dense SwiGLU layers, then 32 experts top-4 with an
    # fp32 expert bias) scaled to 6 layers and 4 experts
    "lfm2-moe": Model(None, {}, "6 layers: 4 short-conv (512 x (3-1)) + 2 full (8/2 x 64); 2 dense, 4 MoE layers", raw={
        "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "vocab_size": SCALED_VOCAB,
        "hidden_size": 512, "intermediate_size": 1536, "moe_intermediate_size": SCALED_FFN, "num_hidden_layers": 6,
        "num_attention_heads": 8, "num_key_value_heads": 2,
        "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention"], "conv_L_cache": 3,
        "conv_bias": False, "num_dense_layers": 2, "num_experts": SCALED_EXPERTS, "num_experts_per_tok": SCALED_TOPK,
        "use_expert_bias": True, "norm_topk_prob": True, "routed_scaling_factor": 1.0, "norm_eps": 1e-5,
        "rope_theta": 1000000.0, "max_position_embeddings": 128000, "tie_embedding": True, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 7, "torch_dtype": "bfloat16"}),
    # Falcon-H1 (no bundled config): attention and a Mamba-2 mixer in every layer, its mu-P multipliers as the
    # 0.5B release states them (activation scales only)
    "falcon-h1": Model(None, {}, "4 layers, each full (4/2 x 64) + Mamba-2 (8 heads x 64 x state 64, 1 group, conv 4)",
                       llm_extra=SSM32, raw={'architectures': ['FalconH1ForCausalLM'], 'model_type': 'falcon_h1', 'vocab_size': 256, 'hidden_size': 256, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 64, 'intermediate_size': 512, 'mamba_d_ssm': 512, 'mamba_n_heads': 8, 'mamba_d_head': 64, 'mamba_d_state': 64, 'mamba_n_groups': 1, 'mamba_d_conv': 4, 'mamba_expand': 2, 'mamba_chunk_size': 128, 'mamba_conv_bias': True, 'mamba_proj_bias': False, 'projectors_bias': False, 'mamba_rms_norm': True, 'mamba_norm_before_gate': False, 'attention_bias': False, 'mlp_bias': False, 'tie_word_embeddings': False, 'max_position_embeddings': 16384, 'rms_norm_eps': 1e-05, 'rope_theta': 100000000000.0, 'attention_in_multiplier': 1.0, 'attention_out_multiplier': 0.9375, 'embedding_multiplier': 5.656854249492381, 'key_multiplier': 0.390625, 'lm_head_multiplier': 0.0390625, 'mlp_multipliers': [0.8838834764831844, 0.5859375], 'ssm_in_multiplier': 1.25, 'ssm_multipliers': [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738], 'ssm_out_multiplier': 0.23570226039551587, 'torch_dtype': 'bfloat16', 'pad_token_id': 0, 'bos_token_id': 1, 'eos_token_id': 11}),
    # Zamba2 (no genuine config bundled): Mamba-2 on every layer, the shared attention (2 x hidden wide, head_dim
    # 2 x hidden / heads) on the hybrid ones, each position its own K/V; two shared blocks with q/k/v adapters and
    # rope, then one block, two groups, use_long_context (16384 positions) and no attention adapters
    "zamba2": Model(None, {}, "7 layers Mamba-2 (8 heads x 64 x state 64, 1 group, conv 4); layers 1, 3, 5 also "
                    "full attention 4 x 128 (2 shared blocks, q/k/v adapters, mem rope)", llm_extra=SSM32,
                    raw={"architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "vocab_size": 256,
                         "hidden_size": 256, "num_hidden_layers": 7,
                         "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "mamba", "hybrid", "mamba"],
                         "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 64,
                         "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1,
                         "n_mamba_heads": 8, "num_mem_blocks": 2, "adapter_rank": 8,
                         "use_shared_attention_adapter": True, "use_mem_rope": True, "hidden_act": "gelu",
                         "max_position_embeddings": 4096, "rope_theta": 10000, "tie_word_embeddings": True,
                         "torch_dtype": "bfloat16", "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    "zamba2-long": Model(None, {}, "6 layers Mamba-2 (4 heads x 128 x state 128, 2 groups: a state page above a "
                         "128-token attention page); layers 2, 5 also full attention 8 x 64 (one shared block, no "
                         "q/k/v adapters), use_long_context (16384 positions)",
                         llm_extra=SSM32, max_model_len=16384,
                         raw={"architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "vocab_size": 256,
                              "hidden_size": 256, "num_hidden_layers": 6,
                              "layers_block_type": ["mamba", "mamba", "hybrid", "mamba", "mamba", "hybrid"],
                              "num_attention_heads": 8, "intermediate_size": 64, "mamba_d_state": 128,
                              "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 2, "n_mamba_heads": 4,
                              "num_mem_blocks": 1, "adapter_rank": 16, "use_long_context": True,
                              "hidden_act": "gelu", "torch_dtype": "bfloat16", "pad_token_id": 0,
                              "bos_token_id": 1, "eos_token_id": 2}),
    # Cohere2 (no genuine config.json found: the Hub is unreachable and no public copy was found): Command-R7B's
    # shape as transformers' Cohere2Config reads it -- three sliding (RoPE) layers then one full NoPE layer
    # (sliding_window_pattern 4), window 4096, head_dim = hidden / heads, parallel block, tied -- scaled to 8 layers
    "cohere2": Model(None, {}, "8 layers: 6 sliding (window 4096 + 1 in vLLM, 8/2 x 64) + 2 full NoPE (8/2 x 64)", raw={
        "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "vocab_size": SCALED_VOCAB,
        "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 2, "sliding_window": 4096, "sliding_window_pattern": 4, "logit_scale": 0.25,
        "layer_norm_eps": 1e-5, "max_position_embeddings": 32768, "rope_theta": 50000.0, "attention_bias": False,
        "hidden_act": "silu", "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 6,
        "torch_dtype": "bfloat16"}, max_model_len=16384),
    # the newer form (layer_types written out, here not the period-4 one) with a window of 1025: vLLM's window + 1
    # (1026) then needs one more block per request than 1025 would (cdiv(1025 + in-flight, 16) + 1); model_max_length
    # below max_position_embeddings sets the rotary table's length (commandr.py) and vLLM's limit
    "cohere2-odd": Model(None, {}, "6 layers: 4 sliding (window 1025 + 1, 4/1 x 128) + 2 full, layer_types, "
                         "model_max_length 8192", raw={
        "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "vocab_size": SCALED_VOCAB,
        "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 1, "sliding_window": 1025,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                        "full_attention", "sliding_attention"],
        "logit_scale": 0.25, "layer_norm_eps": 1e-5, "max_position_embeddings": 32768, "model_max_length": 8192,
        "rope_theta": 50000.0, "hidden_act": "silu", "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 6,
        "torch_dtype": "bfloat16"}, max_model_len=8192),
    # SmolLM3-3B (tests/data/wild-configs/HuggingFaceTB--SmolLM3-3B) scaled: 8 of its 36 layers (NoPE on 3 and 7),
    # head_dim 128, GQA 4:1; vLLM 0.32 runs it through its Transformers backend (registry.py)
    "smollm3": Model(None, {}, "8 layers full (4/1 x 128; NoPE on layers 3, 7), Transformers backend",
                     raw=_smollm3({"layer_types": ["full_attention"] * 8}), max_model_len=8192),
    # use_sliding_window on: SmolLM3Config slides the NoPE layers (3, 7) over sliding_window 1024
    "smollm3-swa": Model(None, {}, "8 layers: 6 full + 2 sliding NoPE (window 1024), 4/1 x 128",
                         raw=_smollm3({"use_sliding_window": True, "sliding_window": 1024}), max_model_len=8192),
    # Gemma-3n text (no genuine config bundled): the last num_kv_shared_layers layers register no KV spec
    # (kv_sharing_target_layer_name, models/gemma3n.py Gemma3nAttention), so only the earlier layers hold a cache
    "gemma-3n-e2b": Model(None, {}, "10 layers 4:1 sliding 512 / full, 8/2 x 256; the last 5 share KV, so 4 sliding + "
                          "1 full own a cache", raw=_gemma3n(10, 5, 8, 2, 256, 512)),
    "gemma-3n-e4b": Model(None, {}, "15 layers (class-default 4:1 pattern, no layer_types), 4/1 x 128, window 256, "
                          "per-layer FFN widths; the last 5 share KV: 8 sliding + 2 full own a cache",
                          raw=_gemma3n(15, 5, 4, 1, 128, 256, layer_types=False,
                                       intermediate=[64] * 5 + [128] * 10)),
    "gemma-3n-noshare": Model(None, {}, "gemma-3n-e2b with num_kv_shared_layers 0: 8 sliding 512 + 2 full, every layer "
                              "its own cache (twice e2b's page per block)", raw=_gemma3n(10, 0, 8, 2, 256, 512)),
    # vLLM's targets are first_shared - 2 for a sliding layer, - 1 for a full one, whatever the kinds: here the sliding
    # layer 6 reads full layer 4 and the full layer 7 sliding layer 5 (transformers: 5 and 4); the bytes do not move
    "gemma-3n-crossed": Model(None, {}, "8 layers s s s s f s | s f, the last 2 sharing KV with vLLM's fixed offsets "
                              "(targets of the other kind): 5 sliding + 1 full own a cache",
                              raw={**_gemma3n(8, 2, 8, 2, 256, 512), "layer_types": [
                                  "full_attention" if i in (4, 7) else "sliding_attention" for i in range(8)]}),
    # Qwen3.5's text models (the vision tower plays no part in the cache): its config's mamba_ssm_dtype float32 is
    # what vLLM's Qwen3_5ForCausalLMConfig makes the SSM state, with no flag
    "qwen3.5": Model("Qwen--Qwen3.5-27B", {"num_hidden_layers": 8, "hidden_size": 256, "layer_types": None},
                     "8 layers: 6 Gated DeltaNet (16 k / 48 v heads x 128, conv 4) + 2 gated full (24/4 x 256), dense",
                     text_only="Qwen3_5ForCausalLM"),
    "qwen3.5-moe": Model("Qwen--Qwen3.5-35B-A3B", {"num_hidden_layers": 8, "hidden_size": 256, "layer_types": None},
                         "8 layers: 6 Gated DeltaNet (16 k / 32 v heads) + 2 full (16/2 x 256), MoE + shared expert",
                         text_only="Qwen3_5MoeForCausalLM"),
    # encoder-decoder
    "whisper": Model("openai--whisper-large-v3", {"d_model": 256, "encoder_layers": 2, "decoder_layers": 2,
                                                  "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                                                  **WHISPER_TOKEN_IDS, "begin_suppress_tokens": None,
                                                  "suppress_tokens": None},
                     "encoder-decoder: self + cross (1500 encoder positions), head_dim 64, fp16", max_model_len=448,
                     tokenizer="whisper"),
    "t5": Model("google-t5--t5-large", {"d_model": 256, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4, "d_kv": 64},
                "encoder-decoder T5", max_model_len=512),
    # facebook/bart-large-cnn (tests/data/wild-configs) scaled: 0.32 refuses BartForConditionalGeneration in-tree
    "bart": Model(None, {}, "encoder-decoder BART (16 heads x 16, learned positions)", max_model_len=128, raw={
        **json.loads((ROOT / "tests" / "data" / "wild-configs" / "facebook--bart-large-cnn" / "config.json").read_text()),
        "d_model": 256, "encoder_layers": 2, "num_hidden_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": SCALED_FFN,
        "decoder_ffn_dim": SCALED_FFN, "vocab_size": SCALED_VOCAB, "max_position_embeddings": 128,
        "torch_dtype": "bfloat16"}),
    # remote-code families
    "chatglm3-6b": Model("THUDM--chatglm3-6b", {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 2},
                         "remote-code ChatGLMModel (multi_query_group_num 2, head_dim 128)"),
    "qwen-7b-v1": Model("Qwen--Qwen-7B", {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 2},
                        "remote-code QWenLMHeadModel (MHA, head_dim 128)"),
}


def scaled_config(name: str) -> dict[str, Any]:
    """The scaled config.json of MODELS[name] (a new dict)."""
    m = MODELS[name]
    if m.raw is not None:
        return copy.deepcopy(m.raw)
    d = json.loads((CONFIG_ROOT / m.base / "config.json").read_text())
    if m.text_only:
        top = d
        d = copy.deepcopy(top["text_config"])
        d["architectures"] = [m.text_only]
        d.setdefault("torch_dtype", top.get("torch_dtype") or top.get("dtype"))
    if isinstance(d.get("text_config"), dict):
        _shrink(d["text_config"])
        d["text_config"].update(m.overrides)
        _clamp_ids(d)
        if isinstance(d.get("vision_config"), dict):
            v = d["vision_config"]
            heads = v.get("num_attention_heads", 4)
            v.update({"hidden_size": 16 * heads, "intermediate_size": SCALED_FFN, "num_hidden_layers": 1})
        for k in ("image_token_index", "image_token_id", "boi_token_index", "eoi_token_index"):
            if isinstance(d.get(k), int):
                d[k] = SCALED_VOCAB - 1 - ("boi" in k) - 2 * ("eoi" in k)
    else:
        _shrink(d)
        d.update(m.overrides)
    for k in [k for k, v in m.overrides.items() if v is None]:
        d.pop(k, None)
        d.get("text_config", {}).pop(k, None)
    return d


def write_configs(root: Path, names) -> dict[str, Path]:
    """config.json of each scaled model under root/<name>/; returns name -> config.json path."""
    out = {}
    for name in names:
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        p = d / "config.json"
        p.write_text(json.dumps(scaled_config(name), indent=1, sort_keys=True))
        if MODELS[name].tokenizer == "whisper":
            _write_whisper_tokenizer(d)
        out[name] = p
    return out


# ---------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One vLLM start. None means vLLM's own default for that setting."""

    model: str
    kv_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE
    block_size: int | None = None  # --block-size (CPU default 128; MLA forced to 16)
    max_model_len: int | None = None  # None: MODELS[model].max_model_len
    kv_cache_dtype: str | None = None  # "fp8", "fp8_e5m2"
    max_num_batched_tokens: int | None = None
    disable_hybrid: bool | None = None  # disable_hybrid_kv_cache_manager
    kv_cache_memory_bytes: int | None = None  # instead of VLLM_CPU_KVCACHE_SPACE (any byte count)
    tag: str = ""  # names `extra` in the case id
    extra: tuple[tuple[str, Any], ...] = ()  # more LLM(...) settings (after the model's llm_extra)
    kvplan_extra: tuple[str, ...] = ()  # kvplan options that say the same as `extra`

    @property
    def id(self) -> str:
        parts = [self.model]
        if self.kv_cache_memory_bytes is not None:
            parts.append(f"kvbytes{self.kv_cache_memory_bytes}")
        elif self.kv_space_gib != 1:
            parts.append(f"space{self.kv_space_gib}")
        if self.block_size is not None:
            parts.append(f"block{self.block_size}")
        if self.max_model_len is not None:
            parts.append(f"len{self.max_model_len}")
        if self.kv_cache_dtype:
            parts.append(self.kv_cache_dtype)
        if self.max_num_batched_tokens is not None:
            parts.append(f"mbt{self.max_num_batched_tokens}")
        if self.disable_hybrid:
            parts.append("nohybrid")
        if self.tag:
            parts.append(self.tag)
        return "-".join(parts)

    def llm_kwargs(self, model_dir: str) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": model_dir, "load_format": "dummy",
                              "skip_tokenizer_init": MODELS[self.model].tokenizer is None,
                              "max_model_len": self.max_model_len or MODELS[self.model].max_model_len,
                              "enforce_eager": True, "seed": 0}
        if self.block_size is not None:
            kw["block_size"] = self.block_size
        if self.kv_cache_dtype:
            kw["kv_cache_dtype"] = self.kv_cache_dtype
        if self.max_num_batched_tokens is not None:
            kw["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.disable_hybrid is not None:
            kw["disable_hybrid_kv_cache_manager"] = self.disable_hybrid
        if self.kv_cache_memory_bytes is not None:
            kw["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        kw.update(dict(MODELS[self.model].llm_extra))
        kw.update(dict(self.extra))
        return kw

    def env(self) -> dict[str, str]:
        return {} if self.kv_cache_memory_bytes is not None else {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_space_gib)}


def _defaults() -> list[Case]:
    return [Case(m) for m in MODELS]


def _variations() -> list[Case]:
    return [
        # budgets
        Case("llama-3.1-8b", kv_space_gib=2), Case("llama-3.1-8b", kv_space_gib=3),
        Case("llama-3.1-8b", kv_cache_memory_bytes=1_500_000_000),
        Case("gemma-2-9b", kv_space_gib=3), Case("jamba", kv_space_gib=2), Case("deepseek-v2-lite", kv_space_gib=3),
        # block sizes
        Case("llama-3.1-8b", block_size=16), Case("llama-3.1-8b", block_size=32),
        Case("gemma-2-9b", block_size=16), Case("gemma-2-9b", block_size=32),
        Case("mistral-7b-v0.1", block_size=16), Case("gpt-oss-20b", block_size=32),
        Case("jamba", block_size=16), Case("jamba", block_size=32),
        Case("nemotron-h", block_size=32), Case("qwen3-next", block_size=32), Case("granite-4.0-h", block_size=32),
        Case("deepseek-v2-lite", block_size=128),
        # max_model_len
        Case("llama-3.1-8b", max_model_len=2048), Case("llama-3.1-8b", max_model_len=8192),
        Case("mistral-7b-v0.1", max_model_len=2048), Case("mistral-7b-v0.1", max_model_len=8192),
        Case("gemma-2-9b", max_model_len=8192), Case("gemma-3-1b", max_model_len=8192),
        Case("gpt-oss-20b", max_model_len=8192), Case("llama-4-scout", max_model_len=16384),
        Case("jamba", max_model_len=8192), Case("deepseek-v2-lite", max_model_len=8192),
        Case("qwen3-next", max_model_len=8192),
        # kv dtype
        Case("llama-3.1-8b", kv_cache_dtype="fp8"), Case("llama-3.1-8b", kv_cache_dtype="fp8_e5m2"),
        Case("gemma-2-9b", kv_cache_dtype="fp8"), Case("jamba", kv_cache_dtype="fp8"),
        Case("deepseek-v2-lite", kv_cache_dtype="fp8"), Case("gpt-oss-20b", kv_cache_dtype="fp8"),
        # max_num_batched_tokens: the sliding-window, chunk and cross-attention reservations
        Case("mistral-7b-v0.1", max_model_len=8192, max_num_batched_tokens=1024),
        Case("gemma-2-9b", max_model_len=8192, max_num_batched_tokens=1024),
        Case("gemma-3-1b", max_num_batched_tokens=512), Case("gpt-oss-20b", max_num_batched_tokens=512),
        Case("llama-4-scout", max_model_len=16384, max_num_batched_tokens=2048),
        Case("whisper", max_num_batched_tokens=2048),
        # hybrid manager off
        Case("gemma-2-9b", disable_hybrid=True), Case("gemma-3-1b", disable_hybrid=True),
        Case("gpt-oss-20b", disable_hybrid=True), Case("mistral-7b-v0.1", disable_hybrid=True),
        Case("llama-4-scout", max_model_len=16384, disable_hybrid=True), Case("jamba", disable_hybrid=True),
        # Mamba / linear-attention state dtypes: conv and SSM both float32 (kvplan --state-dtype fp32 says the same)
        *[Case(m, tag="state32", extra=STATE32, kvplan_extra=("--state-dtype", "fp32"))
          for m in ("mamba", "mamba2", "jamba", "nemotron-h", "qwen3-next", "granite-4.0-h")],
        Case("jamba", tag="state32-noprefix", extra=STATE32 + (("enable_prefix_caching", False),),
             kvplan_extra=("--state-dtype", "fp32")),
        # Gated DeltaNet keeps a bf16 SSM state on CPU when asked (the accelerated 'gdn' backend): all state in bf16
        Case("qwen3-next", tag="ssm-bf16", extra=(("mamba_ssm_cache_dtype", "bfloat16"),)),
        # LFM2's short-conv state: its one conv window in float32 when asked, in fp8 with the KV cache, and 32-token blocks
        Case("lfm2", tag="state32", extra=(("mamba_cache_dtype", "float32"),), kvplan_extra=("--state-dtype", "fp32")),
        Case("lfm2", kv_cache_dtype="fp8"), Case("lfm2", block_size=32), Case("lfm2", kv_space_gib=2),
        Case("lfm2-wide", tag="state32", block_size=32, extra=(("mamba_cache_dtype", "float32"),),
             kvplan_extra=("--state-dtype", "fp32")),
        Case("lfm2-wide", block_size=32), Case("lfm2-wide", kv_cache_dtype="fp8"),
        Case("lfm2-moe", block_size=32),
        Case("falcon-h1", tag="state32", extra=STATE32, kvplan_extra=("--state-dtype", "fp32")),
        Case("falcon-h1", max_model_len=8192),
        Case("zamba2", tag="state32", extra=STATE32, kvplan_extra=("--state-dtype", "fp32")),
        Case("zamba2", kv_space_gib=2), Case("zamba2-long", max_model_len=8192), Case("zamba2-long", block_size=64),
        # Cohere2: the hybrid manager's sliding group (window + 1) beside the full NoPE layers; SmolLM3 windows
        Case("cohere2", max_model_len=32768), Case("cohere2", kv_cache_dtype="fp8"), Case("cohere2", block_size=32),
        Case("cohere2-odd", max_model_len=4096), Case("cohere2-odd", kv_space_gib=2),
        Case("smollm3", kv_cache_dtype="fp8"), Case("smollm3-swa", max_model_len=4096),
        # Gemma-3n: KV-shared layers hold nothing; the windows, blocks and budget act on the layers that own a cache
        Case("gemma-3n-e2b", block_size=32), Case("gemma-3n-e2b", max_num_batched_tokens=512),
        Case("gemma-3n-e2b", disable_hybrid=True), Case("gemma-3n-e2b", kv_space_gib=2),
        Case("gemma-3n-e4b", max_model_len=8192),
        # an explicit flag overrides Qwen3.5's config (vLLM warns and uses the flag); kvplan is told the same
        Case("qwen3.5", tag="ssm-bf16", extra=(("mamba_ssm_cache_dtype", "bfloat16"),),
             kvplan_extra=("--mamba-ssm-cache-dtype", "bf16")),
    ]


STATE32 = (("mamba_cache_dtype", "float32"), ("mamba_ssm_cache_dtype", "float32"))


CASES: list[Case] = _defaults() + _variations()


# ---------------------------------------------------------------------------------------------- version
VLLM_PYTHON_ENV = "KVPLAN_VLLM_PYTHON"  # another interpreter (venv) that has vLLM; default: this one


def vllm_python() -> str:
    return os.environ.get(VLLM_PYTHON_ENV) or sys.executable


def vllm_version() -> str | None:
    """The installed vLLM distribution's version (vllm-cpu or vllm), read without importing vllm, from the
    interpreter the child will run (vllm_python())."""
    probe = ("from importlib import metadata\n"
             "for d in ('vllm-cpu', 'vllm'):\n"
             "    try:\n        print(metadata.version(d)); break\n"
             "    except metadata.PackageNotFoundError:\n        pass\n")
    if vllm_python() == sys.executable:
        from importlib import metadata

        for dist in ("vllm-cpu", "vllm"):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return None
    try:
        out = subprocess.run([vllm_python(), "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out or None


# ---------------------------------------------------------------------------------------------- parent side
CHILD_ENV, PRINTED = vllm_child.CHILD_ENV, vllm_child.PRINTED


def run_cases(cases: list[Case], workdir: Path, timeout: float = 1500.0) -> tuple[dict[str, dict], dict[str, Any]]:
    """Run every case in child processes (one, plus one more per crash); results by case id and run info
    (child wall times, import time, vLLM version, child log paths)."""
    workdir.mkdir(parents=True, exist_ok=True)
    paths = write_configs(workdir / "models", sorted({c.model for c in cases}))
    todo = [{"id": c.id, "env": c.env(), "kwargs": c.llm_kwargs(str(paths[c.model].parent))} for c in cases]
    results: dict[str, dict] = {}
    info: dict[str, Any] = {"children": [], "import_seconds": [], "version": None, "import_error": None}
    deadline = time.monotonic() + timeout
    attempt = 0
    while todo and time.monotonic() < deadline:
        attempt += 1
        spec = workdir / f"spec{attempt}.json"
        out = workdir / f"results{attempt}.jsonl"
        log = workdir / f"child{attempt}.log"
        spec.write_text(json.dumps(todo))
        out.unlink(missing_ok=True)
        env = {**os.environ, **CHILD_ENV}
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        t0 = time.monotonic()
        with open(log, "wb") as lf:
            try:
                proc = subprocess.run([vllm_python(), vllm_child.__file__, str(spec), str(out)], env=env,
                                      stdout=lf, stderr=subprocess.STDOUT, timeout=max(1.0, deadline - time.monotonic()),
                                      cwd=str(workdir))
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        info["children"].append({"rc": rc, "seconds": round(time.monotonic() - t0, 2), "log": str(log)})
        done = []
        if out.exists():
            for line in out.read_text().splitlines():
                if not line.strip():
                    continue
                r = json.loads(line)
                if r["id"] == "__import__":
                    info["version"] = r.get("version")
                    info["host"] = r.get("host")
                    if r.get("error"):
                        info["import_error"] = r["error"]
                    else:
                        info["import_seconds"].append(r["seconds"])
                    continue
                results[r["id"]] = r
                done.append(r["id"])
        if info["import_error"]:
            break
        todo = [t for t in todo if t["id"] not in results]
        if todo and rc == 0:
            break  # the child finished yet left cases: do not loop
        if todo:  # the child died (or timed out) during todo[0]: record it and go on with the rest
            tail = _tail(log)
            results[todo[0]["id"]] = {"id": todo[0]["id"], "error": f"the vLLM child process ended (rc {rc}) during "
                                      f"this case; its last log line: {tail}"}
            todo = todo[1:]
    for t in todo:
        results.setdefault(t["id"], {"id": t["id"], "error": "not run: the vLLM tier ran out of time"})
    return results, info


def _tail(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][-300:] if lines else "(empty log)"


# vLLM knobs kvplan does not have yet (docs/research/VLLM_ORACLE_NOTES.md D6a, D6c): passed as soon as `kvplan fit --help`
# lists them under these names, so the tests pick up the fix without an edit here.
SSM_DTYPE_KNOB = "--mamba-ssm-cache-dtype"
PREFIX_CACHING_KNOB = "--enable-prefix-caching"
TORCH_TO_KVPLAN = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def kvplan_knobs(help_text: str) -> frozenset[str]:
    """The optional knobs above that this kvplan's `fit --help` lists."""
    return frozenset(k for k in (SSM_DTYPE_KNOB, PREFIX_CACHING_KNOB) if k in help_text)


def kvplan_fit_args(case: Case, result: dict[str, Any], config_path: str | Path,
                    knobs: frozenset[str] = frozenset()) -> list[str]:
    """`kvplan fit` for the same question: the budget vLLM was handed, vLLM's max_model_len, the block size the
    CPU platform chose before any hybrid alignment (kvplan's --block-size means the same), the scheduler settings
    vLLM resolved (max_num_batched_tokens, async scheduling off on CPU), the kv dtype and the hybrid switch."""
    args = ["fit", "--gpu", "24GB", "--model", str(config_path), "--kv-budget", f"{result['budget_bytes']}B",
            "--engine", f"vllm@{result['version_number']}", "--ctx", str(result["max_model_len"]),
            "--max-model-len", str(result["max_model_len"]), "--block-size", str(result["platform_block_size"]),
            "--max-num-batched-tokens", str(result["max_num_batched_tokens"])]
    args.append("--async-scheduling" if result["async_scheduling"] else "--no-async-scheduling")
    if case.kv_cache_dtype:
        args += ["--kv-dtype", {"fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8_e5m2"}[case.kv_cache_dtype]]
    if case.disable_hybrid:
        args.append("--disable-hybrid-kv-cache-manager")
    ssm = TORCH_TO_KVPLAN.get(str(result.get("mamba_ssm_cache_dtype")))
    if SSM_DTYPE_KNOB in knobs and ssm and any("Mamba" in g["layer_spec"] for g in result.get("groups", ())):
        args += [SSM_DTYPE_KNOB, ssm]
    if PREFIX_CACHING_KNOB in knobs and result.get("enable_prefix_caching") is not None:
        args.append(PREFIX_CACHING_KNOB if result["enable_prefix_caching"] else "--no-enable-prefix-caching")
    return args + list(case.kvplan_extra)


def table(results: dict[str, dict], models: Path, cases: list[Case] | None = None) -> list[str]:
    """Markdown rows: case, vLLM tokens/blocks/concurrency, kvplan's, equal or not (docs/research/VLLM_ORACLE_NOTES.md)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import run_cli

    knobs = kvplan_knobs(run_cli("fit", "--help").out)
    rows = ["| case | vLLM tokens / blocks / concurrency | kvplan tokens / blocks / concurrency | block size vLLM / kvplan "
            "| equal |", "|---|---:|---:|---:|---|"]
    for c in cases or CASES:
        r = results.get(c.id)
        if r is None:
            continue
        if "error" in r:
            rows.append(f"| {c.id} | refused: {r['error'][:160]} | - | - | skip |")
            continue
        p = r["printed"]
        out = run_cli(*kvplan_fit_args(c, r, models / c.model / "config.json", knobs), "--json")
        if out.code != 0:
            rows.append(f"| {c.id} | {p['tokens']:,} / {r['num_blocks']:,} / {p['concurrency']} | kvplan error: "
                        f"{out.err.strip()[:120]} | - | no |")
            continue
        k = out.json()["results"][0]
        d = k["engine_details"]
        ok = (k["kv_capacity_tokens"], d["num_gpu_blocks"], f"{k['concurrency']:.2f}") == \
            (p["tokens"], r["num_blocks"], p["concurrency"])
        rows.append(f"| {c.id} | {p['tokens']:,} / {r['num_blocks']:,} / {p['concurrency']} | "
                    f"{k['kv_capacity_tokens']:,} / {d['num_gpu_blocks']:,} / {k['concurrency']:.2f} | "
                    f"{r['block_size']} / {d.get('block_size')} | {'yes' if ok else '**no**'} |")
    return rows


def _main(argv: list[str]) -> int:
    """`python tests/oracle_vllm.py WORKDIR [CASE_ID_PREFIX...]`: run the cases (all, or those whose id starts with a
    prefix), print the markdown table and write WORKDIR/results.json. (Two file arguments: the child mode.)"""
    work = Path(argv[0])
    chosen = [c for c in CASES if not argv[1:] or any(c.id.startswith(a) for a in argv[1:])]
    t0 = time.monotonic()
    results, info = run_cases(chosen, work)
    info["wall_seconds"] = round(time.monotonic() - t0, 1)
    (work / "results.json").write_text(json.dumps({"results": results, "info": info}, indent=1))
    print("\n".join(table(results, work / "models", chosen)))
    starts = sorted(r["seconds"] for r in results.values() if "seconds" in r)
    print(f"\n{len(chosen)} cases, {info['wall_seconds']} s wall, import {info['import_seconds']} s, per start "
          f"median {starts[len(starts) // 2] if starts else None} s (vLLM {info['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
