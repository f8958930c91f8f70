"""Engine logs from the wild (tests/data/engine-logs.yaml): every printed KV size for a known context must lie
in the interval its printed precision implies ("%.2f MiB" -> +/- 0.005 MiB). No other tolerance.

The printed figures are read from the log text by regex here, never typed in. Models that are not bundled get a
config built from the case's stated config_facts (layers, KV heads, head dims); only KV is asserted for those.
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from conftest import kvjson, llama_like, write_config

MiB, GiB = 1 << 20, 1 << 30


def printed(log: str, pattern: str, index: int = 0) -> Decimal:
    hits = re.findall(pattern, log)
    assert hits, f"pattern {pattern!r} not in log"
    return Decimal(hits[index].replace(",", ""))


def interval(value: Decimal, unit: int) -> tuple[Decimal, Decimal]:
    """[value - half a printed digit, value + half a printed digit) in bytes."""
    exp = value.as_tuple().exponent
    half = Decimal(5) * Decimal(10) ** (exp - 1) if exp < 0 else Decimal("0.5")
    return (value - half) * unit, (value + half) * unit


def assert_printed(kv_bytes: int, value: Decimal, unit: int, what: str) -> None:
    lo, hi = interval(value, unit)
    assert lo <= kv_bytes < hi, f"{what}: kvplan {kv_bytes:,} B not in [{lo:,.0f}, {hi:,.0f}) (log says {value})"


def tensor_bytes(d: dict, prefix: str) -> int:
    return sum(t["bytes"] for g in d["groups"] for t in g["tensors"] if t["name"].startswith(prefix))


# ---------------------------------------------------------------------------------------------- llama.cpp
def test_llamacpp_405b_rpc(engine_logs, tmp_path):
    case = engine_logs["llamacpp-llama-3.1-405b-q4_0-rpc-3x-c8g"]
    f = case["config_facts"]
    cfg = write_config(tmp_path, "405b", llama_like(f["num_hidden_layers"], 128, f["num_key_value_heads"], f["head_dim"]))
    d = kvjson("size", cfg, "--ctx", str(case["n_ctx"]), "--engine", "llamacpp@b5935")
    log = case["log"]
    assert_printed(d["kv_bytes"], printed(log, r"\bsize = +([\d.]+) MiB \("), MiB, "size")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(f16\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(log, r"V \(f16\): +([\d.]+) MiB"), MiB, "V")
    buffers = [Decimal(x) for x in re.findall(r"KV buffer size = +([\d.]+) MiB", log)]
    assert_printed(d["kv_bytes"], sum(buffers), MiB, "sum of the RPC/CPU layer-split buffers")
    assert d["engine_details"]["cells"] == int(printed(log, r"\( *(\d+) cells"))


def test_llamacpp_llama31_8b_vulkan(engine_logs):
    case = engine_logs["llamacpp-llama-3.1-8b-vulkan-rtx4080"]
    d = kvjson("size", "llama-3.1-8b", "--ctx", str(case["n_ctx"]), "--engine", "llamacpp@b5781")
    log = case["log"]
    assert_printed(d["kv_bytes"], printed(log, r"\bsize = +([\d.]+) MiB \("), MiB, "size")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(f16\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(d["kv_bytes"], printed(log, r"Vulkan0 KV buffer size = +([\d.]+) MiB"), MiB, "buffer")


def test_llamacpp_deepseek_v3_mla_b5331_stores_k_and_v(engine_logs):
    case = engine_logs["llamacpp-deepseek-v3-0324-mla-mainline-k576-v512"]
    d = kvjson("size", "deepseek-v3", "--ctx", str(case["n_ctx"]), "--engine", "llamacpp@b5331")
    log = case["log"]
    assert_printed(d["kv_bytes"], printed(log, r"KV self size += +([\d.]+) MiB"), MiB, "KV self size")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(f16\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(log, r"V \(f16\): +([\d.]+) MiB"), MiB, "V")
    # the four per-device buffers are a layer split of the same total
    buffers = [Decimal(x) for x in re.findall(r"CUDA\d KV buffer size = +([\d.]+) MiB", log)]
    assert_printed(d["kv_bytes"], sum(buffers), MiB, "sum of device buffers")


def test_llamacpp_deepseek_latent_only_matches_ik_mla_modes(engine_logs):
    """Current llama.cpp (V-less MLA cache) = ik_llama.cpp latent-only (mla=0 print 'c^KV', mla=3)."""
    case = engine_logs["llamacpp-deepseek-v3-0324-mla-mainline-k576-v512"]
    d = kvjson("size", "deepseek-v3", "--ctx", str(case["n_ctx"]), "--engine", "llamacpp")
    assert_printed(d["kv_bytes"], printed(case["log"], r"mla_attn += 0\n.*KV self size += +([\d.]+) MiB"), MiB, "latent")
    case = engine_logs["ik-deepseek-r1-0528-mla3-f16-16k"]
    d = kvjson("size", "deepseek-v3", "--ctx", str(case["n_ctx"]), "--engine", "llamacpp")
    assert_printed(d["kv_bytes"], printed(case["log"], r"KV self size += +([\d.]+) MiB"), MiB, "mla=3")


@pytest.mark.parametrize("run,ctx_key,dtype,pattern_total,pattern_k", [
    ("A", 0, "fp16", r"KV self size += +([\d.]+) MiB", r"K \(f16\): +([\d.]+) MiB"),
    ("B", 1, "q8_0", r"KV self size += +([\d.]+) MiB", r"K \(q8_0\): +([\d.]+) MiB"),
])
def test_llamacpp_glm_z1_two_kv_heads(engine_logs, tmp_path, run, ctx_key, dtype, pattern_total, pattern_k):
    case = engine_logs["llamacpp-glm-z1-32b-0414-2kvheads"]
    f = case["config_facts"]
    cfg = write_config(tmp_path, "glm", llama_like(f["num_hidden_layers"], 48, f["num_key_value_heads"], f["head_dim"]))
    ctxs = [int(x) for x in re.findall(r"-c (\d+)", case["log"])]
    d = kvjson("size", cfg, "--ctx", str(ctxs[ctx_key]), "--engine", "llamacpp@b5192", "--kv-dtype", dtype)
    log = case["log"]
    assert_printed(d["kv_bytes"], printed(log, pattern_total, 0 if run == "A" else 1), MiB, f"run {run} total")
    assert_printed(tensor_bytes(d, "K"), printed(log, pattern_k), MiB, f"run {run} K")


def test_ollama_gemma3_4b_swa_two_buffers(engine_logs):
    case = engine_logs["ollama-gemma3-4b-128k-swa-rtx5080"]
    d = kvjson("size", "gemma-3-4b", "--ctx", str(case["n_ctx"]), "--engine", "llamacpp", "--kv-dtype", "f16")
    full, swa = [Decimal(x) for x in re.findall(r"KV buffer size = +([\d.]+) MiB", case["log"])]
    by_kind = {g["kind"]: g["bytes"] for g in d["groups"]}
    assert_printed(by_kind["full"], full, MiB, "non-SWA buffer")
    assert_printed(by_kind["sliding"], swa, MiB, "SWA buffer")


def test_ik_qwen3_235b_k_q8_v_f16(engine_logs):
    case = engine_logs["ik-qwen3-235b-a22b-kq8-vf16-8k-cpu"]
    d = kvjson("size", "qwen3-235b-a22b", "--ctx", str(case["n_ctx"]), "--engine", "llamacpp",
               "--k-dtype", "q8_0", "--v-dtype", "f16")
    log = case["log"]
    assert d["kv_dtype"] == "q8_0/fp16"
    assert_printed(d["kv_bytes"], printed(log, r"KV self size += +([\d.]+) MiB"), MiB, "total")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(q8_0\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(log, r"V \(f16\): +([\d.]+) MiB"), MiB, "V")


def test_ik_llama2_13b_mha(engine_logs, tmp_path):
    case = engine_logs["ik-llama-2-13b-mha-512"]
    f = case["config_facts"]
    cfg = write_config(tmp_path, "13b", llama_like(f["num_hidden_layers"], f["num_attention_heads"], f["num_key_value_heads"], f["head_dim"]))
    d = kvjson("size", cfg, "--ctx", str(case["n_ctx"]), "--engine", "llamacpp")
    assert_printed(d["kv_bytes"], printed(case["log"], r"KV self size += +([\d.]+) MiB"), MiB, "total")


def test_ik_nemotron_ultra_per_layer_heads(engine_logs, tmp_path):
    """A per-layer n_head_kv array (0 = no-op attention) written as DeciLM block_configs; -c 12228 pads to 12288."""
    case = engine_logs["ik-llama-3.1-nemotron-ultra-253b-kq8-vq4"]
    log = case["log"]
    heads = [int(x) for x in re.search(r"n_head_kv += \[([^\]]*)\]", log).group(1).split(",")]
    blocks = [{"attention": {"n_heads_in_group": 128 // h, "no_op": False} if h else {"no_op": True},
               "ffn": {"ffn_mult": 1.0}} for h in heads]
    cfg = {"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "hidden_size": 16384,
           "num_attention_heads": 128, "head_dim": 128, "vocab_size": 128256, "num_hidden_layers": len(heads),
           "block_configs": blocks, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
    path = write_config(tmp_path, "ultra", cfg)
    requested = re.search(r"-c (\d+)", log).group(1)
    d = kvjson("size", path, "--ctx", requested, "--engine", "llamacpp", "--k-dtype", "q8_0", "--v-dtype", "q4_0")
    assert d["engine_details"]["n_ctx"] == int(printed(log, r"n_ctx += (\d+)"))
    assert_printed(d["kv_bytes"], printed(log, r"KV self size += +([\d.]+) MiB"), MiB, "total")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(q8_0\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(log, r"V \(q4_0\): +([\d.]+) MiB"), MiB, "V")


def test_ik_command_a_cohere2_every_layer_full(engine_logs, tmp_path):
    """Command-A (cohere2: 3 sliding layers of 4096, then 1 full) in ik_llama.cpp, which keeps no separate SWA cache:
    every layer holds all n_ctx cells, llama.cpp's layout with --swa-full. The config is the log's own metadata."""
    case = engine_logs["ik-command-a-agatha-111b-cohere2-q8kv-32k"]
    log = case["log"]
    meta = lambda key: int(printed(log, rf"llm_load_print_meta: {key} += (\d+)"))  # noqa: E731
    cfg = write_config(tmp_path, "cmd-a", {
        "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "vocab_size": 256000,
        "hidden_size": meta("n_embd"), "intermediate_size": 36864, "num_hidden_layers": meta("n_layer"),
        "num_attention_heads": meta("n_head"), "num_key_value_heads": meta("n_head_kv"),
        "head_dim": meta("n_embd_head_k"), "sliding_window": meta("n_swa"),
        "sliding_window_pattern": meta("n_swa_pattern"), "max_position_embeddings": meta("n_ctx_train"),
        "torch_dtype": "bfloat16"})
    ctx = str(int(printed(log, r"n_ctx += (\d+)")))
    d = kvjson("size", cfg, "--ctx", ctx, "--engine", "llamacpp", "--kv-dtype", "q8_0", "--swa-full")
    assert {g["kind"]: g["layers"] for g in d["groups"]} == {"sliding": 48, "full": 16}
    assert_printed(d["kv_bytes"], printed(log, r"KV self size += +([\d.]+) MiB"), MiB, "total")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(q8_0\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(log, r"V \(q8_0\): +([\d.]+) MiB"), MiB, "V")
    # mainline's iSWA cache (the default, no --swa-full) would be far smaller: the log is not that layout
    mainline = kvjson("size", cfg, "--ctx", ctx, "--engine", "llamacpp", "--kv-dtype", "q8_0")
    assert mainline["kv_bytes"] < 0.4 * d["kv_bytes"]


def test_ik_kimi_k2_latent_q8_and_cuda_row_padding(engine_logs, tmp_path):
    """Kimi-K2 (deepseek2 arch, -mla 3): the q8_0 latent cache alone. The config is the log's metadata. The two
    CUDA buffers carry ggml-cuda's one padded row per quantized tensor whose row (576) is not a multiple of 512."""
    case = engine_logs["ik-kimi-k2-instruct-mla3-q8-latent-128k"]
    log = case["log"]
    kv = lambda key: int(printed(log, rf"deepseek2\.{key} u32 += (\d+)"))  # noqa: E731
    layers, rank, rope = kv("block_count"), kv("attention.kv_lora_rank"), kv("rope.dimension_count")
    cfg = write_config(tmp_path, "k2", {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 163840,
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": layers,
        "num_attention_heads": int(printed(log, r"n_head += (\d+)")), "num_key_value_heads": 64,
        "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
        "q_lora_rank": 1536, "kv_lora_rank": rank, "qk_nope_head_dim": 128, "qk_rope_head_dim": rope,
        "v_head_dim": int(printed(log, r"n_embd_head_v += (\d+)")), "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16"})
    ctx = int(printed(log, r"n_ctx += (\d+)"))
    d = kvjson("size", cfg, "--ctx", str(ctx), "--engine", "llamacpp", "--kv-dtype", "q8_0")
    assert_printed(d["kv_bytes"], printed(log, r"KV self size += +([\d.]+) MiB"), MiB, "total")
    assert_printed(d["kv_bytes"], printed(log, r"c\^KV \(q8_0\): +([\d.]+) MiB"), MiB, "latent")
    per_layer = d["kv_bytes"] // layers
    pad = (512 - (rank + rope) % 512) * 34 // 32  # ggml-cuda get_alloc_size: one q8_0 row of the missing elements
    buffers = [Decimal(x) for x in re.findall(r"CUDA\d KV buffer size = +([\d.]+) MiB", log)]
    for n_layers, buf in zip((13, 48), buffers):  # --tensor-split 1,4 over 61 layers
        assert_printed(n_layers * (per_layer + pad), buf, MiB, f"{n_layers}-layer buffer")


