"""The `--json` contract as JSON Schema (issue #14): kvplan/schemas/<command>.schema.json, draft 2020-12, one per
command, shipped inside the package. Every schema is itself valid; real outputs of the real CLI (run in-process)
validate against it, for every engine and the model kinds that shape the output (sliding window, MLA, hybrids,
cross attention, GGUF input, tp/pp, split K/V dtypes); and broken outputs are rejected, so these tests can fail.

The keys each schema requires are CONTRACTS.md's (each command's `--json` keys); other keys are typed
where kvplan emits them but stay optional, and additional properties are allowed ("add freely")."""

from __future__ import annotations

import copy
import json
import sys
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, ValidationError

import hubserver
from conftest import declined, run_cli, write_config, write_gguf_file
from kvplan import catalog

fake_hub = hubserver.fake_hub  # the fixture (isolated HF_HOME, a local fake Hub), under its name in this module

SCHEMA_NAMES = ("size", "fit", "check", "verify", "models", "gpus", "pull", "plan", "explain")
ENGINES = ("vllm", "sglang", "llamacpp", "trtllm", "hf")
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


@cache
def schema(name: str) -> dict[str, Any]:
    """Read from the installed package (kvplan/schemas/), where a wheel ships it."""
    return json.loads((files("kvplan") / "schemas" / f"{name}.schema.json").read_text(encoding="utf-8"))


def validate(name: str, data: Any) -> Any:
    Draft202012Validator(schema(name)).validate(data)
    return data


def errors(name: str, data: Any) -> list[ValidationError]:
    return list(Draft202012Validator(schema(name)).iter_errors(data))


def cli_json(*args: str, code: int = 0) -> Any:
    r = run_cli(*args)
    assert r.code == code, (args, r.code, r.err)
    return r.json()


@cache
def cached(*args: str) -> str:
    """Outputs the rejection tests mutate (a fresh copy each time through `real`)."""
    r = run_cli(*args)
    assert r.code in (0, 1), (args, r.err)
    return r.out


def real(*args: str) -> Any:
    return json.loads(cached(*args))


# ---------------------------------------------------------------------------------------------- the schemas themselves
def test_every_schema_is_a_valid_draft_2020_12_schema():
    folder = files("kvplan") / "schemas"
    shipped = sorted(p.name for p in folder.iterdir() if p.name.endswith(".schema.json"))
    assert shipped == sorted(f"{n}.schema.json" for n in SCHEMA_NAMES)
    for name in SCHEMA_NAMES:
        s = schema(name)
        assert s["$schema"] == DRAFT_2020_12, name
        Draft202012Validator.check_schema(s)
        assert s.get("additionalProperties", True) is True, name  # "add freely": never closed at the top


def test_plan_output_validates_and_broken_outputs_do_not():
    out = real("plan", "llama-3.1-8b", "--gpu", "H100", "--prompt", "100-300", "--output", "20-60", "-n", "50",
               "--users", "400", "--tpot", "20ms", "--json")
    validate("plan", out)
    assert schema("plan")["$defs"]["model"] == schema("fit")["$defs"]["model"]
    assert schema("plan")["$defs"]["gpu"] == schema("fit")["$defs"]["gpu"]
    for path, value in ((("run", "peak_running"), -1), (("pool", "kv_budget_source"), "guessed"), (("mode",), "steady"),
                        (("speed", "by_batch"), []), (("fleet", "gpus_per_instance"), 0)):
        broken = json.loads(json.dumps(out))
        node = broken
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        assert errors("plan", broken), path


def test_shared_definitions_are_the_same_in_every_file():
    """Each file is standalone (no cross-file $ref), so the objects the contract shares are copies: keep them equal."""
    model = schema("size")["$defs"]["model"]
    for name in ("fit", "check", "verify"):
        assert schema(name)["$defs"]["model"] == model, name
    assert schema("check")["$defs"]["fit_result"] == schema("fit")["$defs"]["fit_result"]  # figures = fit's entry
    assert schema("check")["$defs"]["gpu"] == schema("fit")["$defs"]["gpu"]
    assert schema("verify")["$defs"]["group_kind"] == schema("size")["$defs"]["group"]["properties"]["kind"]


