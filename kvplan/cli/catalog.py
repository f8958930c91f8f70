"""The listing commands: `kvplan models` (the bundled catalog, or a search of it or of the Hub), `kvplan pull`
(cache Hub configs for --offline runs) and `kvplan gpus` (the GPU catalog, or this machine's GPUs)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from kvplan import catalog
from kvplan.cli.app import GroupedCommand, app
from kvplan.cli.options import Json, Revision, Timeout, Token, print_json
from kvplan.errors import KvplanError


@app.command(cls=GroupedCommand, short_help="List or search the models (bundled, Hub).",
             help="List the bundled catalog (every alias and its Hub id), or search it (--search, --hub for the Hub).\n\n"
              "Examples: kvplan models;  kvplan models --search qwen3;  kvplan models --search gemma --hub")
def models(
    search: Annotated[Optional[str], typer.Option("--search", "-s", metavar="TEXT", help="text to look for in aliases and Hub ids")] = None,
    hub: Annotated[bool, typer.Option("--hub", help="with --search: search the Hub's model list instead", rich_help_panel="Model")] = False,
    limit: Annotated[int, typer.Option("--limit", metavar="N", help="most Hub results")] = 20,
    json_out: Json = False, token: Token = None, timeout: Timeout = None,
) -> None:
    from kvplan import render

    if hub and not search:
        raise KvplanError("--hub needs --search TEXT (the Hub's model list is searched, not listed)")
    if search:
        from kvplan import hub as hub_mod

        hits = hub_mod.search_models(search, hub=hub, limit=limit, token=token, timeout=timeout)
        rows = [(", ".join(h.aliases), h.repo_id, h.source + (f", {h.downloads:,} downloads" if h.downloads else "")
                 + (", gated" if h.gated else "")) for h in hits]
    else:
        rows = []
        for m in catalog.bundled_models():
            for alias in m.aliases or ("",):
                rows.append((alias, m.repo_id, m.note or ""))
    if json_out:
        print_json({"schema": 1, "models": [{"alias": a or None, "id": r, "note": n or None} for a, r, n in rows]})
    elif not rows:
        where = "on the Hub" if hub else "in the bundled catalog"
        sys.stdout.write(f"no model matches {search!r} {where}" + ("" if hub else "; --hub searches the Hub") + "\n")
    else:
        title = f"Hub search: {search!r}" if hub else None
        render.console().print(render.models_view(rows, title))


@app.command(cls=GroupedCommand, short_help="Cache Hub configs for --offline runs.",
             help="Cache configs and safetensors headers of Hub models so later runs (and CI) work --offline.\n\n"
              "Example: kvplan pull Qwen/Qwen3-8B meta-llama/Llama-3.1-8B --token $HF_TOKEN")
def pull(
    models: Annotated[list[str], typer.Argument(help="Hub ids (org/name) or aliases")],
    to: Annotated[Optional[str], typer.Option("--to", metavar="DIR", help="also write a catalog folder (model_configs layout) here")] = None,
    revision: Revision = None, token: Token = None, timeout: Timeout = None, json_out: Json = False,
) -> None:
    from kvplan import hub as hub_mod

    pulled = hub_mod.pull(models, to=to, revision=revision, token=token, timeout=timeout)
    if json_out:
        print_json({"schema": 1, "pulled": [
            {"requested": p.requested, "id": p.repo_id, "revision": p.revision, "commit": p.commit,
             "config_path": p.config_path, "weights_path": p.weights_path, "weight_bytes": p.weight_bytes,
             "note": p.note} for p in pulled]})
        return
    for p in pulled:
        weights = f", safetensors {p.weight_bytes:,} B" if p.weight_bytes is not None else ""
        sys.stdout.write(f"{p.repo_id}@{p.revision} ({(p.commit or '')[:12]}): config{weights}"
                         + (f"  [{p.note}]" if p.note else "") + "\n")


@app.command(cls=GroupedCommand, short_help="List the GPU catalog, or this machine's GPUs.",
             help="List the GPU catalog (names, aliases, nvidia-smi and CUDA totals, bandwidth); --local: this machine's GPUs.\n\n"
              "Examples: kvplan gpus;  kvplan gpus --local --json")
def gpus(
    json_out: Json = False,
    local: Annotated[bool, typer.Option("--local", help="the local CUDA devices (name, NVML and CUDA totals) in the catalog's form, and the entry each matches (needs torch)")] = False,
) -> None:
    from kvplan import gpus as gpu_catalog, render

    if local:
        from kvplan.verify.local_gpu import local_devices

        devices = local_devices()
        if json_out:
            print_json({"schema": 1, "devices": devices})
        else:
            render.console().print(render.local_gpus_view(devices))
        return
    rows = gpu_catalog.catalog_rows()
    if json_out:
        print_json({"schema": 1, "gpus": rows})
    else:
        render.console().print(render.gpus_view(rows))
