"""What public start-up logs say about the budget model: the shift `fit` applies to an estimated KV budget and the
range it prints beside it.

kvplan/data/budget_evidence.json holds, per engine, kvplan's raw estimate of the KV budget minus the one the engine
printed, for every public log kvplan can predict (tests/data/wild-logs.yaml), with the log's source, engine version,
GPU and parallelism. `bench/budget_eval.py --evidence` writes it; tests/test_wild_budget.py holds it to the code.

For a setup, the evidence of its class is used: the same model kind (dense, MoE, multimodal), engine era, GPU tier
and parallelism (tp 1, tp over NVLink, tp over PCIe, pipeline only), backing off to coarser classes until at least
MIN_SOURCES independent sources speak. Every source (a repository, an issue thread, a sweep) weighs the same however
many logs it holds, so one benchmark sweep cannot outvote ten users. The likely range is the class's 10th to 90th
percentile error; the point estimate moves by its median where AGREEMENT of its sources erred the same way
(Estimate.shift). `bench/budget_loso.py` measures both with each source left out in turn.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kvplan.engines.versions import version_key

EVIDENCE_PATH = Path(__file__).resolve().parent / "data" / "budget_evidence.json"  # fields: data/README.md
# the evaluation (bench/budget_eval.py) points this at a file with one source left out
PATH_VARIABLE = "KVPLAN_BUDGET_EVIDENCE"
SHOWN_PATH = "kvplan/data/budget_evidence.json"  # the file as `fit` names it in the basis of its range
LOW_QUANTILE, MEDIAN, HIGH_QUANTILE = 0.1, 0.5, 0.9  # the central 80% of cases, and the point estimate
AGREEMENT = 0.8  # the share of a class's sources that must err the same way for its median to move the estimate
MIN_SOURCES = 5  # a class speaks with at least this many independent sources
# where an engine's budget rules changed enough to make its residuals differ (versions the eras start at):
# vLLM 0.19 (NCCL's multi-GiB buffers under tp), 0.20 (CUDA graphs charged); SGLang 0.5 (its new memory pools)
ERAS = {"vllm": ("0.19", "0.20"), "sglang": ("0.5",)}


@dataclass(frozen=True)
class Case:
    """One public log: where it came from, its setup, and kvplan's raw estimate minus the printed budget (bytes)."""
    id: str
    source: str
    version: str
    gpu: str
    tier: str
    interconnect: str
    tp: int
    pp: int
    error: int
    kind: str = "dense"  # ModelSpec.kind: dense | moe | multimodal


@dataclass(frozen=True)
class Query:
    """The setup an estimate is for, described as the evidence is."""
    engine: str
    version: str | None  # the version asked for (None: the newest rules)
    tier: str
    interconnect: str
    tp: int
    pp: int
    kind: str = "dense"


def era(engine: str, version: str | None) -> str:
    """'vllm', '0.19.1' -> '0.19 .. 0.20'; None (the newest rules) -> the newest era."""
    starts = ERAS.get(engine, ())
    version = version or None
    index = len(starts) if version is None else sum(version_key(version) >= version_key(s) for s in starts)
    low = starts[index - 1] if index else None
    high = starts[index] if index < len(starts) else None
    return f"{engine} " + (f">= {low}" if high is None and low else f"< {high}" if low is None and high else
                           f"{low} .. {high}" if low else "any version")


def parallel(tp: int, pp: int, interconnect: str) -> str:
    if tp > 1:
        return "tp over PCIe" if interconnect in ("pcie", "unknown") else "tp over NVLink"
    return "pipeline only" if pp > 1 else "one GPU"


def _classes(engine: str, version: str | None, tier: str, par: str, kind: str) -> list[tuple[str, tuple]]:
    """(description, key) from the narrowest class to the engine as a whole; every class but the last keeps the
    model kind (a multimodal profile or an MoE scratch misses by other amounts than a dense model's)."""
    e = era(engine, version)
    models = f"{kind} models"
    gpus = f"{tier} GPUs" if tier != "unknown" else "GPUs of no catalog tier (a plain size)"
    return [(f"{e}, {gpus}, {par}, {models}", (e, tier, par, kind)), (f"{e}, {gpus}, {models}", (e, tier, None, kind)),
            (f"{engine}, {gpus}, {par}, {models}", (None, tier, par, kind)), (f"{e}, {models}", (e, None, None, kind)),
            (f"{engine}, {models}", (None, None, None, kind)), (f"all {engine} logs", (None, None, None, None))]


