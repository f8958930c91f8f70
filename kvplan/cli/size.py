"""`kvplan size`: the KV cache, weights and their sum for one model at batch x ctx."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.app import GroupedCommand, app
from kvplan.cli.options import (Engine, EncoderLen, Hub, Json, KDtype, KvDtype, Mmproj, Offline, Pp, RawKnobs, Refresh,
                                Revision, StateDtype, Timeout, Token, Tp, VDtype, WeightDtype, complete_model,
                                engine_options, model_options, parse_knobs, print_json, with_knobs)
from kvplan.units import parse_count, parse_tokens


@app.command(cls=GroupedCommand, short_help="KV cache, weights and their sum, exactly.",
             help="KV cache per token and for batch x ctx, weights and the total, exactly.\n\n"
              "Examples: kvplan size llama-3.1-8b --ctx 32k --batch 8;  kvplan size deepseek-v3 --tp 8 --kv-dtype fp8 --json")
@with_knobs("size")
def size(
    model: Annotated[str, typer.Argument(metavar="MODEL", autocompletion=complete_model, help="alias (kvplan models), Hub id org/name, a path to config.json or a .gguf, or org/name:file.gguf")],
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", metavar="TOKENS", help="tokens per sequence: 4096, 32k, 1M (default: the model maximum)")] = None,
    batch: Annotated[str, typer.Option("--batch", "-b", metavar="N", help="concurrent sequences")] = "1",
    engine: Engine = None, kv_dtype: KvDtype = None, k_dtype: KDtype = None, v_dtype: VDtype = None,
    state_dtype: StateDtype = None, weight_dtype: WeightDtype = None, tp: Tp = "1", pp: Pp = "1",
    encoder_len: EncoderLen = None, mmproj: Mmproj = None,
    knobs: RawKnobs = None,
    json_out: Json = False, revision: Revision = None, offline: Offline = False, refresh: Refresh = False,
    hub: Hub = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan import sizing

    knobs = parse_knobs(knobs)
    mo = model_options(model, revision=revision, offline=offline, refresh=refresh, hub=hub, token=token,
                       timeout=timeout, encoder_len=encoder_len, mmproj=mmproj)
    eo = engine_options(engine=engine, kv_dtype=kv_dtype, k_dtype=k_dtype, v_dtype=v_dtype, state_dtype=state_dtype,
                        weight_dtype=weight_dtype, tp=tp, pp=pp, knobs=knobs)
    result = sizing.size(mo, eo, parse_tokens(ctx, "--ctx") if ctx is not None else None, parse_count(batch, "--batch"))
    if json_out:
        print_json(result.to_json())
    else:
        from kvplan import render

        render.console().print(render.size_view(result))
