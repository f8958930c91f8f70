"""`kvplan check`: capacity checks for CI pipelines. YAML files -> validated deployments -> fit -> pass/fail.

A file holds `deployments:` (a list of mappings) and optionally `defaults:` (a mapping merged under every
deployment; top-level keys starting with `x-` are ignored, room for YAML anchors). Each deployment names a model, a GPU and a context, and states requirements that must hold:

    min_batch      requests of ctx tokens that must run at once  (fit's max_batch at ctx; `batch` is the same key)
    min_ctx        the context that must fit at min_batch (or 1) requests  (fit's max_ctx)
    min_kv_tokens  tokens the KV cache must hold  (fit's kv_capacity_tokens)

A deployment may also state its traffic (the keys of `kvplan plan`: prompt, output, requests, shared_prefix, users,
tpot); then ctx may be left out (the longest request), the mix is replayed through vLLM's scheduler (or
llama-server's slots with engine llamacpp, its -np / -c as the keys parallel / ctx_size), and two more
requirements can be stated:

    min_running    requests the replay must run at once (its median over the steady steps)
    max_gpus       GPUs the fleet for `users` users (at `tpot`, when given) may need at most

Every one given must hold; none given means one request of ctx tokens must fit. The figures of a deployment are
`planner.fit_model(...).to_json()`, the very `fit --json` result entry for the same inputs (one code path).

The YAML is read with PyYAML's SafeLoader but only *composed* (yaml.compose): values are converted here from the
nodes, so every problem carries FILE:LINE:COLUMN, duplicate keys are caught, and YAML 1.1 readings that surprise
(`no` read as false, `016` as octal 14, `1:30` as 90) are errors where a string or a number is expected. Every
problem of every file is collected before anything is reported.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvplan import JSON_SCHEMA, dtypes, engines
from kvplan.errors import CheckFailed, InputError, KvplanError
from kvplan.units import fmt_bytes, fmt_int, parse_bytes, parse_count, parse_fraction, parse_headroom, parse_ratio, parse_tokens

MAX_FILE_BYTES = 16 << 20  # a check file is kilobytes; 24 MB of YAML comments took 10 s to read

FORMATS = ("table", "json", "junit", "github")

# ---------------------------------------------------------------------------------------------- the schema
# key -> kind. Kinds: string, tokens (8192, 8k, 1M), count (a positive integer; k/M accepted too),
# fraction (0.9 or 90%), headroom (a fraction in [0, 1)), size (24GB; an integer is bytes), reserve (a size or 0),
# bool (true/false).
GENERAL_KEYS: dict[str, str] = {
    "name": "string",
    "model": "string",
    "revision": "string",
    "gpu": "string",
    "engine": "string",
    "tp": "count",
    "pp": "count",
    "ctx": "tokens",
    "min_batch": "count",
    "batch": "count",  # the same key as min_batch
    "min_ctx": "tokens",
    "min_kv_tokens": "tokens",
    "kv_dtype": "string",
    "k_dtype": "string",
    "v_dtype": "string",
    "state_dtype": "string",
    "weight_dtype": "string",
    "kv_budget": "size",
    "reserve": "reserve",
    "headroom": "headroom",
    "require_start": "bool",
    # traffic (kvplan plan)
    "prompt": "lengths",
    "output": "lengths",
    "requests": "count",
    "shared_prefix": "tokens",
    "users": "count",
    "tpot": "time",
    "min_running": "count",
    "max_gpus": "count",
}
PLAN_KEYS = ("prompt", "output", "requests", "shared_prefix", "users", "tpot", "min_running", "max_gpus")
# engine knobs: fit's flags with _ for -, typed by each engine's Knob.kind (each engine accepts only its own)
KNOB_KEYS: dict[str, str] = {name: knob.kind for name, knob in engines.all_knobs().items()}
KEYS: dict[str, str] = {**GENERAL_KEYS, **KNOB_KEYS}
TOP_KEYS = ("defaults", "deployments")
REQUIRED = ("name", "model", "gpu")
REQUIREMENT_KEYS = ("min_batch", "min_ctx", "min_kv_tokens")
DTYPE_KEYS = ("kv_dtype", "k_dtype", "v_dtype", "state_dtype")

_EXPECTED = {
    "string": "a string",
    "tokens": "a token count such as 8192, 8k or 1M",
    "count": "a positive integer",
    "fraction": "a fraction such as 0.9 or 90%",
    "ratio": "a positive ratio such as 0.9 or 1.5",
    "headroom": "a fraction such as 0.1 or 10%",
    "size": "a size such as 24GB or 512MiB",
    "reserve": "a size such as 1.5GiB, or 0",
    "bool": "true or false",
    "dtype": "auto or a dtype name such as fp32 or bf16",
    "lengths": "a token count such as 1000, or a range such as 500-3000",
    "time": "a time such as 30ms or 0.05s",
}
_STRING_WHAT = {
    "name": "a deployment name",
    "model": "a model (alias, Hub id org/name or a path)",
    "gpu": "a GPU (catalog name, a size such as 24GB, or NxGPU such as 2xA10G)",
    "engine": "an engine name[@version] such as vllm or vllm@0.10",
    "revision": "a revision (branch, tag or commit)",
}

NO_FLEET = 1 << 40  # max_gpus's achievable figure when no instance meets the target (never met)
_TAG = "tag:yaml.org,2002:"
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


# ---------------------------------------------------------------------------------------------- results
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


# ---------------------------------------------------------------------------------------------- YAML scalars
class _Bad(Exception):
    """A value that cannot be used; the message is the problem text (the position is added by the caller)."""


def _kind(node: ScalarNode) -> str:
    return node.tag[len(_TAG):] if node.tag.startswith(_TAG) else "other"


def _read_as(node: ScalarNode) -> str:
    """How YAML 1.1 (PyYAML) reads a plain scalar: 'the boolean false', 'the integer 14'."""
    kind = _kind(node)
    try:
        value = _CONSTRUCTOR.yaml_constructors[node.tag](_CONSTRUCTOR, node)
    except Exception:  # noqa: BLE001 - only for the message
        value = node.value
    if kind == "bool":
        return f"the boolean {str(value).lower()}"
    if kind == "int":
        return f"the integer {value}"
    if kind == "float":
        return f"the number {value}"
    if kind == "null":
        return "null (no value)"
    if kind == "timestamp":
        return f"the date {value}"
    return f"a value tagged {node.tag}"


def _shape(node: Node) -> str:
    return "a list" if isinstance(node, SequenceNode) else "a mapping" if isinstance(node, MappingNode) else "a value"


def _plain(node: ScalarNode) -> bool:
    return node.style is None


def _user_error(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except InputError as e:
        raise _Bad(str(e)) from None


def _integer(node: Node, key: str, kind: str) -> int:
    expected = _EXPECTED[kind]
    if not isinstance(node, ScalarNode):
        raise _Bad(f"{key}: expected {expected}, got {_shape(node)}")
    text, k = node.value, _kind(node)
    parser = parse_tokens if kind == "tokens" else parse_count
    parse = lambda v: _user_error(lambda: parser(v, key))  # noqa: E731
    if _plain(node) and re.fullmatch(r"[-+]?0[0-9_]+[kKmM]?", text.strip()):
        octal = f" as the octal number {_CONSTRUCTOR.construct_yaml_int(node)}" if k == "int" else ""
        raise _Bad(f"{key}: {text} has a leading zero, which YAML 1.1 reads{octal or ' as octal'}; "
                   f"write {text.strip().lstrip('+-0') or '0'} (or quote it)")
    if k == "str":
        return parse(text)
    if k == "int" and _plain(node):
        if re.fullmatch(r"[-+]?[0-9]+", text):
            return parse(int(text))
        raise _Bad(f"{key}: {text} is read by YAML 1.1 as {_read_as(node)}; write {expected} in plain digits")
    if k == "float" and _plain(node):
        raise _Bad(f"{key}: expected {expected} (a whole number), got {text}")
    if k == "null":
        raise _Bad(f"{key}: no value; expected {expected}")
    raise _Bad(f"{key}: {text} is read by YAML as {_read_as(node)}; expected {expected}")


def _number_text(node: ScalarNode, key: str, kind: str) -> str | float | int:
    """A fraction or size as typed: a string for units/percent, a number for plain numbers."""
    expected = _EXPECTED[kind]
    text, k = node.value, _kind(node)
    if k == "str":
        return text
    if k in ("int", "float") and _plain(node):
        if re.fullmatch(r"[0-9]+", text):
            return int(text)
        if k == "float" and re.fullmatch(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", text):
            return float(text)
        if re.fullmatch(r"-[0-9]+", text):
            return int(text)
        raise _Bad(f"{key}: {text} is read by YAML 1.1 as {_read_as(node)}; expected {expected}")
    if k == "null":
        raise _Bad(f"{key}: no value; expected {expected}")
    raise _Bad(f"{key}: {text} is read by YAML as {_read_as(node)}; expected {expected}")


def _reserve(value: str | float | int, key: str) -> int:
    if isinstance(value, (int, float)) and value == 0:
        return 0
    if isinstance(value, str) and value.strip().lower() in ("0", "0b", "0gib", "0gb", "0mib", "0mb"):
        return 0
    return parse_bytes(value, key)


def convert(node: Node, key: str, kind: str) -> Any:
    """A YAML node -> the value of `key`, or _Bad with the problem text."""
    if kind in ("tokens", "count"):
        return _integer(node, key, kind)
    expected = _EXPECTED[kind]
    if not isinstance(node, ScalarNode):
        raise _Bad(f"{key}: expected {expected}, got {_shape(node)}")
    text, k = node.value, _kind(node)
    if kind == "string":
        if k == "str":
            if not text.strip():
                raise _Bad(f"{key}: empty; expected {_STRING_WHAT.get(key, expected)}")
            return text.strip()
        if k == "null":
            raise _Bad(f"{key}: no value; expected {_STRING_WHAT.get(key, expected)}")
        raise _Bad(f"{key}: {text} is read by YAML as {_read_as(node)}, not a string; "
                   f"quote it if you mean the text: {key}: \"{text}\"")
    if kind == "lengths":
        if k not in ("str", "int") or (k == "int" and not _plain(node)):
            raise _Bad(f"{key}: expected {expected}, got {text!r}")
        from kvplan.workload import parse_lengths

        return _user_error(lambda: parse_lengths(text, key).canonical)
    if kind == "time":
        if k not in ("str", "int", "float"):
            raise _Bad(f"{key}: expected {expected}, got {text!r}")
        from kvplan.units import parse_seconds

        return _user_error(lambda: parse_seconds(text, key))
    if kind == "dtype":
        if k != "str" or not text.strip():
            raise _Bad(f"{key}: expected {expected}, got {text!r}")
        return _user_error(lambda: "auto" if text.strip().lower() == "auto" else dtypes.kv_dtype(text).name)
    if kind == "bool":
        if k == "bool" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if k == "bool":
            raise _Bad(f"{key}: {text} is YAML 1.1 for {str(_CONSTRUCTOR.construct_yaml_bool(node)).lower()} but "
                       "a string in YAML 1.2; write true or false")
        raise _Bad(f"{key}: expected true or false, got {text!r}" if k != "null" else f"{key}: no value; expected true or false")
    value = _number_text(node, key, kind)
    if kind == "fraction":
        return _user_error(lambda: parse_fraction(value, key))
    if kind == "ratio":
        return _user_error(lambda: parse_ratio(value, key))
    if kind == "headroom":
        if isinstance(value, (int, float)) and not 0 <= value < 1:
            raise _Bad(f"{key}: {text} is outside [0, 1); use e.g. 0.1 or 10% (the share of the KV budget held back)")
        return _user_error(lambda: parse_headroom(value, key))
    if kind == "size":
        if isinstance(value, float):
            raise _Bad(f"{key}: {text} has no unit; expected {expected} (an integer alone is bytes)")
        return _user_error(lambda: parse_bytes(value, key))
    if kind == "reserve":
        if isinstance(value, float) and value != 0:
            raise _Bad(f"{key}: {text} has no unit; expected {expected} (an integer alone is bytes)")
        return _user_error(lambda: _reserve(value, key))
    raise AssertionError(kind)  # pragma: no cover


# ---------------------------------------------------------------------------------------------- parsing a file
def _suggest(key: str, valid: list[str] | tuple[str, ...]) -> str:
    norm = key.strip().lower().replace("-", "_").replace(" ", "_")
    if norm in valid and norm != key:
        return f" (did you mean {norm}?)"
    close = difflib.get_close_matches(norm, list(valid), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]}?)"
    return f"; valid keys: {', '.join(valid)}"


class _FileParser:
    def __init__(self, report: FileReport):
        self.report = report
        self.path = report.path
        self.expanded: dict[int, dict[str, tuple[ScalarNode, Node]]] = {}

    def problem(self, node: Node | None, message: str, mark: Any = None) -> None:
        mark = mark if mark is not None else (node.start_mark if node is not None else None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        self.report.problems.append(Problem(self.path, line, col, message))

    # -- mappings: duplicate keys, merge keys (<<: *anchor)
    def pairs(self, node: MappingNode, seen: frozenset[int] = frozenset()) -> dict[str, tuple[ScalarNode, Node]]:
        """The mapping's keys with `<<` merges applied; each node is expanded once (memoised), so anchors merged
        over and over (a merge-key bomb: 10 x 10 x ... over 8 levels) cost their size, not fan-out^depth."""
        done = self.expanded.get(id(node))
        if done is not None:
            return done
        result = self._expand(node, seen)
        self.expanded[id(node)] = result
        return result

    def _expand(self, node: MappingNode, seen: frozenset[int]) -> dict[str, tuple[ScalarNode, Node]]:
        explicit: dict[str, tuple[ScalarNode, Node]] = {}
        merged: dict[str, tuple[ScalarNode, Node]] = {}
        for k, v in node.value:
            if k.tag == _TAG + "merge":
                sources = v.value if isinstance(v, SequenceNode) else [v]
                for src in sources:
                    if not isinstance(src, MappingNode) or src is node or id(src) in seen:
                        self.problem(src, "<< (merge) takes a mapping or a list of mappings, such as <<: *defaults")
                        continue
                    for key, pair in self.pairs(src, seen | {id(node)}).items():
                        merged.setdefault(key, pair)
                continue
            if not isinstance(k, ScalarNode) or _kind(k) == "null":
                self.problem(k, "a key must be a plain name such as ctx or min_batch")
                continue
            if k.value in explicit:
                first = explicit[k.value][0].start_mark.line + 1
                self.problem(k, f"duplicate key {k.value!r} (first at line {first})")
                continue
            explicit[k.value] = (k, v)
        return {**merged, **explicit}

    def fields(self, node: MappingNode, *, in_defaults: bool) -> tuple[dict[str, Field], bool, set[str]]:
        out: dict[str, Field] = {}
        ok = True
        where = "defaults" if in_defaults else "a deployment"
        present = {"min_batch" if k == "batch" else k for k in self.pairs(node)}
        for key, (knode, vnode) in self.pairs(node).items():
            if key not in KEYS:
                self.problem(knode, f"unknown key {key!r} in {where}{_suggest(key, list(k for k in KEYS if k != 'batch'))}")
                ok = False
                continue
            if key == "name" and in_defaults:
                self.problem(knode, "name cannot be a default: every deployment names itself")
                ok = False
                continue
            try:
                value = convert(vnode, key, KEYS[key])
            except _Bad as e:
                self.problem(vnode, str(e))
                ok = False
                continue
            target = "min_batch" if key == "batch" else key
            if target in out:
                self.problem(knode, "batch and min_batch are the same key; give one")
                ok = False
                continue
            out[target] = Field(target, value, vnode.start_mark.line + 1, vnode.start_mark.column + 1, in_defaults)
        return out, ok, present

    def parse(self, text: str) -> None:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            message = ": ".join(str(x) for x in (e.context, e.problem) if x) or "invalid YAML"
            self.problem(None, f"invalid YAML: {message}", mark)
            return
        except yaml.reader.ReaderError as e:  # a character YAML forbids (NUL, most control characters)
            line = text.count("\n", 0, e.position) + 1
            column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
            self.report.problems.append(Problem(self.path, line, column, f"invalid YAML: unacceptable character "
                                                f"#x{e.character:04x}: {e.reason}" if isinstance(e.character, int)
                                                else f"invalid YAML: {e.reason}"))
            return
        except yaml.YAMLError as e:
            self.problem(None, "invalid YAML: " + " ".join(str(e).split()))
            return
        except RecursionError:
            self.report.problems.append(Problem(self.path, None, None, "invalid YAML: nested too deeply to read; "
                                                "a check file is a few levels deep"))
            return
        if root is None:
            self.report.problems.append(Problem(self.path, 1, 1, "the file is empty; expected `deployments:` "
                                                "(a list of deployments) and optionally `defaults:`"))
            return
        if not isinstance(root, MappingNode):
            self.problem(root, "expected a mapping with `deployments:` (a list) and optionally `defaults:`, "
                         f"got {_shape(root) if not isinstance(root, ScalarNode) else 'a single value'}")
            return
        top = self.pairs(root)
        for key, (knode, _) in top.items():
            if key not in TOP_KEYS and not key.startswith("x-"):  # x-...: room for anchors, as in compose files
                self.problem(knode, f"unknown top-level key {key!r}{_suggest(key, TOP_KEYS)}")
        defaults: dict[str, Field] = {}
        defaults_ok, defaults_present = True, set()
        if "defaults" in top:
            dnode = top["defaults"][1]
            if isinstance(dnode, MappingNode):
                defaults, defaults_ok, defaults_present = self.fields(dnode, in_defaults=True)
            elif not (isinstance(dnode, ScalarNode) and _kind(dnode) == "null"):
                self.problem(dnode, f"defaults: expected a mapping of keys, got {_shape(dnode)}")
        if "deployments" not in top:
            self.problem(root, "no `deployments:` list; every file needs at least one deployment")
            return
        dnode = top["deployments"][1]
        if not isinstance(dnode, SequenceNode):
            self.problem(dnode, f"deployments: expected a list of deployments (- name: ...), got {_shape(dnode)}")
            return
        if not dnode.value:
            self.problem(dnode, "deployments: the list is empty; every file needs at least one deployment")
            return
        first_name: dict[str, int] = {}
        for i, item in enumerate(dnode.value, 1):
            if not isinstance(item, MappingNode):
                self.problem(item, f"deployment #{i}: expected a mapping (name: ..., model: ..., gpu: ..., ctx: ...), "
                             f"got {_shape(item) if not isinstance(item, ScalarNode) else repr(item.value)}")
                continue
            own, ok, present = self.fields(item, in_defaults=False)
            dep = Deployment(self.path, i, item.start_mark.line + 1, item.start_mark.column + 1,
                             {**defaults, **own}, broken=not (ok and defaults_ok),
                             present=frozenset(present | defaults_present))
            self.validate(dep, item)
            name = dep.get("name")
            if name is not None:
                if name in first_name:
                    f = dep.fields["name"]
                    self.report.problems.append(Problem(self.path, f.line, f.column,
                                                        f"duplicate deployment name {name!r} (first at line {first_name[name]})"))
                    dep.broken = True
                else:
                    first_name[name] = dep.fields["name"].line
            self.report.deployments.append(dep)

    def at(self, f: Field, message: str, dep: Deployment) -> None:
        suffix = f" (inherited from defaults by deployment {dep.name!r})" if f.inherited else ""
        self.report.problems.append(Problem(self.path, f.line, f.column, message + suffix))
        dep.broken = True

    def validate(self, dep: Deployment, node: MappingNode) -> None:
        """Checks of one merged deployment that need no model or GPU: required keys, engine, knobs, dtype names."""
        from kvplan import dtypes, engines, weights

        label = f"deployment {dep.get('name')!r}" if dep.get("name") else f"deployment #{dep.index}"
        missing = [k for k in REQUIRED if k not in dep.present]
        traffic = set(PLAN_KEYS) & dep.present
        if traffic:
            missing += [k for k in ("prompt", "output") if k not in dep.present]
            missing += [f"users (for {k})" for k in ("tpot", "max_gpus") if k in dep.present and "users" not in dep.present]
        elif not {"ctx", "min_ctx"} & dep.present:
            missing.append("ctx")
        if missing:
            self.problem(node, f"{label}: missing {', '.join(missing)}"
                         + (" (ctx may be left out only when min_ctx is given)" if "ctx" in missing else ""))
            dep.broken = True
        engine_name = None
        f = dep.fields.get("engine")
        try:
            engine_name = engines.choose(f.value if f else None).name
        except InputError as e:
            if f is not None:
                self.at(f, f"engine: {e}", dep)
        if engine_name is not None and traffic and engine_name not in ("vllm", "llamacpp"):
            self.at(f or dep.fields[sorted(traffic)[0]], f"traffic keys ({', '.join(sorted(traffic))}) are replayed "
                    f"through vLLM's scheduler or llama-server's slots; engine {engine_name} is not modelled yet "
                    "(accepted: vllm, llamacpp)", dep)
        if engine_name is not None:
            accepted = engines.LISTINGS[engine_name].knobs
            for key in KNOB_KEYS:
                kf = dep.fields.get(key)
                if kf is None or key in accepted:
                    continue
                owners = engines.knob_owners(key)
                self.at(kf, f"{key} does not apply to engine {engine_name}"
                        + (f" (it applies to {', '.join(owners)})" if owners else ""), dep)
        for key in DTYPE_KEYS:
            kf = dep.fields.get(key)
            if kf is not None and kf.value.lower() != "auto":
                try:
                    dtypes.kv_dtype(kf.value)
                except InputError as e:
                    self.at(kf, f"{key}: {e}", dep)
        wf = dep.fields.get("weight_dtype")
        if wf is not None:
            if weights.canonical_weight_dtype(wf.value) is None:
                self.at(wf, f"weight_dtype: unknown weight dtype {wf.value!r}; accepted: {', '.join(weights.WEIGHT_DTYPES)}", dep)


def parse_file(path: str) -> FileReport:
    """Phase 1: read and validate one file (schema, types, names that need no model)."""
    report = FileReport(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(info.st_mode):  # a FIFO or /dev/zero would hang or fill memory
            report.problems.append(Problem(path, None, None, "is not a regular file; expected a kvplan.yaml file"))
            return report
        if info.st_size > MAX_FILE_BYTES:
            report.problems.append(Problem(path, None, None, f"is {info.st_size:,} bytes, more than the "
                                           f"{MAX_FILE_BYTES:,} accepted for a check file"))
            return report
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        report.problems.append(Problem(path, None, None, "no such file"))
        return report
    except IsADirectoryError:
        report.problems.append(Problem(path, None, None, "is a directory; expected a kvplan.yaml file"))
        return report
    except OSError as e:
        report.problems.append(Problem(path, None, None, f"cannot read: {e.strerror or e}"))
        return report
    except UnicodeDecodeError:
        report.problems.append(Problem(path, None, None, "not a UTF-8 text file; expected YAML"))
        return report
    _FileParser(report).parse(text)
    return report


# ---------------------------------------------------------------------------------------------- solving
class _Resolver:
    """GPU selections and loaded models, each resolved once for all deployments of all files."""

    def __init__(self, offline: bool, timeout: float | None = None, calibrations: tuple = ()):
        self.offline = offline
        self.timeout = timeout
        self.calibrations = calibrations  # saved measurements (calibration.py) every deployment's fit may use
        self.gpus: dict[str, Any] = {}
        self.models: dict[tuple[str, str | None], Any] = {}

    def gpu(self, text: str) -> Any:
        from kvplan.gpus import resolve_gpu

        if text not in self.gpus:
            try:
                self.gpus[text] = resolve_gpu(text)
            except KvplanError as e:
                self.gpus[text] = e
        return self.gpus[text]

    def model_options(self, model: str, revision: str | None) -> Any:
        from kvplan.sizing import ModelOptions

        return ModelOptions(model, revision, True if self.offline else None, timeout=self.timeout)

    def model(self, model: str, revision: str | None) -> Any:
        from kvplan.sizing import load_spec

        key = (model, revision)
        if key not in self.models:
            try:
                self.models[key] = load_spec(self.model_options(model, revision))
            except KvplanError as e:
                self.models[key] = e
        return self.models[key]


def _solve(dep: Deployment, res: _Resolver, report: FileReport) -> DeploymentResult | None:
    """Phase 2: resolve GPU and model (problems with their lines), then fit and judge. None when not solvable."""
    from kvplan import engines, planner, weights
    from kvplan.sizing import EngineOptions, float_dtype_for

    def fail(f: Field | None, message: str) -> None:
        line, col = (f.line, f.column) if f is not None else (dep.line, dep.column)
        suffix = f" (inherited from defaults by deployment {dep.name!r})" if f is not None and f.inherited else ""
        report.problems.append(Problem(dep.file, line, col, message + suffix))
        dep.broken = True

    sel = loaded = None
    gf, mf = dep.fields.get("gpu"), dep.fields.get("model")
    if gf is not None:
        sel = res.gpu(gf.value)
        if isinstance(sel, KvplanError):
            fail(gf, f"gpu: {sel}")
            sel = None
    if mf is not None:
        loaded = res.model(mf.value, dep.get("revision"))
        if isinstance(loaded, KvplanError):
            fail(mf, f"model: {loaded}")
            loaded = None
    if sel is not None and (dep.get("tp") or dep.get("pp")):
        try:
            planner.parallelism(sel, dep.get("tp"), dep.get("pp"))
        except InputError as e:
            fail(dep.fields.get("tp") or dep.fields.get("pp"), f"{e}".replace("--tp", "tp").replace("--pp", "pp"))
    if loaded is not None and not dep.broken:
        engine = engines.choose(dep.get("engine"))
        spec = loaded[1]
        wf = dep.fields.get("weight_dtype")
        if wf is not None:
            try:
                weights.weight_format(spec, wf.value, float_dtype_for(engine, spec))
            except InputError as e:
                fail(wf, f"weight_dtype: {e}".replace("--weight-dtype", "weight_dtype"))
        given = [dep.fields[k] for k in DTYPE_KEYS if k in dep.fields]
        try:
            engines.kv_dtypes(engine, spec, *(dep.get(k) for k in DTYPE_KEYS))
        except InputError as e:
            fail(given[0] if given else None, str(e))
    if dep.broken or sel is None or loaded is None:
        return None

    min_batch, min_ctx, min_kv = (dep.get(k) for k in REQUIREMENT_KEYS)
    knobs = {k: dep.get(k) for k in KNOB_KEYS if k in dep.fields}
    eo = EngineOptions(dep.get("engine"), dep.get("kv_dtype"), dep.get("k_dtype"), dep.get("v_dtype"),
                       dep.get("state_dtype"), dep.get("weight_dtype"), 1, 1, knobs)
    traffic = None
    if dep.get("prompt") is not None:
        from kvplan import serving, workload

        try:
            work = workload.sampled(dep.get("requests") or 1000, workload.parse_lengths(dep.get("prompt"), "prompt"),
                                    workload.parse_lengths(dep.get("output"), "output"), dep.get("shared_prefix") or 0)
            traffic = serving.plan(res.model_options(dep.get("model"), dep.get("revision")), eo, sel, work,
                                   users=dep.get("users"), tpot=dep.get("tpot"), kv_budget=dep.get("kv_budget"),
                                   reserve=dep.get("reserve"), tp=dep.get("tp"), pp=dep.get("pp"),
                                   calibrations=res.calibrations)
        except KvplanError as e:
            fail(None, f"deployment {dep.name!r}: {e}")
            return None
    ctx = dep.get("ctx") or min_ctx or (traffic.workload.longest if traffic is not None else None)
    batch = min_batch or 1
    if traffic is not None and "ctx_size" in knobs:  # llama-server -c: the replay's; fit solves its own
        eo = replace(eo, knobs={k: v for k, v in knobs.items() if k != "ctx_size"})
    try:
        r = planner.fit_model(res.model_options(dep.get("model"), dep.get("revision")), eo, sel, ctx, batch,
                              kv_budget=dep.get("kv_budget"), reserve=dep.get("reserve"), frontier=True,
                              tp=dep.get("tp"), pp=dep.get("pp"), loaded=loaded, headroom=dep.get("headroom") or 0.0,
                              calibrations=res.calibrations)
    except KvplanError as e:
        fail(None, f"deployment {dep.name!r}: {e}")
        return None
    tp, pp, _ = planner.parallelism(sel, dep.get("tp"), dep.get("pp"))
    return _judge(dep, r, sel, tp, pp, ctx, batch, traffic)


def _traffic_requirements(dep: Deployment, traffic: Any) -> list[Requirement]:
    out = []
    if dep.get("min_running") is not None:
        out.append(Requirement("min_running", dep.get("min_running"), traffic.run.p50_running, "requests"))
    if dep.get("max_gpus") is not None:
        gpus = (traffic.fleet or {}).get("gpus")
        out.append(Requirement("max_gpus", dep.get("max_gpus"), gpus if gpus is not None else NO_FLEET, "GPUs",
                               upper=True))
    return out


def _judge(dep: Deployment, r: Any, sel: Any, tp: int, pp: int, ctx: int, batch: int,
           traffic: Any = None) -> DeploymentResult:
    figures = r.to_json()
    if traffic is not None:
        plan_json = traffic.to_json()
        figures["plan"] = {k: plan_json[k] for k in ("workload", "mode", "users", "pool", "run", "speed", "fleet")}
    model_max = r.setup.max_ctx
    min_batch, min_ctx, min_kv = (dep.get(k) for k in REQUIREMENT_KEYS)
    reqs: list[Requirement] = []
    warnings: list[str] = []
    detail: list[str] = []
    if model_max is not None and ctx > model_max:
        over = Requirement("ctx", ctx, model_max, "tokens")
        reqs = [over]
        reason = "ctx exceeds model maximum"
        detail.append(f"ctx {ctx:,} exceeds the model maximum {model_max:,} ({r.setup.max_ctx_source})")
        binding = over
    else:
        if min_batch is not None:
            reqs.append(Requirement("min_batch", min_batch, r.max_batch, "requests", at=r.ctx))
        if min_ctx is not None:
            reqs.append(Requirement("min_ctx", min_ctx, r.max_ctx, "tokens", at=batch))
        if min_kv is not None:
            reqs.append(Requirement("min_kv_tokens", min_kv, r.capacity.kv_capacity_tokens or 0, "tokens"))
        if traffic is not None:
            reqs.extend(_traffic_requirements(dep, traffic))
        if not reqs:
            reqs.append(Requirement("min_batch", 1, r.max_batch, "requests", at=r.ctx, implicit=True))
        binding = min(reqs, key=lambda q: q.relative)  # the smallest relative margin (first on ties)
        failing = [q for q in reqs if not q.passed]
        if not r.weights_fit:
            reason = "weights do not fit"
            detail.append(f"weights {fmt_bytes(r.weight_bytes)} per GPU leave no KV budget "
                          f"({fmt_bytes(r.kv_budget_bytes)}) on {sel.gpu.name}")
        elif failing:
            reason = "; ".join(q.sentence() for q in sorted(failing, key=lambda q: q.relative))
        else:
            reason = "; ".join(q.sentence() for q in reqs)
        detail.extend(q.sentence() for q in reqs)
    would_start = r.capacity.engine_would_start
    start_failed = False
    if not would_start and r.weights_fit:
        message = r.capacity.start_message or "the engine's start-up checks fail"
        if dep.get("require_start"):
            start_failed = True
            detail.append(f"engine would not start: {message}")
        else:
            hint = "set max_model_len to the context you serve; " if "max_model_len" in message else ""
            warnings.append(f"engine would not start as configured: {message} ({hint}require_start: true fails on this)")
    passed = all(q.passed for q in reqs) and r.weights_fit and not start_failed
    if start_failed and all(q.passed for q in reqs) and r.weights_fit:
        reason = "engine would not start"
    inputs = {k: f.value for k, f in sorted(dep.fields.items(), key=lambda kv: list(KEYS).index(kv[0]))}
    inputs.setdefault("ctx", ctx)
    return DeploymentResult(dep, passed, reason, "; ".join(detail), inputs, r.setup.engine.label, sel.to_json(), tp, pp,
                            figures, binding, tuple(reqs), tuple(warnings))


def run(paths: list[str], *, only: list[str] | None = None, offline: bool = False,
        timeout: float | None = None, calibrations: tuple = ()) -> CheckReport:
    """Check every deployment of every file (or only those named); problems of every file are collected."""
    files = [parse_file(p) for p in paths]
    wanted = set(only or ())
    if wanted:
        known = {d.get("name") for f in files for d in f.deployments}
        unknown = sorted(wanted - known)
        if unknown and all(f.valid for f in files):
            have = ", ".join(sorted(n for n in known if n)) or "none"
            raise InputError(f"--only: no deployment named {', '.join(map(repr, unknown))} (deployments: {have})")
    res = _Resolver(offline, timeout, calibrations)
    for f in files:
        for dep in f.deployments:
            if wanted and dep.get("name") not in wanted:
                continue
            result = _solve(dep, res, f)
            if result is not None:
                f.results.append(result)
        f.problems = sorted(set(f.problems), key=lambda p: (p.line or 0, p.column or 0, p.message))
        if f.problems:
            f.results = []  # an invalid file is reported by its problems only
    return CheckReport(files)


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