def test_llamacpp_lfm2_hybrid_kv_and_conv_state(engine_logs, tmp_path):
    """LFM2 (LFM2.5-Audio's language model): K/V on the 6 attention layers the per-layer n_head_kv marks, r rows
    ((L_cache - 1) x hidden, f32) on the 10 short-conv layers, no s rows. The config is the log's own metadata."""
    case = engine_logs["llamacpp-lfm2.5-audio-1.5b-lm-4k-cpu"]
    log = case["log"]
    heads = [int(x) for x in re.search(r"n_head_kv += \[([^\]]*)\]", log).group(1).split(",")]
    meta = lambda key: int(printed(log, rf"print_info: {key} += (\d+)"))  # noqa: E731
    cfg = write_config(tmp_path, "lfm2", {
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": 65536, "hidden_size": meta("n_embd"),
        "num_hidden_layers": meta("n_layer"), "num_attention_heads": meta("n_head"), "num_key_value_heads": max(heads),
        "conv_L_cache": int(printed(log, r"shortconv.l_cache u32 += (\d+)")), "conv_bias": False,
        "full_attn_idxs": [i for i, h in enumerate(heads) if h], "max_position_embeddings": meta("n_ctx_train"),
        "torch_dtype": "bfloat16"})
    assert meta("n_embd_head_k") == meta("n_embd") // meta("n_head")  # the head size kvplan derives
    d = kvjson("size", cfg, "--ctx", str(int(printed(log, r"n_ctx += (\d+)"))), "--engine", "llamacpp")
    attn = next(g for g in d["groups"] if g["kind"] == "full")
    conv = next(g for g in d["groups"] if g["kind"] == "conv_state")
    kv_line, rs_line = [ln for ln in log.splitlines() if ": size =" in ln]
    assert (attn["tokens"], attn["layers"]) == tuple(int(x) for x in re.search(r"\( *(\d+) cells, +(\d+) lay", kv_line).groups())
    assert_printed(attn["bytes"], printed(kv_line, r"size = +([\d.]+) MiB"), MiB, "llama_kv_cache size")
    assert_printed(tensor_bytes(d, "K"), printed(kv_line, r"K \(f16\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(kv_line, r"V \(f16\): +([\d.]+) MiB"), MiB, "V")
    assert_printed(conv["bytes"], printed(rs_line, r"size = +([\d.]+) MiB"), MiB, "llama_memory_recurrent size")
    assert_printed(tensor_bytes(d, "r"), printed(rs_line, r"R \(f32\): +([\d.]+) MiB"), MiB, "R")
    assert_printed(tensor_bytes(d, "s"), printed(rs_line, r"S \(f32\): +([\d.]+) MiB"), MiB, "S")


# ---------------------------------------------------------------------------------------------- SGLang, TRT-LLM
def test_sglang_qwen3_235b_tp4_k_and_v(engine_logs):
    case = engine_logs["sglang-qwen3-235b-a22b-fp8-4xh100-tp4"]
    log = case["log"]
    tokens = int(printed(log, r"#tokens: (\d+)"))
    d = kvjson("size", "qwen3-235b-a22b", "--ctx", str(tokens), "--engine", "sglang", "--tp", str(case["tp"]))
    assert_printed(tensor_bytes(d, "k_buffer"), printed(log, r"K size: ([\d.]+) GB"), GiB, "K size (SGLang GB = GiB)")
    assert_printed(tensor_bytes(d, "v_buffer"), printed(log, r"V size: ([\d.]+) GB"), GiB, "V size")


def test_trtllm_llama31_8b_fp8_bytes_per_token(engine_logs):
    case = engine_logs["trtllm-llama-3.1-8b-fp8-h100-fp8kv"]
    log = case["log"]
    tokens = int(printed(log, r"paged KV cache \((\d+)\)"))
    d = kvjson("size", "llama-3.1-8b", "--ctx", str(tokens), "--engine", "trtllm", "--kv-dtype", "fp8")
    assert_printed(d["kv_bytes_per_token"] * tokens, printed(log, r"Allocated ([\d.]+) GiB"), GiB, "Allocated")
    assert tokens % int(printed(log, r"tokens per block: (\d+)")) == 0


def test_trtllm_1_2_1_smollm2_both_fractions(engine_logs, tmp_path):
    """TensorRT-LLM 1.2.1 (the default rule set) on SmolLM2-135M: the pool's bytes at the printed token counts of
    both runs (fraction 0.9: the log; 0.25: the page's prose), one pool whose window is max_seq_len."""
    case = engine_logs["trtllm-1.2.1-smollm2-135m-rtx4070super-len2048"]
    f = case["config_facts"]
    path = write_config(tmp_path, "smollm2", llama_like(f["num_hidden_layers"], f["num_attention_heads"],
                                                        f["num_key_value_heads"], f["head_dim"]))
    log = case["log"]
    tokens = int(printed(log, r"paged KV cache \((\d+)\)"))
    d = kvjson("size", path, "--ctx", str(tokens), "--engine", "trtllm")
    assert d["engine"] == "trtllm@1.2"
    assert_printed(d["kv_bytes_per_token"] * tokens, printed(log, r"Allocated ([\d.]+) GiB"), GiB, "Allocated")
    run = case["other_runs"][0]
    assert_printed(d["kv_bytes_per_token"] * run["kv_tokens"], Decimal(str(run["kv_gib"])), GiB, "fraction 0.25")
    window = int(printed(log, r"\[window size=(\d+)\]"))
    per_seq = kvjson("size", path, "--ctx", str(window), "--engine", "trtllm")
    blocks = sum(g["tokens"] for g in per_seq["groups"]) // 32
    assert blocks == int(printed(log, r"blocks per sequence: (\d+)")) and window == int(printed(log, r"max sequence length=(\d+)"))


def test_trtllm_1_3_0rc7_kimi_k25_mla_latent_fp8(engine_logs):
    """A 1.3 pre-release on V1 (Kimi K2.5 opted in to V2 later): the MLA latent pool, kv_factor 1, fp8, per TP rank;
    Kimi K2.5's text model has DeepSeek-V3's 61 layers of 512 + 64."""
    case = engine_logs["trtllm-1.3.0rc7-kimi-k2.5-nvfp4-8xb300-tp8-fp8kv"]
    log = case["log"]
    tokens = int(printed(log, r"paged KV cache \((\d+)\)"))
    d = kvjson("size", "deepseek-v3", "--ctx", str(tokens), "--engine", "trtllm@1.3.0rc7", "--kv-dtype", "fp8",
               "--tp", str(case["tp"]))
    f = case["config_facts"]
    assert d["kv_bytes_per_token"] == f["num_hidden_layers"] * (f["kv_lora_rank"] + f["qk_rope_head_dim"])
    assert_printed(d["kv_bytes_per_token"] * tokens, printed(log, r"Allocated ([\d.]+) GiB"), GiB, "Allocated")
    window = int(printed(log, r"\[window size=(\d+)\]"))
    per_seq = kvjson("size", "deepseek-v3", "--ctx", str(window), "--engine", "trtllm@1.3.0rc7", "--kv-dtype", "fp8")
    assert [g["tokens"] // 32 for g in per_seq["groups"]] == [int(printed(log, r"blocks per sequence: (\d+)"))]


# ---------------------------------------------------------------------------------------------- vLLM
AVAIL = r"Available KV cache memory:\**\s*([\d.]+) GiB"


def _vllm_blocks_consistent(bytes_per_block: int, avail: Decimal, blocks: int) -> bool:
    """Some available memory inside the printed interval yields exactly `blocks` = floor(avail / bytes_per_block)."""
    lo, hi = interval(avail, GiB)
    return max(lo, Decimal(blocks * bytes_per_block)) < min(hi, Decimal((blocks + 1) * bytes_per_block))


@pytest.mark.parametrize("case_id,model,args", [
    ("vllm-qwen2-7b-a100-80gb-tp1-gmu0.25", "qwen2", ()),
    ("vllm-qwen2-7b-2xa100-80gb-tp2-gmu0.25", "qwen2", ("--tp", "2")),
    ("vllm-qwen3-14b-1gpu", "qwen3-14b", ()),
    ("vllm-mistral-small-3.2-24b-h100-block128", "mistral-small", ("--block-size", "128")),
    ("vllm-gpt-oss-120b-4xa100-80gb-tp4-gmu0.8", "gpt-oss-120b", ("--tp", "4")),
    ("vllm-deepseek-v2-lite-tp2-pp2-4xl4-mla", "deepseek-v2-lite", ("--tp", "2", "--pp", "2")),
])
def test_vllm_bytes_per_block_reproduces_block_count(engine_logs, tmp_path, case_id, model, args):
    case = engine_logs[case_id]
    log = case["log"]
    facts = case["config_facts"]
    if model in ("qwen2", "qwen3-14b", "mistral-small"):
        model = write_config(tmp_path, model, llama_like(facts["num_hidden_layers"], facts.get("num_attention_heads", 32),
                                                        facts["num_key_value_heads"], facts["head_dim"]))
    ctx = case["max_model_len"]
    d = kvjson("size", model, "--ctx", str(ctx), "--engine", "vllm@0.10.1.1", *args)
    per_block = d["engine_details"]["bytes_per_block"]
    avail = printed(log, AVAIL, -1 if "pp" in case_id else 0)
    m = re.search(r"num_gpu_blocks is: (\d+)", log)
    if m:
        blocks = int(m.group(1))
    elif "blocks x" in log:
        blocks = int(printed(log, r"\(([\d,]+) blocks x"))
    else:  # tokens = blocks x block size for single-group models
        blocks = int(printed(log, r"GPU KV cache size: ([\d,]+) tokens")) // d["engine_details"]["block_size"]
    if "pp" in case_id:  # the engine takes the min over workers: the stage printing the larger budget holds fewer layers
        avail = printed(log, AVAIL, 2)
    assert _vllm_blocks_consistent(per_block, avail, blocks), (per_block, avail, blocks)


def test_vllm_v0_llama31_8b_blocks(engine_logs):
    case = engine_logs["vllm-v0-llama-3.1-8b-rtx3090-len20000"]
    log = case["log"]
    d = kvjson("size", "llama-3.1-8b", "--ctx", str(case["max_model_len"]), "--engine", "vllm@0.10")
    assert _vllm_blocks_consistent(d["engine_details"]["bytes_per_block"], printed(log, r"kv_cache_size=([\d.]+)GiB"),
                                   int(printed(log, r"GPU blocks: (\d+)")))

