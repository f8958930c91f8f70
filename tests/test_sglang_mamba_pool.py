"""SGLang's Mamba state pool beside the token pool (kvplan/engines/sglang/ Prepared.mamba_split, _mamba_pool):
the KV budget left after the weights is split r : 1 between MambaPool (max_mamba_cache_size slots of one request's
conv + SSM state) and the token pool, r = --mamba-full-memory-ratio (0.9), and a running request takes 1, 3 or 5
state slots. Oracles, none written here:

- SGLang's own code run from its wheels (tests/oracle_sglang_mamba.py): the config classes' mamba2_cache_params on
  the bundled configs, 0.5.10's handle_max_mamba_cache and 0.5.23's _handle_max_mamba_cache and
  _calculate_mamba_ratio, and 0.5.23's list of architectures that take the extra buffer;
- a start-up log of SGLang 0.5.18 (Qwen3.8-27B-FP8 on one H100; the qwen3.5-27b layout): "max_mamba_cache_size: 124"
  and "#tokens: 330323" together fit only the 0.5.17+ split (the pool charged K + 1 slots), and its "capped to 24"
  fits 5 slots a request.
"""

from __future__ import annotations

import json
import os
import random

import pytest

from conftest import ROOT, kvjson, run_cli

import oracle_sglang_mamba as oracle

GiB = 1 << 30
KIMI = ROOT / "tests" / "data" / "wild-configs" / "moonshotai--Kimi-Linear-48B-A3B-Instruct" / "config.json"
MODELS = {  # the model as kvplan takes it -> its config.json (bundled, or Moonshot's own for Kimi Linear)
    "qwen3-next-80b-a3b": ROOT / "model_configs" / "Qwen--Qwen3-Next-80B-A3B-Thinking" / "config.json",
    "nemotron-3-nano": ROOT / "model_configs" / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16" / "config.json",
    "qwen3.5-27b": ROOT / "model_configs" / "Qwen--Qwen3.5-27B" / "config.json",
    "lfm2-1.2b": ROOT / "model_configs" / "LiquidAI--LFM2-1.2B" / "config.json",
    str(KIMI): KIMI,
}


def config(alias: str) -> dict:
    return json.loads(MODELS[alias].read_text())


