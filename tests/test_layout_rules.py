"""Guards of the engine layer's shape (issue #10): every engine answers for every cache kind, a kind without a
rule is one clear line and exit 2 on every engine, the CLI's knob flags are exactly the engines' declared knobs,
and the computing core never imports the presentation layer, torch or the Hub client."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import typer

from kvplan import cli, engines, sizing, spec as spec_module
from kvplan.engines import layout
from kvplan.spec import LayerCache

ROOT = Path(__file__).resolve().parents[1] / "kvplan"


@pytest.mark.parametrize("engine", engines.names())
def test_every_engine_states_a_rule_for_every_cache_kind(engine):
    rules = engines.REGISTRY[engine].KIND_RULES
    kinds = [cls for cls in spec_module.cache_kinds() if cls.__module__.startswith("kvplan.")]
    assert len(kinds) >= 9
    missing = [cls.__name__ for cls in kinds if cls not in rules]
    assert not missing, f"{engine} has no KIND_RULES row for {missing}"


@dataclasses.dataclass(frozen=True)
class _InventedKind(LayerCache):
    """A cache kind no engine knows (what the next architecture will bring)."""

    kind = "invented_keys"
    width: int = 64

    @property
    def grows_with_context(self) -> bool:
        return True


@pytest.mark.parametrize("engine", engines.names())
def test_a_kind_without_a_rule_is_one_line_and_exit_2(engine, monkeypatch, capsys):
    real = sizing.load_spec

    def with_invented_layer(mo):
        resolved, spec = real(mo)
        caches = ((0, _InventedKind()),) + spec.caches[1:]
        return resolved, dataclasses.replace(spec, caches=caches)

    monkeypatch.setattr(sizing, "load_spec", with_invented_layer)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["size", "llama-2-7b", "--ctx", "4096", "--engine", engine])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{engine} has no layout rule for invented_keys layers" in err


def test_rule_lookup_is_by_exact_class_not_by_parent():
    """A subclass of a known kind is a new kind: it must get its own row, not silently inherit its parent's."""

    @dataclasses.dataclass(frozen=True)
    class NarrowerWindow(spec_module.SlidingWindow):
        pass

    with pytest.raises(layout.UnsupportedKind, match="vllm has no layout rule"):
        layout.rule_for("vllm", engines.REGISTRY["vllm"].KIND_RULES, NarrowerWindow(1, 64, 64, window=128))


def _knob_params(command: str) -> set[str]:
    click_command = typer.main.get_command(cli.app).commands[command]
    return {p.name for p in click_command.params if getattr(p, "rich_help_panel", None) == cli._KNOBS_PANEL}


def test_fit_has_a_flag_for_every_engine_knob_and_no_other():
    assert _knob_params("fit") == set(engines.all_knobs())


@pytest.mark.parametrize("command", ["size", "verify"])
def test_size_and_verify_take_exactly_the_layout_knobs(command):
    layout_knobs = {name for name, k in engines.all_knobs().items() if k.layout}
    assert _knob_params(command) == layout_knobs


def test_check_accepts_every_engine_knob_under_its_yaml_name():
    from kvplan import check

    assert {k: v.kind for k, v in engines.all_knobs().items()} == check.KNOB_KEYS
    assert set(check.KNOB_KEYS) <= set(check.KEYS)


def test_a_knob_belongs_to_one_engine():
    seen: dict[str, str] = {}
    for name, module in engines.REGISTRY.items():
        for knob in module.ENGINE.knobs:
            assert knob not in seen, f"{knob} is declared by {seen.get(knob)} and {name}"
            seen[knob] = name


# ---------------------------------------------------------------------------------------------- import layering
CORE = ["spec.py", "parallel.py", "dtypes.py", "units.py", "weights.py", "sizing.py", "planner.py", "check",
        "gguf.py", "gpus.py", "errors.py", "catalog.py", "architectures", "engines"]
FORBIDDEN_EVERYWHERE = ("torch", "transformers", "kvplan.render", "kvplan.cli", "rich", "typer")
FORBIDDEN_FOR_COMPUTING = ("huggingface_hub", "kvplan.verify", "kvplan.hub")


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _files(entries: list[str]) -> list[Path]:
    out = []
    for e in entries:
        p = ROOT / e
        out.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return out


def _hits(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in _imports(path) for f in forbidden if m == f or m.startswith(f + "."))


@pytest.mark.parametrize("path", _files(CORE), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_never_imports_presentation_or_torch(path):
    assert not _hits(path, FORBIDDEN_EVERYWHERE)


@pytest.mark.parametrize("path", _files(["spec.py", "parallel.py", "architectures", "engines", "weights.py",
                                         "planner.py"]), ids=lambda p: str(p.relative_to(ROOT)))
def test_layout_and_planning_never_reach_the_hub_or_verify(path):
    assert not _hits(path, FORBIDDEN_FOR_COMPUTING)


@pytest.mark.parametrize("path", _files(["hub"]), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_hub_client_does_not_import_the_resolver(path):
    """hub/ and resolve.py once imported each other; the shared types live in model_ref.py now."""
    assert not _hits(path, ("kvplan.resolve",))
    assert not _hits(ROOT / "model_ref.py", ("kvplan.resolve", "kvplan.hub", "huggingface_hub"))
