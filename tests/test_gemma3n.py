"""Gemma-3n (model_type gemma3n / gemma3n_text), checked against the code that runs it.

No genuine google/gemma-3n-E2B/E4B config.json was found with the search tools (tests/data/wild-configs/SOURCES.yaml
lists the search under `missing:`), so the configs here are Gemma3nForCausalLM text configs written for the test
(tests/oracle_vllm.py `_gemma3n`: the E2B/E4B 4 sliding : 1 full pattern, the last layers reusing KV) and
transformers' own Gemma3nTextConfig defaults. Oracles:

- parameters: transformers' Gemma3nForCausalLM built on the meta device (tests/oracle_hf.py);
- `--engine hf`: transformers' cache after a real CPU forward, beyond the 512-token window;
- `--engine vllm`: vLLM 0.32's CPU build on the same files (tokens, blocks, concurrency it printed, recorded below;
  tests/test_engine_vllm.py -k gemma-3n reruns vLLM live);
- `--engine llamacpp`: a scaled gemma3n GGUF run by llama.cpp b11434 (tests/oracle_llamacpp.py cases gemma3n-*,
  recorded in tests/data/llamacpp-oracle/b11434.json); from a config.json, b11434's fixed 20 KV layers;
- `--engine sglang`: SGLang 0.5.10's rule read in its source (a K/V buffer for every layer), arithmetic below;
- TensorRT-LLM has no Gemma-3n model: refused.
"""

from __future__ import annotations

import json

import pytest

import oracle_hf as oracle
from conftest import kvjson, run_cli, vllm_cpu_fit
from kvplan.architectures import normalize
from kvplan.engines import llamacpp
from oracle_vllm import MODELS, _gemma3n

BF16 = 2
SCALED = ("gemma-3n-e2b", "gemma-3n-e4b", "gemma-3n-noshare", "gemma-3n-crossed")


def _write(tmp_path, name: str, config: dict) -> str:
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(config))
    return str(p)


def _scaled(name: str) -> dict:
    return json.loads(json.dumps(MODELS[name].raw))


def _defaults() -> dict:
    from transformers import Gemma3nTextConfig

    return {**Gemma3nTextConfig().to_dict(), "architectures": ["Gemma3nForCausalLM"], "torch_dtype": "bfloat16"}


# ---------------------------------------------------------------------------------------------- transformers
@pytest.mark.slow
@pytest.mark.parametrize("name", SCALED)
def test_params_equal_transformers_meta(tmp_path, name):
    """Every parameter Gemma3nForCausalLM builds: no k/v projections or k_norm on the KV-shared layers, per-layer
    FFN widths, AltUp, LAuReL, the per-layer input table and its projection; tied lm_head."""
    config = _scaled(name)
    d = kvjson("size", _write(tmp_path, name, config), "--engine", "hf", "--ctx", "64")
    assert d["params"] == oracle.hf_param_counts(config)["params"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCALED)
def test_hf_cache_equals_a_real_forward(tmp_path, name):
    """DynamicCache after a CPU forward of [2, ctx]: sliding layers keep window - 1 tokens, full layers all of them,
    the shared layers nothing (transformers' config.kv_sharing_modes 'reuse')."""
    config = _scaled(name)
    path = _write(tmp_path, name, config)
    for ctx in (16, 600):
        truth = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="float16", device="cpu")
        d = kvjson("size", path, "--engine", "hf", "--kv-dtype", "fp16", "--ctx", str(ctx), "--batch", "2")
        assert d["kv_bytes"] == truth["total"], f"ctx {ctx}: kvplan {d['kv_bytes']:,} vs transformers {truth['total']:,}"


def test_layer_pattern_and_producers_from_the_config(tmp_path):
    """gemma-3n-e2b: 10 layers, full iff (i+1) % 5 == 0, the last 5 shared -> own 0-3 sliding + 4 full; the shared
    sliding layers 5-8 reuse layer 3, the full layer 9 reuses layer 4 (the last earlier layer of their kind). The
    crossed layout s s s s f s | s f: layer 6 reuses 5 and layer 7 reuses 4 in transformers."""
    d = kvjson("size", _write(tmp_path, "e2b", _scaled("gemma-3n-e2b")), "--engine", "hf", "--ctx", "64")
    kinds = {g["kind"]: g["layer_ids"] for g in d["groups"] if g["kind"] != "shared"}
    assert kinds == {"sliding": [0, 1, 2, 3], "full": [4]}
    assert [(i, c.target) for i, c in normalize(_scaled("gemma-3n-e2b")).caches if c.kind == "shared"] == [
        (5, 3), (6, 3), (7, 3), (8, 3), (9, 4)]
    assert [(i, c.target) for i, c in normalize(_scaled("gemma-3n-crossed")).caches if c.kind == "shared"] == [
        (6, 5), (7, 4)]


