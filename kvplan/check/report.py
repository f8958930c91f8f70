"""What `kvplan check` found: problems with their FILE:LINE:COLUMN, the deployments read, and each one's result
(its requirements, the binding one, the fit figures), with the JSON the renderers and --format json print."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvplan import JSON_SCHEMA
from kvplan.errors import CheckFailed, InputError, KvplanError
from kvplan.units import fmt_int

FORMATS = ("table", "json", "junit", "github")
NO_FLEET = 1 << 40  # max_gpus's achievable figure when no instance meets the target (never met)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a file, where it is (1-based; None for a file that could not be read)."""

    file: str
    line: int | None
    column: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line is not None else self.file
        return f"{where}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "column": self.column, "message": self.message}


@dataclass(frozen=True)
class Field:
    key: str
    value: Any
    line: int
    column: int
    inherited: bool  # from defaults


@dataclass
class Deployment:
    file: str
    index: int  # 1-based position in the list
    line: int
    column: int
    fields: dict[str, Field]
    broken: bool = False  # a phase-1 problem: never solved
    present: frozenset[str] = frozenset()  # keys written (valid or not), defaults included

    def get(self, key: str, default: Any = None) -> Any:
        f = self.fields.get(key)
        return default if f is None else f.value

    @property
    def name(self) -> str:
        return self.get("name") or f"#{self.index}"


@dataclass(frozen=True)
class Requirement:
    kind: str  # min_batch | min_ctx | min_kv_tokens | ctx (the model maximum)
    value: int
    achievable: int
    unit: str
    at: int | None = None  # the ctx (min_batch) or the batch (min_ctx) it is measured at
    implicit: bool = False  # no requirement given: one request of ctx must fit
    upper: bool = False  # a ceiling (max_gpus): the achievable figure must not exceed the value

    @property
    def margin(self) -> int:
        return self.value - self.achievable if self.upper else self.achievable - self.value

    @property
    def passed(self) -> bool:
        return self.margin >= 0

    @property
    def relative(self) -> float:
        return self.margin / self.value if self.value else float(self.margin)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "achievable": self.achievable,
                "margin": {"value": self.margin, "unit": self.unit}, "passed": self.passed,
                **({"at_ctx": self.at} if self.kind == "min_batch" and self.at is not None else {}),
                **({"at_batch": self.at} if self.kind == "min_ctx" and self.at is not None else {}),
                **({"implicit": True} if self.implicit else {})}

    def sentence(self) -> str:
        """'min_batch 16 not met: 4 requests of 8,192 tokens fit (short by 12)'."""
        v, a = fmt_int(self.value), fmt_int(self.achievable)
        if self.kind == "ctx":
            return f"ctx {v} exceeds the model maximum {a}"
        if self.kind == "min_batch" and self.implicit:
            if self.passed:
                return f"one request fits: {a} requests of {fmt_int(self.at)} tokens fit (margin {self.margin:+,})"
            return f"not one request of {fmt_int(self.at)} tokens fits"
        if self.kind == "min_batch":
            what = f"min_batch {v}"
            got = f"{a} request{'s' if self.achievable != 1 else ''} of {fmt_int(self.at)} tokens fit"
        elif self.kind == "min_ctx":
            what, got = f"min_ctx {v}", f"max ctx {a} at batch {fmt_int(self.at)}"
        elif self.kind == "min_running":
            what, got = f"min_running {v}", f"{a} requests run at once (median of the replay)"
        elif self.kind == "max_gpus":
            what, got = f"max_gpus {v}", (f"the fleet needs {a} GPUs" if self.achievable < NO_FLEET
                                          else "no fleet meets the target")
        else:
            what, got = f"min_kv_tokens {v}", f"KV capacity {a} tokens"
        if self.passed:
            return f"{what} met: {got} (margin {self.margin:+,})"
        if self.kind == "max_gpus" and self.achievable >= NO_FLEET:
            return f"{what} not met: {got}"
        unit = self.unit[:-1] if self.margin == -1 else self.unit
        return f"{what} not met: {got} (short by {-self.margin:,} {unit})"


@dataclass(frozen=True)
class DeploymentResult:
    deployment: Deployment
    passed: bool
    reason: str
    detail: str
    inputs: dict[str, Any]
    engine: str
    gpu: dict[str, Any]
    tp: int
    pp: int
    figures: dict[str, Any]
    binding: Requirement
    requirements: tuple[Requirement, ...]
    warnings: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.deployment.name

    @property
    def file(self) -> str:
        return self.deployment.file

    @property
    def line(self) -> int:
        return self.deployment.line

    def to_json(self) -> dict[str, Any]:
        b = self.binding
        return {
            "name": self.name,
            "file": self.file,
            "line": self.line,
            "passed": self.passed,
            "reason": self.reason,
            "detail": self.detail,
            "inputs": self.inputs,
            "engine": self.engine,
            "gpu": self.gpu,
            "tp": self.tp,
            "pp": self.pp,
            "figures": self.figures,
            "requirement": {"kind": b.kind, "value": b.value},
            "achievable": b.achievable,
            "margin": {"value": b.margin, "unit": b.unit},
            "requirements": [r.to_json() for r in self.requirements],
            "warnings": list(self.warnings),
        }


@dataclass
class FileReport:
    path: str
    problems: list[Problem] = field(default_factory=list)
    deployments: list[Deployment] = field(default_factory=list)
    results: list[DeploymentResult] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def failures(self) -> int:
        return sum(not r.passed for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "valid": self.valid, "deployments": len(self.results), "failures": self.failures,
                "problems": [p.to_json() for p in self.problems]}


@dataclass
class CheckReport:
    files: list[FileReport]

    @property
    def results(self) -> list[DeploymentResult]:
        return [r for f in self.files for r in f.results]

    @property
    def problems(self) -> list[Problem]:
        return [p for f in self.files for p in f.problems]

    @property
    def passed(self) -> bool:
        return not self.problems and all(r.passed for r in self.results)

    @property
    def exit_code(self) -> int:
        """2 if any file is invalid, else 1 if any deployment fails, else 0."""
        if self.problems:
            return 2
        return 0 if all(r.passed for r in self.results) else 1

    def to_json(self) -> dict[str, Any]:
        results = self.results
        return {
            "schema": JSON_SCHEMA,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "deployments": [r.to_json() for r in results],
            "files": [f.to_json() for f in self.files],
            "problems": [p.to_json() for p in self.problems],
            "summary": {"deployments": len(results), "passed": sum(r.passed for r in results),
                        "failed": sum(not r.passed for r in results),
                        "invalid_files": sum(not f.valid for f in self.files)},
        }


def outcome_error(report: CheckReport) -> KvplanError:
    """The error the CLI boundary turns into the one summary line and the exit code (2 invalid, 1 failing)."""
    invalid = [f.path for f in report.files if not f.valid]
    if invalid:
        n = len(report.problems)
        return InputError(f"{n} problem{'s' if n != 1 else ''} in {', '.join(invalid)} (listed above); "
                          f"nothing in {'that file' if len(invalid) == 1 else 'those files'} was checked")
    failed = [r.name for r in report.results if not r.passed]
    return CheckFailed(f"{len(failed)} of {len(report.results)} deployment{'s' if len(report.results) != 1 else ''} "
                       f"failed: {', '.join(failed)}")
