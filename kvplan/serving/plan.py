"""`kvplan plan`: for a workload on a GPU, how many requests run at once, how fast each decodes (a bound), and how
many GPUs N users need at a target time per output token.

Memory side: the engine's own pool (the same budget and block layout `fit` solves with) replayed request by
request through vLLM's scheduler (schedule_sim.py): admissions, block growth, preemptions, shared prefix blocks;
or, with --engine llamacpp, through llama-server's slots (slot_sim.py): -np slots over the cells of -c, deferral,
requests refused or cut by their slot's context, and a unified cache running out of cells (setup.py builds either
from the engine's view of its pool). Speed side: a memory-bandwidth bound per decode step (speed.py).
"""

from __future__ import annotations

import math
from typing import Any

from kvplan.errors import InputError
from kvplan.gpus import GpuSelection
from kvplan.serving.pools import computed_max, mean_request_blocks, server_warnings
from kvplan.serving.report import PlanReport
from kvplan.serving.setup import SETUPS
from kvplan.serving.speed import (ACTIVATION_BYTES, SpeedModel, crossover, prefill_model, speed_model, speed_rows,
                                  step_timer)
from kvplan.serving.stats import (SATURATION_ROUNDS, RunStats, enough_requests, latency_stats, poisson_arrivals,
                                  run_stats, steady_window)
from kvplan.sizing import EngineOptions, ModelOptions
from kvplan.workload import Workload


