"""`kvplan plan`'s answer: the pool, the replay's statistics, the speed bounds, the fleet, and its JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan import JSON_SCHEMA
from kvplan.serving.pools import Pool, computed_max, computed_mean, static_comparison
from kvplan.serving.speed import PrefillModel, SpeedModel, SpeedRow
from kvplan.serving.stats import RunStats
from kvplan.workload import Workload

@dataclass(frozen=True)
class PlanReport:
    fit: Any  # planner.FitResult the pool comes from
    pool: Pool
    workload: Workload
    mode: str  # burst | users
    users: int | None
    run: RunStats
    mean_request_blocks: float
    speed: SpeedModel | None
    speed_table: tuple[SpeedRow, ...]
    step_bound: float | None  # the replay's median decode-step bound, seconds
    crossover_batch: int | None
    tpot_target: float | None
    fleet: dict[str, Any] | None
    assumptions: tuple[str, ...]
    warnings: tuple[str, ...]
    prefill: PrefillModel | None = None
    latency: dict[str, Any] | None = None
    rate: float | None = None

    @property
    def static(self) -> dict[str, Any] | None:
        if not isinstance(self.pool, Pool):  # llama.cpp: a slot's context is itself a static reservation
            return None
        return static_comparison(self.pool, self.workload, self.mean_request_blocks)

    @property
    def prefill_seconds(self) -> tuple[float, float] | None:
        """The prefill bound for the mean and the longest prompt a request computes (None without a bound)."""
        if self.prefill is None or self.speed is None:
            return None
        return (self.prefill.seconds(round(computed_mean(self.workload, self.pool)), self.speed),
                self.prefill.seconds(computed_max(self.workload, self.pool), self.speed))

    def to_json(self) -> dict[str, Any]:
        f = self.fit
        out = {
            "schema": JSON_SCHEMA, "model": f.setup.ref.to_json(), "engine": f.setup.engine.label,
            "gpu": f.gpu.to_json(), "tp": f.setup.tp, "pp": f.setup.pp, "kv_dtype": f.setup.kvd.label,
            "weight_bytes": f.weight_bytes, "workload": self.workload.to_json(), "mode": self.mode,
            "users": self.users, "pool": self.pool.to_json(), "run": self.run.to_json(),
            "mean_request_blocks": round(self.mean_request_blocks, 3),
            "static_comparison": self.static,
            "speed": None, "fleet": self.fleet, "rate": self.rate, "latency": self.latency,
            "assumptions": list(self.assumptions), "warnings": list(self.warnings),
        }
        if self.speed is not None:
            out["speed"] = {**self.speed.to_json(), "step_seconds_bound": self.step_bound,
                            "tokens_per_s_per_request_bound": round(1 / self.step_bound, 3) if self.step_bound else None,
                            "cache_over_weights_from_batch": self.crossover_batch,
                            "by_batch": [r.to_json() for r in self.speed_table],
                            "prefill": self.prefill.to_json(*self.prefill_seconds)
                            if self.prefill is not None else None}
        return out
