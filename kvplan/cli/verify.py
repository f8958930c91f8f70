"""`kvplan verify`: check the predictions against a live torch allocation, or (--run) against the installed
engine started on this machine."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from kvplan.cli.app import GroupedCommand, app
from kvplan.cli.options import (Engine, EncoderLen, Hub, Json, KDtype, KvDtype, ModelArg, Offline, Pp, RawKnobs,
                                Refresh, Revision, StateDtype, Timeout, Token, Tp, VDtype, WeightDtype,
                                engine_options, model_options, parse_knobs, parse_kv_budget, print_json, with_knobs)
from kvplan.errors import KvplanError
from kvplan.units import parse_count, parse_tokens


@app.command(cls=GroupedCommand, short_help="Check predictions on a live allocation.",
             help="Check predictions against a live torch allocation (CUDA, or CPU without a GPU): allocate the "
                  "CachePlan and measure it; --fit finds the real limit; --with-model runs transformers' model code. "
                  "Exit 1 when a check fails. Needs torch: pip install \"kvplan[verify]\".\n\n"
                  "Examples: kvplan verify llama-3.2-1b --ctx 4096 --batch 2;  kvplan verify gemma-2-9b --with-model;  "
                  "kvplan verify llama-3.2-1b --run vllm")
@with_knobs("verify")
def verify(
    model: ModelArg,
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", metavar="TOKENS", help="tokens per sequence (default: the model maximum; with --fit: search the largest ctx at --batch)")] = None,
    batch: Annotated[str, typer.Option("--batch", "-b", metavar="N", help="concurrent sequences")] = "1",
    device: Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto (CUDA when torch sees one, else CPU), cpu, cuda, cuda:N; with --with-model also runs a real forward there")] = "auto",
    fit_check: Annotated[bool, typer.Option("--fit", help="find the largest batch at --ctx (or the largest ctx at --batch) that really allocates within the engine budget, beside the prediction")] = False,
    memory_limit: Annotated[Optional[str], typer.Option("--memory-limit", metavar="SIZE", help="memory for weights + KV (e.g. 16GiB); KV budget = limit - predicted weights. Required for --fit on CPU")] = None,
    with_model: Annotated[bool, typer.Option("--with-model", help="run transformers' model code for the config (meta device; a scaled real forward with --device) and compare its cache with the hf layout")] = False,
    rss: Annotated[bool, typer.Option("--rss/--no-rss", help="CPU: touch tensors of >= 1 MiB in a fresh process and check its RSS growth")] = True,
    run_engine: Annotated[Optional[str], typer.Option("--run", metavar="ENGINE", help="start the installed engine on this machine and compare what it sizes with kvplan (exit 1 on a difference): vllm (the model's config, dummy weights: KV tokens, blocks, concurrency; KVPLAN_VLLM_PYTHON picks the Python that has vLLM) or llamacpp (a local .gguf with -np --batch -c batch*ctx: every cache size line)")] = None,
    kv_budget: Annotated[Optional[str], typer.Option("--kv-budget", metavar="SIZE", help="with --run on CPU: the KV budget handed to vLLM's CPU build, whole GiB (default 1GiB)", rich_help_panel="Budget")] = None,
    engine: Engine = None, kv_dtype: KvDtype = None, k_dtype: KDtype = None, v_dtype: VDtype = None,
    state_dtype: StateDtype = None, weight_dtype: WeightDtype = None, tp: Tp = "1", pp: Pp = "1",
    encoder_len: EncoderLen = None,
    knobs: RawKnobs = None,
    json_out: Json = False, revision: Revision = None, offline: Offline = False, refresh: Refresh = False,
    hub: Hub = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan.errors import CheckFailed
    from kvplan.progress import waiting
    from kvplan.units import parse_bytes
    from kvplan.verify import core

    knobs = parse_knobs(knobs)
    mo = model_options(model, revision=revision, offline=offline, refresh=refresh, hub=hub, token=token,
                       timeout=timeout, encoder_len=encoder_len)
    eo = engine_options(engine=engine, kv_dtype=kv_dtype, k_dtype=k_dtype, v_dtype=v_dtype, state_dtype=state_dtype,
                        weight_dtype=weight_dtype, tp=tp, pp=pp, knobs=knobs)
    if run_engine is not None:
        _verify_run(run_engine, mo, eo, ctx, parse_count(batch, "--batch"), kv_budget, device, json_out)
        return
    if kv_budget is not None:
        raise KvplanError("--kv-budget applies to verify --run (the budget handed to vLLM's CPU build)")
    opts = core.VerifyOptions(device=device, fit=fit_check, with_model=with_model, rss=rss,
                              memory_limit=parse_bytes(memory_limit, "--memory-limit") if memory_limit else None)
    with waiting("allocating the predicted cache" + (" and bisecting the real limit" if fit_check else "")):
        result = core.run(mo, eo, parse_tokens(ctx, "--ctx") if ctx is not None else None,
                          parse_count(batch, "--batch"), opts)
    if json_out:
        print_json(result.to_json())
    else:
        from kvplan import render

        render.console().print(render.verify_view(result))
    if not result.passed:
        raise CheckFailed(result.failure_line())


def _verify_run(engine_name: str, mo: Any, eo: Any, ctx: str | None, batch: int, kv_budget: str | None, device: str,
                json_out: bool) -> None:
    """verify --run ENGINE: start the engine and compare its start-up figures with kvplan's."""
    from kvplan.errors import CheckFailed
    from kvplan.progress import waiting
    from kvplan.verify import engine_run

    with waiting(f"starting {engine_name} on the model (importing an engine takes a while)"):
        result = engine_run.run(engine_name, mo, eo, parse_tokens(ctx, "--ctx") if ctx is not None else None,
                                parse_kv_budget(kv_budget) if kv_budget is not None else None, device, batch)
    if json_out:
        print_json(result.to_json())
    else:
        from kvplan import render

        render.console().print(render.engine_run_view(result))
    if not result.passed:
        raise CheckFailed(result.failure_line())