def _in_class(engine: str, case: Case, key: tuple) -> bool:
    e, tier, par, kind = key
    return ((e is None or era(engine, case.version) == e) and (tier is None or case.tier == tier)
            and (par is None or parallel(case.tp, case.pp, case.interconnect) == par)
            and (kind is None or case.kind == kind))


def _weights(cases: list[Case]) -> dict[str, float]:
    """Each log's weight: every source weighs 1 in all, shared by its logs."""
    per_source: dict[str, int] = {}
    for c in cases:
        per_source[c.source] = per_source.get(c.source, 0) + 1
    return {c.id: 1.0 / per_source[c.source] for c in cases}


def weighted_quantile(cases: list[Case], q: float) -> int:
    """The error (bytes) at quantile q, every source weighing the same (_weights): nearest rank. Bytes, not
    shares of the GPU's memory nor multiples of kvplan's own non-KV estimate: scored all three ways with each source
    left out (stop 45 note), bytes placed the most logs within 3%."""
    weight = _weights(cases)
    ordered = sorted(cases, key=lambda c: c.error)
    total, seen = sum(weight.values()), 0.0
    for c in ordered:
        seen += weight[c.id]
        if seen >= q * total - 1e-9:
            return c.error
    return ordered[-1].error


def _agreement(cases: list[Case], median: int) -> float:
    """The weighted share of sources whose errors lie on the median's side of zero."""
    weight = _weights(cases)
    same = sum(weight[c.id] for c in cases if (c.error > 0) == (median > 0) and c.error != 0)
    return same / sum(weight.values())


def _estimate(engine: str, members: list[Case], described: str, asked: str, engine_wide: bool) -> Estimate:
    med, low, high = (weighted_quantile(members, q) for q in (MEDIAN, LOW_QUANTILE, HIGH_QUANTILE))
    return Estimate(engine, described, asked, med, low, high, len(members), len({c.source for c in members}),
                    engine_wide, _agreement(members, med))


@dataclass(frozen=True)
class Estimate:
    """The evidence of one class: the shift to apply to the raw estimate and the range around it (bytes)."""
    engine: str
    described: str  # the class used
    asked: str  # the narrowest class, which had too few sources when it differs from `described`
    median: int  # raw estimate minus printed budget (bytes), weighted median
    low: int  # 10th percentile
    high: int  # 90th percentile
    logs: int
    sources: int
    engine_wide: bool = False  # no narrower class had MIN_SOURCES sources
    agreement: float = 1.0  # the weighted share of the class's sources whose errors have the median's sign

    @property
    def backed_off(self) -> bool:
        return self.described != self.asked

    @property
    def shift(self) -> int:
        """What the point estimate moves by (bytes, subtracted from the raw estimate): the class's median where its
        sources agree on the direction (AGREEMENT of them), else no more than keeps the point inside the range. A
        median of sources that disagree is one source's miss of its own cause (a multimodal profile, an unstated
        version); scored with each source left out, moving by it shifted well-modelled setups by more than it
        corrected the others (stop 45)."""
        if self.engine_wide or self.agreement < AGREEMENT:
            return min(max(0, self.low), self.high)
        return self.median

    def budget_range(self, raw: int) -> tuple[int, int]:
        """The KV budgets the engine would print for this raw estimate, over the central 80% of the class."""
        return raw - self.high, raw - self.low

    def basis(self) -> str:
        thin = (f"too few public logs for {self.asked} (fewer than {MIN_SOURCES} sources), so the class is wider: "
                if self.backed_off else "")
        point = ("; the point estimate stays kvplan's model, as these sources disagree on the direction"
                 if self.shift != self.median else "")
        return (f"{thin}{self.logs} public {self.engine} start-up logs from {self.sources} sources ({self.described}) "
                f"put the engine's budget {_gib(-self.high)} to {_gib(-self.low)} from kvplan's model, median "
                f"{_gib(-self.median)} (each source weighs the same; {SHOWN_PATH}){point}")