def plan(mo: ModelOptions, eo: EngineOptions, gpu: GpuSelection, workload: Workload, *, users: int | None = None,
         tpot: float | None = None, bandwidth: float | None = None, kv_budget: int | None = None,
         reserve: int | None = None, tp: int | None = None, pp: int | None = None, burst: bool = False,
         ttft: float | None = None, rate: float | None = None, interconnect: float | None = None,
         calibrations: tuple = ()) -> PlanReport:
    """burst: every workload request arrives at once (a benchmark run). Otherwise a closed loop: `users` users (or,
    without users, enough to saturate one instance) each keep one request in the system."""
    from kvplan import engines
    from kvplan.engines.listing import LISTINGS, replaying

    if rate is not None and (users is not None or burst):
        raise InputError("--rate, --users and --burst are three ways to state the load (an arrival rate, a closed "
                         "loop of users, everything at once); give one")
    engine = engines.choose(eo.engine)
    row = LISTINGS[engine.name]
    if not row.replay_pool:
        names = replaying()
        raise InputError(f"plan replays {' and '.join(LISTINGS[n].replays for n in names)}; --engine {eo.engine} is "
                         f"not modelled yet (accepted: {', '.join(names)})")
    ready = SETUPS[row.replay_pool](engine.module, mo, eo, gpu, workload, kv_budget, reserve, tp, pp, calibrations)
    fit, pool, replay, seqs, assumptions, warnings = (ready.fit, ready.pool, ready.replay, ready.seqs,
                                                      ready.assumptions, ready.warnings)
    s = fit.setup
    mean_blocks = mean_request_blocks(pool, workload)
    speed, table, step_bound, cross = None, (), None, None
    bw, bw_source = (round(bandwidth), "--bandwidth") if bandwidth else (
        (round(gpu.gpu.bandwidth_gbps * 1e9), f"{gpu.gpu.name} vendor peak {gpu.gpu.bandwidth_gbps:g} GB/s")
        if gpu.gpu.bandwidth_gbps else (None, ""))
    stage = s.prepared.limiting_stage(fit.ctx)
    if bw:
        speed = speed_model(s, stage, bw, bw_source, pool.bytes_per_block, interconnect)
        if speed.link:
            assumptions.append(f"tensor parallel {s.tp}: two all-reduces per layer of hidden x {ACTIVATION_BYTES} B per "
                               f"token, a ring moving 2(tp-1)/tp of them over --interconnect {speed.link / 1e9:g} GB/s "
                               "per GPU; a step lasts the longest of its memory, compute and communication bounds "
                               "(they may overlap)")
        elif s.tp > 1:
            assumptions.append(f"tensor parallel {s.tp}: all-reduce time left out of every bound (--interconnect GB/s "
                               "adds it)")
    else:
        warnings.append(f"no memory bandwidth for {gpu.requested}: the speed side needs --bandwidth GB/s")
    prefill = prefill_model(s, stage, gpu.gpu) if speed is not None else None
    timing = step_timer(speed, prefill, pool.bytes_per_block) if speed is not None else None
    if rate is not None and timing is None:
        raise InputError(f"--rate needs step times, which need a memory bandwidth for {gpu.requested} (--bandwidth GB/s)")
    latency = None
    if rate is not None:
        reqs = list(workload.requests)
        trace = replay(reqs, arrivals=poisson_arrivals(len(reqs), rate), step_seconds=timing)
        run = run_stats(trace, len(reqs))
        latency = latency_stats(trace, reqs, rate)
        mode, loop_users = "rate", None
    elif burst:
        reqs = list(workload.requests)
        trace = replay(reqs, step_seconds=timing)
        run = run_stats(trace, len(reqs))
        latency = latency_stats(trace, reqs, None) if timing else None
        mode, loop_users = "burst", None
    else:
        saturating = pool.saturating_users(mean_blocks)
        loop_users = min(users, saturating) if users is not None else saturating
        reqs = enough_requests(workload, loop_users * SATURATION_ROUNDS)
        trace = replay(reqs, users=loop_users, step_seconds=timing)
        run = run_stats(trace, len(reqs), steady_window(trace, loop_users, len(reqs)))
        latency = latency_stats(trace, reqs, None, run.window) if timing else None
        mode = "users"
    if run.answers:
        warnings += server_warnings(run.answers, pool, run.requests)
    if speed is not None:
        per_req = mean_blocks * pool.bytes_per_block
        top = max(1, min(seqs, int(pool.usable_blocks / max(mean_blocks, 1e-9))))
        table = tuple(speed_rows(speed, per_req, top))
        cross = crossover(speed, per_req)
        bounds = sorted(speed.step_seconds(st.decoding, st.held_blocks * pool.bytes_per_block)
                        for st in trace.steps[run.window[0]:run.window[1]] if st.decoding)
        step_bound = bounds[len(bounds) // 2] if bounds else None
        assumptions.append("decode speed: a memory-bandwidth bound, (weights read + cache blocks held by running "
                           "requests) / bandwidth per step; compute, all-reduce and kernel efficiency left out, so "
                           "tokens/s are upper bounds" + (", routed experts touched by a batch under uniform "
                                                          "routing" if speed.expert_bytes else ""))
    if prefill is not None:
        assumptions.append(f"prefill: at least 2 FLOPs per active linear parameter per prompt token at the GPU's dense "
                           f"{prefill.dtype} rate (attention scores left out), and no faster than its weights read; "
                           "a lower bound on time to first token, queueing left out"
                           + (", cached shared-prefix blocks not recomputed" if workload.shared_prefix and pool.prefix_caching else ""))
    elif speed is not None:
        warnings.append(f"no dense TFLOPS for {gpu.gpu.name} in the catalog: no prefill bound")
    if latency is not None:
        assumptions.append("latencies and throughput: each engine step takes its bound (the longer of its bytes over "
                           "the bandwidth and its tokens' FLOPs over the dense rate), so they are the best the engine "
                           "could do: real ones are longer")
    if (tpot is not None or ttft is not None) and users is None:
        raise InputError("--tpot and --ttft need --users N (the users to serve at those targets)")
    if ttft is not None and prefill is None:
        raise InputError(f"--ttft needs the GPU's dense TFLOPS, which the catalog lacks for {gpu.requested}")
    fleet = None
    if users is not None and not burst:
        fleet = _fleet(users, tpot, run, speed, mean_blocks * pool.bytes_per_block, fit, seqs)
        if ttft is not None:
            longest_prefill = prefill.seconds(computed_max(workload, pool), speed)
            fleet["ttft_seconds"] = ttft
            fleet["ttft_met"] = longest_prefill <= ttft
            if not fleet["ttft_met"]:
                fleet["users_per_instance"], fleet["instances"], fleet["gpus"] = 0, None, None
                warnings.append(f"the longest prompt's prefill alone takes at least {longest_prefill * 1e3:.1f} ms on "
                                f"one instance, above --ttft {ttft * 1e3:g} ms: no number of instances meets it "
                                "(more tensor parallelism or a faster GPU would)")
    if rate is not None:
        # what one instance sustains: the saturated closed loop's completions per second
        saturating = pool.saturating_users(mean_blocks)
        sat_reqs = enough_requests(workload, saturating * SATURATION_ROUNDS)
        sat = replay(sat_reqs, users=saturating, step_seconds=timing)
        sat_stats = latency_stats(sat, sat_reqs, None, run_stats(sat, len(sat_reqs),
                                                                   steady_window(sat, saturating, len(sat_reqs))).window)
        per_instance = sat_stats["requests_per_s"]
        instances = math.ceil(rate / per_instance) if per_instance else None
        gpus_per_instance = s.tp * s.pp
        fleet = {"users": None, "tpot_seconds": tpot, "users_per_instance_memory": None, "users_per_instance_speed": None,
                 "users_per_instance": None, "gpus_per_instance": gpus_per_instance, "instances": instances,
                 "gpus": instances * gpus_per_instance if instances else None, "rate": rate,
                 "requests_per_s_per_instance": per_instance}
    return PlanReport(fit, pool, workload, mode, loop_users, run, mean_blocks, speed, table, step_bound, cross, tpot,
                      fleet, tuple(assumptions + list(fit.assumptions)), tuple(warnings), prefill, latency, rate)


def _fleet(need: int, tpot: float | None, run: RunStats, speed: SpeedModel | None, per_request_cache: float,
           fit, seqs: int) -> dict[str, Any]:
    """Users one engine instance serves at once (memory: the saturated replay's median running requests; speed:
    the largest batch whose step bound meets the target), and instances and GPUs for `need` users."""
    by_memory = max(0, min(run.p50_running, seqs))
    by_speed = None
    if tpot is not None and speed is not None:
        by_speed = 0
        lo, hi = 1, max(1, seqs)
        if speed.step_seconds(1, per_request_cache) <= tpot:
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if speed.step_seconds(mid, mid * per_request_cache) <= tpot:
                    lo = mid
                else:
                    hi = mid - 1
            by_speed = lo
    per_instance = by_memory if by_speed is None else min(by_memory, by_speed)
    gpus_per_instance = fit.setup.tp * fit.setup.pp
    instances = math.ceil(need / per_instance) if per_instance else None
    return {"users": need, "tpot_seconds": tpot, "users_per_instance_memory": by_memory,
            "users_per_instance_speed": by_speed, "users_per_instance": per_instance,
            "gpus_per_instance": gpus_per_instance, "instances": instances,
            "gpus": instances * gpus_per_instance if instances else None}
