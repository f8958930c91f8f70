"""GGUF models as input (issue #7): header -> ModelSpec, exact stored weight bytes, quant mix, mmproj, remote
headers by HTTP range requests, bad input.

Every file is written here with the `gguf` package's GGUFWriter: the metadata of real models (layer counts, head
arrays, MLA and SWA keys) with a handful of tiny tensors of several ggml types. The expected weight bytes come from
the gguf package's own reader (GGUFReader), never from kvplan.
"""

from __future__ import annotations

import re
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import quantize  # noqa: E402

import hubserver  # noqa: E402
from conftest import ROOT, kvjson, run_cli, write_gguf_file  # noqa: E402
from hubserver import FakeHub  # noqa: E402
from test_engine_logs import MiB, assert_printed, printed, tensor_bytes  # noqa: E402

from kvplan.architectures import gguf_spec, normalize  # noqa: E402
from kvplan.gguf import read_header_from_path  # noqa: E402
from kvplan.resolve import read_config_file  # noqa: E402
from kvplan.spec import FullAttention, LatentAttention, NoCache, SlidingWindow  # noqa: E402

fake_hub = hubserver.fake_hub
RNG = np.random.default_rng(7)


# ---------------------------------------------------------------------------------------------- writing GGUFs
def tiny_tensors(layers: int = 1) -> list[tuple[str, np.ndarray, Q | None]]:
    """Real tensor names, tiny shapes, seven ggml types (quantized ones as uint8 byte arrays)."""
    f = RNG.standard_normal((4, 256)).astype(np.float32)
    out: list[tuple[str, np.ndarray, Q | None]] = [("token_embd.weight", RNG.standard_normal((8, 64)).astype(np.float16), None)]
    for i in range(layers):
        out += [
            (f"blk.{i}.attn_norm.weight", np.ones(64, dtype=np.float32), None),
            (f"blk.{i}.attn_q.weight", quantize(f, Q.Q8_0), Q.Q8_0),
            (f"blk.{i}.attn_k.weight", quantize(f, Q.Q4_0), Q.Q4_0),
            (f"blk.{i}.ffn_up.weight", RNG.integers(0, 256, (16, 144 * 2), dtype=np.uint8), Q.Q4_K),
            (f"blk.{i}.ffn_down.weight", RNG.integers(0, 256, (8, 210), dtype=np.uint8), Q.Q6_K),
        ]
    out.append(("output.weight", quantize(f, Q.BF16), Q.BF16))
    return out


def write_gguf(path: Path, arch: str, kv: dict[str, Any], tensors=None, **writer: Any) -> Path:
    return write_gguf_file(path, arch, kv, tensors if tensors is not None else tiny_tensors(), **writer)


def written(*paths: Path) -> tuple[int, int]:
    """(bytes, elements) of every tensor in the files, as the gguf package reads them."""
    tensors = [t for p in paths for t in GGUFReader(p).tensors]
    return sum(int(t.n_bytes) for t in tensors), sum(int(t.n_elements) for t in tensors)


def bundled(name: str):
    return normalize(read_config_file(ROOT / "model_configs" / name / "config.json"))


def kv_layout(spec) -> tuple:
    return spec.num_layers, spec.caches, spec.max_ctx


LLAMA_8B = {
    "general.name": "Meta Llama 3.1 8B Instruct",
    "general.file_type": 15,  # MOSTLY_Q4_K_M
    "llama.block_count": 32,
    "llama.context_length": 131072,
    "llama.embedding_length": 4096,
    "llama.feed_forward_length": 14336,
    "llama.attention.head_count": 32,
    "llama.attention.head_count_kv": 8,
    "llama.rope.freq_base": 500000.0,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "llama.vocab_size": 128256,
    "llama.rope.dimension_count": 128,
}
GEMMA3_4B = {
    "gemma3.block_count": 34,
    "gemma3.context_length": 131072,
    "gemma3.embedding_length": 2560,
    "gemma3.feed_forward_length": 10240,
    "gemma3.attention.head_count": 8,
    "gemma3.attention.head_count_kv": 4,
    "gemma3.attention.key_length": 256,
    "gemma3.attention.value_length": 256,
    "gemma3.attention.sliding_window": 1024,
}
DEEPSEEK_V3 = {  # what llama.cpp's MLA conversion (conversion/deepseek.py) writes
    "deepseek2.block_count": 61,
    "deepseek2.context_length": 163840,
    "deepseek2.embedding_length": 7168,
    "deepseek2.attention.head_count": 128,
    "deepseek2.attention.head_count_kv": 1,
    "deepseek2.attention.key_length": 576,
    "deepseek2.attention.value_length": 512,
    "deepseek2.attention.key_length_mla": 192,
    "deepseek2.attention.value_length_mla": 128,
    "deepseek2.attention.kv_lora_rank": 512,
    "deepseek2.attention.q_lora_rank": 1536,
    "deepseek2.rope.dimension_count": 64,
    "deepseek2.leading_dense_block_count": 3,
    "deepseek2.expert_count": 256,
    "deepseek2.expert_used_count": 8,
    "deepseek2.expert_feed_forward_length": 2048,
}


