"""`kvplan fit`: what fits on a GPU (max batch at a context, max context at a batch), for one model or the whole
bundled catalog."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.app import GroupedCommand, app
from kvplan.cli.options import (Calibrations, EncoderLen, Engine, Gpu, Hub, Json, KDtype, KvBudget, KvDtype, Mmproj,
                                NoCalibration, Offline, PpOfGpus, RawKnobs, Refresh, Reserve, Revision, StateDtype,
                                Timeout, Token, TpOfGpus, VDtype, WeightDtype, calibrations as load_calibrations,
                                complete_model, engine_options, model_options, parse_knobs, parse_kv_budget,
                                parse_reserve, print_json, with_knobs)
from kvplan.errors import InputError
from kvplan.units import parse_count, parse_tokens


@app.command(cls=GroupedCommand, short_help="What fits on a GPU: batch x context limits.",
             help="What fits on a GPU: max batch at a context, max context at a batch, the frontier; or the whole catalog.\n\n"
              "Examples: kvplan fit llama-3.1-8b --gpu L4 --ctx 8k;  kvplan fit --gpu 24GB;  kvplan fit qwen3-32b --gpu 2xH100 --kv-budget 60GiB")
@with_knobs("fit")
def fit(
    gpu: Gpu,
    model_arg: Annotated[Optional[str], typer.Argument(metavar="[MODEL]", autocompletion=complete_model, help="one model, as --model (either form)", show_default=False)] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", autocompletion=complete_model, help="one model (alias, Hub id or path); default: the whole bundled catalog")] = None,
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", metavar="TOKENS", help="tokens per request for max batch (default 4096 for the catalog, 4096 or the model max for one model)")] = None,
    batch: Annotated[str, typer.Option("--batch", "-b", metavar="N", help="requests for max ctx")] = "1",
    engine: Engine = None, kv_dtype: KvDtype = None, k_dtype: KDtype = None, v_dtype: VDtype = None,
    state_dtype: StateDtype = None, weight_dtype: WeightDtype = None, tp: TpOfGpus = None, pp: PpOfGpus = None,
    mmproj: Mmproj = None, encoder_len: EncoderLen = None,
    kv_budget: KvBudget = None, reserve: Reserve = None,
    headroom: Annotated[Optional[str], typer.Option("--headroom", metavar="FRACTION", help="share of the KV budget held back before solving, e.g. 10%", rich_help_panel="Budget")] = None,
    estimate: Annotated[str, typer.Option("--estimate", metavar="median|low", help="solve an estimated budget at its point estimate (median) or at the low end of its likely range (low: what `kvplan check` gates on)", rich_help_panel="Budget")] = "median",
    calibrations: Calibrations = None, no_calibration: NoCalibration = False,
    knobs: RawKnobs = None,
    json_out: Json = False, revision: Revision = None, offline: Offline = False, refresh: Refresh = False,
    hub: Hub = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan import gpus as gpu_catalog, planner
    from kvplan.units import parse_headroom

    if model_arg is not None:
        if model is not None and model != model_arg:
            raise InputError(f"fit: the model is given twice ({model_arg!r} and --model {model!r}); give one")
        model = model_arg

    selection = gpu_catalog.resolve_gpu(gpu)
    knobs = parse_knobs(knobs)
    if encoder_len and not model:
        raise InputError("--encoder-len sizes one model's cross attention; give the model (MODEL or --model), the "
                         "catalog holds models without it")
    mo = model_options(model or "", revision=revision, offline=offline, refresh=refresh, hub=hub, token=token,
                       timeout=timeout, encoder_len=encoder_len, mmproj=mmproj)
    eo = engine_options(engine=engine, kv_dtype=kv_dtype, k_dtype=k_dtype, v_dtype=v_dtype, state_dtype=state_dtype,
                        weight_dtype=weight_dtype, tp="1", pp="1", knobs=knobs)
    report = planner.fit(
        [model] if model else None, eo, selection, parse_tokens(ctx, "--ctx") if ctx else None,
        parse_count(batch, "--batch"),
        mo_template=mo, kv_budget=parse_kv_budget(kv_budget) if kv_budget else None,
        reserve=parse_reserve(reserve), tp=parse_count(tp, "--tp") if tp else None,
        pp=parse_count(pp, "--pp") if pp else None,
        headroom=parse_headroom(headroom, "--headroom") if headroom else 0.0,
        calibrations=load_calibrations(calibrations, no_calibration), estimate=estimate,
    )
    if json_out:
        print_json(report.to_json())
        return
    from kvplan import render

    view = render.fit_one_view(report) if model else render.fit_catalog_view(report)
    render.console().print(view)
