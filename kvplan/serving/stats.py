"""What one replay did: running requests over the steady window, preemptions, llama-server's answers, and the
latencies of the step clock; and the closed-loop helpers (enough requests, the window the loop is full in)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.schedule_sim import SimRequest, Trace
from kvplan.workload import Workload

@dataclass(frozen=True)
class RunStats:
    """One replay: what the scheduler did (steps are engine iterations)."""

    requests: int
    steps: int
    peak_running: int
    mean_running: float
    p10_running: int
    p50_running: int
    p90_running: int
    preemptions: int
    preempted_requests: int
    window: tuple[int, int]  # the steps the means are over
    truncated: bool
    answers: dict[str, int] | None = None  # llama-server: peak_deferred and the requests refused, cut and failed

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "steps": self.steps, "peak_running": self.peak_running,
                "mean_running": round(self.mean_running, 2), "p10_running": self.p10_running,
                "p50_running": self.p50_running, "p90_running": self.p90_running, "preemptions": self.preemptions,
                "preempted_requests": self.preempted_requests, "window_steps": list(self.window),
                "truncated": self.truncated, **(self.answers or {})}


def run_stats(trace: Trace, requests: int, window: tuple[int, int] | None = None) -> RunStats:
    lo, hi = window or (0, len(trace.steps))
    hi = max(hi, lo + 1)
    running = sorted(s.running for s in trace.steps[lo:hi]) or [0]

    def pct(q: float) -> int:
        return running[min(len(running) - 1, int(q * len(running)))]

    inside = [p for p in trace.preemptions if lo <= p[0] < hi]
    answers = None
    if hasattr(trace, "outcomes"):  # llama-server (slot_sim.ServerTrace): over the whole replay
        answers = {"peak_deferred": trace.peak_deferred, "refused_requests": trace.count("rejected"),
                   "cut_requests": trace.count("cut"), "failed_requests": trace.count("failed"),
                   "kv_exhaustions": len(trace.failures)}
    return RunStats(requests, len(trace.steps), trace.peak_running, sum(running) / len(running), pct(0.1), pct(0.5),
                    pct(0.9), len(inside), len({i for _, i in inside}), (lo, hi), trace.truncated, answers)


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """n arrival times of a Poisson process at `rate` requests per second (fixed seed: the same plan each run)."""
    import random

    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def latency_stats(trace: Trace, reqs: list[SimRequest], rate: float | None,
                  window: tuple[int, int] | None = None) -> dict[str, Any]:
    """Time to first token and time per output token per request (from the step clock), throughput, and whether
    an arrival process is kept up with (the queue does not grow: the last quarter's TTFT stays near the first's)."""
    clock = trace.clock
    idx = [i for i in trace.finished_at if window is None or window[0] <= trace.finished_at[i] < window[1]]
    ttft = [clock[trace.first_token_at[i]] - trace.arrived_at[i] for i in idx if i in trace.arrived_at]
    outcomes = getattr(trace, "outcomes", None)  # llama-server: a request cut at its slot's context made fewer
    made = {i: outcomes[i].generated if outcomes else reqs[i].output for i in idx}
    tpot = [(clock[trace.finished_at[i]] - clock[trace.first_token_at[i]]) / (made[i] - 1)
            for i in idx if made[i] > 1]
    lo = clock[window[0] - 1] if window and window[0] > 0 else 0.0
    hi = clock[window[1] - 1] if window else (clock[-1] if clock else 0.0)
    span = max(hi - lo, 1e-12)
    out_tokens = sum(made.values())
    stats: dict[str, Any] = {
        "ttft_p50_seconds": _pct(ttft, 0.5), "ttft_p90_seconds": _pct(ttft, 0.9), "ttft_p99_seconds": _pct(ttft, 0.99),
        "tpot_p50_seconds": _pct(tpot, 0.5), "tpot_p90_seconds": _pct(tpot, 0.9),
        "requests_per_s": len(idx) / span, "output_tokens_per_s": out_tokens / span, "seconds": span,
    }
    if rate is not None:
        order = sorted(trace.arrived_at, key=trace.arrived_at.get)
        q = max(1, len(order) // 4)
        first = [clock[trace.first_token_at[i]] - trace.arrived_at[i] for i in order[:q]]
        last = [clock[trace.first_token_at[i]] - trace.arrived_at[i] for i in order[-q:]]
        mean_first, mean_last = sum(first) / len(first), sum(last) / len(last)
        stats["kept_up"] = not (mean_last > 3 * mean_first and mean_last - mean_first > 1.0)
    return stats


def enough_requests(workload: Workload, n: int) -> list[SimRequest]:
    reqs = list(workload.requests)
    while len(reqs) < n:
        reqs += workload.requests
    return reqs[:max(n, len(workload.requests))]


def steady_window(trace: Trace, users: int, total: int) -> tuple[int, int]:
    """From the first request's end to the step the last request arrives (the loop is full in between)."""
    if not trace.finished_at:
        return 0, len(trace.steps)
    start = min(trace.finished_at.values())
    ends = sorted(trace.finished_at.values())
    k = total - users - 1
    stop = ends[k] if 0 <= k < len(ends) else len(trace.steps)
    return (start, stop) if stop > start else (0, len(trace.steps))


SATURATION_ROUNDS = 3  # requests per user in the saturated closed loop (the first round warms up, the last drains)
