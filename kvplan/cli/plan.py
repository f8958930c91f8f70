"""`kvplan plan`: capacity for a traffic mix, replayed through the engine's scheduler (vLLM's, or llama-server's
slots), with a decode-speed bound and the GPUs for N users."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.app import GroupedCommand, app
from kvplan.cli.options import (Calibrations, Engine, Gpu, Hub, Json, KvBudget, KvDtype, ModelArg, NoCalibration,
                                Offline, PpOfGpus, RawKnobs, Refresh, Reserve, Revision, Timeout, Token, TpOfGpus,
                                WeightDtype, calibrations as load_calibrations, engine_options, model_options,
                                parse_knobs, parse_kv_budget, parse_reserve, print_json, with_knobs)
from kvplan.errors import InputError
from kvplan.units import parse_count, parse_tokens

_WORKLOAD = "Workload (plan)"


@app.command(cls=GroupedCommand, short_help="A traffic mix: requests at once, speed, GPUs.",
             help="Capacity for a traffic mix: requests running at once under the engine's scheduler (vLLM's, or "
                  "llama-server's slots with --engine llamacpp), a decode-speed bound, and GPUs for N users at a time "
                  "per output token.\n\n"
                  "Example: kvplan plan llama-3.1-8b --gpu H100 --prompt 500-3000 --output 100-800 --users 2000 --tpot 30ms")
@with_knobs("plan")
def plan(
    model: ModelArg,
    gpu: Gpu,
    prompt: Annotated[Optional[str], typer.Option("--prompt", metavar="TOKENS", help="prompt length: 1000, or a range 500-3000 (uniform)", rich_help_panel=_WORKLOAD)] = None,
    output: Annotated[Optional[str], typer.Option("--output", metavar="TOKENS", help="output length: 300, or a range 100-800 (uniform)", rich_help_panel=_WORKLOAD)] = None,
    requests_file: Annotated[Optional[str], typer.Option("--requests-file", metavar="FILE", help="real request lengths: CSV with a header or JSONL (prompt_tokens/input_tokens, output_tokens/completion_tokens; OpenAI usage objects)", rich_help_panel=_WORKLOAD)] = None,
    requests: Annotated[Optional[str], typer.Option("--requests", "-n", metavar="N", help="requests drawn from the ranges (default 1,000)", rich_help_panel=_WORKLOAD)] = None,
    shared_prefix: Annotated[Optional[str], typer.Option("--shared-prefix", metavar="TOKENS", help="leading prompt tokens every request shares (a system prompt), cached once with prefix caching", rich_help_panel=_WORKLOAD)] = None,
    users: Annotated[Optional[str], typer.Option("--users", "-u", metavar="N", help="concurrent users to serve (closed loop); sizes the fleet", rich_help_panel=_WORKLOAD)] = None,
    tpot: Annotated[Optional[str], typer.Option("--tpot", metavar="TIME", help="target time per output token: 30ms, 0.05s (needs --users)", rich_help_panel=_WORKLOAD)] = None,
    ttft: Annotated[Optional[str], typer.Option("--ttft", metavar="TIME", help="target time to first token: 500ms, 2s (needs --users; checked against the longest prompt's prefill bound)", rich_help_panel=_WORKLOAD)] = None,
    interconnect: Annotated[Optional[str], typer.Option("--interconnect", metavar="GB/S", help="tensor parallelism: each GPU's link bandwidth in GB/s, one direction (e.g. 450 for NVLink 4); adds all-reduce time to the bounds", rich_help_panel=_WORKLOAD)] = None,
    bandwidth: Annotated[Optional[str], typer.Option("--bandwidth", metavar="GB/S", help="memory bandwidth of one GPU in GB/s (default: the catalog's)", rich_help_panel=_WORKLOAD)] = None,
    rate: Annotated[Optional[str], typer.Option("--rate", metavar="REQ/S", help="requests per second arriving (Poisson, fixed seed) instead of a closed loop of users; latencies and the instances that sustain it", rich_help_panel=_WORKLOAD)] = None,
    burst: Annotated[bool, typer.Option("--burst", help="every request arrives at once (a benchmark run) instead of a closed loop", rich_help_panel=_WORKLOAD)] = False,
    engine: Engine = None, kv_dtype: KvDtype = None, weight_dtype: WeightDtype = None,
    tp: TpOfGpus = None, pp: PpOfGpus = None,
    kv_budget: KvBudget = None, reserve: Reserve = None,
    calibrations: Calibrations = None, no_calibration: NoCalibration = False,
    knobs: RawKnobs = None,
    json_out: Json = False, revision: Revision = None, offline: Offline = False, refresh: Refresh = False,
    hub: Hub = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan import gpus as gpu_catalog, serving, workload as wl
    from kvplan.progress import waiting
    from kvplan.units import parse_bandwidth, parse_rate, parse_seconds

    selection = gpu_catalog.resolve_gpu(gpu)
    knobs = parse_knobs(knobs)
    prefix = parse_tokens(shared_prefix, "--shared-prefix") if shared_prefix else 0
    count = parse_count(requests, "--requests") if requests else None
    if requests_file:
        if prompt or output:
            raise InputError("--requests-file gives the lengths; leave out --prompt and --output")
        work = wl.from_file(requests_file, prefix, count)
    else:
        if not prompt or not output:
            raise InputError("plan needs the request lengths: --prompt TOKENS and --output TOKENS (each a number or "
                             "a range such as 500-3000), or --requests-file FILE")
        work = wl.sampled(count or 1000, wl.parse_lengths(prompt, "--prompt"), wl.parse_lengths(output, "--output"), prefix)
    mo = model_options(model, revision=revision, offline=offline, refresh=refresh, hub=hub, token=token,
                       timeout=timeout, encoder_len=None)
    eo = engine_options(engine=engine, kv_dtype=kv_dtype, k_dtype=None, v_dtype=None, state_dtype=None,
                        weight_dtype=weight_dtype, tp="1", pp="1", knobs=knobs)
    with waiting(f"replaying {len(work.requests):,} requests through {_replays(engine)}"):
        report = serving.plan(
            mo, eo, selection, work, users=parse_count(users, "--users") if users else None,
            tpot=parse_seconds(tpot, "--tpot") if tpot else None, ttft=parse_seconds(ttft, "--ttft") if ttft else None,
            rate=parse_rate(rate, "--rate") if rate else None,
            bandwidth=parse_bandwidth(bandwidth, "--bandwidth") if bandwidth else None,
            interconnect=parse_bandwidth(interconnect, "--interconnect") if interconnect else None,
            kv_budget=parse_kv_budget(kv_budget) if kv_budget else None, reserve=parse_reserve(reserve),
            tp=parse_count(tp, "--tp") if tp else None, pp=parse_count(pp, "--pp") if pp else None, burst=burst,
            calibrations=load_calibrations(calibrations, no_calibration),
        )
    if json_out:
        print_json(report.to_json())
        return
    from kvplan import render

    render.console().print(render.plan_view(report))


def _replays(engine: str | None) -> str:
    """What the replay runs through, for the spinner: the engine listing's `replays`; an engine with no replay is
    refused by serving.plan, and until then the default engine's scheduler is named."""
    from kvplan import engines
    from kvplan.engines.listing import LISTINGS

    name = engines.split_engine(engine or engines.DEFAULT_ENGINE)[0]
    return LISTINGS[name].replays or LISTINGS[engines.DEFAULT_ENGINE].replays
