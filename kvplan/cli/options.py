"""The options several commands share, declared once, and what their values become (ModelOptions, EngineOptions,
byte counts); the engine knob options are generated here from the engine listings.

Why one place: a flag's spelling, help line and parsing are then the same in every command that takes it, and an
engine knob is one row in its engine's listing (kvplan/engines/listing.py) that reaches every command taking it.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from typing import Annotated, Any, Callable, Optional

import typer

from kvplan import catalog, engines
from kvplan.engines.listing import Knob
from kvplan.errors import InputError, KvplanError
from kvplan.units import parse_count, parse_tokens


def complete_model(incomplete: str) -> list[str]:
    """Shell completion for MODEL: the bundled aliases and Hub ids (no network)."""
    try:
        names = [n for m in catalog.bundled_models() for n in (*m.aliases, m.repo_id)]
    except Exception:  # noqa: BLE001 - completion never fails loudly
        return []
    return sorted(n for n in names if n.lower().startswith(incomplete.lower()))


def complete_gpu(incomplete: str) -> list[str]:
    """Shell completion for --gpu: catalog names and aliases (sizes and NxGPU are typed)."""
    from kvplan import gpus

    try:
        names = [n for g in gpus.load_catalog() for n in (g.name, *g.aliases) if " " not in n]
    except Exception:  # noqa: BLE001
        return []
    return sorted({n for n in names if n.lower().startswith(incomplete.lower())})


# ---------------------------------------------------------------------------------------------- shared options
_ENGINE_HELP = ", ".join(f"{n} (default)" if n == engines.DEFAULT_ENGINE else n for n in engines.names())
Engine = Annotated[Optional[str], typer.Option("--engine", "-e", metavar="ENGINE", help=f"{_ENGINE_HELP}; optionally name@version", rich_help_panel="Engine and layout")]
KvDtype = Annotated[Optional[str], typer.Option("--kv-dtype", "--kv-cache-dtype", metavar="DTYPE", help="auto (default), fp16, bf16, fp32, fp8 (fp8_e4m3), fp8_e5m2, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl", rich_help_panel="Engine and layout")]
KDtype = Annotated[Optional[str], typer.Option("--k-dtype", metavar="DTYPE", help="K cache dtype (overrides --kv-dtype for K)", rich_help_panel="Engine and layout")]
VDtype = Annotated[Optional[str], typer.Option("--v-dtype", metavar="DTYPE", help="V cache dtype (overrides --kv-dtype for V)", rich_help_panel="Engine and layout")]
StateDtype = Annotated[Optional[str], typer.Option("--state-dtype", metavar="DTYPE", help="Mamba/linear-attention state dtype (engine default otherwise)", rich_help_panel="Engine and layout")]
WeightDtype = Annotated[Optional[str], typer.Option("--weight-dtype", metavar="DTYPE", help="fp32, fp16, bf16, fp8, int8, int4 (default: the checkpoint's)", rich_help_panel="Engine and layout")]
Tp = Annotated[str, typer.Option("--tp", "--tensor-parallel-size", metavar="N", help="tensor-parallel GPUs", rich_help_panel="Engine and layout")]
Pp = Annotated[str, typer.Option("--pp", "--pipeline-parallel-size", metavar="N", help="pipeline-parallel stages", rich_help_panel="Engine and layout")]
# fit and plan: the GPUs of --gpu NxGPU are split unless told
TpOfGpus = Annotated[Optional[str], typer.Option("--tp", "--tensor-parallel-size", metavar="N", help="tensor-parallel GPUs (default: all GPUs of NxGPU)", rich_help_panel="Engine and layout")]
PpOfGpus = Annotated[Optional[str], typer.Option("--pp", "--pipeline-parallel-size", metavar="N", help="pipeline-parallel stages", rich_help_panel="Engine and layout")]
Gpu = Annotated[str, typer.Option("--gpu", "-g", metavar="GPU", autocompletion=complete_gpu, help="catalog name (kvplan gpus), a size such as 24GB, or NxGPU such as 8xH100")]
ModelArg = Annotated[str, typer.Argument(metavar="MODEL", autocompletion=complete_model, help="alias (kvplan models), Hub id org/name, or a path to config.json")]
EncoderLen = Annotated[Optional[str], typer.Option("--encoder-len", metavar="TOKENS", help="encoder positions for cross attention (T5 default n_positions, Whisper 1500)", rich_help_panel="Model")]
Mmproj = Annotated[Optional[str], typer.Option("--mmproj", metavar="GGUF", help="GGUF vision projector (llama.cpp --mmproj): a .gguf path or org/name:file.gguf; its bytes join the weights", rich_help_panel="Model")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object (CONTRACTS.md keys) instead of tables", rich_help_panel="Output")]
Revision = Annotated[Optional[str], typer.Option("--revision", metavar="REV", help="Hub revision (branch, tag or commit)", rich_help_panel="Model")]
Offline = Annotated[bool, typer.Option("--offline", help="never touch the network: bundled catalog and HF cache only", rich_help_panel="Model")]
Refresh = Annotated[bool, typer.Option("--refresh", help="ask the Hub even for bundled or cached models", rich_help_panel="Model")]
Hub = Annotated[bool, typer.Option("--hub", help="resolve a bundled Hub id on the Hub instead of the bundled file", rich_help_panel="Model")]
Token = Annotated[Optional[str], typer.Option("--token", metavar="TOKEN", help="Hugging Face token (default: HF_TOKEN or the stored login)", rich_help_panel="Model")]
Timeout = Annotated[Optional[float], typer.Option("--timeout", metavar="SECONDS", help="seconds to wait for the Hub per lookup (default 10, env KVPLAN_HUB_TIMEOUT)", rich_help_panel="Model")]
KvBudget = Annotated[Optional[str], typer.Option("--kv-budget", metavar="SIZE", help="KV memory per GPU the engine reported (skips the budget model), e.g. 5.01GiB", rich_help_panel="Budget")]
Reserve = Annotated[Optional[str], typer.Option("--reserve", metavar="SIZE", help="non-KV, non-weight memory per GPU (replaces the estimate), e.g. 1.5GiB", rich_help_panel="Budget")]
Calibrations = Annotated[Optional[str], typer.Option("--calibrations", metavar="FILE", help="calibration file (default $KVPLAN_CALIBRATIONS or ~/.config/kvplan/calibrations.yaml): non-KV memory measured by engine logs, saved by kvplan explain --save-calibration", rich_help_panel="Budget")]
NoCalibration = Annotated[bool, typer.Option("--no-calibration", help="ignore saved calibrations: the budget model's estimate", rich_help_panel="Budget")]

# ---------------------------------------------------------------------------------------------- engine knobs
# Each engine accepts only its own knobs (engines/listing.py declares them). Values are read as text and parsed by
# the knob's kind (Knob.parse), so every command gives the same one-line error for a bad value.
KNOBS_PANEL = "Engine knobs (each applies to the engine named first in its help)"

_KIND_METAVAR = {"count": "N", "tokens": "TOKENS", "fraction": "FRACTION", "ratio": "RATIO", "bool": None,
                 "dtype": "DTYPE"}

# Which knobs a command takes: a property of the knob's row, never a list of names here.
TAKES: dict[str, Callable[[Knob], bool]] = {
    "size": lambda k: k.layout,
    "verify": lambda k: k.layout,
    "fit": lambda k: True,
    "plan": lambda k: k.plan,
}

RawKnobs = dict[str, Any]  # knob name -> the value as typed (None: not given); parse_knobs reads them


@functools.lru_cache(maxsize=None)
def knob_option(knob: Knob, in_plan: bool = False) -> Any:
    """The knob as an Annotated typer option: --NAME (and --no-NAME), its aliases, help and metavar; in_plan: with
    plan's own help and aliases. One object per knob, shared by the commands that take it."""
    flags = knob.flag + (f"/--no-{knob.flag[2:]}" if knob.negatable else "")
    aliases = knob.aliases + (knob.plan_aliases if in_plan else ())
    option = typer.Option(flags, *aliases, help=(knob.plan_help if in_plan else "") or knob.cli_help,
                          metavar=_KIND_METAVAR[knob.kind], rich_help_panel=KNOBS_PANEL)
    return Annotated[Optional[bool] if knob.kind == "bool" else Optional[str], option]


