"""Guards of the engine layer's shape (issue #10): every engine answers for every cache kind, a kind without a
rule is one clear line and exit 2 on every engine, the CLI's knob flags are generated from the engines' listed knobs,
and the computing core never imports the presentation layer, torch or the Hub client."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import typer

from kvplan import cli, engines, sizing, spec as spec_module
from kvplan.cli import options
from kvplan.engines import layout, listing
from kvplan.spec import LayerCache

ROOT = Path(__file__).resolve().parents[1] / "kvplan"


@pytest.mark.parametrize("engine", engines.names())
def test_every_engine_states_a_rule_for_every_cache_kind(engine):
    rules = engines.REGISTRY[engine].KIND_RULES
    kinds = [cls for cls in spec_module.cache_kinds() if cls.__module__.startswith("kvplan.")]
    from kvplan import caches

    defined = {c for c in vars(caches).values() if isinstance(c, type) and issubclass(c, LayerCache)
               and c not in (LayerCache, caches.RecurrentState)}
    assert set(kinds) == defined  # cache_kinds() finds every kind caches.py defines, no fewer
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


def _knob_options(command: str) -> dict:
    """The options `kvplan COMMAND --help` lists in the engine-knob panel, as click built them."""
    click_command = typer.main.get_command(cli.app).commands[command]
    return {p.name: p for p in click_command.params if getattr(p, "rich_help_panel", None) == options.KNOBS_PANEL}


COMMANDS = ["size", "fit", "plan", "explain", "check", "models", "pull", "gpus", "verify"]


def test_fit_has_a_flag_for_every_engine_knob_and_no_other():
    assert set(_knob_options("fit")) == set(engines.all_knobs())


@pytest.mark.parametrize("command", ["size", "verify"])
def test_size_and_verify_take_exactly_the_layout_knobs(command):
    layout_knobs = {name for name, k in engines.all_knobs().items() if k.layout}
    assert set(_knob_options(command)) == layout_knobs


def test_plan_takes_the_knobs_its_rows_mark_and_only_of_engines_it_replays():
    marked = {name for name, k in engines.all_knobs().items() if k.plan}
    assert set(_knob_options("plan")) == marked
    replayed = set().union(*(engines.LISTINGS[name].knobs for name in listing.replaying()))
    assert marked and marked <= replayed


@pytest.mark.parametrize("command", COMMANDS)
def test_every_knob_option_is_its_listing_row(command):
    """The flag (and --no-FLAG where the row is negatable), the row's aliases, the row's CLI help naming the owning
    engine first (the panel's title promises it), the kind's metavar; a knob is never declared outside the panel,
    and the commands without a knob rule take none."""
    click_command = typer.main.get_command(cli.app).commands[command]
    generated = _knob_options(command)
    assert {p.name for p in click_command.params} & set(engines.all_knobs()) == set(generated)
    if command not in options.TAKES:
        assert not generated
    in_plan = command == "plan"
    for name, p in generated.items():
        k = engines.all_knobs()[name]
        assert p.opts == [k.flag, *k.aliases, *(k.plan_aliases if in_plan else ())]
        assert p.secondary_opts == ([f"--no-{k.flag[2:]}"] if k.negatable else [])
        assert p.help == ((k.plan_help if in_plan else "") or k.cli_help)
        assert p.help.startswith(engines.knob_owners(name)[0])
        assert p.metavar == {"bool": None, "count": "N", "tokens": "TOKENS", "fraction": "FRACTION",
                             "ratio": "RATIO", "dtype": "DTYPE"}[k.kind]


def test_a_new_knob_row_reaches_every_command_that_takes_it(monkeypatch):
    """One row in a listing is all a new knob needs: each command's generator lists it (or not, by the row) and
    hands its value to the command in the knobs dict."""
    new = listing.Knob("test_knob", "count", "a knob for this test", layout=False, cli_help="vllm: a test knob",
                       plan=True)
    row = engines.LISTINGS["vllm"]
    monkeypatch.setitem(engines.LISTINGS, "vllm", dataclasses.replace(row, knobs={**row.knobs, new.name: new}))

    def command(model: str, knobs: options.RawKnobs = None) -> dict:
        return knobs

    for name, takes in {"size": False, "verify": False, "fit": True, "plan": True}.items():
        one = typer.Typer()
        one.command()(options.with_knobs(name)(command))
        click_command = typer.main.get_command(one)
        assert ("test_knob" in {p.name for p in click_command.params}) is takes, name
        given = click_command.main(["m", *(["--test-knob", "7"] if takes else []), "--block-size", "32"],
                                   standalone_mode=False)
        assert set(given) == {k.name for k in options.command_knobs(name)}
        assert given["block_size"] == "32" and given.get("test_knob") == ("7" if takes else None)
        assert sum(v is not None for v in given.values()) == 1 + takes


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