def test_required_keys_are_the_contracts():
    """The contract's key lists, written out once more here: a schema that stops requiring one fails."""
    assert set(schema("size")["required"]) == {
        "schema", "model", "engine", "tp", "pp", "ctx", "batch", "kv_dtype", "kv_dtype_source", "model_max_ctx",
        "model_max_ctx_source", "kv_bytes", "kv_bytes_per_token", "params", "weight_bytes", "weight_source",
        "total_bytes", "assumptions", "groups"}
    assert set(schema("size")["$defs"]["group"]["required"]) == {
        "kind", "layers", "layer_ids", "kv_heads", "head_dim_k", "head_dim_v", "window", "tokens", "dtype", "bytes"}
    assert set(schema("size")["$defs"]["model"]["required"]) == {"requested", "id", "source", "revision", "commit"}
    assert set(schema("fit")["required"]) == {"schema", "gpu", "engine", "tp", "pp", "results"}
    assert set(schema("fit")["$defs"]["gpu"]["required"]) == {"name", "count", "total_bytes", "cuda_total_bytes",
                                                              "estimated"}
    assert set(schema("fit")["$defs"]["fit_result"]["required"]) == {
        "model", "ctx", "weight_bytes", "kv_budget_bytes", "kv_budget_source", "kv_capacity_tokens", "max_batch",
        "engine_batch_cap", "concurrency", "max_ctx", "fits", "engine_would_start"}
    check = schema("check")
    assert set(check["required"]) == {"schema", "passed", "deployments"}
    assert set(check["properties"]["deployments"]["items"]["required"]) == {
        "name", "passed", "reason", "inputs", "figures", "requirement", "margin"}
    verify = schema("verify")["$defs"]
    assert set(verify["allocation"]["required"]) == {
        "schema", "device", "predicted_bytes", "measured_bytes", "measured_reserved_bytes", "measured_device_bytes",
        "rss_delta_bytes", "groups", "passed"}
    assert verify["allocation"]["dependentRequired"]["fit"] == ["predicted_max_batch", "measured_max_batch",
                                                                "difference"]
    assert set(verify["engine_run"]["required"]) == {"schema", "run", "engine", "device", "model", "passed",
                                                     "settings", "rows", "seconds", "notes"}


# ---------------------------------------------------------------------------------------------- size
def kinds(d: dict[str, Any]) -> set[str]:
    return {g["kind"] for g in d["groups"]}


SIZE_CASES = [  # (args, a group kind the case is there for)
    (("llama-2-7b", "--ctx", "4096"), "full"),
    (("llama-3.1-8b", "--ctx", "32k", "--batch", "4", "--engine", "sglang"), "full"),
    (("gemma-2-9b", "--ctx", "8k", "--engine", "vllm"), "sliding"),
    (("gemma-2-9b", "--ctx", "8k", "--engine", "llamacpp"), "sliding"),
    (("gemma-3-4b", "--ctx", "16k", "--engine", "hf"), "sliding"),
    (("deepseek-v3", "--ctx", "4k", "--engine", "vllm", "--kv-dtype", "fp8"), "mla"),
    (("deepseek-v2-lite", "--ctx", "4k", "--engine", "sglang"), "mla"),
    (("deepseek-v3", "--ctx", "4k", "--engine", "llamacpp"), "mla"),
    (("nemotron-3-nano", "--ctx", "4k", "--engine", "trtllm"), "mamba_state"),
    (("jamba-v0.1", "--ctx", "4k", "--engine", "vllm"), "mamba_state"),
    (("qwen3-next-80b-a3b", "--ctx", "4k", "--engine", "vllm"), "linear_state"),
    (("qwen3-next-80b-a3b", "--ctx", "4k", "--engine", "hf"), "linear_state"),
    (("mamba-2.8b", "--ctx", "1M", "--engine", "llamacpp"), "mamba_state"),
    (("t5-large", "--ctx", "512", "--engine", "hf"), "cross"),
    (("llama-3.1-8b", "--ctx", "4k", "--engine", "trtllm", "--kv-dtype", "fp8"), "full"),
    (("llama-3.1-8b", "--ctx", "4k", "--engine", "vllm@0.10"), "full"),
]


def _case_id(args: tuple[str, ...]) -> str:
    engine = args[args.index("--engine") + 1] if "--engine" in args else "vllm"
    return f"{args[0]}-{engine}" + ("-" + args[-1] if "--kv-dtype" in args else "")


