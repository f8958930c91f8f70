"""`kvplan plan --engine llamacpp`: llama-server b11434's slot rules (kvplan/slot_sim.py) on hand-worked cases read
in its source (tools/server/server-context.cpp, server-queue.cpp; src/llama-context.cpp, src/llama-kv-cache.cpp),
and the plan built on them: the deployment's flags against `fit`, the cells and bytes against the config's
arithmetic, refusals. (llama-server itself checks the replay iteration by iteration:
tests/test_llamacpp_sched_oracle.py.)
"""

from __future__ import annotations

import math

import pytest

from conftest import run_cli
from kvplan.schedule_sim import SimRequest
from kvplan.slot_sim import ServerSettings, simulate
from kvplan.workload import Lengths, sampled
from test_plan import plan

# -np 4 -c 2048: n_ctx_seq = PAD(2048 / 4, 256) = 512 cells per slot (llama_context ctor)
SLOTS = ServerSettings(n_slots=4, n_ctx=2048, n_ctx_slot=512, unified=False, n_batch=2048)


def kinds(trace) -> dict[int, tuple[str, int]]:
    return {i: (o.kind, o.generated) for i, o in trace.outcomes.items()}


# ---------------------------------------------------------------------------------------------- slot rules
def test_a_slot_refuses_a_prompt_of_its_context_and_cuts_at_it():
    """pre_decode: task.n_tokens >= n_ctx_slot is refused; process_token stops when tokens + 1 >= n_ctx_slot, so a
    prompt P gets min(n_predict, n_ctx_slot - P) tokens."""
    reqs = [SimRequest(512, 5), SimRequest(511, 5), SimRequest(500, 50), SimRequest(462, 50)]
    t = simulate(SLOTS, reqs)
    assert kinds(t) == {0: ("rejected", 0), 1: ("cut", 1), 2: ("cut", 12), 3: ("done", 50)}


def test_slots_bound_what_runs_and_the_rest_wait_deferred():
    t = simulate(SLOTS, [SimRequest(100, 60)] * 10)
    assert t.peak_running == 4 and t.steps[0].waiting == 6 and t.peak_deferred == 6
    assert [s.running for s in t.steps[:60]] == [4] * 60  # the first four end together at step 59
    # 3 rounds of 4, 4, 2: each a prefill step and 59 decode steps
    assert len(t.steps) == 3 * 60 and t.decodes == 180
    assert all(o.kind == "done" and o.generated == 60 for o in t.outcomes.values())


def test_lru_takes_the_highest_idle_slot_and_tasks_freed_together_start_in_reverse():
    """get_available_slot: `slot.t_last_used <= t_last` keeps the last of equals (all -1 at start: slot N-1 first).
    pop_deferred_task puts each freed task at the FRONT of the queue, so two freed in one iteration start in
    reverse; each takes the least recently used slot."""
    st = ServerSettings(n_slots=2, n_ctx=1024, n_ctx_slot=512, unified=False, n_batch=1024)
    t = simulate(st, [SimRequest(50, 10)] * 4)
    slot = {i: o.slot for i, o in t.outcomes.items()}
    assert slot[0] == 1 and slot[1] == 0
    # both end at step 9; slot 0 is released first (post_decode runs in slot order), so it is the least recently
    # used: request 3 (popped second, queued first) takes it
    assert slot[3] == 0 and slot[2] == 1


def test_prompts_fill_the_batch_in_slot_order_and_chunk():
    """update_slots: generating tokens first, then prompt tokens slot by slot while the batch has room."""
    st = ServerSettings(n_slots=2, n_ctx=1024, n_ctx_slot=512, unified=False, n_batch=512)
    t = simulate(st, [SimRequest(400, 3), SimRequest(400, 3)])
    # request 0 sits in slot 1, request 1 in slot 0: slot 0's prompt goes first (400), slot 1 gets 112 of its 400
    assert t.first_token_at == {1: 0, 0: 1}
    assert [s.scheduled_tokens for s in t.steps[:2]] == [512, 1 + 288]


def test_a_slot_reuses_the_shared_prefix_it_holds():
    """Similarity selection: an idle slot whose cached tokens share more than 10% of the prompt; the prompt then
    reuses the common prefix (cache_prompt). Without a match the LRU slot's copy comes from the RAM cache."""
    st = ServerSettings(n_slots=2, n_ctx=2048, n_ctx_slot=1024, unified=False, n_batch=2048)
    t = simulate(st, [SimRequest(600, 10, 256) for _ in range(6)])
    cached = [t.outcomes[i].cached for i in range(6)]
    assert cached == [0, 0, 256, 256, 256, 256]
    off = simulate(ServerSettings(2, 2048, 1024, False, 2048, cache_prompt=False), [SimRequest(600, 10, 256)] * 6)
    assert all(o.cached == 0 for o in off.outcomes.values())
    tokens = [sum(st.scheduled_tokens for st in tr.steps) for tr in (off, t)]
    assert tokens[0] - tokens[1] == 4 * 256  # the prefix computed again by the four later requests