def test_class_defaults_fill_missing_fields(tmp_path):
    """A config that states only the widths: Gemma3nTextConfig's defaults (35 layers of which the last 15 share KV,
    window 512, 8 heads / 2 KV x 256) decide the cache, as transformers builds it."""
    full = _defaults()
    slim = {k: full[k] for k in ("architectures", "model_type", "hidden_size", "num_attention_heads", "vocab_size",
                                 "num_hidden_layers", "torch_dtype")}
    d = kvjson("size", _write(tmp_path, "slim", slim), "--engine", "hf", "--ctx", "1000")
    # 16 sliding layers hold 511 tokens, 4 full layers 1000; 2 KV heads x 256 x K,V x 2 B
    assert d["kv_bytes"] == (16 * 511 + 4 * 1000) * 2 * 256 * 2 * BF16
    assert d["params"] == oracle.hf_param_counts(full)["params"]


# ---------------------------------------------------------------------------------------------- vLLM 0.32
# vLLM 0.32.0 CPU build (tests/oracle_vllm.py, VLLM_CPU_KVCACHE_SPACE=1, max_model_len 4096, 4096 batched tokens,
# dummy weights): tokens, num_gpu_blocks, printed concurrency, bytes per block, blocks per request
VLLM_032_CPU = {
    ("gemma-3n-e2b", 128): (102300, 4096, "24.98", 262_144, 164),  # 4 sliding + 1 full groups of 1 layer
    ("gemma-3n-e2b", 32): (104206, 16384, "25.44", 65_536, 644),
    ("gemma-3n-e4b", 128): (204600, 8192, "49.95", 131_072, 164),  # 5 groups of 2 layers, 1 x 128
    ("gemma-3n-noshare", 128): (51150, 2048, "12.49", 524_288, 164),  # twice e2b's layers: half the tokens
    ("gemma-3n-crossed", 128): (85163, 4096, "20.79", 262_144, 197),  # 5 sliding + 1 full own a cache
}


@pytest.mark.parametrize("name, block", sorted(VLLM_032_CPU))
def test_vllm_layout_equals_vllm_032_cpu(tmp_path, name, block):
    """What vLLM decided for the same file: KV-shared layers register no spec (kv_sharing_target_layer_name), so the
    groups, the page per block and the blocks per request come from the other layers only."""
    tokens, blocks, concurrency, per_block, per_request = VLLM_032_CPU[(name, block)]
    r = vllm_cpu_fit(_write(tmp_path, name, _scaled(name)), block)
    d = r["engine_details"]
    assert (r["kv_capacity_tokens"], d["num_gpu_blocks"], f"{r['concurrency']:.2f}") == (tokens, blocks, concurrency)
    assert (d["bytes_per_block"], d["blocks_per_request"]) == (per_block, per_request)


def test_vllm_page_is_the_owned_layers_only(tmp_path):
    """The vLLM page of gemma-3n-e2b from the config, written out: 5 owned layers, 2 KV heads x 256 x K,V x 2 B per
    token per layer; each of vLLM's 5 groups (one layer each) has a 128-token page of 262,144 B."""
    r = vllm_cpu_fit(_write(tmp_path, "e2b", _scaled("gemma-3n-e2b")), 128)
    assert r["engine_details"]["bytes_per_block"] == 1 * 128 * 2 * 256 * 2 * BF16
    d = kvjson("size", _write(tmp_path, "e2b2", _scaled("gemma-3n-e2b")), "--engine", "vllm", "--ctx", "4096")
    assert d["kv_bytes_per_token"] == 5 * 2 * 256 * 2 * BF16