@pytest.mark.parametrize("args,kind", SIZE_CASES, ids=[_case_id(a) for a, _ in SIZE_CASES])
def test_size_outputs_validate(args, kind):
    d = validate("size", cli_json("size", *args, "--json"))
    assert kind in kinds(d)


@pytest.mark.slow
def test_size_every_bundled_model_under_every_engine_validates():
    """The whole catalog, all five engines: every output the bundled models produce."""
    refs = [m.aliases[0] if m.aliases else m.repo_id for m in catalog.bundled_models()]
    seen: set[str] = set()
    for engine in ENGINES:
        for ref in refs:
            if declined(ref, engine):
                continue  # a one-line refusal (tests/test_size_cli.py), no JSON
            d = cli_json("size", ref, "--ctx", "2048", "--engine", engine, "--json")
            assert not errors("size", d), (ref, engine, [e.message for e in errors("size", d)][:3])
            seen |= kinds(d)
    assert {"full", "sliding", "mla", "mamba_state", "linear_state", "cross"} <= seen


def test_size_tp_pp_split_kv_dtypes_and_a_local_config(tmp_path):
    tp = validate("size", cli_json("size", "llama-3.1-70b", "--ctx", "4k", "--tp", "4", "--pp", "2", "--json"))
    assert tp["kv_bytes_all_gpus"] > tp["kv_bytes"]  # the sibling the schema requires with tp/pp
    split = validate("size", cli_json("size", "llama-3.1-8b", "--ctx", "4k", "--engine", "llamacpp",
                                      "--k-dtype", "q8_0", "--v-dtype", "q4_0", "--json"))
    assert (split["kv_dtype"], split["kv_dtype_source"]) == ("q8_0/q4_0", "flag")
    cfg = write_config(tmp_path, "tiny", {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "max_position_embeddings": 2048, "torch_dtype": "bfloat16"})
    local = validate("size", cli_json("size", cfg, "--ctx", "1k", "--json"))
    assert local["model"]["source"] == "file"


