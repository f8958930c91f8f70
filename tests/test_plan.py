"""`kvplan plan`: workload input, the replay's properties, the decode-speed arithmetic against the catalog's figures,
the fleet, and one-line refusals. (vLLM's own scheduler checks the replay step by step: tests/test_schedule_oracle.py.)
"""

from __future__ import annotations

import json
import math

import pytest
from jsonschema import Draft202012Validator

from conftest import run_cli
from test_json_schemas import schema


def plan(*args: str, code: int = 0):
    r = run_cli("plan", *args)
    assert r.code == code, (args, r.code, r.err)
    if code == 0:
        data = r.json() if "--json" in args else None
        if data is not None:
            Draft202012Validator(schema("plan")).validate(data)
        return data if data is not None else r.out
    assert r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
    return r.err


SMALL = ("--prompt", "200-400", "--output", "50-150", "-n", "200")


def test_dense_decode_bound_is_weights_plus_cache_over_the_catalog_bandwidth():
    out = plan("llama-3.1-8b", "--gpu", "H100", *SMALL, "--json")
    sp = out["speed"]
    assert sp["bandwidth_bytes_per_s"] == 3350e9  # the catalog's H100 SXM figure, GB/s = 1e9 B/s
    assert sp["weight_bytes"] == out["weight_bytes"] == 16_060_522_496  # bf16 Llama-3.1-8B, one GPU
    assert sp["routed_expert_bytes"] == 0
    per_request = out["mean_request_blocks"] * out["pool"]["bytes_per_block"]
    for row in sp["by_batch"]:
        assert row["weight_read_bytes"] == sp["weight_bytes"]  # a dense model reads every weight each step
        assert row["cache_read_bytes"] == round(row["batch"] * per_request)
        assert row["step_seconds"] == pytest.approx((sp["weight_bytes"] + row["batch"] * per_request) / 3350e9, rel=1e-12)
        assert row["tokens_per_s"] == pytest.approx(row["batch"] / row["step_seconds"], rel=1e-6)
    b = sp["cache_over_weights_from_batch"]
    assert b * per_request > sp["weight_bytes"] >= (b - 1) * per_request


def test_moe_reads_the_experts_a_batch_touches():
    out = plan("qwen3-235b-a22b", "--gpu", "8xH100", *SMALL, "--json")
    sp = out["speed"]
    assert sp["experts_per_token"] == 8 and sp["routed_expert_bytes"] > 0.9 * sp["weight_bytes"]
    rows = {r["batch"]: r for r in sp["by_batch"]}
    other = sp["weight_bytes"] - sp["routed_expert_bytes"]
    # batch 1 touches exactly k of E = 128 experts per layer
    assert rows[1]["weight_read_bytes"] == round(other + sp["routed_expert_bytes"] * 8 / 128)
    reads = [r["weight_read_bytes"] for r in sp["by_batch"]]
    assert reads == sorted(reads) and reads[-1] <= sp["weight_bytes"]
    big = max(rows)
    assert rows[big]["weight_read_bytes"] == round(other + sp["routed_expert_bytes"] * (1 - (1 - 8 / 128) ** big))


def test_few_users_all_run_without_preemption():
    out = plan("llama-3.1-8b", "--gpu", "H100", *SMALL, "--users", "4", "--json")
    assert out["mode"] == "users" and out["users"] == 4
    assert out["run"]["p50_running"] == 4 and out["run"]["preemptions"] == 0
    assert out["fleet"]["users_per_instance"] == 4 and out["fleet"]["instances"] == 1 and out["fleet"]["gpus"] == 1


def test_a_saturated_pool_holds_what_its_blocks_allow():
    # 24 GB with a 16 GB model: a few thousand blocks; requests of ~3k tokens cannot all run
    out = plan("llama-3.1-8b", "--gpu", "RTX-4090", "--prompt", "3000", "--output", "200", "-n", "300", "--json")
    usable, per = out["pool"]["usable_blocks"], math.ceil(3100 / out["pool"]["block_size"])
    assert out["run"]["p50_running"] <= usable // math.ceil(3000 / out["pool"]["block_size"])
    assert out["run"]["p50_running"] >= usable // math.ceil(3200 / out["pool"]["block_size"])
    assert out["run"]["p50_running"] < out["users"]  # more users than fit: the rest wait
    assert per > 0


