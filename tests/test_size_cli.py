"""`kvplan size` as a user meets it: the contract's JSON keys, defaults and warnings, per-GPU semantics,
dtype resolution, and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest

from conftest import declined, kvjson, run_cli, write_config

SIZE_KEYS = ("schema", "model", "engine", "tp", "pp", "ctx", "batch", "kv_dtype", "kv_dtype_source", "model_max_ctx",
             "model_max_ctx_source", "kv_bytes", "kv_bytes_per_token", "params", "weight_bytes", "weight_source",
             "total_bytes", "assumptions", "groups")
GROUP_KEYS = ("kind", "layers", "layer_ids", "kv_heads", "head_dim_k", "head_dim_v", "window", "tokens", "dtype", "bytes")


def test_contract_keys_and_the_llama2_figures():
    d = kvjson("size", "llama-2-7b", "--ctx", "4096")
    assert all(k in d for k in SIZE_KEYS)
    assert all(k in g for g in d["groups"] for k in GROUP_KEYS)
    assert d["model"] == {"requested": "llama-2-7b", "id": "meta-llama/Llama-2-7b-hf", "source": "bundled",
                          "revision": None, "commit": None}
    assert (d["kv_bytes"], d["kv_bytes_per_token"], d["params"], d["weight_bytes"]) == (
        2_147_483_648, 524_288, 6_738_415_616, 13_476_831_232)
    assert d["total_bytes"] == d["kv_bytes"] + d["weight_bytes"] and d["engine"] == "vllm@0.33"


def test_ctx_defaults_to_model_max_and_above_it_warns():
    d = kvjson("size", "llama-3.1-8b")
    assert d["ctx"] == d["model_max_ctx"] == 131072 and any("model maximum" in a for a in d["assumptions"])
    over = kvjson("size", "llama-2-7b", "--ctx", "8k")
    assert over["ctx"] == 8192 and any("exceeds the model maximum" in w for w in over["warnings"])


def test_token_suffixes_are_binary():
    assert kvjson("size", "llama-3.1-8b", "--ctx", "32k")["ctx"] == 32768
    assert kvjson("size", "mamba-2.8b", "--ctx", "1M")["ctx"] == 1_048_576


def test_tp_reports_the_limiting_gpu_and_all_gpus():
    one = kvjson("size", "llama-3.1-70b", "--ctx", "8k")
    four = kvjson("size", "llama-3.1-70b", "--ctx", "8k", "--tp", "4")
    assert four["kv_bytes"] * 4 == four["kv_bytes_all_gpus"] == one["kv_bytes"]
    assert four["groups"][0]["kv_heads"] == 2 and four["params"] == one["params"]
    sixteen = kvjson("size", "llama-3.1-8b", "--ctx", "8k", "--tp", "16")  # 8 KV heads: replicated, 1 per GPU
    assert sixteen["groups"][0]["kv_heads"] == 1 and sixteen["kv_bytes_per_token"] == 16_384
    mla = kvjson("size", "deepseek-v3", "--ctx", "8k", "--tp", "8")  # MLA is never split by TP
    assert mla["kv_bytes"] == kvjson("size", "deepseek-v3", "--ctx", "8k")["kv_bytes"]


def test_pp_limiting_stage_holds_the_most_layers():
    d = kvjson("size", "deepseek-v3", "--ctx", "8k", "--pp", "4")  # 61 layers -> [15, 15, 16, 15]
    assert d["groups"][0]["layers"] == 16


def test_k_and_v_dtypes_apart():
    d = kvjson("size", "llama-3.1-8b", "--ctx", "8k", "--engine", "llamacpp", "--k-dtype", "q8_0", "--v-dtype", "f16")
    assert (d["k_dtype"], d["v_dtype"], d["kv_dtype"], d["kv_dtype_source"]) == ("q8_0", "fp16", "q8_0/fp16", "flag")


def test_auto_kv_dtype_follows_the_engine_and_checkpoint(tmp_path):
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
            "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
            "max_position_embeddings": 4096, "torch_dtype": "float32"}
    fp32 = write_config(tmp_path, "fp32", base)
    assert kvjson("size", fp32, "--ctx", "1k")["kv_dtype"] == "bf16"  # vLLM serves fp32 configs as bf16
    assert kvjson("size", fp32, "--ctx", "1k", "--engine", "hf")["kv_dtype"] == "fp32"  # transformers loads fp32
    assert kvjson("size", fp32, "--ctx", "1k", "--engine", "llamacpp")["kv_dtype"] == "fp16"
    scheme = {**base, "quantization_config": {"quant_method": "compressed-tensors",
                                              "kv_cache_scheme": {"type": "float", "num_bits": 8}}}
    q = write_config(tmp_path, "q", scheme)
    d = kvjson("size", q, "--ctx", "1k")
    assert (d["kv_dtype"], d["kv_dtype_source"]) == ("fp8_e4m3", "quantization_config")
    assert kvjson("size", q, "--ctx", "1k", "--engine", "llamacpp")["kv_dtype_source"] == "engine default"


@pytest.mark.parametrize("args,needle", [
    (["no-such-model"], "unknown model"),
    (["lama-2-7b"], "did you mean"),
    (["llama-2-7b", "--ctx", "0"], "--ctx"),
    (["llama-2-7b", "--ctx", "4.5k"], "--ctx"),
    (["llama-2-7b", "--batch", "-1"], "--batch"),
    (["llama-2-7b", "--kv-dtype", "fp7"], "unknown KV dtype"),
    (["llama-2-7b", "--kv-dtype", "q8_0"], "cannot store its KV cache as q8_0"),
    (["llama-2-7b", "--engine", "foo"], "unknown engine"),
    (["llama-2-7b", "--engine", "vllm@x.y"], "not a version"),
    (["llama-2-7b", "--weight-dtype", "int3"], "unknown weight dtype"),
    (["llama-2-7b", "--tp", "3"], "KV heads"),
    (["llama-2-7b", "--engine", "hf", "--tp", "2"], "one device"),
    (["llama-2-7b", "--engine", "llamacpp", "--tp", "2"], "--pp"),
    (["llama-2-7b", "--page-size", "4"], "does not apply to engine vllm"),
    (["llama-2-7b", "--encoder-len", "100"], "encoder-decoder"),
    (["llama-2-7b", "--bogus"], "No such option"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run_cli("size", *args)
    assert r.code == 2 and needle in r.err, (r.code, r.err)
    assert r.err.count("\n") == 1 and "Traceback" not in r.err and r.out == ""


def test_bad_config_files(tmp_path):
    (tmp_path / "broken.json").write_text('{"num_hidden_layers": 4')
    (tmp_path / "sparse.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4}')
    r = run_cli("size", str(tmp_path / "broken.json"))
    assert r.code == 2 and "not valid JSON (line" in r.err
    r = run_cli("size", str(tmp_path / "sparse.json"))
    assert r.code == 2 and "hidden_size" in r.err and "num_attention_heads" in r.err and "vocab_size" in r.err


def test_every_bundled_model_sizes_on_every_engine():
    from kvplan import catalog

    for m in catalog.bundled_models():
        for engine in ("vllm", "sglang", "llamacpp", "trtllm", "hf"):
            r = run_cli("size", m.repo_id, "--ctx", "2k", "--engine", engine, "--json")
            if declined(m.repo_id, engine):  # the engine's own row says why, in one line
                assert r.code == 2 and r.err.count("\n") == 1 and declined(m.repo_id, engine) in r.err
                continue
            assert r.code == 0, (m.repo_id, engine, r.err)
            assert json.loads(r.out)["kv_bytes"] > 0


def test_fp32_weights_are_four_bytes_each():
    """`--weight-dtype fp32` counted 2 B a parameter before stop 23. vLLM with --dtype float32 on Llama-3.1-8B-Instruct
    (tests/data/wild-logs.yaml, vllm-llama-3.1-8b-instruct-h100-80gb-tp1-len8192-dtf32) printed "Model loading took
    29.98 GiB": the fp32 weights plus its RoPE cos/sin cache (131,072 positions x 128 x 4 B, also fp32)."""
    d = kvjson("size", "llama-3.1-8b", "--weight-dtype", "fp32")
    assert d["weight_dtype"] == "fp32" and d["weight_bytes"] == 4 * d["params"]
    assert round((d["weight_bytes"] + 131_072 * 128 * 4) / 2**30, 2) == 29.98