def test_size_of_a_gguf_file_validates(tmp_path):
    pytest.importorskip("gguf")
    import numpy as np

    meta = {"llama.block_count": 2, "llama.context_length": 4096, "llama.embedding_length": 64,
            "llama.feed_forward_length": 128, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 32, "llama.rope.dimension_count": 16}
    tensors = [("token_embd.weight", np.zeros((32, 64), dtype=np.float16), None),
               ("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32), None)]
    path = write_gguf_file(tmp_path / "tiny.gguf", "llama", meta, tensors)
    d = validate("size", cli_json("size", str(path), "--engine", "llamacpp", "--ctx", "1024", "--json"))
    assert d["weight_source"] == "gguf" and d["quant_mix"] and d["model"]["id"] is None


# ---------------------------------------------------------------------------------------------- fit
def test_fit_the_catalog_on_a_sized_gpu_validates():
    d = validate("fit", cli_json("fit", "--gpu", "24GB", "--json"))
    assert len(d["results"]) > 20 and "frontier" not in d["results"][0]


@pytest.mark.parametrize("engine", ENGINES)
def test_fit_one_model_validates_with_its_frontier(engine):
    d = validate("fit", cli_json("fit", "--gpu", "H100", "--model", "llama-3.1-8b", "--engine", engine, "--json"))
    (r,) = d["results"]
    assert r["frontier"] and r["kv_budget_source"] == "estimated" and d["gpu"]["count"] == 1


def test_fit_parallel_budget_flag_and_models_that_do_not_fit():
    tp = validate("fit", cli_json("fit", "--gpu", "2xH100", "--model", "llama-3.1-70b", "--json"))
    assert (tp["tp"], tp["gpu"]["count"]) == (2, 2)
    flag = validate("fit", cli_json("fit", "--gpu", "L4", "--model", "qwen3-next-80b-a3b", "--kv-budget", "5.01GiB",
                                    "--json"))
    assert flag["results"][0]["kv_budget_source"] == "flag"
    small = validate("fit", cli_json("fit", "--gpu", "8GB", "--engine", "sglang", "--json"))
    assert any(not r["fits"] for r in small["results"])  # the weights-do-not-fit entries validate too


# ---------------------------------------------------------------------------------------------- check
CHECK_OK = """\
deployments:
  - name: chat-small
    model: llama-3.2-1b
    gpu: L4
    ctx: 8k
    min_batch: 16
    gpu_memory_utilization: 0.9
  - name: long
    model: qwen2.5-7b
    gpu: 2xA10G
    tp: 2
    ctx: 32k
    kv_dtype: fp8
    min_ctx: 16k
  - name: tokens
    model: gemma-2-9b
    gpu: H100
    engine: sglang
    ctx: 8k
    min_kv_tokens: 100000
"""
CHECK_FAILS = """\
deployments:
  - name: too-big
    model: llama-3.1-70b
    gpu: L4
    ctx: 4k
  - name: too-long
    model: llama-2-7b
    gpu: H100
    ctx: 32k
"""
CHECK_INVALID = """\
deployments:
  - name: fine
    model: llama-3.2-1b
    gpu: L4
  - name: unknown
    model: no-such-model-xyz
    gpu: L4
"""


@pytest.mark.parametrize("text,code", [(CHECK_OK, 0), (CHECK_FAILS, 1), (CHECK_INVALID, 2)],
                         ids=["pass", "fail", "invalid"])
def test_check_outputs_validate(tmp_path, text, code):
    path = tmp_path / "kvplan.yaml"
    path.write_text(text)
    d = validate("check", cli_json("check", str(path), "--format", "json", code=code))
    assert d["passed"] is (code == 0)
    if code == 1:
        assert {x["requirement"]["kind"] for x in d["deployments"]} == {"min_batch", "ctx"}
    json_flag = run_cli("check", str(path), "--json")  # the same as --format json
    assert validate("check", json_flag.json()) == d


def test_check_the_shipped_example_validates():
    root = Path(__file__).resolve().parents[1]
    validate("check", cli_json("check", str(root / "examples" / "kvplan.yaml"), "--format", "json", code=1))


# ---------------------------------------------------------------------------------------------- models, gpus, pull
def test_models_and_a_catalog_search_validate():
    d = validate("models", cli_json("models", "--json"))
    assert len(d["models"]) > 20
    validate("models", cli_json("models", "--search", "llama", "--json"))


def test_gpus_catalog_validates():
    d = validate("gpus", cli_json("gpus", "--json"))
    assert any(g["estimated"] for g in d["gpus"]) and any(not g["estimated"] for g in d["gpus"])


def test_gpus_local_validates_on_the_fake_device(monkeypatch):
    """`gpus --local` needs CUDA: test_verify_cuda's fake device (torch.cuda's functions replaced) stands in."""
    pytest.importorskip("torch")
    from test_verify_cuda import FakeCuda

    from kvplan.verify import local_gpu

    FakeCuda(monkeypatch)
    monkeypatch.setattr(local_gpu, "_nvml_totals", lambda: {"#0": {"nvml_bytes": 85520809984, "source": "nvidia-smi"}})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    d = validate("gpus", cli_json("gpus", "--local", "--json"))
    assert d["devices"][0]["match"] == "H100-SXM-80GB"


TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "max_position_embeddings": 2048, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def test_pull_and_hub_outputs_validate(fake_hub, tmp_path):
    """pull, a Hub search and size from the Hub and from the cache, all against the local fake Hub."""
    commit = fake_hub.add_repo("someorg/tiny", {"config.json": TINY})
    d = validate("pull", cli_json("pull", "someorg/tiny", "--to", str(tmp_path / "catalog"), "--json"))
    assert d["pulled"][0]["commit"] == commit and d["pulled"][0]["weight_bytes"] is None
    cached_size = validate("size", cli_json("size", "someorg/tiny", "--ctx", "1k", "--offline", "--json"))
    assert cached_size["model"]["source"] == "cache" and cached_size["model"]["commit"] == commit
    validate("models", cli_json("models", "--search", "tiny", "--hub", "--json"))


# ---------------------------------------------------------------------------------------------- verify
def test_verify_on_cpu_validates():
    pytest.importorskip("torch")
    d = validate("verify", cli_json("verify", "llama-3.2-1b", "--ctx", "2k", "--device", "cpu", "--json"))
    assert d["device"]["kind"] == "cpu" and d["rss_delta_bytes"] is not None and "fit" not in d
    validate("verify", cli_json("verify", "gemma-2-9b", "--ctx", "2000", "--engine", "sglang", "--device", "cpu",
                                "--no-rss", "--json"))
    validate("verify", cli_json("verify", "deepseek-v2-lite", "--ctx", "300", "--batch", "2", "--engine", "llamacpp",
                                "--k-dtype", "q8_0", "--v-dtype", "q4_0", "--device", "cpu", "--no-rss", "--json"))


@pytest.mark.slow
def test_verify_fit_on_cpu_validates_in_both_modes():
    pytest.importorskip("torch")
    from kvplan.sizing import EngineOptions, ModelOptions, size

    weights = size(ModelOptions("gpt2"), EngineOptions("vllm"), 64, 1).weight_bytes
    batch = validate("verify", cli_json("verify", "gpt2", "--ctx", "1024", "--fit", "--memory-limit",
                                        f"{weights + (200 << 20)}B", "--device", "cpu", "--json"))
    assert batch["fit"]["mode"] == "max_batch" and batch["predicted_max_batch"] >= 1
    ctx = validate("verify", cli_json("verify", "gpt2", "--batch", "2", "--fit", "--memory-limit",
                                      f"{weights + (100 << 20)}B", "--device", "cpu", "--json"))
    assert ctx["fit"]["mode"] == "max_ctx" and ctx["predicted_max_batch"] is None


def test_verify_with_model_validates():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    d = validate("verify", cli_json("verify", "gpt2", "--ctx", "64", "--with-model", "--device", "cpu", "--no-rss",
                                    "--json"))
    assert d["model_check"]


def test_verify_on_the_fake_cuda_device_validates(monkeypatch):
    """The CUDA form (reserved and device bytes filled in), on test_verify_cuda's fake device."""
    pytest.importorskip("torch")
    from test_verify_cuda import FakeCuda

    FakeCuda(monkeypatch)
    d = validate("verify", cli_json("verify", "llama-3.1-8b", "--ctx", "8k", "--batch", "4", "--device", "cuda",
                                    "--json"))
    assert d["device"]["kind"] == "cuda" and d["measured_reserved_bytes"] is not None


FAKE_VLLM = """\
#!{python}
# A stand-in for vLLM's child process (kvplan/verify/vllm_child.py): answers the version probe and writes the
# result line kvplan reads. Its figures are kvplan's own, so the comparison passes; only the JSON shape is tested.
import json, sys
if sys.argv[1] == "-c":
    print("0.33.0")
    sys.exit(0)
with open(sys.argv[3], "w") as out:
    out.write(json.dumps({result}) + "\\n")
"""


def test_verify_run_validates_with_a_stand_in_engine(monkeypatch, tmp_path):
    """`verify --run vllm` through the real code path (version probe, child process, kvplan's side of the
    comparison), with KVPLAN_VLLM_PYTHON pointing at a stand-in that answers with kvplan's own figures."""
    pytest.importorskip("torch")
    fit = cli_json("fit", "--gpu", "64GiB", "--model", "gpt2", "--ctx", "1024", "--kv-budget", "1GiB",
                   "--engine", "vllm@0.33", "--block-size", "16", "--max-num-batched-tokens", "2048",
                   "--max-model-len", "1024", "--json")["results"][0]
    details = fit["engine_details"]
    result = {"id": "run", "budget_bytes": 1 << 30, "num_blocks": details["num_gpu_blocks"],
              "tokens": fit["kv_capacity_tokens"], "concurrency_value": fit["concurrency"], "block_size": 16,
              "platform_block_size": 16, "bytes_per_block": details["bytes_per_block"],
              "groups": [{"layer_spec": "FullAttentionSpec", "blocks_per_request": 64}], "max_model_len": 1024,
              "max_num_batched_tokens": 2048, "async_scheduling": True, "enable_prefix_caching": True,
              "cache_dtype": "auto", "mamba_ssm_cache_dtype": None, "model_dtype": "bfloat16"}
    fake = tmp_path / "python"
    fake.write_text(FAKE_VLLM.format(python=sys.executable, result=f"json.loads({json.dumps(result)!r})"))
    fake.chmod(0o755)
    monkeypatch.setenv("KVPLAN_VLLM_PYTHON", str(fake))
    r = run_cli("verify", "gpt2", "--run", "vllm", "--device", "cpu", "--ctx", "1024", "--json")
    assert r.code == 0, r.err
    d = validate("verify", r.json())
    assert d["run"] == "vllm 0.33.0" and d["rows"] and isinstance(d["device"], str)


# ---------------------------------------------------------------------------------------- broken outputs are rejected
def _size() -> dict[str, Any]:
    return real("size", "gemma-2-9b", "--ctx", "8k", "--json")


def _size_tp() -> dict[str, Any]:
    return real("size", "llama-3.1-70b", "--ctx", "4k", "--tp", "4", "--json")


def _size_split() -> dict[str, Any]:
    return real("size", "llama-3.1-8b", "--ctx", "4k", "--engine", "llamacpp", "--k-dtype", "q8_0", "--v-dtype",
                "q4_0", "--json")


def _fit() -> dict[str, Any]:
    return real("fit", "--gpu", "H100", "--model", "llama-3.1-8b", "--json")


def _verify() -> dict[str, Any]:
    pytest.importorskip("torch")
    return real("verify", "gpt2", "--ctx", "64", "--device", "cpu", "--no-rss", "--json")


def _check() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[1]
    return real("check", str(root / "examples" / "kvplan.yaml"), "--json")


def _del(*path: Any):
    def go(d):
        for p in path[:-1]:
            d = d[p]
        del d[path[-1]]
    return go


def _set(value: Any, *path: Any):
    def go(d):
        for p in path[:-1]:
            d = d[p]
        d[path[-1]] = value
    return go


BROKEN = [  # (schema, a real output, what breaks it)
    ("size", _size, _set("2147483648", "kv_bytes")),  # bytes as a string
    ("size", _size, _set(1234.5, "kv_bytes")),  # bytes as a fraction
    ("size", _size, _set(-1, "kv_bytes")),  # negative bytes
    ("size", _size, _del("kv_bytes_per_token")),  # a required key removed
    ("size", _size, _del("assumptions")),
    ("size", _size, _set(2, "schema")),  # another schema version
    ("size", _size, _set("vllm", "engine")),  # engine without its resolved version
    ("size", _size, _set("4k", "ctx")),  # the resolved integer, not what was typed
    ("size", _size, _set("paged", "groups", 0, "kind")),  # a group kind the contract does not list
    ("size", _size, _del("groups", 0, "window")),
    ("size", _size, _set("hub-ish", "model", "source")),
    ("size", _size, _del("model", "commit")),
    ("size", _size, _set("guessed", "kv_dtype_source")),
    ("size", _size_tp, _del("kv_bytes_all_gpus")),  # tp > 1 needs the all-GPU sibling
    ("size", _size_split, _del("v_dtype")),  # k_dtype without v_dtype
    ("size", _size_split, _set("q8_0", "kv_dtype")),  # split dtypes: kv_dtype is "<k>/<v>"
    ("fit", _fit, _del("results", 0, "engine_would_start")),
    ("fit", _fit, _set("110", "results", 0, "max_batch")),
    ("fit", _fit, _set("guess", "results", 0, "kv_budget_source")),
    ("fit", _fit, _del("gpu", "cuda_total_bytes")),
    ("fit", _fit, _set([{"ctx": 1024}], "results", 0, "frontier")),
    ("check", _check, _del("deployments", 0, "figures", "kv_capacity_tokens")),  # figures are fit's entry
    ("check", _check, _set({"kind": "max_batch", "value": 16}, "deployments", 0, "requirement")),
    ("check", _check, _set({"value": 50, "unit": "GiB"}, "deployments", 0, "margin")),
    ("check", _check, _set("yes", "passed")),
    ("verify", _verify, _del("measured_device_bytes")),
    ("verify", _verify, _set("2097152", "measured_bytes")),
    ("verify", _verify, _del("groups", 0, "measured_bytes")),
    ("verify", _verify, _set({"mode": "max_batch", "predicted": 1, "measured": 1, "difference": 0, "passed": True},
                             "fit")),  # --fit without predicted_max_batch / measured_max_batch / difference
    ("verify", _verify, _set("vllm 0.33.0", "run")),  # claims to be --run: then rows, settings... are required
    ("models", lambda: real("models", "--json"), _del("models", 0, "id")),
    ("gpus", lambda: real("gpus", "--json"), _set("80GB", "gpus", 0, "cuda_total_bytes")),
    ("gpus", lambda: real("gpus", "--json"), _del("gpus")),
]


@pytest.mark.parametrize("name,output,breaks", BROKEN, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BROKEN)])
def test_broken_outputs_are_rejected(name, output, breaks):
    good = output()
    assert not errors(name, good), [e.message for e in errors(name, good)][:3]  # the real output passes...
    bad = copy.deepcopy(good)
    breaks(bad)
    with pytest.raises(ValidationError):  # ...and the broken copy does not
        validate(name, bad)