def test_vllm_refusals(tmp_path):
    """vLLM 0.32's Gemma-3n classes do not implement SupportsPP; a shared sliding layer whose fixed target
    first_shared - 2 is below 0 has no target (its forward passes no K/V): one line, exit 2."""
    path = _write(tmp_path, "e2b", _scaled("gemma-3n-e2b"))
    r = run_cli("size", path, "--engine", "vllm", "--pp", "2")
    assert r.code == 2 and r.err.count("\n") == 1 and "SupportsPP" in r.err
    one = {**_gemma3n(4, 3, 8, 2, 256, 512), "layer_types": ["sliding_attention"] * 4}
    r = run_cli("size", _write(tmp_path, "one", one), "--engine", "vllm")
    assert r.code == 2 and r.err.count("\n") == 1 and "at layer -1" in r.err
    assert run_cli("size", _write(tmp_path, "one2", one), "--engine", "hf").code == 0  # transformers runs it


# ---------------------------------------------------------------------------------------------- SGLang 0.5.10
def test_sglang_pool_has_every_layer(tmp_path):
    """models/gemma3n_causal.py: the shared layers' RadixAttention reads layer first_shared - 1 / - 2 and saves no
    K/V, but ModelRunner sizes the token pool for num_hidden_layers layers (get_cell_size_per_token) and hybrid-SWA
    memory is off for Gemma-3n (server_args.py): 10 layers x 2 KV heads x 256 x K,V x 2 B, full length."""
    path = _write(tmp_path, "e2b", _scaled("gemma-3n-e2b"))
    d = kvjson("size", path, "--engine", "sglang", "--ctx", "4096")
    assert d["kv_bytes_per_token"] == 10 * 2 * 256 * 2 * BF16
    assert d["kv_bytes"] == 10 * (4096 + 1) * 2 * 256 * 2 * BF16  # one page of padding rows (page 1)
    assert any("write no K/V but keep their buffers" in a and "1,312,000 parameters" in a for a in d["assumptions"])
    r = run_cli("size", path, "--engine", "sglang", "--pp", "2")
    assert r.code == 2 and r.err.count("\n") == 1 and "pipeline stages" in r.err


# ---------------------------------------------------------------------------------------------- llama.cpp b11434
@pytest.mark.parametrize("layers, shared, owned", [(10, 5, 10), (30, 10, 20), (35, 15, 20), (25, 5, 20), (40, 10, 20)])
def test_llamacpp_keeps_kv_on_the_first_20_layers(tmp_path, layers, shared, owned):
    """src/models/gemma3n.cpp: n_layer_kv_from_start = 20 whatever num_kv_shared_layers says (E2B 30/10 and E4B
    35/15 agree with transformers; 10 layers share nothing, 40/10 keeps 20 not 30)."""
    path = _write(tmp_path, f"l{layers}", _gemma3n(layers, shared, 8, 2, 256, 512))
    d = kvjson("size", path, "--engine", "llamacpp", "--ctx", "4096")
    kept = [i for g in d["groups"] if g["kind"] != "shared" for i in g["layer_ids"]]
    assert sorted(kept) == list(range(owned))
    spec = llamacpp.models.gemma3n_layers(normalize(_gemma3n(layers, shared, 8, 2, 256, 512)))
    kinds = ["full" if (i + 1) % 5 == 0 else "sliding" for i in range(layers)]
    assert [(i, c.target) for i, c in spec.caches if c.kind == "shared"] == [
        (i, 18 if kinds[i] == "sliding" else 19) for i in range(20, layers)]


def test_llamacpp_gguf_matches_the_recorded_run(tmp_path):
    """The scaled gemma3n GGUF (25 layers, shared_kv_layers 5) as llama.cpp b11434 printed it (tests/data/
    llamacpp-oracle/b11434.json): 4 full layers of 4096 cells and 16 SWA layers of 1024, 32.00 MiB each."""
    import oracle_llamacpp as ol

    rec = json.loads((ol.DATA / "b11434.json").read_text())["cases"]["gemma3n-c4096"]
    assert rec["kv"] == ["llama_kv_cache: size =   32.00 MiB (  4096 cells,   4 layers,  1/1 seqs), K (f16):   16.00 MiB, "
                         "V (f16):   16.00 MiB",
                         "llama_kv_cache: size =   32.00 MiB (  1024 cells,  16 layers,  1/1 seqs), K (f16):   16.00 MiB, "
                         "V (f16):   16.00 MiB"]
    gguf = ol.write_model("gemma3n", tmp_path)
    d = kvjson("size", str(gguf), "--engine", "llamacpp@b11434", "--ctx", "4096")
    assert d["kv_bytes"] == (4 * 4096 + 16 * 1024) * 2 * 256 * 2 * 2  # f16 K and V, 2 KV heads x 256