@dataclass(frozen=True)
class BudgetEvidence:
    """Every public log of one engine that kvplan predicted."""
    engine: str
    cases: tuple[Case, ...]

    def estimate(self, query: Query) -> Estimate | None:
        par = parallel(query.tp, query.pp, query.interconnect)
        classes = _classes(self.engine, query.version, query.tier, par, query.kind)
        for described, key in classes:
            members = [c for c in self.cases if _in_class(self.engine, c, key)]
            whole = key == (None, None, None, None)
            if len({c.source for c in members}) >= MIN_SOURCES or (whole and members):
                return _estimate(self.engine, members, described, classes[0][0], whole)
        return None

    def overall(self) -> Estimate:
        """The engine's evidence as a whole (docs/accuracy.md)."""
        whole = f"all {self.engine} logs"
        return _estimate(self.engine, list(self.cases), whole, whole, True)

    def caution(self, gpu: str, tp: int, estimate: Estimate) -> str | None:
        """A warning where the evidence says little or worse about this GPU: no public log on it (the non-KV terms
        were never checked there), or logs on it outside the likely range (named, with their error)."""
        on_gpu = [c for c in self.cases if c.gpu == gpu]
        if not on_gpu:
            covered = sorted({c.gpu for c in self.cases})
            return (f"no public {self.engine} start-up log on {gpu} is in kvplan's evidence (it has {', '.join(covered)}): "
                    "the estimate of the memory besides weights and KV (activation peak, non-torch memory, CUDA "
                    "graphs) is unchecked on this GPU and may miss by more than the likely range")
        outside = [c for c in on_gpu if not estimate.low <= c.error <= estimate.high]
        parts = []
        if outside:
            shown = "; ".join(f"{c.id} (tp {c.tp}): {_gib(estimate.shift - c.error)}" for c in outside[:3])
            fewer = all(c.error > estimate.high for c in outside)
            parts.append(f"on {gpu}, {len(outside)} of {len(on_gpu)} public {self.engine} logs put the engine's budget "
                         f"outside the likely range, from kvplan's estimate: {shown}"
                         + ("; expect fewer tokens than estimated" if fewer else ""))
        if tp > 1 and not any(c.tp > 1 for c in on_gpu):
            parts.append(f"no public {self.engine} log on {gpu} used tensor parallelism: its all-reduce buffers are "
                         "estimated from other GPUs")
        return "; ".join(parts) or None


def _gib(b: int) -> str:
    return f"{round(b / (1 << 30), 2) + 0.0:+.2f} GiB"  # + 0.0: no "-0.00"


def path() -> Path:
    return Path(os.environ.get(PATH_VARIABLE) or EVIDENCE_PATH)


@functools.lru_cache(maxsize=4)
def _table(where: str) -> dict[str, BudgetEvidence]:
    p = Path(where)
    if not p.exists():
        return {}
    doc = json.loads(p.read_text(encoding="utf-8")) or {}
    out = {}
    for engine, row in (doc.get("engines") or {}).items():
        cases = tuple(Case(k, str(v["source"]), str(v.get("version") or ""), str(v["gpu"]), str(v["tier"]),
                           str(v["interconnect"]), int(v.get("tp", 1)), int(v.get("pp", 1)), int(v["error_bytes"]),
                           str(v.get("kind") or "dense"))
                      for k, v in sorted((row.get("cases") or {}).items()))
        if cases:
            out[engine] = BudgetEvidence(engine, cases)
    return out


def for_engine(engine: str) -> BudgetEvidence | None:
    return _table(str(path())).get(engine)


__all__ = ["BudgetEvidence", "Case", "Estimate", "Query", "for_engine", "EVIDENCE_PATH", "PATH_VARIABLE"]