def test_a_shared_prefix_lets_more_requests_run_at_once():
    base = ("llama-3.1-8b", "--gpu", "RTX-4090", "--prompt", "2000", "--output", "100", "-n", "200", "--burst", "--json")
    alone = plan(*base)
    shared = plan(*base, "--shared-prefix", "1800")
    assert shared["run"]["peak_running"] > 3 * alone["run"]["peak_running"]
    off = plan(*base, "--shared-prefix", "1800", "--no-enable-prefix-caching")
    assert off["run"]["peak_running"] == alone["run"]["peak_running"] and not off["pool"]["prefix_caching"]


@pytest.mark.slow
def test_fleet_for_users_at_a_tpot_target():
    out = plan("llama-3.1-8b", "--gpu", "H100", *SMALL, "--users", "5000", "--tpot", "12ms", "--json")
    fl, sp = out["fleet"], out["speed"]
    assert fl["tpot_seconds"] == 0.012
    per_request = out["mean_request_blocks"] * out["pool"]["bytes_per_block"]
    b = fl["users_per_instance_speed"]
    assert (sp["weight_bytes"] + b * per_request) / 3350e9 <= 0.012 < (sp["weight_bytes"] + (b + 1) * per_request) / 3350e9
    assert fl["users_per_instance"] == min(b, fl["users_per_instance_memory"])
    assert fl["instances"] == math.ceil(5000 / fl["users_per_instance"]) and fl["gpus"] == fl["instances"]
    tp2 = plan("llama-3.1-8b", "--gpu", "2xH100", *SMALL, "--users", "5000", "--json")["fleet"]
    assert tp2["gpus_per_instance"] == 2 and tp2["gpus"] == 2 * tp2["instances"]


def test_request_files(tmp_path):
    csv = tmp_path / "r.csv"
    csv.write_text("id,Prompt_Tokens,output_tokens\n1,100,20\n2,300,40\n")
    out = plan("llama-3.1-8b", "--gpu", "H100", "--requests-file", str(csv), "--burst", "--json")
    assert out["workload"]["requests"] == 2 and out["workload"]["max_prompt"] == 300 and out["run"]["peak_running"] == 2
    jl = tmp_path / "r.jsonl"
    jl.write_text('{"usage": {"prompt_tokens": 50, "completion_tokens": 7}}\n\n{"input_tokens": 80, "output_tokens": 9}\n')
    out = plan("llama-3.1-8b", "--gpu", "H100", "--requests-file", str(jl), "--burst", "--json")
    assert out["workload"]["mean_prompt"] == 65 and out["workload"]["max_output"] == 9