# ---------------------------------------------------------------------------------------------- TensorRT-LLM, input
def test_trtllm_refuses(tmp_path):
    r = run_cli("size", _write(tmp_path, "e2b", _scaled("gemma-3n-e2b")), "--engine", "trtllm")
    assert r.code == 2 and r.err.count("\n") == 1 and "no Gemma-3n model" in r.err


@pytest.mark.parametrize("change, text", [
    ({"num_kv_shared_layers": 11}, "exceeds num_hidden_layers"),
    ({"num_kv_shared_layers": 6}, "has no earlier full layer"),
    ({"intermediate_size": [64] * 9}, "9 values for 10 layers"),
    ({"layer_types": ["chunked_attention"] * 10}, "full or sliding"),
])
def test_bad_configs_are_one_line(tmp_path, change, text):
    r = run_cli("size", _write(tmp_path, "bad", {**_scaled("gemma-3n-e2b"), **change}))
    assert r.code == 2 and r.err.count("\n") == 1 and text in r.err, r.err


# ---------------------------------------------------------------------------------------------- a log from the wild
# ggml-org/llama.cpp issue 14604 ("Eval bug: Gemma 3n incoherent with HIP when prompt length > ubatch", 2025-07, a
# llama.cpp build of that month, gemma-3n-E4B GGUF, f16 cache), lines of its log as the issue shows them (the
# excerpt the search index holds stops inside the size line; its locale prints a decimal comma). Not in
# tests/data/engine-logs.yaml: `kvplan explain` reads no decimal comma, and the excerpt has no SWA line.
ISSUE_14604 = """\
llama_kv_cache_unified: layer  19: dev = ROCm0
llama_kv_cache_unified: GEMMA3N: reuse layers [20, 34]
llama_kv_cache_unified: layer  24: reuse layer 19, isw = 0
llama_kv_cache_unified: layer  29: reuse layer 19, isw = 0
llama_kv_cache_unified: layer  34: reuse layer 19, isw = 0
llama_kv_cache_unified:      ROCm0 KV buffer size =   256,00 MiB
llama_kv_cache_unified: size =  256,00 MiB ( 32768 cells,   4 lay"""


def test_llamacpp_log_of_gemma3n_e4b(tmp_path):
    """E4B's shape (35 layers, the last 15 shared, 2 KV heads x 256; transformers' Gemma3nTextConfig defaults) at
    32768 cells: the non-SWA cache holds the 4 full layers 4, 9, 14, 19 (256.00 MiB as printed), layers 20-34
    reuse, the full ones layer 19."""
    import re

    spec = llamacpp.models.gemma3n_layers(normalize(_gemma3n(35, 15, 8, 2, 256, 512)))
    shared = {i: c.target for i, c in spec.caches if c.kind == "shared"}
    first, last = map(int, re.search(r"reuse layers \[(\d+), (\d+)\]", ISSUE_14604).groups())
    assert sorted(shared) == list(range(first, last + 1))
    for layer, target in re.findall(r"layer +(\d+): reuse layer (\d+)", ISSUE_14604):
        assert shared[int(layer)] == int(target)
    d = kvjson("size", _write(tmp_path, "e4b", _gemma3n(35, 15, 8, 2, 256, 512)), "--engine", "llamacpp@b5850",
               "--ctx", "32768", "--kv-dtype", "f16")
    full = next(g for g in d["groups"] if g["kind"] == "full")
    cells, layers = map(int, re.search(r"\( *(\d+) cells, +(\d+) lay", ISSUE_14604).groups())
    mib = float(re.search(r"size = +([\d,]+) MiB", ISSUE_14604).group(1).replace(",", "."))
    assert (full["tokens"], len(full["layer_ids"])) == (cells, layers)
    assert abs(full["bytes"] / 2**20 - mib) < 0.005
