"""How far an estimated KV budget has been from the engine's own, over public start-up logs: the interval `fit`
prints beside a budget the budget model produced.

kvplan/data/budget_evidence.json holds, per engine, kvplan's estimated KV budget minus the one the engine printed
for every public log kvplan can predict (tests/data/wild-logs.yaml). `bench/budget_eval.py --evidence` writes it and
tests/test_wild_budget.py holds it to the code, so the interval moves when the budget model does.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

EVIDENCE_PATH = Path(__file__).resolve().parent / "data" / "budget_evidence.json"  # fields: data/README.md
# the file as `fit` names it in the basis of its "likely" range
SHOWN_PATH = "kvplan/data/budget_evidence.json"
LOW_QUANTILE, HIGH_QUANTILE = 0.1, 0.9  # the central 80% of cases


@dataclass(frozen=True)
class BudgetEvidence:
    """How far kvplan's KV budget landed from engines' printed ones in public logs (fit's caution interval)."""
    engine: str
    errors: tuple[int, ...]  # estimated minus printed KV budget per GPU, bytes, one per distinct setup, ascending
    logs: int  # the logs behind them (a sweep over max_model_len alone repeats one setup's figure exactly)
    cases: tuple[tuple[str, str, int, int], ...] = ()  # (log id, catalog GPU, tp, error bytes), every log

    @property
    def setups(self) -> int:
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
        return (f"80% of {self.setups} setups in {self.logs} public {self.engine} start-up logs put the engine's budget "
                f"{_gib(-hi)} to "
                f"{_gib(-lo)} from kvplan's estimate (all of them {_gib(-worst_hi)} to {_gib(-worst_lo)}; "
                f"{SHOWN_PATH})")


    def caution(self, gpu: str, tp: int) -> str | None:
        """A warning where the evidence says little or worse about this GPU: no public log on it (the non-KV terms
        were never checked there), or logs on it outside the central 80% (named, with their error)."""
        on_gpu = [c for c in self.cases if c[1] == gpu]
        if not on_gpu:
            covered = sorted({c[1] for c in self.cases})
            return (f"no public {self.engine} start-up log on {gpu} is in kvplan's evidence (it has {', '.join(covered)}): "
                    "the estimate of the memory besides weights and KV (activation peak, non-torch memory, CUDA "
                    "graphs) is unchecked on this GPU and may miss by more than the likely range")
        lo, hi = self.central()
        outside = [c for c in on_gpu if not lo <= c[3] <= hi]
        parts = []
        if outside:
            shown = "; ".join(f"{cid} (tp {t}): {_gib(-e)}" for cid, _, t, e in outside[:3])
            fewer = all(c[3] > 0 for c in outside)
            parts.append(f"on {gpu}, {len(outside)} of {len(on_gpu)} public {self.engine} logs put the engine's budget "
                         f"outside the likely range, from kvplan's estimate: {shown}"
                         + ("; expect fewer tokens than estimated" if fewer else ""))
        if tp > 1 and not any(c[2] > 1 for c in on_gpu):
            parts.append(f"no public {self.engine} log on {gpu} used tensor parallelism: its all-reduce buffers are "
                         "estimated from other GPUs")
        return "; ".join(parts) or None


def _rank(values: tuple[int, ...], q: float) -> int:
    i = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[i]


def _gib(b: int) -> str:
    return f"{round(b / (1 << 30), 2) + 0.0:+.2f} GiB"  # + 0.0: no "-0.00"


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, BudgetEvidence]:
    if not EVIDENCE_PATH.exists():
        return {}
    doc = json.loads(EVIDENCE_PATH.read_text(encoding="utf-8")) or {}
    out = {}
    for engine, row in (doc.get("engines") or {}).items():
        errors = {k: int(v) for k, v in (row.get("errors_bytes") or {}).items()}
        setups = row.get("setups") or {}
        cases = tuple((k, str(setups.get(k, {}).get("gpu", "")), int(setups.get(k, {}).get("tp", 1)), e)
                      for k, e in errors.items())
        if errors:
            out[engine] = BudgetEvidence(engine, tuple(sorted(set(errors.values()))), len(errors), cases)
    return out


def for_engine(engine: str) -> BudgetEvidence | None:
    return _table().get(engine)


__all__ = ["BudgetEvidence", "for_engine", "EVIDENCE_PATH"]