def command_knobs(command: str) -> list[Knob]:
    """The knobs `command` takes, in listing order (engine by engine, as engines/listing.py lists them)."""
    return [k for k in engines.all_knobs().values() if TAKES[command](k)]


class _WithKnobs:
    """A command function whose `knobs` parameter typer sees as one option per knob the command takes.

    The signature is worked out when typer first asks for it (inspect.signature reads __signature__), so a run
    builds the knob options of its own command only, as it builds only that command's other parameters."""

    def __init__(self, func: Callable[..., Any], command: str) -> None:
        functools.update_wrapper(self, func, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
        self._func, self._command = func, command

    @functools.cached_property
    def __signature__(self) -> inspect.Signature:
        signature = inspect.signature(self._func, eval_str=True)
        assert "knobs" in signature.parameters, self.__name__
        params: list[inspect.Parameter] = []
        for p in signature.parameters.values():
            if p.name != "knobs":
                params.append(p)
                continue
            params += [inspect.Parameter(k.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                         annotation=knob_option(k, self._command == "plan"))
                       for k in command_knobs(self._command)]
        return signature.replace(parameters=params)

    @property
    def __annotations__(self) -> dict[str, Any]:  # what typing.get_type_hints reads (typer asks it too)
        return {p.name: p.annotation for p in self.__signature__.parameters.values()}

    def __call__(self, **values: Any) -> Any:
        given = {k.name: values.pop(k.name) for k in command_knobs(self._command)}
        return self._func(**values, knobs=given)


def with_knobs(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command whose signature has a `knobs: RawKnobs` parameter: typer sees one option per knob the
    command takes in its place (TAKES, by the knob's row), and the command gets their values back as the one dict
    `knobs` ({name: value as typed, None where not given}; parse_knobs reads it).

    The options are parameters of the signature typer reads, so typer builds them exactly as it builds a
    hand-written one (help line, completion, flag parsing)."""
    assert command in TAKES, command
    return lambda func: _WithKnobs(func, command)


def parse_knobs(given: RawKnobs) -> dict[str, Any]:
    """Engine knob flags -> engine options, each parsed by its declared kind; None = the engine's default."""
    table = engines.all_knobs()
    return {name: table[name].parse(value) for name, value in given.items()}


# ---------------------------------------------------------------------------------------------- what values become
def model_options(model: str, *, revision, offline, refresh, hub, token, timeout, encoder_len, mmproj=None):
    from kvplan.sizing import ModelOptions

    if timeout is not None or os.environ.get("KVPLAN_HUB_TIMEOUT"):  # checked now, not first when the Hub is asked
        from kvplan import hub as hub_mod

        hub_mod.resolve_timeout(timeout)
    return ModelOptions(model, revision, offline or None, refresh, hub, token, timeout,
                        parse_tokens(encoder_len, "--encoder-len") if encoder_len else None, mmproj)


def engine_options(*, engine, kv_dtype, k_dtype, v_dtype, state_dtype, weight_dtype, tp, pp, knobs):
    from kvplan import dtypes
    from kvplan.sizing import EngineOptions

    for flag, name in (("--kv-dtype", kv_dtype), ("--k-dtype", k_dtype), ("--v-dtype", v_dtype)):
        if name is not None and dtypes.canonical(name) != "auto":  # a name no engine knows: bad input for every model
            try:
                dtypes.kv_dtype(name)
            except KvplanError as e:
                raise type(e)(f"{flag}: {e}") from None
    return EngineOptions(engine, kv_dtype, k_dtype, v_dtype, state_dtype, weight_dtype,
                         parse_count(tp, "--tp"), parse_count(pp, "--pp"), knobs)


def parse_kv_budget(text: str) -> int:
    """--kv-budget: a size; a bare number is bytes, and one too small for a KV block is taken as a missing unit."""
    from kvplan.units import parse_bytes

    value = parse_bytes(text, "--kv-budget")
    if value < (1 << 20) and str(text).strip().replace(",", "").isdigit():
        raise InputError(f"--kv-budget {text}: {value:,} bytes cannot hold a KV block; give a unit, e.g. {text}GiB "
                         "(a bare number is bytes)")
    return value


def parse_reserve(text: str | None) -> int | None:
    if text is None:
        return None
    from kvplan.units import parse_bytes

    if text.strip() in ("0", "0B", "0GiB", "0GB"):
        return 0
    return parse_bytes(text, "--reserve")


def calibrations(path: str | None, off: bool) -> tuple:
    """The saved calibrations a fit uses: none with --no-calibration; a named file must exist."""
    from kvplan import calibration

    if off:
        if path:
            raise InputError("--calibrations and --no-calibration contradict each other; give one")
        return ()
    return calibration.load(path, must_exist=bool(path))


def print_json(data: Any) -> None:
    """--json: one JSON object on stdout."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