# ---------------------------------------------------------------------------------------------- spec = config spec
def test_llama31_8b_spec_and_exact_weights(tmp_path):
    path = write_gguf(tmp_path / "Llama-3.1-8B-Instruct-Q4_K_M.gguf", "llama", LLAMA_8B, tiny_tensors(2))
    spec = gguf_spec.from_header(read_header_from_path(path))
    assert kv_layout(spec) == kv_layout(bundled("meta-llama--Llama-3.1-8B"))
    assert spec.max_ctx_source == "GGUF llama.context_length" and spec.family == "decoder"
    assert spec.stored_format == "Q4_K_M" and not spec.tied_embeddings

    nbytes, n_elements = written(path)
    d = kvjson("size", str(path), "--engine", "llamacpp", "--ctx", "8192")
    assert (d["weight_bytes"], d["params"], d["weight_source"], d["weight_dtype"]) == (nbytes, n_elements, "gguf", "Q4_K_M")
    assert {m["type"] for m in d["quant_mix"]} == {"F16", "F32", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "BF16"}
    assert sum(m["bytes"] for m in d["quant_mix"]) == nbytes
    assert d["quant_mix"][0]["type"] == "Q4_K"  # largest first
    assert (d["model_max_ctx"], d["model"]["source"], d["model"]["id"]) == (131072, "file", None)
    same = kvjson("size", "llama-3.1-8b", "--engine", "llamacpp", "--ctx", "8192")
    assert d["kv_bytes"] == same["kv_bytes"] == 1024 * MiB  # engines.md §3.4
    assert any("Q4_K " in a and "%" in a for a in d["assumptions"])
    assert any("token_embd" in a and "host memory" in a for a in d["assumptions"])

    text = run_cli("size", str(path), "--engine", "llamacpp", "--ctx", "8k")
    assert text.code == 0 and "quant mix" in text.out and "Q4_K" in text.out
    vllm = kvjson("size", str(path), "--ctx", "8192")  # the default engine, allowed, with a note
    assert any("usually served by llama.cpp" in a for a in vllm["assumptions"])
    assert vllm["weight_bytes"] == nbytes


