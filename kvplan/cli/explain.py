"""`kvplan explain`: read an engine's start-up log and reproduce every KV-related number it printed."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

import typer

from kvplan.cli.app import GroupedCommand, app
from kvplan.cli.options import (Calibrations, Engine, Json, KvDtype, Offline, Timeout, complete_gpu, complete_model,
                                print_json)
from kvplan.errors import InputError
from kvplan.units import parse_count, parse_tokens


@app.command(cls=GroupedCommand, short_help="Reproduce the KV figures of an engine's log.",
             help="Read an engine's start-up log (vLLM, SGLang, llama.cpp, TensorRT-LLM) and reproduce every "
                  "KV-related number it printed, or say why not. Exit 1 when an exact figure differs.\n\n"
                  "Examples: kvplan explain vllm.log;  docker logs vllm 2>&1 | kvplan explain - --gpu H100;  "
                  "kvplan explain server.log --model ./model.gguf")
def explain(
    log: Annotated[str, typer.Argument(metavar="LOG", help="a log file, or - for stdin")],
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", autocompletion=complete_model, help="the model, where the log names none kvplan can load (alias, Hub id, config.json or .gguf)")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", metavar="GPU", autocompletion=complete_gpu, help="the GPU, where the log names none (needed for kvplan's budget estimate)")] = None,
    engine: Engine = None, kv_dtype: KvDtype = None,
    tp: Annotated[Optional[str], typer.Option("--tp", "--tensor-parallel-size", metavar="N", help="tensor-parallel GPUs, where the log does not say", rich_help_panel="Engine and layout")] = None,
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", metavar="TOKENS", help="the context the engine sized for, where the log prints none (llama.cpp -c)")] = None,
    save_calibration: Annotated[bool, typer.Option("--save-calibration", help="save what this vLLM or SGLang log measured besides the cache (per GPU) to the calibration file, for later fit / check / plan runs on that GPU, engine version and model shape", rich_help_panel="Budget")] = False,
    calibrations: Calibrations = None,
    json_out: Json = False, offline: Offline = False, timeout: Timeout = None,
) -> None:
    from kvplan import explain as ex

    text = _read_log(log)
    o = ex.Overrides(model=model, gpu=gpu, engine=engine, kv_dtype=kv_dtype,
                     ctx=parse_tokens(ctx, "--ctx") if ctx else None, tp=parse_count(tp, "--tp") if tp else None,
                     offline=offline or None, timeout=timeout)
    result = ex.explain(text, o)
    if save_calibration:
        ex.save_calibration(result, text, "stdin" if log == "-" else os.path.basename(log), calibrations)
    if json_out:
        print_json({"schema": 1, **result.to_json()})
    else:
        from kvplan import render

        render.console().print(render.explain_view(result))
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _read_log(path: str) -> str:
    """The log's text, at most explain.MAX_LOG_BYTES of it (a longer one is refused, not cut)."""
    from kvplan.explain import MAX_LOG_BYTES

    if path == "-":
        data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
        where = "stdin"
    else:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_LOG_BYTES + 1)
        except OSError as e:
            raise InputError(f"cannot read {path}: {e.strerror or e}; give a log file or - for stdin") from None
        where = path
    if len(data) > MAX_LOG_BYTES:
        raise InputError(f"{where}: more than {MAX_LOG_BYTES >> 20} MiB; give the engine's start-up part of the log")
    return data.decode("utf-8", errors="replace")