def cell(alias: str, tp: int) -> int:
    """One token of the pooled layers on one rank, bf16: K and V of the full-attention layers' KV heads (SGLang
    divides them by the attention TP size, at least one a rank), or Kimi Linear's MLA latent (kv_lora_rank + rope,
    not divided)."""
    c = config(alias)
    text = c.get("text_config") or c
    if "linear_attn_config" in text:
        return len(text["linear_attn_config"]["full_attn_layers"]) * (text["kv_lora_rank"] + text["qk_rope_head_dim"]) * 2
    if "hybrid_override_pattern" in text:
        full = text["hybrid_override_pattern"].count("*")
    elif "full_attn_idxs" in text:
        full = len(text["full_attn_idxs"])
    else:
        full = text["num_hidden_layers"] // text["full_attention_interval"]
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    heads = max(1, text["num_key_value_heads"] // tp)
    return full * heads * head_dim * 2 * 2


def fit(alias: str, engine: str, budget: int, tp: int = 1, *extra: str) -> dict:
    return kvjson("fit", alias, "--gpu", f"{tp}xH200" if tp > 1 else "H200", "--tp", str(tp), "--engine", engine,
                  "--ctx", "32768", "--kv-budget", f"{budget}B", *extra)["results"][0]


@pytest.fixture(scope="module")
def sources():
    if not os.environ.get("KVPLAN_SGLANG_SRC"):
        pytest.skip("KVPLAN_SGLANG_SRC / KVPLAN_SGLANG_0_5_10_SRC (unzipped sglang 0.5.23 and 0.5.10.post1 wheels) "
                    "are not set; .ci/run sets them")
    assert oracle.available(), "the SGLang sources .ci/run extracts are missing"


CASES = [(alias, tp, budget) for alias in MODELS for tp in (1, 2) for budget in (8 * GiB + 12_345, 61_000_000_000)]


@pytest.mark.parametrize("alias, tp, budget", CASES)
def test_state_bytes_and_split_equal_sglang_0_5_23(sources, alias, tp, budget):
    """One request's state (mamba_cache_per_req), max_mamba_cache_size, max_total_num_tokens and the slots a request
    takes, as SGLang 0.5.23's own code computes them."""
    _, params = oracle.cache_params(config(alias), tp)
    k, rest, ratio = oracle.split_0_5_23(params.mamba_cache_per_req, budget / GiB, config(alias)["architectures"][0])
    r = fit(alias, "sglang@0.5.23", budget, tp)
    d = r["engine_details"]
    assert d["mamba_cache_per_req"] == params.mamba_cache_per_req
    assert (d["max_mamba_cache_size"], d["mamba_slots_per_request"]) == (k, ratio)
    assert r["kv_capacity_tokens"] == int(rest * GiB) // cell(alias, tp)


@pytest.mark.parametrize("alias, tp, budget", CASES)
def test_split_equals_sglang_0_5_10(sources, alias, tp, budget):
    _, params = oracle.cache_params(config(alias), tp)
    k, rest = oracle.split_0_5_10(params.mamba_cache_per_req, budget / GiB)
    r = fit(alias, "sglang@0.5", budget, tp)
    assert r["engine_details"]["max_mamba_cache_size"] == k
    # no_buffer with the radix cache (0.5.10 server_args.py); Kimi Linear runs without it
    assert r["engine_details"]["mamba_slots_per_request"] == (1 if alias == str(KIMI) else 3)
    assert r["kv_capacity_tokens"] == int(rest * GiB) // cell(alias, tp)


@pytest.mark.parametrize("seed", range(4))
def test_random_budgets_and_ratios_equal_sglang(sources, seed):
    rng = random.Random(seed)
    alias = rng.choice(sorted(MODELS))
    budget, r = rng.randrange(2 * GiB, 120 * GiB), rng.choice((0.2, 0.5, 0.9, 1.5))
    _, params = oracle.cache_params(config(alias), 1)
    k, rest, _ = oracle.split_0_5_23(params.mamba_cache_per_req, budget / GiB, config(alias)["architectures"][0], r)
    got = fit(alias, "sglang@0.5.23", budget, 1, "--mamba-full-memory-ratio", str(r))
    assert got["engine_details"]["max_mamba_cache_size"] == k
    assert got["kv_capacity_tokens"] == int(rest * GiB) // cell(alias, 1)


def test_extra_buffer_architectures_are_sglang_0_5_23s(sources):
    """kvplan's list, for the architectures it sizes, is SGLang 0.5.23's _MAMBA_EXTRA_BUFFER_ARCHS."""
    from kvplan.engines import sglang

    theirs = oracle.literal_frozenset(f"{oracle.SRC}/srt/arg_groups/overrides.py", "_MAMBA_EXTRA_BUFFER_ARCHS")
    ours = dict(sglang.VERSIONS)["0.5.23"].mamba_extra_buffer
    assert ours <= theirs
    for arch in ("JambaForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Zamba2ForCausalLM"):
        assert arch not in theirs and arch not in ours


# ---------------------------------------------------------------------------------------------- a log from the wild
# Code index read_file id 65830671609 (a bring-up README, section "H100 serve - single GPU", quoting its server log
# "verbatim" with the timestamps stripped): python -m sglang.launch_server --model-path Qwen/Qwen3.8-27B-FP8
# --trust-remote-code --mem-fraction-static 0.85 --max-running-requests 32 (sglang 0.5.18, 1x H100 80GB HBM3, bf16
# KV). The README adds that the log printed "max_running_requests is capped to 24 by the mamba state cache", and
# quotes from a ROCm run of the same checkpoint "mamba_cache_per_req=146.81 MB".
QWEN38_LOG = """\
Load weight end. elapsed=429.52 s, type=Qwen3_5ForConditionalGeneration, quant=fp8, fmt=e4m3, avail mem=50.01 GB, mem usage=28.47 GB.
Mamba Cache is allocated. max_mamba_cache_size: 124, conv_state size: 0.34GB, ssm_state size: 17.58GB
KV Cache is allocated. dtype: torch.bfloat16, #tokens: 330323, K size: 10.08 GB, V size: 10.08 GB
"""


def _first(lo: int, hi: int, ok) -> int:
    """The smallest b in [lo, hi] with ok(b) (ok monotone), or hi + 1."""
    while lo <= hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid - 1
        else:
            lo = mid + 1
    return lo


def budget_giving(alias: str, engine: str, slots: int, tokens: int, *, tp: int = 1, kv_dtype: str | None = None):
    """A KV budget at which kvplan's SGLang rules print both figures, or None. max_mamba_cache_size grows with the
    budget, and within one slot count so does the token pool (it drops when a slot is added): bisect for the budgets
    of `slots` slots, then within them for `tokens` tokens."""
    from kvplan.sizing import EngineOptions, ModelOptions, setup

    p = setup(ModelOptions(alias, offline=True), EngineOptions(engine=engine, tp=tp, kv_dtype=kv_dtype)).prepared
    top = 1 << 45
    start = _first(0, top, lambda b: p.mamba_split(b)[0] >= slots)
    end = _first(start, top, lambda b: p.mamba_split(b)[0] > slots)
    if start > top or p.mamba_split(start)[0] != slots:
        return None
    b = _first(start, end - 1, lambda b: p.mamba_split(b)[1] // p.cell_size(0) >= tokens)
    return b if b < end and p.mamba_split(b)[1] // p.cell_size(0) == tokens else None


def test_sglang_0_5_18_log_fits_the_k_plus_one_split():
    """124 slots and 330,323 tokens come out of one budget under the 0.5.17+ split; under 0.5.16's (the pool charged
    K slots, not K + 1) no budget gives both. The state per request is what the log's 146.81 MB says, and 124 slots
    at 5 a request cap the running requests at 24, as printed."""
    assert "max_mamba_cache_size: 124" in QWEN38_LOG and "#tokens: 330323" in QWEN38_LOG
    r = kvjson("fit", "qwen3.5-27b", "--gpu", "H100", "--engine", "sglang@0.5.18", "--ctx", "32768",
               "--kv-budget", "38GiB")["results"][0]
    assert f"{r['engine_details']['mamba_cache_per_req'] / 2**20:.2f}" == "146.81"
    assert r["engine_details"]["mamba_slots_per_request"] == 5 and 124 // 5 == 24
    assert budget_giving("qwen3.5-27b", "sglang@0.5.18", 124, 330_323)
    assert budget_giving("qwen3.5-27b", "sglang@0.5.16", 124, 330_323) is None


# sglang 0.5.21 (image xomoxcc/dgx-spark-sglang:0.5.21-sm121), nvidia/Nemotron-3-Nano-Omni-30B-A3B-Reasoning-NVFP4 on
# 4x GB10, tp 4, fp8 KV, mamba_full_memory_ratio 0.9 (tests/data/wild-logs.yaml; code index read_file id 70117488909)
OMNI_LOG = """\
Mamba Cache is allocated. max_mamba_cache_size: 2211, conv_state size: 0.44GB, ssm_state size: 24.84GB
KV Cache is allocated. dtype: float8_e4m3fn, #tokens: 19644177, K size: 14.05 GB, V size: 14.05 GB
"""


def test_sglang_0_5_21_omni_log_fits_the_k_plus_one_split():
    """A second log: Nemotron-3-Nano-Omni's language model is the nemotron-3-nano layout (its SSM buffer, 24.84 GiB
    for 2,212 slots, is 23 Mamba-2 layers of 16 x 64 x 128 fp32 at tp 4). 2,211 slots and 19,644,177 tokens come out
    of one budget under the K + 1 split, not under 0.5.16's."""
    assert "max_mamba_cache_size: 2211" in OMNI_LOG and "#tokens: 19644177" in OMNI_LOG
    assert budget_giving("nemotron-3-nano", "sglang@0.5.21", 2211, 19_644_177, tp=4, kv_dtype="fp8")
    assert budget_giving("nemotron-3-nano", "sglang@0.5.16", 2211, 19_644_177, tp=4, kv_dtype="fp8") is None


# ---------------------------------------------------------------------------------------------- knobs, refusals
def test_explicit_slots_and_ratio():
    base = fit("qwen3-next-80b-a3b", "sglang@0.5.23", 40 * GiB)
    fixed = fit("qwen3-next-80b-a3b", "sglang@0.5.23", 40 * GiB, 1, "--max-mamba-cache-size", "100")
    per = base["engine_details"]["mamba_cache_per_req"]
    assert fixed["engine_details"]["max_mamba_cache_size"] == 100
    assert fixed["kv_capacity_tokens"] == (40 * GiB - 101 * per) // cell("qwen3-next-80b-a3b", 1)
    assert fixed["engine_batch_cap"] == 100 // 5
    more = fit("qwen3-next-80b-a3b", "sglang@0.5.23", 40 * GiB, 1, "--mamba-full-memory-ratio", "1.5")
    assert more["engine_details"]["max_mamba_cache_size"] > base["engine_details"]["max_mamba_cache_size"]
    assert more["kv_capacity_tokens"] < base["kv_capacity_tokens"]


def test_kimi_linear_slots_by_version(tmp_path):
    """Kimi Linear: radix cache off in 0.5.10-0.5.13 (1 slot a request), on from 0.5.14 (3), extra buffer from
    0.5.16 (5)."""
    from conftest import write_config

    path = write_config(tmp_path, "kl", json.loads(KIMI.read_text()))
    got = {v: kvjson("fit", path, "--gpu", "2xH200", "--tp", "2", "--engine", f"sglang@{v}", "--ctx", "8192",
                     "--kv-budget", "40GiB")["results"][0]["engine_details"]["mamba_slots_per_request"]
           for v in ("0.5.10", "0.5.14", "0.5.16")}
    assert got == {"0.5.10": 1, "0.5.14": 3, "0.5.16": 5}


def test_sglang_0_4_refuses_a_mamba_hybrid_in_one_line():
    r = run_cli("fit", "nemotron-3-nano", "--gpu", "H100", "--engine", "sglang@0.4")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "0.5.10" in r.err, r.err


def test_explain_reproduces_the_state_pool_of_the_0_5_18_log(monkeypatch):
    """explain reads the Mamba line: the conv and SSM buffers of 124 + 1 slots (slot 0 pads), and K / V at 330,323
    tokens, from the qwen3.5-27b layout; the slot count needs the measured budget the excerpt lacks."""
    from conftest import DATA
    import yaml
    from kvplan.explain import Overrides, explain

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    entry = next(e for e in yaml.safe_load((DATA / "wild-logs.yaml").read_text())
                 if e["id"] == "sglang-0.5.18-qwen3.8-27b-fp8-1xh100-80gb-tp1-msf0.85-mrr32")
    assert all(line in entry["log"] for line in QWEN38_LOG.splitlines())
    x = explain(entry["log"], Overrides(model="qwen3.5-27b", engine="sglang@0.5.18", offline=True))
    verdicts = {f.printed.what: f.verdict for f in x.findings}
    assert {verdicts[w] for w in ("conv_state_size", "ssm_state_size", "k_size", "v_size")} == {"reproduced"}
    assert verdicts["mamba_slots"] == "not reproduced"


@pytest.mark.parametrize("printed, verdict", [(24, "reproduced"), (41, "differs")])
def test_the_running_request_cap_line(printed, verdict, monkeypatch):
    """0.5.17+'s warning (kv_cache_configurator.py _resolve_max_num_reqs: "max_running_requests is capped to %d by
    the mamba state cache (max_mamba_cache_size=%d, %d state slots per request)"), here in that format with the
    README's figures: 124 // 5 = 24 under the extra buffer; 41 would be 0.5.10's 3 slots a request."""
    from kvplan.explain import Overrides, explain

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = (f"max_running_requests is capped to {printed} by the mamba state cache (max_mamba_cache_size=124, 5 state "
            "slots per request). To raise it: increase --mamba-full-memory-ratio")
    x = explain(QWEN38_LOG + line + "\n", Overrides(model="qwen3.5-27b", engine="sglang@0.5.18", offline=True))
    assert {f.printed.what: f.verdict for f in x.findings}["mamba_request_cap"] == verdict


def test_explain_reproduces_the_state_pool_of_the_0_5_21_omni_log(monkeypatch):
    from conftest import DATA
    import yaml
    from kvplan.explain import Overrides, explain

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    entry = next(e for e in yaml.safe_load((DATA / "wild-logs.yaml").read_text())
                 if e["id"] == "sglang-0.5.21-nemotron-3-nano-omni-30b-a3b-reasoning-nvfp4-4xgb10-tp4-fp8kv")
    assert entry["log"] == OMNI_LOG
    x = explain(entry["log"], Overrides(model="nemotron-3-nano", engine="sglang@0.5.21", tp=4, offline=True))
    verdicts = {f.printed.what: f.verdict for f in x.findings}
    assert {verdicts[w] for w in ("conv_state_size", "ssm_state_size", "k_size", "v_size")} == {"reproduced"}
    one_gpu = explain(entry["log"], Overrides(model="nemotron-3-nano", engine="sglang@0.5.21", tp=1, offline=True))
    assert {f.printed.what: f.verdict for f in one_gpu.findings}["ssm_state_size"] == "differs"


@pytest.mark.parametrize("mrr", [None, 8])
def test_radix_cache_off_equals_sglang_0_5_23(sources, mrr):
    """--disable-radix-cache: one slot a running request; with --max-running-requests, that many slots."""
    alias, budget = "nemotron-3-nano", 20 * GiB
    _, params = oracle.cache_params(config(alias), 1)
    k, rest, ratio = oracle.split_0_5_23(params.mamba_cache_per_req, budget / GiB, config(alias)["architectures"][0],
                                         radix_off=True, max_running_requests=mrr)
    extra = ("--disable-radix-cache",) + (("--max-running-requests", str(mrr)) if mrr else ())
    got = fit(alias, "sglang@0.5.23", budget, 1, *extra)
    d = got["engine_details"]
    assert (d["max_mamba_cache_size"], d["mamba_slots_per_request"]) == (k, ratio) and ratio == 1
    assert got["kv_capacity_tokens"] == int(rest * GiB) // cell(alias, 1)


@pytest.mark.parametrize("alias, key, where", [
    ("qwen3-next-80b-a3b", "mamba_ssm_dtype", "top"), ("qwen3.5-27b", "mamba_ssm_dtype", "text_config"),
    ("nemotron-3-nano", "mamba_ssm_dtype", "top"),
    ("nemotron-3-nano", "mamba_ssm_cache_dtype", "top"),  # Nemotron-H's own key: SGLang does not read it
])
def test_a_configs_ssm_dtype_as_sglang_reads_it(sources, alias, key, where, tmp_path):
    """configs/mamba_utils.py mamba2_state_dtype(config): the config classes that pass themselves read
    mamba_ssm_dtype (a Qwen3.5 text_config's own), so a bfloat16 there halves the SSM state; vLLM's Nemotron-H key
    mamba_ssm_cache_dtype is not SGLang's. SGLang's own config classes give the bytes a request's state takes."""
    c = config(alias)
    (c[where] if where != "top" else c)[key] = "bfloat16"
    _, params = oracle.cache_params(c, 1)
    (tmp_path / "config.json").write_text(json.dumps(c))
    d = fit(str(tmp_path), "sglang@0.5.23", 8 * GiB)["engine_details"]
    assert d["mamba_cache_per_req"] == params.mamba_cache_per_req
    default = fit(alias, "sglang@0.5.23", 8 * GiB)["engine_details"]["mamba_cache_per_req"]
    assert (d["mamba_cache_per_req"] < default) == (key == "mamba_ssm_dtype")
