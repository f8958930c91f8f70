"""The shape of the package, held so that it cannot drift back (issue 37): engines know models only through the
ModelSpec and tables keyed by what the engine keys on, never by kvplan's family names or a model-family module;
modules stay small; nothing outside the engine modules picks an engine by comparing its name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "kvplan"
ENGINES = PKG / "engines"
MAX_LINES = 600


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[str]:
    """Every module a file imports, at the top or inside a function."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


@pytest.mark.parametrize("path", _modules(ENGINES), ids=lambda p: str(p.relative_to(PKG)))
def test_engines_import_no_family_module(path):
    """An engine reads facts off the ModelSpec (encoder layers, windows, ...); a family module is the families'."""
    bad = [m for m in _imports(path) if m == "kvplan.architectures" or m.startswith("kvplan.architectures.")]
    assert not bad, bad


def _literal_strings(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_literal_strings(e) for e in node.elts)


@pytest.mark.parametrize("path", _modules(ENGINES), ids=lambda p: str(p.relative_to(PKG)))
def test_engines_compare_no_model_name(path):
    """No `spec.family` anywhere in an engine, and no architecture / model_type compared with a name written in
    the code: a model an engine treats specially is a row of a table keyed by its class (layout.model_row)."""
    tree = ast.parse(path.read_text())
    family = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "family"]
    assert not family, f"{path.name}: .family read at lines {family}"
    named = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Compare):
            continue
        sides = [n.left, *n.comparators]
        keyed = any(isinstance(s, ast.Attribute) and s.attr in ("architecture", "model_type") for s in sides)
        if keyed and any(_literal_strings(s) for s in sides):
            named.append(n.lineno)
    assert not named, f"{path.name}: a model name compared at lines {named}"


def test_the_guard_sees_a_family_branch(tmp_path):
    """The two checks above fail on the code they forbid (so their passing means something)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f(spec):\n    if spec.architecture in ('Cohere2ForCausalLM',):\n        return 1\n"
                   "    from kvplan.architectures import encdec\n    return spec.family\n")
    with pytest.raises(AssertionError, match="line"):
        test_engines_compare_no_model_name(bad)
    with pytest.raises(AssertionError):
        test_engines_import_no_family_module(bad)


ENGINE_MODULES = ("vllm", "sglang", "llamacpp", "trtllm", "hf")


@pytest.mark.parametrize("path", _modules(PKG / "serving"), ids=lambda p: p.name)
def test_the_replay_imports_no_engine_module(path):
    """`kvplan plan` reaches an engine through its listing and its module's view of the pool (engines/views.py),
    so a change inside an engine's layout classes cannot break the replay unseen."""
    bad = [m for m in _imports(path) if any(m == f"kvplan.engines.{e}" or m.startswith(f"kvplan.engines.{e}.")
                                            for e in ENGINE_MODULES)]
    assert not bad, bad


def test_no_module_is_a_room_of_its_own():
    """Every module of the package under 600 lines (split along its seams when it grows)."""
    big = {str(p.relative_to(PKG)): n for p in _modules(PKG) if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, big


def _members(protocol) -> set[str]:
    own = set()
    for cls in protocol.__mro__:
        if cls.__name__ in ("Protocol", "Generic", "object"):
            continue
        own |= {n for n in vars(cls) if not n.startswith("_")} | set(getattr(cls, "__annotations__", {}))
    return own


@pytest.mark.parametrize("name", list(__import__("kvplan.engines.listing", fromlist=["LISTINGS"]).LISTINGS))
def test_each_engine_module_provides_what_its_listing_row_promises(name):
    """The contract is what callers use: every module has EngineModule's members, and exactly the modules whose row
    says `calibrates` / `replay_pool` have CalibratingEngine's / the replay protocol's (no caller probes with
    hasattr)."""
    from kvplan import engines
    from kvplan.engines import base
    from kvplan.engines.listing import LISTINGS

    module, row = engines.REGISTRY[name], LISTINGS[name]
    assert not (_members(base.EngineModule) - set(dir(module))), name
    for capability, protocol in base.CAPABILITY_PROTOCOLS.items():
        promised = row.calibrates if capability == "calibrates" else row.replay_pool == capability
        extra = _members(protocol) - _members(base.EngineModule)
        assert (not (extra - set(dir(module)))) == promised, (name, capability, sorted(extra - set(dir(module))))
