"""Reading a `kvplan check` file: YAML composed (never constructed) into nodes, each value converted by its
key's kind with FILE:LINE:COLUMN on every problem, then the checks of each deployment that need no model or GPU.

Why compose: PyYAML's YAML 1.1 readings that surprise (`no` read as false, `016` as octal 14, `1:30` as 90)
become errors where a string or a number is expected, and duplicate keys are caught, not silently overwritten.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvplan import dtypes
from kvplan.check.report import Deployment, Field, FileReport, Problem
from kvplan.check.schema import (
    DTYPE_KEYS, EXPECTED, KEYS, KNOB_KEYS, PLAN_KEYS, REQUIRED, STRING_WHAT, TOP_KEYS,
)
from kvplan.engines.listing import LISTINGS, replaying
from kvplan.errors import InputError
from kvplan.units import parse_bytes, parse_count, parse_fraction, parse_headroom, parse_ratio, parse_tokens

MAX_FILE_BYTES = 16 << 20  # a check file is kilobytes; 24 MB of YAML comments took 10 s to read
_TAG = "tag:yaml.org,2002:"
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


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
    expected = EXPECTED[kind]
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
    expected = EXPECTED[kind]
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


def _string(node: ScalarNode, key: str, kind: str) -> str:
    text, k = node.value, _kind(node)
    if k == "str":
        if not text.strip():
            raise _Bad(f"{key}: empty; expected {STRING_WHAT.get(key, EXPECTED[kind])}")
        return text.strip()
    if k == "null":
        raise _Bad(f"{key}: no value; expected {STRING_WHAT.get(key, EXPECTED[kind])}")
    raise _Bad(f"{key}: {text} is read by YAML as {_read_as(node)}, not a string; "
               f"quote it if you mean the text: {key}: \"{text}\"")


def _lengths(node: ScalarNode, key: str, kind: str) -> Any:
    text, k = node.value, _kind(node)
    if k not in ("str", "int") or (k == "int" and not _plain(node)):
        raise _Bad(f"{key}: expected {EXPECTED[kind]}, got {text!r}")
    from kvplan.workload import parse_lengths

    return _user_error(lambda: parse_lengths(text, key).canonical)


def _time(node: ScalarNode, key: str, kind: str) -> float:
    text, k = node.value, _kind(node)
    if k not in ("str", "int", "float"):
        raise _Bad(f"{key}: expected {EXPECTED[kind]}, got {text!r}")
    from kvplan.units import parse_seconds

    return _user_error(lambda: parse_seconds(text, key))


def _dtype(node: ScalarNode, key: str, kind: str) -> str:
    text, k = node.value, _kind(node)
    if k != "str" or not text.strip():
        raise _Bad(f"{key}: expected {EXPECTED[kind]}, got {text!r}")
    return _user_error(lambda: "auto" if text.strip().lower() == "auto" else dtypes.kv_dtype(text).name)


def _bool(node: ScalarNode, key: str, kind: str) -> bool:
    text, k = node.value, _kind(node)
    if k == "bool" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if k == "bool":
        raise _Bad(f"{key}: {text} is YAML 1.1 for {str(_CONSTRUCTOR.construct_yaml_bool(node)).lower()} but "
                   "a string in YAML 1.2; write true or false")
    if k == "null":
        raise _Bad(f"{key}: no value; expected true or false")
    raise _Bad(f"{key}: expected true or false, got {text!r}")


def _fraction(node: ScalarNode, key: str, kind: str) -> float:
    value = _number_text(node, key, kind)
    return _user_error(lambda: parse_fraction(value, key))


def _ratio(node: ScalarNode, key: str, kind: str) -> float:
    value = _number_text(node, key, kind)
    return _user_error(lambda: parse_ratio(value, key))


def _headroom(node: ScalarNode, key: str, kind: str) -> float:
    value = _number_text(node, key, kind)
    if isinstance(value, (int, float)) and not 0 <= value < 1:
        raise _Bad(f"{key}: {node.value} is outside [0, 1); use e.g. 0.1 or 10% (the share of the KV budget held back)")
    return _user_error(lambda: parse_headroom(value, key))


def _size(node: ScalarNode, key: str, kind: str) -> int:
    value = _number_text(node, key, kind)
    if isinstance(value, float):
        raise _Bad(f"{key}: {node.value} has no unit; expected {EXPECTED[kind]} (an integer alone is bytes)")
    return _user_error(lambda: parse_bytes(value, key))


def _reserve_size(node: ScalarNode, key: str, kind: str) -> int:
    value = _number_text(node, key, kind)
    if isinstance(value, float) and value != 0:
        raise _Bad(f"{key}: {node.value} has no unit; expected {EXPECTED[kind]} (an integer alone is bytes)")
    return _user_error(lambda: _reserve(value, key))


# kind (schema.py) -> its reader: (node, key, kind) -> the value, or _Bad with the problem text
CONVERTERS: dict[str, Callable[[Any, str, str], Any]] = {
    "tokens": _integer, "count": _integer, "string": _string, "lengths": _lengths, "time": _time, "dtype": _dtype,
    "bool": _bool, "fraction": _fraction, "ratio": _ratio, "headroom": _headroom, "size": _size,
    "reserve": _reserve_size,
}


def convert(node: Node, key: str, kind: str) -> Any:
    """A YAML node -> the value of `key`, or _Bad with the problem text."""
    if not isinstance(node, ScalarNode):
        raise _Bad(f"{key}: expected {EXPECTED[kind]}, got {_shape(node)}")
    return CONVERTERS[kind](node, key, kind)


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
        from kvplan.planner import ESTIMATES

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
        if engine_name is not None and traffic and not LISTINGS[engine_name].replays:
            through = " or ".join(LISTINGS[n].replays for n in replaying())
            self.at(f or dep.fields[sorted(traffic)[0]], f"traffic keys ({', '.join(sorted(traffic))}) are replayed "
                    f"through {through}; engine {engine_name} is not modelled yet "
                    f"(accepted: {', '.join(replaying())})", dep)
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
        ef = dep.fields.get("estimate")
        if ef is not None and ef.value not in ESTIMATES:
            self.at(ef, f"estimate: {ef.value!r} is not one of {', '.join(ESTIMATES)} (low: the low end of the likely "
                    "range of an estimated budget, the default; median: the point estimate)", dep)
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