@pytest.mark.parametrize("args, says", [
    (("--gpu", "H100"), "--prompt TOKENS and --output TOKENS"),
    (("--gpu", "H100", "--prompt", "900-100", "--output", "5"), "runs backwards"),
    (("--gpu", "H100", "--prompt", "100", "--output", "5", "--shared-prefix", "200"), "longer than the shortest prompt"),
    (("--gpu", "H100", "--prompt", "100", "--output", "5", "--engine", "sglang"), "accepted: vllm"),
    (("--gpu", "H100", "--prompt", "100", "--output", "5", "--tpot", "30ms"), "--tpot and --ttft need --users"),
    (("--gpu", "H100", "--prompt", "100", "--output", "5", "--users", "3", "--tpot", "fast"), "is not a time"),
    (("--gpu", "H100", "--prompt", "100", "--output", "5", "--bandwidth", "lots"), "is not a bandwidth"),
    (("--gpu", "H100", "--prompt", "4000", "--output", "5", "--max-model-len", "2048"), "max_model_len is 2,048"),
    (("--gpu", "T4", "--prompt", "100", "--output", "5"), "leave no KV memory"),
    (("--gpu", "H100", "--requests-file", "/nonexistent.csv"), "no such file"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    err = plan("llama-3.1-8b", *args, code=2)
    assert says in err


def test_bad_request_files(tmp_path):
    f = tmp_path / "bad.csv"
    f.write_text("prompt,completion\n1,2\n")
    assert "accepted names" in plan("llama-3.1-8b", "--gpu", "H100", "--requests-file", str(f), code=2)
    f.write_text('{"prompt_tokens": "x", "output_tokens": 3}\n')
    assert "not a whole number" in plan("llama-3.1-8b", "--gpu", "H100", "--requests-file", str(f), code=2)
    f.write_text('{"prompt_tokens": 3, "output_tokens": 3}\n{oops\n')
    assert "line 2 is not JSON" in plan("llama-3.1-8b", "--gpu", "H100", "--requests-file", str(f), code=2)


@pytest.mark.slow
def test_hybrid_and_sliding_layouts_plan_with_their_caveat():
    out = plan("gpt-oss-20b", "--gpu", "H100", *SMALL, "--json")
    assert out["pool"]["kv_groups"] >= 2 and out["pool"]["prefix_caching"] is True
    assert any("sliding-window groups replayed" in a and "window 128 tokens" in a for a in out["assumptions"])


def test_table_output_names_the_bound():
    text = plan("llama-3.1-8b", "--gpu", "H100", *SMALL, "--users", "100")
    assert "running at once" in text and "decode-step bound by batch" in text and "upper bounds" in text
    text = plan("llama-3.1-8b", "--gpu", "24GB", *SMALL)
    assert "--bandwidth" in text  # a bare size has no bandwidth: the speed side says what it needs


# ---------------------------------------------------------------------------------------------- check keys
CHECK = """\
defaults:
  gpu: H100
  model: llama-3.1-8b
  prompt: 500-3000
  output: 100-800
deployments:
  - name: big
    users: 2000
    tpot: 30ms
    min_running: 150
    max_gpus: {max_gpus}
  - name: small
    requests: 300
    users: 200
    min_running: 150
"""


def _check(tmp_path, text: str):
    f = tmp_path / "kvplan.yaml"
    f.write_text(text)
    return run_cli("check", str(f), "--json")


@pytest.mark.slow
def test_check_gates_on_the_same_figures_plan_prints(tmp_path):
    planned = plan("llama-3.1-8b", "--gpu", "H100", "--prompt", "500-3000", "--output", "100-800", "--users", "2000",
                   "--tpot", "30ms", "--json")
    need = planned["fleet"]["gpus"]
    ok = _check(tmp_path, CHECK.format(max_gpus=need))
    assert ok.code == 0, ok.err
    big = ok.json()["deployments"][0]
    assert big["figures"]["plan"]["fleet"] == planned["fleet"] and big["figures"]["plan"]["run"] == planned["run"]
    kinds = {r["kind"]: r for r in big["requirements"]}
    assert kinds["min_running"]["achievable"] == planned["run"]["p50_running"]
    assert kinds["max_gpus"]["margin"] == {"value": 0, "unit": "GPUs"}
    short = _check(tmp_path, CHECK.format(max_gpus=need - 1))
    assert short.code == 1 and "max_gpus" in short.json()["deployments"][0]["reason"]
    Draft202012Validator(schema("check")).validate(short.json())


@pytest.mark.parametrize("text, says", [
    ("deployments:\n  - {name: a, gpu: H100, model: llama-3.1-8b, prompt: 100}\n", "missing output"),
    ("deployments:\n  - {name: a, gpu: H100, model: llama-3.1-8b, prompt: 100, output: 5, tpot: 30ms}\n",
     "missing users (for tpot)"),
    ("deployments:\n  - {name: a, gpu: H100, model: llama-3.1-8b, prompt: 900-100, output: 5}\n", "runs backwards"),
    ("deployments:\n  - {name: a, gpu: H100, model: llama-3.1-8b, prompt: 100, output: 5, users: 3, tpot: soon}\n",
     "is not a time"),
    ("deployments:\n  - {name: a, gpu: H100, model: llama-3.1-8b, prompt: 100, output: 5, engine: sglang}\n",
     "accepted: vllm"),
])
def test_check_traffic_keys_refuse_bad_values_with_their_line(tmp_path, text, says):
    r = _check(tmp_path, text)
    assert r.code == 2
    problems = r.json()["problems"]
    assert any(says in p["message"] and p["line"] == 2 for p in problems), problems


# ---------------------------------------------------------------------------------------------- prefill bound
def test_prefill_bound_is_two_flops_per_active_linear_parameter_at_the_catalog_rate():
    out = plan("llama-3.1-8b", "--gpu", "H100", "--prompt", "1000", "--output", "10", "-n", "20", "--json")
    pf = out["speed"]["prefill"]
    hidden, kv, inter, layers = 4096, 8 * 128, 14336, 32  # the bundled config's widths
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter  # q, o; k, v; gate, up, down
    assert pf["active_params_per_token"] == layers * per_layer
    assert pf["flops_per_s"] == 989e12 and pf["flops_dtype"] == "bf16"  # H100 SXM dense BF16
    compute = 2 * 1000 * layers * per_layer / 989e12
    assert pf["mean_prompt_seconds"] == pytest.approx(max(compute, out["weight_bytes"] / 3350e9), rel=1e-9)


def test_prefill_of_fp8_weights_uses_the_fp8_rate_and_moe_counts_the_experts_a_token_uses():
    out = plan("qwen3-235b-a22b", "--gpu", "8xH100", "--weight-dtype", "fp8", *SMALL, "--json")
    pf = out["speed"]["prefill"]
    assert pf["flops_dtype"] == "fp8" and pf["flops_per_s"] == 1978e12
    # 94 layers: attention (64 q heads, 4 KV heads of 128) + 8 of 128 experts of 3 x 4096 x 1536, over tp 8
    attn = 2 * 4096 * 64 * 128 + 2 * 4096 * 4 * 128
    experts = 8 * 3 * 4096 * 1536
    assert pf["active_params_per_token"] == round(94 * (attn + experts) / 8)


def test_a_ttft_target_below_the_prefill_bound_cannot_be_met(tmp_path):
    out = plan("llama-3.1-8b", "--gpu", "L4", "--prompt", "8000", "--output", "10", "-n", "20", "--users", "10",
               "--ttft", "50ms", "--json")
    fl = out["fleet"]
    assert fl["ttft_met"] is False and fl["instances"] is None and fl["gpus"] is None
    assert any("no number of instances meets it" in w for w in out["warnings"])
    ok = plan("llama-3.1-8b", "--gpu", "L4", "--prompt", "8000", "--output", "10", "-n", "20", "--users", "10",
              "--ttft", "20s", "--json")["fleet"]
    assert ok["ttft_met"] is True and ok["gpus"] >= 1


# ---------------------------------------------------------------------------------------------- arrival rate
def test_an_idle_engine_serves_each_arrival_in_its_step_bounds():
    """At 0.01 requests/s each request finds the engine empty: its TTFT is exactly its prefill step's bound and its
    TPOT the one decode step's bound (weights + its cache blocks over the bandwidth, or FLOPs over the rate)."""
    out = plan("llama-3.1-8b", "--gpu", "H100", "--prompt", "1000", "--output", "2", "-n", "20", "--rate", "0.01",
               "--json")
    lt, sp = out["latency"], out["speed"]
    assert out["mode"] == "rate" and lt["kept_up"] is True and out["run"]["peak_running"] == 1
    active, flops, bw, bpb = (sp["prefill"]["active_params_per_token"], sp["prefill"]["flops_per_s"],
                              sp["bandwidth_bytes_per_s"], out["pool"]["bytes_per_block"])
    prefill = max((sp["weight_bytes"] + math.ceil(1000 / 16) * bpb) / bw, 2 * 1000 * active / flops)
    decode = max((sp["weight_bytes"] + math.ceil(1001 / 16) * bpb) / bw, 2 * active / flops)
    assert lt["ttft_p50_seconds"] == pytest.approx(prefill, rel=1e-6)  # active is rounded in JSON
    assert lt["tpot_p50_seconds"] == pytest.approx(decode, rel=1e-6)


@pytest.mark.slow
def test_an_overloaded_instance_says_so_and_the_fleet_divides_the_rate():
    out = plan("llama-3.1-8b", "--gpu", "H100", "--prompt", "500-3000", "--output", "100-800", "-n", "400",
               "--rate", "40", "--json")
    assert out["latency"]["kept_up"] is False
    fl = out["fleet"]
    assert fl["rate"] == 40 and fl["instances"] == math.ceil(40 / fl["requests_per_s_per_instance"]) > 1
    light = plan("llama-3.1-8b", "--gpu", "H100", "--prompt", "500-3000", "--output", "100-800", "-n", "400",
                 "--rate", "2", "--json")
    assert light["latency"]["kept_up"] is True and light["fleet"]["instances"] == 1
    assert light["latency"]["requests_per_s"] == pytest.approx(2, rel=0.25)  # it serves what arrives


def test_rate_users_and_burst_are_exclusive():
    err = plan("llama-3.1-8b", "--gpu", "H100", "--prompt", "100", "--output", "5", "--rate", "3", "--users", "4",
               code=2)
    assert "give one" in err
    assert "is not a rate" in plan("llama-3.1-8b", "--gpu", "H100", "--prompt", "100", "--output", "5", "--rate",
                                   "fast", code=2)
    assert "--bandwidth" in plan("llama-3.1-8b", "--gpu", "24GB", "--prompt", "100", "--output", "5", "--rate", "3",
                                 code=2)


@pytest.mark.slow
def test_paged_blocks_against_a_static_cache():
    out = plan("llama-3.1-8b", "--gpu", "H100", "--prompt", "100-3000", "--output", "50-1500", "-n", "300", "--json")
    sc = out["static_comparison"]
    mean_tokens = sc["mean_tokens"]
    assert sc["static_reserved_tokens"] == out["workload"]["longest_request"]  # prompt + output of the longest
    assert sc["static_waste"] == pytest.approx(1 - mean_tokens / sc["static_reserved_tokens"], abs=1e-4)
    assert sc["paged_reserved_tokens"] == pytest.approx(out["mean_request_blocks"] * 16, abs=0.01)
    assert 0 <= sc["paged_waste"] < 0.01 < 0.4 < sc["static_waste"]  # block rounding vs a slot per longest request
    usable_tokens = out["pool"]["usable_blocks"] * 16
    assert sc["static_requests_at_once"] == usable_tokens // sc["static_reserved_tokens"]
    assert plan("gpt-oss-20b", "--gpu", "H100", *SMALL, "--json")["static_comparison"] is None  # windows: no slot model


@pytest.mark.slow
def test_tensor_parallel_all_reduce_over_a_stated_interconnect():
    """Two all-reduces per layer of hidden x 2 B per token, a ring moving 2(tp-1)/tp of them: Llama-3.1-8B over tp 2
    moves 2 x 32 x 4096 x 2 x 2 x 1/2 = 524,288 B per token per GPU. At 0.1 GB/s a step is communication-bound."""
    args = ("llama-3.1-8b", "--gpu", "2xH100", "--prompt", "1000", "--output", "100", "-n", "50", "--json")
    slow = plan(*args, "--interconnect", "0.1")
    sp = slow["speed"]
    assert sp["allreduce_bytes_per_token"] == 2 * 32 * 4096 * 2 * 2 // 2 and sp["interconnect_bytes_per_s"] == 10**8
    for row in sp["by_batch"]:
        assert row["step_seconds"] == pytest.approx(row["batch"] * 524_288 / 1e8, rel=1e-12)
    fast = plan(*args, "--interconnect", "450")["speed"]  # NVLink-class: memory-bound again
    plain = plan(*args)["speed"]
    assert [r["step_seconds"] for r in fast["by_batch"]] == [r["step_seconds"] for r in plain["by_batch"]]
    assert plain["interconnect_bytes_per_s"] is None
    assert any("all-reduce time left out" in a for a in plan(*args)["assumptions"])
