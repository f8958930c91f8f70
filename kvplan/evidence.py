"""How far an estimated KV budget has been from the engine's own, over public start-up logs: the interval `fit`
prints beside a budget the budget model produced.

kvplan/data/budget_evidence.yaml holds, per engine, kvplan's estimated KV budget minus the one the engine printed
for every public log kvplan can predict (tests/data/wild-logs.yaml). `bench/budget_eval.py --evidence` writes it and
tests/test_wild_budget.py holds it to the code, so the interval moves when the budget model does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

EVIDENCE_PATH = Path(__file__).resolve().parent / "data" / "budget_evidence.yaml"
LOW_QUANTILE, HIGH_QUANTILE = 0.1, 0.9  # the central 80% of cases


@dataclass(frozen=True)
class BudgetEvidence:
    engine: str
    errors: tuple[int, ...]  # estimated minus printed KV budget per GPU, bytes, one per distinct setup, ascending
    logs: int  # the logs behind them (a sweep over max_model_len alone repeats one setup's figure exactly)

    @property
    def cases(self) -> int:
        return len(self.errors)

    def central(self) -> tuple[int, int]:
        """(10th, 90th) percentile of the errors (nearest rank)."""
        return _rank(self.errors, LOW_QUANTILE), _rank(self.errors, HIGH_QUANTILE)

    def budget_range(self, estimate: int) -> tuple[int, int]:
        """The KV budgets the engine would print for this estimate, over the central 80% of the logs."""
        lo_err, hi_err = self.central()
        return estimate - hi_err, estimate - lo_err

    def basis(self) -> str:
        lo, hi = self.central()
        worst_lo, worst_hi = self.errors[0], self.errors[-1]
        return (f"80% of {self.cases} setups in {self.logs} public {self.engine} start-up logs put the engine's budget "
                f"{_gib(-hi)} to "
                f"{_gib(-lo)} from kvplan's estimate (all of them {_gib(-worst_hi)} to {_gib(-worst_lo)}; "
                "kvplan/data/budget_evidence.yaml)")


def _rank(values: tuple[int, ...], q: float) -> int:
    i = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[i]


def _gib(b: int) -> str:
    return f"{b / (1 << 30):+.2f} GiB"


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, BudgetEvidence]:
    from kvplan import yaml_files

    if not EVIDENCE_PATH.exists():
        return {}
    doc = yaml_files.load(EVIDENCE_PATH) or {}
    out = {}
    for engine, row in (doc.get("engines") or {}).items():
        values = [int(v) for v in (row.get("errors_bytes") or {}).values()]
        if values:
            out[engine] = BudgetEvidence(engine, tuple(sorted(set(values))), len(values))
    return out


def for_engine(engine: str) -> BudgetEvidence | None:
    return _table().get(engine)


__all__ = ["BudgetEvidence", "for_engine", "EVIDENCE_PATH"]