def test_a_unified_cache_that_runs_out_fails_every_request_in_flight():
    """Two requests of 200 + 200 in 512 shared cells: 400 after the prefill step, 2 more each step; at step 57 the
    two sampled tokens find no cell, the batch halves to one token, which fails: "Context size has been exceeded."
    releases both (57 tokens sampled each)."""
    st = ServerSettings(n_slots=2, n_ctx=512, n_ctx_slot=512, unified=True, n_batch=512)
    t = simulate(st, [SimRequest(200, 200)] * 2)
    assert t.failures == [57] and kinds(t) == {0: ("failed", 57), 1: ("failed", 57)}
    assert t.attempts[57] == [(0, 512), (0, 256), (0, 128), (0, 64), (0, 32), (0, 16), (0, 8), (0, 4), (0, 2),
                              (0, 1)]
    separate = simulate(ServerSettings(2, 1024, 512, False, 1024), [SimRequest(200, 200), SimRequest(201, 200)])
    assert {o.kind for o in separate.outcomes.values()} == {"done"}


def test_an_idle_slots_cached_prompt_is_cleared_before_the_batch_shrinks():
    """try_clear_idle_slots: a unified cache first drops an idle slot's cached tokens (here kept: no RAM prompt
    cache, so idle slots are not cleared at launch), then retries the same batch."""
    st = ServerSettings(n_slots=2, n_ctx=512, n_ctx_slot=512, unified=True, n_batch=512, cache_ram_tokens=None)
    t = simulate(st, [SimRequest(300, 1), SimRequest(400, 2, arrival_step=1)])
    assert kinds(t) == {0: ("done", 1), 1: ("done", 2)} and not t.failures
    assert t.attempts[1] == [(0, 512), (0, 512)]  # failed once, cleared slot 1's 300 tokens, fitted


def test_a_closed_loop_keeps_one_request_per_user():
    t = simulate(SLOTS, [SimRequest(100, 20)] * 12, users=3)
    assert t.peak_running == 3 and t.peak_deferred == 0 and t.count("done") == 12


# ---------------------------------------------------------------------------------------------- the plan
PER_CELL = 32 * 2 * 8 * 128 * 2  # Llama-3.1-8B: 32 layers, K and V of 8 heads x 128 in f16


def test_plan_deploys_what_fit_suggests_and_sizes_its_cells():
    args = ("llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp", "--prompt", "1000-3000", "--output",
            "100-700", "-n", "120")
    out = plan(*args, "--burst", "--json")
    pool, run = out["pool"], out["run"]
    longest = out["workload"]["longest_request"]
    fitted = run_cli("fit", "llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp", "--ctx", str(longest),
                     "--json").json()["results"][0]
    slots = fitted["max_batch"]
    assert pool["flags"] == f"-np {slots} -c {slots * longest}" and pool["slots"] == slots
    per_slot = math.ceil(math.ceil(slots * longest / 256) * 256 / slots / 256) * 256  # PAD(PAD(c, 256) / np, 256)
    assert pool["ctx_per_slot"] == per_slot and pool["ctx_size"] == slots * per_slot and pool["streams"] == slots
    assert pool["bytes_per_block"] == PER_CELL and pool["kv_bytes"] == PER_CELL * slots * per_slot
    assert pool["kv_bytes"] <= pool["kv_budget_bytes"] and pool["kv_unified"] is False
    # a burst of 120: every slot busy, the rest deferred; nothing refused, cut or failed
    assert run["peak_running"] == slots and run["peak_deferred"] == 120 - slots
    assert run["refused_requests"] == run["cut_requests"] == run["failed_requests"] == 0
    assert out["static_comparison"] is None


def test_plan_counts_the_prompts_a_slot_refuses_and_the_outputs_it_cuts():
    # -np 4 -c 4096: 1,024 tokens a slot
    out = plan("llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp", "--prompt", "900-1100", "--output", "50",
               "-n", "40", "--burst", "-np", "4", "-c", "4096", "--json")
    work = sampled(40, Lengths(900, 1100), Lengths(50, 50))  # the same draw (seed 0)
    refused = sum(1 for r in work.requests if r.prompt >= 1024)
    cut = sum(1 for r in work.requests if r.prompt < 1024 < r.prompt + r.output)
    assert out["pool"]["ctx_per_slot"] == 1024 and refused and cut
    assert out["run"]["refused_requests"] == refused and out["run"]["cut_requests"] == cut
    assert any("refuses them" in w for w in out["warnings"]) and any("stops them there" in w for w in out["warnings"])