def test_directory_and_any_shard(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    write_gguf(d / "Model.gguf", "llama", LLAMA_8B, tiny_tensors(3), split_max_tensors=5)
    write_gguf(d / "mmproj-Model-F16.gguf", "clip", {}, [("v.patch_embd.weight", np.zeros((8, 32), np.float16), None)])
    shards = sorted(d.glob("Model-*-of-*.gguf"))
    assert len(shards) == 4
    nbytes, _ = written(*shards)
    for ref in (str(d), str(shards[0]), str(shards[2])):
        out = kvjson("size", ref, "--engine", "llamacpp", "--ctx", "4096")
        assert out["weight_bytes"] == nbytes and out["model"]["source"] == "file", ref
    write_gguf(d / "Other.gguf", "llama", LLAMA_8B)
    r = run_cli("size", str(d), "--engine", "llamacpp")
    assert r.code == 2 and "several GGUF models" in r.err


def test_gemma3_4b_swa_pattern(tmp_path):
    path = write_gguf(tmp_path / "gemma-3-4b-it-Q4_0.gguf", "gemma3", GEMMA3_4B)
    spec = gguf_spec.from_header(read_header_from_path(path))
    assert kv_layout(spec) == kv_layout(bundled("google--gemma-3-4b-it"))
    full = [i for i, c in spec.caches if isinstance(c, FullAttention) and not isinstance(c, SlidingWindow)]
    assert full == [5, 11, 17, 23, 29] and spec.family == "gemma"
    # a scalar pattern overrides llama.cpp's default 6; a per-layer array gives each layer's flag (true = sliding)
    p4 = write_gguf(tmp_path / "p4.gguf", "gemma3", {**GEMMA3_4B, "gemma3.attention.sliding_window_pattern": 4})
    assert [i for i, c in gguf_spec.from_header(read_header_from_path(p4)).caches if c.kind == "full"] == list(range(3, 34, 4))
    flags = [i % 3 != 0 for i in range(34)]
    arr = write_gguf(tmp_path / "arr.gguf", "gemma3", {**GEMMA3_4B, "gemma3.attention.sliding_window_pattern": flags})
    assert [i for i, c in gguf_spec.from_header(read_header_from_path(arr)).caches if c.kind == "full"] == list(range(0, 34, 3))
    # newer llama.cpp: no window in the file, no sliding layers
    kv = {k: v for k, v in GEMMA3_4B.items() if k != "gemma3.attention.sliding_window"}
    nowin = write_gguf(tmp_path / "nowin.gguf", "gemma3", kv)
    assert {c.kind for _, c in gguf_spec.from_header(read_header_from_path(nowin)).caches} == {"full"}


def test_gemma2_and_gpt_oss_alternate(tmp_path):
    g2 = {"gemma2.block_count": 42, "gemma2.context_length": 8192, "gemma2.embedding_length": 3584,
          "gemma2.attention.head_count": 16, "gemma2.attention.head_count_kv": 8, "gemma2.attention.key_length": 256,
          "gemma2.attention.value_length": 256}  # no window key: llama.cpp's default 4096
    spec = gguf_spec.from_header(read_header_from_path(write_gguf(tmp_path / "g2.gguf", "gemma2", g2)))
    assert kv_layout(spec) == kv_layout(bundled("google--gemma-2-9b"))
    oss = {"gpt-oss.block_count": 36, "gpt-oss.context_length": 131072, "gpt-oss.embedding_length": 2880,
           "gpt-oss.attention.head_count": 64, "gpt-oss.attention.head_count_kv": 8, "gpt-oss.attention.key_length": 64,
           "gpt-oss.attention.value_length": 64, "gpt-oss.attention.sliding_window": 128}
    spec = gguf_spec.from_header(read_header_from_path(write_gguf(tmp_path / "oss.gguf", "gpt-oss", oss)))
    assert kv_layout(spec) == kv_layout(bundled("openai--gpt-oss-120b")) and spec.family == "gpt-oss"


def test_deepseek_v3_mla(tmp_path):
    path = write_gguf(tmp_path / "DeepSeek-V3-Q2_K.gguf", "deepseek2", DEEPSEEK_V3)
    spec = gguf_spec.from_header(read_header_from_path(path))
    config = bundled("deepseek-ai--DeepSeek-V3")
    assert kv_layout(spec) == kv_layout(config)
    assert spec.caches[0][1] == LatentAttention(512, 64, 128, 128, 128) and spec.family == "deepseek-mla"
    d = kvjson("size", str(path), "--engine", "llamacpp", "--ctx", "32768")
    assert d["kv_bytes"] == 576 * 2 * 32768 * 61  # engines.md §3.4: 2,196 MiB K, no V
    # converted before MLA (no *_mla keys): llama.cpp caches plain K/V with the file's heads and lengths
    old = {k: v for k, v in DEEPSEEK_V3.items() if "_mla" not in k}
    old.update({"deepseek2.attention.head_count_kv": 128, "deepseek2.attention.key_length": 192,
                "deepseek2.attention.value_length": 128})
    spec = gguf_spec.from_header(read_header_from_path(write_gguf(tmp_path / "old.gguf", "deepseek2", old)))
    assert {c for _, c in spec.caches} == {FullAttention(128, 192, 128)}


def test_hybrids_and_state_space(tmp_path):
    m = {"mamba.block_count": 64, "mamba.context_length": 1048576, "mamba.embedding_length": 2560,
         "mamba.ssm.conv_kernel": 4, "mamba.ssm.inner_size": 5120, "mamba.ssm.state_size": 16,
         "mamba.ssm.time_step_rank": 160}
    spec = gguf_spec.from_header(read_header_from_path(write_gguf(tmp_path / "m.gguf", "mamba", m)))
    assert kv_layout(spec) == kv_layout(bundled("state-spaces--mamba-2.8b-hf"))
    heads = [0 if i % 8 != 4 else 8 for i in range(32)]  # Jamba: attention where layer % 8 == 4
    j = {"jamba.block_count": 32, "jamba.context_length": 262144, "jamba.embedding_length": 4096,
         "jamba.attention.head_count": 32, "jamba.attention.head_count_kv": heads, "jamba.ssm.conv_kernel": 4,
         "jamba.ssm.inner_size": 8192, "jamba.ssm.state_size": 16, "jamba.ssm.time_step_rank": 256}
    spec = gguf_spec.from_header(read_header_from_path(write_gguf(tmp_path / "j.gguf", "jamba", j)))
    assert spec.caches == bundled("ai21labs--Jamba-v0.1").caches
    qn = {"qwen3next.block_count": 48, "qwen3next.context_length": 262144, "qwen3next.embedding_length": 2048,
          "qwen3next.attention.head_count": 16, "qwen3next.attention.head_count_kv": 2,
          "qwen3next.attention.key_length": 256, "qwen3next.attention.value_length": 256,
          "qwen3next.ssm.conv_kernel": 4, "qwen3next.ssm.state_size": 128, "qwen3next.ssm.group_count": 16,
          "qwen3next.ssm.time_step_rank": 32, "qwen3next.ssm.inner_size": 4096, "qwen3next.full_attention_interval": 4}
    spec = gguf_spec.from_header(read_header_from_path(write_gguf(tmp_path / "qn.gguf", "qwen3next", qn)))
    assert kv_layout(spec) == kv_layout(bundled("Qwen--Qwen3-Next-80B-A3B-Thinking"))
    r = run_cli("size", str(tmp_path / "m.gguf"), "--engine", "llamacpp", "--ctx", "4096", "--json")
    assert r.code == 0 and r.json()["model_max_ctx"] is None


def test_nemotron_ultra_per_layer_heads(engine_logs, tmp_path):
    case = engine_logs["ik-llama-3.1-nemotron-ultra-253b-kq8-vq4"]
    heads = [int(x) for x in re.search(r"n_head_kv += \[([^\]]*)\]", case["log"]).group(1).split(",")]
    path = write_gguf(tmp_path / "ultra.gguf", "deci", deci_kv(heads))
    spec = gguf_spec.from_header(read_header_from_path(path))
    assert [i for i, c in spec.caches if isinstance(c, NoCache)] == [i for i, h in enumerate(heads) if h == 0]
    blocks = [{"attention": {"n_heads_in_group": 128 // h} if h else {"no_op": True}, "ffn": {"ffn_mult": 1.0}}
              for h in heads]
    config = normalize({"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "hidden_size": 16384,
                        "num_attention_heads": 128, "head_dim": 128, "vocab_size": 128256, "block_configs": blocks,
                        "max_position_embeddings": 131072})
    assert kv_layout(spec) == kv_layout(config) and spec.family == "nemotron-nas"


def deci_kv(heads: list[int]) -> dict[str, Any]:
    return {"deci.block_count": len(heads), "deci.context_length": 131072, "deci.embedding_length": 16384,
            "deci.attention.head_count": [128 if h else 0 for h in heads], "deci.attention.head_count_kv": heads,
            "deci.attention.key_length": 128, "deci.attention.value_length": 128}


# ---------------------------------------------------------------------------------------------- engine logs
def meta_from_log(log: str) -> dict[str, Any]:
    """The GGUF facts llama.cpp printed (print_info / llm_load_print_meta): n_layer, n_head_kv, n_embd_head_k/v."""
    out = {}
    for key in ("n_layer", "n_head_kv", "n_embd_head_k", "n_embd_head_v"):
        m = re.search(rf"\b{key} += (\[[^\]]*\]|\d+)", log)
        if m:
            v = m.group(1)
            out[key] = [int(x) for x in v.strip("[]").split(",")] if v.startswith("[") else int(v)
    return out


def gguf_from_log(tmp_path: Path, arch: str, log: str, heads: int, **extra: Any) -> str:
    m = meta_from_log(log)
    kv = {f"{arch}.block_count": m["n_layer"], f"{arch}.context_length": 131072,
          f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": m["n_head_kv"],
          f"{arch}.attention.key_length": m["n_embd_head_k"],
          f"{arch}.attention.value_length": m.get("n_embd_head_v", m["n_embd_head_k"]),
          f"{arch}.embedding_length": heads * m["n_embd_head_k"], **extra}
    return str(write_gguf(tmp_path / f"{arch}-{m['n_layer']}.gguf", arch, kv))


def test_log_llama_405b_rpc(engine_logs, tmp_path):
    case = engine_logs["llamacpp-llama-3.1-405b-q4_0-rpc-3x-c8g"]
    log = case["log"]
    d = kvjson("size", gguf_from_log(tmp_path, "llama", log, 128), "--ctx", str(case["n_ctx"]), "--engine", "llamacpp@b5935")
    assert_printed(d["kv_bytes"], printed(log, r"\bsize = +([\d.]+) MiB \("), MiB, "size")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(f16\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(log, r"V \(f16\): +([\d.]+) MiB"), MiB, "V")
    assert_printed(d["kv_bytes"], sum(Decimal(x) for x in re.findall(r"KV buffer size = +([\d.]+) MiB", log)), MiB, "buffers")
    assert d["engine_details"]["cells"] == int(printed(log, r"\( *(\d+) cells"))


def test_log_llama31_8b_vulkan(engine_logs, tmp_path):
    case = engine_logs["llamacpp-llama-3.1-8b-vulkan-rtx4080"]
    log = case["log"]
    path = gguf_from_log(tmp_path, "llama", log, 32)
    d = kvjson("size", path, "--ctx", str(case["n_ctx"]), "--engine", "llamacpp@b5781")
    assert_printed(d["kv_bytes"], printed(log, r"\bsize = +([\d.]+) MiB \("), MiB, "size")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(f16\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(d["kv_bytes"], printed(log, r"Vulkan0 KV buffer size = +([\d.]+) MiB"), MiB, "buffer")
    assert kv_layout(gguf_spec.from_header(read_header_from_path(path)))[:2] == kv_layout(bundled("meta-llama--Llama-3.1-8B"))[:2]


def test_log_deepseek_v3_mla(engine_logs, tmp_path):
    case = engine_logs["llamacpp-deepseek-v3-0324-mla-mainline-k576-v512"]
    log, f = case["log"], case["config_facts"]
    m = meta_from_log(log)
    rope = m["n_embd_head_k"] - f["kv_lora_rank"]
    assert rope == f["qk_rope_head_dim"]
    kv = {**DEEPSEEK_V3, "deepseek2.block_count": m["n_layer"], "deepseek2.attention.head_count_kv": m["n_head_kv"],
          "deepseek2.attention.key_length": m["n_embd_head_k"], "deepseek2.attention.value_length": m["n_embd_head_v"],
          "deepseek2.attention.kv_lora_rank": f["kv_lora_rank"], "deepseek2.rope.dimension_count": rope}
    path = str(write_gguf(tmp_path / "ds.gguf", "deepseek2", kv))
    d = kvjson("size", path, "--ctx", str(case["n_ctx"]), "--engine", "llamacpp@b5331")
    assert_printed(d["kv_bytes"], printed(log, r"KV self size += +([\d.]+) MiB"), MiB, "KV self size")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(f16\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(log, r"V \(f16\): +([\d.]+) MiB"), MiB, "V")
    buffers = [Decimal(x) for x in re.findall(r"CUDA\d KV buffer size = +([\d.]+) MiB", log)]
    assert_printed(d["kv_bytes"], sum(buffers), MiB, "sum of device buffers")
    latest = kvjson("size", path, "--ctx", str(case["n_ctx"]), "--engine", "llamacpp")
    assert_printed(latest["kv_bytes"], printed(log, r"mla_attn += 0\n.*KV self size += +([\d.]+) MiB"), MiB, "latent")


@pytest.mark.parametrize("run,dtype,pattern_k", [("A", "fp16", r"K \(f16\): +([\d.]+) MiB"),
                                                 ("B", "q8_0", r"K \(q8_0\): +([\d.]+) MiB")])
def test_log_glm_z1(engine_logs, tmp_path, run, dtype, pattern_k):
    case = engine_logs["llamacpp-glm-z1-32b-0414-2kvheads"]
    log = case["log"]
    ctx = [int(x) for x in re.findall(r"-c (\d+)", log)][0 if run == "A" else 1]
    d = kvjson("size", gguf_from_log(tmp_path, "glm4", log, 48), "--ctx", str(ctx), "--engine", "llamacpp@b5192",
               "--kv-dtype", dtype)
    assert_printed(d["kv_bytes"], printed(log, r"KV self size += +([\d.]+) MiB", 0 if run == "A" else 1), MiB, "total")
    assert_printed(tensor_bytes(d, "K"), printed(log, pattern_k), MiB, "K")


def test_log_ollama_gemma3_4b(engine_logs, tmp_path):
    case = engine_logs["ollama-gemma3-4b-128k-swa-rtx5080"]
    f = case["config_facts"]
    kv = {**GEMMA3_4B, "gemma3.block_count": f["num_hidden_layers"], "gemma3.attention.head_count_kv": f["num_key_value_heads"],
          "gemma3.attention.key_length": f["head_dim"], "gemma3.attention.value_length": f["head_dim"],
          "gemma3.attention.sliding_window": f["sliding_window"]}
    path = str(write_gguf(tmp_path / "gemma3.gguf", "gemma3", kv))
    d = kvjson("size", path, "--ctx", str(case["n_ctx"]), "--engine", "llamacpp", "--kv-dtype", "f16")
    full, swa = [Decimal(x) for x in re.findall(r"KV buffer size = +([\d.]+) MiB", case["log"])]
    by_kind = {g["kind"]: g["bytes"] for g in d["groups"]}
    assert_printed(by_kind["full"], full, MiB, "non-SWA buffer")
    assert_printed(by_kind["sliding"], swa, MiB, "SWA buffer")


def test_log_ik_qwen3_235b(engine_logs, tmp_path):
    case = engine_logs["ik-qwen3-235b-a22b-kq8-vf16-8k-cpu"]
    log = case["log"]
    path = gguf_from_log(tmp_path, "qwen3moe", log, 64)
    d = kvjson("size", path, "--ctx", str(case["n_ctx"]), "--engine", "llamacpp", "--k-dtype", "q8_0", "--v-dtype", "f16")
    assert_printed(d["kv_bytes"], printed(log, r"KV self size += +([\d.]+) MiB"), MiB, "total")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(q8_0\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(log, r"V \(f16\): +([\d.]+) MiB"), MiB, "V")
    assert gguf_spec.from_header(read_header_from_path(path)).caches == bundled("Qwen--Qwen3-235B-A22B").caches


def test_log_ik_llama2_13b(engine_logs, tmp_path):
    case = engine_logs["ik-llama-2-13b-mha-512"]
    path = gguf_from_log(tmp_path, "llama", case["log"], case["config_facts"]["num_attention_heads"])
    d = kvjson("size", path, "--ctx", str(case["n_ctx"]), "--engine", "llamacpp")
    assert_printed(d["kv_bytes"], printed(case["log"], r"KV self size += +([\d.]+) MiB"), MiB, "total")


def test_log_ik_nemotron_ultra(engine_logs, tmp_path):
    case = engine_logs["ik-llama-3.1-nemotron-ultra-253b-kq8-vq4"]
    log = case["log"]
    path = str(write_gguf(tmp_path / "ultra.gguf", "deci", deci_kv(meta_from_log(log)["n_head_kv"])))
    d = kvjson("size", path, "--ctx", re.search(r"-c (\d+)", log).group(1), "--engine", "llamacpp",
               "--k-dtype", "q8_0", "--v-dtype", "q4_0")
    assert d["engine_details"]["n_ctx"] == int(printed(log, r"n_ctx += (\d+)"))
    assert_printed(d["kv_bytes"], printed(log, r"KV self size += +([\d.]+) MiB"), MiB, "total")
    assert_printed(tensor_bytes(d, "K"), printed(log, r"K \(q8_0\): +([\d.]+) MiB"), MiB, "K")
    assert_printed(tensor_bytes(d, "V"), printed(log, r"V \(q4_0\): +([\d.]+) MiB"), MiB, "V")


# ---------------------------------------------------------------------------------------------- remote
def big_tensors() -> list[tuple[str, np.ndarray, Q | None]]:
    """tiny_tensors plus 4.25 MiB of Q8_0 data, so a full download would show."""
    return tiny_tensors() + [("blk.1.ffn_gate.weight", np.zeros((1024, 34 * 128), np.uint8), Q.Q8_0)]


def test_remote_header_by_range_requests(fake_hub: FakeHub, tmp_path):
    path = write_gguf(tmp_path / "Llama-Q4_K_M.gguf", "llama", LLAMA_8B, big_tensors())
    size = path.stat().st_size
    assert size > 4 << 20
    commit = fake_hub.add_repo("acme/Llama-GGUF", {"README.md": "x", "Q4_K_M/Llama-Q4_K_M.gguf": path.read_bytes()})
    ref = "acme/Llama-GGUF:Q4_K_M/Llama-Q4_K_M.gguf"
    d = kvjson("size", ref, "--engine", "llamacpp", "--ctx", "8192")
    assert d["model"] == {"requested": ref, "id": "acme/Llama-GGUF", "source": "hub", "revision": "main", "commit": commit}
    assert d["weight_bytes"] == written(path)[0] and d["kv_bytes"] == 1024 * MiB and d["weight_source"] == "gguf"
    gets = [e for e in fake_hub.requests_for("Llama-Q4_K_M.gguf") if e.method == "GET"]
    assert gets and all(e.range and e.status == 206 for e in gets)
    sent = sum(e.bytes_sent for e in gets)
    assert sent <= 1 << 20 and sent < size / 4  # one 1 MiB prefix holds this header; tensor data never fetched

    r = run_cli("size", "acme/Llama-GGUF:Q4_K_M/Other.gguf", "--engine", "llamacpp", "--ctx", "8192")
    assert r.code == 2 and "has no Q4_K_M/Other.gguf" in r.err and r.err.count("\n") == 1
    r = run_cli("size", ref, "--engine", "llamacpp", "--ctx", "8192", "--offline")
    assert r.code == 2 and "not in the Hugging Face cache" in r.err and "hf download" in r.err


def test_remote_cached_file_offline_and_gated(fake_hub: FakeHub, tmp_path):
    from huggingface_hub import hf_hub_download

    from kvplan import hub

    path = write_gguf(tmp_path / "M-Q8_0.gguf", "llama", LLAMA_8B)
    commit = fake_hub.add_repo("acme/M-GGUF", {"M-Q8_0.gguf": path.read_bytes()})
    hf_hub_download("acme/M-GGUF", "M-Q8_0.gguf", cache_dir=hub.hub_cache_dir(), endpoint=fake_hub.url)  # `hf download`
    before = len(fake_hub.log)
    d = kvjson("size", "acme/M-GGUF:M-Q8_0.gguf", "--engine", "llamacpp", "--ctx", "4096", "--offline")
    assert (d["model"]["source"], d["model"]["commit"], d["weight_bytes"]) == ("cache", commit, written(path)[0])
    assert len(fake_hub.log) == before  # served from the HF cache, no request
    fake_hub.add_repo("meta/Gated-GGUF", {"G.gguf": path.read_bytes()}, gated=True)
    r = run_cli("size", "meta/Gated-GGUF:G.gguf", "--engine", "llamacpp")
    assert r.code == 2 and "meta/Gated-GGUF is gated" in r.err and r.err.count("\n") == 1


def test_remote_split_model(fake_hub: FakeHub, tmp_path):
    write_gguf(tmp_path / "R1-Q2_K.gguf", "llama", LLAMA_8B, big_tensors(), split_max_tensors=3)
    shards = sorted(tmp_path.glob("R1-Q2_K-*-of-*.gguf"))
    assert len(shards) == 3
    fake_hub.add_repo("acme/R1-GGUF", {f"Q2_K/{p.name}": p.read_bytes() for p in shards})
    d = kvjson("size", f"acme/R1-GGUF:Q2_K/{shards[0].name}", "--engine", "llamacpp", "--ctx", "4096")
    assert d["weight_bytes"] == written(*shards)[0]
    gets = [e for e in fake_hub.log if e.method == "GET"]
    assert len({e.path for e in gets}) == 3 and all(e.range for e in gets)
    assert sum(e.bytes_sent for e in gets) < sum(p.stat().st_size for p in shards) / 2


# ---------------------------------------------------------------------------------------------- mmproj
def test_mmproj_adds_its_bytes(tmp_path):
    model = write_gguf(tmp_path / "gemma-3-4b-it-Q4_0.gguf", "gemma3", GEMMA3_4B)
    f = RNG.standard_normal((4, 256)).astype(np.float32)
    proj = write_gguf(tmp_path / "mmproj-gemma-3-4b-it-F16.gguf", "clip", {"clip.has_vision_encoder": True}, [
        ("v.patch_embd.weight", RNG.standard_normal((16, 64)).astype(np.float16), None),
        ("v.blk.0.attn_q.weight", quantize(f, Q.Q8_0), Q.Q8_0),
        ("mm.input_projection.weight", np.ones((8, 32), np.float32), None),
    ])
    plain = kvjson("size", str(model), "--engine", "llamacpp", "--ctx", "4096")
    both = kvjson("size", str(model), "--engine", "llamacpp", "--ctx", "4096", "--mmproj", str(proj))
    nbytes, n_elements = written(proj)
    assert both["mmproj_bytes"] == nbytes and "mmproj_bytes" not in plain
    assert both["weight_bytes"] - plain["weight_bytes"] == nbytes
    assert both["params"] - plain["params"] == n_elements == both["vision_params"]
    assert both["kv_bytes"] == plain["kv_bytes"]
    assert any("vision projector" in a for a in both["assumptions"])
    r = run_cli("size", "llama-3.1-8b", "--mmproj", str(proj))
    assert r.code == 2 and "--mmproj applies to a GGUF model" in r.err
    r = run_cli("size", str(proj), "--engine", "llamacpp")
    assert r.code == 2 and "projector (mmproj)" in r.err and "--mmproj" in r.err


# ---------------------------------------------------------------------------------------------- bad input
def one_line(r) -> str:
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1, (r.code, r.err)
    return r.err


def test_bad_input_one_line_exit_2(tmp_path):
    notgguf = tmp_path / "model.gguf"
    notgguf.write_text('{"model_type": "llama"}')
    assert "not a GGUF file" in one_line(run_cli("size", str(notgguf))) and "JSON" in run_cli("size", str(notgguf)).err

    good = write_gguf(tmp_path / "good.gguf", "llama", LLAMA_8B)
    data = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 3])
    assert "truncated GGUF" in one_line(run_cli("size", str(cut)))

    v99 = tmp_path / "v99.gguf"
    v99.write_bytes(data[:4] + struct.pack("<I", 99) + data[8:])
    assert "unsupported GGUF version 99" in one_line(run_cli("size", str(v99)))

    unknown = write_gguf(tmp_path / "foo.gguf", "foo", {"foo.block_count": 4})
    err = one_line(run_cli("size", str(unknown), "--engine", "llamacpp"))
    assert all(k in err for k in ("foo.context_length", "foo.attention.head_count", "foo.embedding_length"))
    assert "foo.block_count" not in err
    bare = write_gguf(tmp_path / "bare.gguf", "foo", {})
    assert "foo.block_count" in one_line(run_cli("size", str(bare)))
    ok = write_gguf(tmp_path / "foo-ok.gguf", "foo", {k.replace("llama.", "foo."): v for k, v in LLAMA_8B.items()})
    d = kvjson("size", str(ok), "--engine", "llamacpp", "--ctx", "8192")
    assert d["kv_bytes"] == 1024 * MiB and any("not in kvplan's table" in a for a in d["assumptions"])

    rwkv = write_gguf(tmp_path / "rwkv.gguf", "rwkv7", {"rwkv7.block_count": 24})
    assert "not modelled" in one_line(run_cli("size", str(rwkv)))
    assert "no such file" in one_line(run_cli("size", str(tmp_path / "missing.gguf")))
    assert "--weight-dtype does not apply" in one_line(run_cli("size", str(good), "--weight-dtype", "int4"))


def test_split_shards_must_all_be_there(tmp_path):
    write_gguf(tmp_path / "M.gguf", "llama", LLAMA_8B, tiny_tensors(2), split_max_tensors=4)
    shards = sorted(tmp_path.glob("M-*-of-*.gguf"))
    shards[-1].unlink()
    assert "missing shard" in one_line(run_cli("size", str(shards[1])))
    shards[0].unlink()
    assert "missing shard" in one_line(run_cli("size", str(shards[1])))
