"""DeepSeek-V4 (genuine Flash and Pro configs) against oracles nobody here wrote:

- parameters: transformers' own DeepseekV4ForCausalLM built on the meta device;
- vLLM's KV groups: a published printout of an instrumented vLLM build (vllm-project/vllm#54703: DeepSeek-V4-Flash
  fp8, five groups with page sums 1,002,240 / 823,680 / 786,240 / 870,912 / 656,640 B);
- vLLM 0.32's own KV-cache planner (v1/core/kv_cache_utils.py), driven by tests/vllm_dsv4_child.py in the vLLM
  interpreter with the specs DeepSeek-V4's layers register: bytes per block, blocks per request, the block
  count and capacity for a budget, and the start-up refusal, across lengths, token budgets and async scheduling.
- transformers' cache (hf): arithmetic written from models/deepseek_v4's cache classes here; the cache of real
  forwards in tests/test_oracle_hf.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import oracle_vllm as ov
from conftest import kvjson, run_cli
from kvplan.sizing import EngineOptions, ModelOptions, setup

DATA = Path(__file__).resolve().parent / "data"
CONFIGS = {"flash": DATA / "aic-configs" / "deepseek-ai--DeepSeek-V4-Flash_config.json",
           "pro": DATA / "wild-configs" / "deepseek-ai--DeepSeek-V4-Pro" / "config.json"}
META_PARAMS = {"flash": 284_332_230_231, "pro": 1_572_997_179_491}  # what the meta build counted (test below)


def _spec(name: str):
    return setup(ModelOptions(str(CONFIGS[name])), EngineOptions()).spec


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_params_equal_transformers_meta_count(name):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch

    config = transformers.AutoConfig.for_model(**{k: v for k, v in json.loads(CONFIGS[name].read_text()).items()
                                                  if k not in ("architectures", "transformers_version")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    count = sum(p.numel() for p in model.parameters())
    assert count == META_PARAMS[name]
    assert _spec(name).params == count


def test_mtp_layer_is_apart_from_params():
    """transformers drops the MTP layer (_keys_to_ignore_on_load_unexpected mtp.*); kvplan keeps it as part mtp."""
    spec = _spec("flash")
    assert spec.params_of("mtp") == 6_610_048_891  # the checkpoint's mtp.0 module, embedding and head shared
    assert spec.params == META_PARAMS["flash"]


def _stage(name: str, *args: str):
    s = setup(ModelOptions(str(CONFIGS[name])), EngineOptions(engine="vllm@0.32"))
    return s.prepared.stages[0]


def test_vllm_groups_match_a_published_vllm_printout():
    """vllm-project/vllm#54703 (a v0.28.1-based build instrumenting get_kv_cache_configs on DeepSeek-V4-Flash fp8)
    prints five groups: the latent + indexer group 1,002,240 B per block, the two window groups 823,680 and
    786,240, the ratio-4 compressor states 870,912 and the ratio-128 states 656,640."""
    stage = _stage("flash")
    pages = dict(stage.layer_pages)
    sums = sorted(sum(pages[e] for e in g.layers) for g in stage.groups)
    assert sums == sorted([1_002_240, 823_680, 786_240, 870_912, 656_640])
    assert stage.bytes_per_block == 1_002_240


def test_kv_dtype_and_block_size_are_the_backends():
    out = run_cli("size", str(CONFIGS["flash"]), "--kv-dtype", "bf16")
    assert out.code == 2 and "fp8_ds_mla only" in out.err
    out = run_cli("size", str(CONFIGS["flash"]), "--block-size", "64")
    assert out.code == 2 and "block size 256 only" in out.err
    out = run_cli("size", str(CONFIGS["flash"]), "--engine", "vllm@0.25")
    assert out.code == 2 and "0.32" in out.err
    for engine in ("llamacpp",):
        out = run_cli("size", str(CONFIGS["flash"]), "--engine", engine)
        assert out.code == 2 and "sliding_latent" in out.err, engine
    # SGLang 0.5.10 and TensorRT-LLM: refused by family, naming what their source does
    # (tests/test_sglang_trtllm_families.py; SGLang 0.5.23 lays it out: tests/test_dsv4_sglang023.py)
    for engine, why in (("sglang@0.5", "0.5.10 has no DeepSeek-V4 model"), ("trtllm", "KVCacheManagerV2")):
        out = run_cli("size", str(CONFIGS["flash"]), "--engine", engine)
        assert out.code == 2 and out.err.count("\n") == 1 and why in out.err, engine


# ---------------------------------------------------------------------------------------------- transformers
def hf_bytes(config: dict, ctx: int, batch: int = 1, elem: int = 2) -> int:
    """transformers 5.24 models/deepseek_v4 after one forward of ctx tokens, written from its cache classes: a
    window-only layer (ratio 0, DynamicSlidingWindowLayer) keeps K and V of min(ctx, window - 1) tokens x head_dim;
    a compressed layer that window once (K is V), one head_dim entry per closed window of `ratio` tokens, the
    ctx % ratio tokens still open as kv and gate (kv_proj width 2 x head_dim at ratio 4, head_dim at 128), and at
    ratio 4 the same again for the indexer (index_head_dim) plus, once a window closed, overlap kv [ratio, head_dim]
    in the compute dtype and overlap gate in fp32, for both."""
    d, di, w = config["head_dim"], config["index_head_dim"], min(ctx, config["sliding_window"] - 1)
    total = 0
    for ratio in config["compress_ratios"][:config["num_hidden_layers"]]:
        if ratio == 0:
            total += 2 * w * d * elem
            continue
        total += w * d * elem + ctx // ratio * d * elem
        if ratio == 128:
            total += 2 * (ctx % ratio) * d * elem
        else:
            total += ctx // ratio * di * elem + 2 * (ctx % ratio) * (2 * d + 2 * di) * elem
            total += (ctx >= ratio) * ratio * (d + di) * (elem + 4)
    return batch * total


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("ctx", [3, 127, 128, 517, 100_000])
def test_hf_cache_written_from_transformers_classes(name, ctx):
    config = json.loads(CONFIGS[name].read_text())
    out = kvjson("size", str(CONFIGS[name]), "--engine", "hf", "--ctx", str(ctx), "--batch", "2")
    assert out["kv_bytes"] == hf_bytes(config, ctx, batch=2)  # bf16: the config's dtype
    kinds = {g["kind"] for g in out["groups"]}
    assert kinds == ({"sliding"} if 0 in config["compress_ratios"][:-1] else set()) | {
        "sliding_latent", "compressed_latent", "indexer", "compressor_state"}


def test_hf_refuses_rule_sets_without_the_model_code():
    out = run_cli("size", str(CONFIGS["flash"]), "--engine", "hf@4.57")
    assert out.code == 2 and out.err.count("\n") == 1 and "models/deepseek_v4" in out.err


def test_plan_refuses_the_packed_pool_in_one_line():
    out = run_cli("plan", "deepseek-v4", "--gpu", "8xH200", "--tp", "8", "--prompt", "2000", "--output", "500")
    assert out.code == 2 and out.err.count("\n") == 1 and "DeepSeek-V4" in out.err


def test_packed_plan_adds_up_to_whole_blocks():
    d = kvjson("size", str(CONFIGS["flash"]), "--ctx", "30000", "--batch", "3", "--max-num-batched-tokens", "16384",
               "--no-async-scheduling")
    details = d["engine_details"]
    assert details["blocks_per_request"] == 6_800  # 2 x 259 window + 118 latent + 4,099 + 2,065 state blocks
    assert d["kv_bytes"] == 3 * 6_800 * details["bytes_per_block"] == sum(g["bytes"] for g in d["groups"])


# ---------------------------------------------------------------------------------------------- vLLM's planner
CASES = [
    # id, model, max_model_len, max_num_batched_tokens, async scheduling, available KV bytes
    ("flash-30k-16k-sync-20g", "flash", 30_000, 16_384, False, 20 << 30),
    ("flash-30k-16k-async-20g", "flash", 30_000, 16_384, True, 20 << 30),
    ("flash-8k-8k-async-20g", "flash", 8_192, 8_192, True, 20 << 30),
    ("flash-1m-8k-async-60g", "flash", 1_048_576, 8_192, True, 60 << 30),
    ("flash-128k-2k-sync-7g", "flash", 131_072, 2_048, False, 7 << 30),
    ("flash-30k-16k-async-5g-refused", "flash", 30_000, 16_384, True, 5 << 30),
    ("pro-64k-8k-async-40g", "pro", 65_536, 8_192, True, 40 << 30),
    ("pro-1m-4k-sync-100g", "pro", 1_048_576, 4_096, False, 100 << 30),
]


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    work = tmp_path_factory.mktemp("dsv4")
    cases = [{"id": i, "config": str(CONFIGS[m]), "max_model_len": L, "max_num_batched_tokens": t,
              "async_scheduling": a, "available_bytes": b} for i, m, L, t, a, b in CASES]
    (work / "cases.json").write_text(json.dumps(cases))
    child = Path(__file__).resolve().parent / "vllm_dsv4_child.py"
    out = subprocess.run([ov.vllm_python(), str(child), str(work / "cases.json"), str(work / "out.json")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((work / "out.json").read_text())


@pytest.mark.engine
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_capacity_equals_vllm_planner(planner, case):
    cid, model, max_len, mnbt, async_on, available = case
    truth = planner[cid]
    r = kvjson("fit", "--gpu", "H100", "--model", str(CONFIGS[model]), "--engine", "vllm@0.32", "--kv-budget",
               str(available), "--ctx", str(max_len), "--max-model-len", str(max_len), "--max-num-batched-tokens",
               str(mnbt), "--async-scheduling" if async_on else "--no-async-scheduling")["results"][0]
    details = r["engine_details"]
    assert details["bytes_per_block"] == truth["bytes_per_block"]
    assert details["blocks_per_request"] == truth["blocks_per_request"]
    if "error" in truth:  # vLLM refuses to start: kvplan must say so, and suggest the length vLLM estimates
        assert r["engine_would_start"] is False
        assert f"is {r['suggested_max_model_len']}" in truth["error"].replace(",", "")
    else:
        assert r["engine_would_start"] is True
        assert details["num_gpu_blocks"] == truth["num_blocks"]
        assert r["kv_capacity_tokens"] == truth["capacity_tokens"]
        assert r["concurrency"] == round(truth["concurrency"], 2)