def test_an_oversubscribed_unified_cache_fails_requests_and_separate_streams_do_not():
    base = ("llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp", "--prompt", "1000-3000", "--output",
            "200-800", "-n", "60", "--burst", "-np", "8", "-c", "12k", "--json")
    unified = plan(*base, "--kv-unified")
    assert unified["pool"]["kv_unified"] and unified["pool"]["ctx_per_slot"] == 12288
    assert unified["run"]["failed_requests"] > 0 and unified["run"]["kv_exhaustions"] > 0
    assert any("Context size has been exceeded" in w for w in unified["warnings"])
    separate = plan(*base)  # 8 streams of 1,536 cells: no request can take another's cells, long ones are refused
    assert separate["run"]["failed_requests"] == 0 and separate["pool"]["ctx_per_slot"] == 1536
    assert separate["run"]["refused_requests"] > 0


def test_an_idle_server_serves_each_arrival_in_its_step_bounds():
    """One request at a time: its prefill step holds its 1,000 prompt cells, its decode step 1,001 (cells, not
    blocks), each over the H100's bandwidth, or its FLOPs over the dense rate."""
    out = plan("llama-3.1-8b", "--gpu", "H100", "--engine", "llamacpp", "--prompt", "1000", "--output", "2", "-n",
               "20", "--rate", "0.01", "--json")
    lt, sp = out["latency"], out["speed"]
    active, flops, bw = sp["prefill"]["active_params_per_token"], sp["prefill"]["flops_per_s"], sp["bandwidth_bytes_per_s"]
    prefill = max((sp["weight_bytes"] + 1000 * PER_CELL) / bw, 2 * 1000 * active / flops)
    decode = max((sp["weight_bytes"] + 1001 * PER_CELL) / bw, 2 * active / flops)
    assert lt["ttft_p50_seconds"] == pytest.approx(prefill, rel=1e-6)
    assert lt["tpot_p50_seconds"] == pytest.approx(decode, rel=1e-6)


def test_users_per_instance_are_the_slots():
    out = plan("llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp", "--prompt", "500", "--output", "100", "-n",
               "50", "--users", "40", "-np", "6", "--json")
    assert out["users"] == 6 and out["run"]["p50_running"] == 6
    assert out["fleet"]["users_per_instance"] == 6 and out["fleet"]["instances"] == math.ceil(40 / 6)


def test_table_output_names_the_flags_and_the_answers():
    text = plan("llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp", "--prompt", "500", "--output", "100",
                "-n", "30", "--burst", "-np", "4", "-c", "4096")
    assert "-np 4 -c 4096" in text and "deferred" in text and "refused" in text


@pytest.mark.parametrize("args, says", [
    (("-np", "300"), "at most 256 sequences"),
    (("-np", "40"), "llama.cpp's KV cache takes"),
    (("-np", "0"), "--parallel"),
    (("--engine", "vllm", "-np", "4"), "applies to llamacpp"),
    (("--engine", "llamacpp@b5000"), "is not modelled"),
])
def test_bad_llamacpp_plans_are_one_line_and_exit_2(args, says):
    base = ("llama-3.1-8b", "--gpu", "RTX-4090", "--prompt", "3000", "--output", "500", "-n", "10")
    engine = () if "--engine" in args else ("--engine", "llamacpp")
    assert says in plan(*base, *engine, *args, code=2)


def test_fit_caps_its_batch_at_the_slots_and_leaves_ctx_size_to_plan():
    out = run_cli("fit", "llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp", "--ctx", "4k", "-np", "6",
                  "--json").json()["results"][0]
    assert out["engine_batch_cap"] == 6 and out["max_batch"] == 6
    r = run_cli("fit", "llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp", "--ctx-size", "8k")
    assert r.code == 2 and "read by kvplan plan" in r.err and r.err.count("\n") == 1


def test_check_plans_a_llamacpp_deployment(tmp_path):
    f = tmp_path / "kvplan.yaml"
    f.write_text("deployments:\n  - {name: a, gpu: RTX-4090, model: llama-3.1-8b, engine: llamacpp, prompt: 500,"
                 " output: 100, requests: 40, users: 20, parallel: 6, min_running: 6}\n")
    r = run_cli("check", str(f), "--json")
    assert r.code == 0, r.err
    assert r.json()["deployments"][0]["figures"]["plan"]["pool"]["slots"] == 6
