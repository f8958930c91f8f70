"""`kvplan plan` for people: the pool, the replay, the decode-speed bound by batch and the fleet."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape as esc
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvplan.render.cells import bytes_cell, label_grid, note_block
from kvplan.units import fmt_bytes, fmt_int


def plan_view(p: Any) -> Group:
    """`kvplan plan`: the pool, the replay, the speed bound by batch and (with --users) the fleet."""
    f, run, pool = p.fit, p.run, p.pool
    s = f.setup
    head = label_grid()
    g = f.gpu
    head.add_row("GPU", f"{g.count} x {g.gpu.name}")
    head.add_row("model", f"{esc(s.ref.id or s.ref.requested)}  [dim]{s.ref.source}[/dim]")
    head.add_row("engine", f"{s.engine.label}   tp {s.tp} x pp {s.pp}   kv {s.kvd.label}")
    head.add_row("workload", esc(p.workload.description) + (f", shared prefix {fmt_int(p.workload.shared_prefix)}" if p.workload.shared_prefix else ""))
    pj = pool.to_json()
    server = "slots" in pj  # llama-server: slots over cells
    if server:
        head.add_row("llama-server", f"{esc(pj['flags'])}: {fmt_int(pj['slots'])} slots of {fmt_int(pj['ctx_per_slot'])} "
                     f"tokens, {fmt_int(pj['ctx_size'])} cells " + ("shared (--kv-unified)" if pj["kv_unified"] else
                                                                     "in per-slot streams")
                     + f" ({bytes_cell(pj['kv_bytes'])} of a {bytes_cell(pool.kv_budget_bytes)} {pool.kv_budget_source} budget)")
    else:
        head.add_row("KV pool / GPU", f"{fmt_int(pool.usable_blocks)} usable blocks x {fmt_int(pj['block_size'])} tokens "
                     f"({bytes_cell(pool.kv_budget_bytes)} {pool.kv_budget_source})")
    if p.mode == "burst":
        head.add_row("replay", f"all {fmt_int(run.requests)} requests at once: {fmt_int(run.steps)} engine steps")
    elif p.mode == "rate":
        head.add_row("replay", f"{fmt_int(run.requests)} requests arriving at {p.rate:g}/s (Poisson): "
                     f"{fmt_int(run.steps)} engine steps")
    else:
        head.add_row("replay", f"{fmt_int(p.users)} users in a closed loop, {fmt_int(run.requests)} requests, "
                     f"steady steps {fmt_int(run.window[0])}-{fmt_int(run.window[1])}")
    head.add_row("running at once", f"median {fmt_int(run.p50_running)}  (p10 {fmt_int(run.p10_running)}, p90 "
                 f"{fmt_int(run.p90_running)}, peak {fmt_int(run.peak_running)})")
    if server:
        a = run.answers or {}
        head.add_row("deferred", f"peak {fmt_int(a.get('peak_deferred', 0))} waiting for a slot")
        head.add_row("answers", f"{fmt_int(a.get('refused_requests', 0))} refused (prompt >= a slot's context), "
                     f"{fmt_int(a.get('cut_requests', 0))} cut at the slot's context, {fmt_int(a.get('failed_requests', 0))} "
                     f"failed ({fmt_int(a.get('kv_exhaustions', 0))} times the unified cache ran out of cells)")
    else:
        head.add_row("preemptions", f"{fmt_int(run.preemptions)} ({fmt_int(run.preempted_requests)} requests)")
    sc = p.static
    if sc:
        head.add_row("paged vs static", f"paged blocks leave {sc['paged_waste']:.1%} of what a request holds unused; a "
                     f"static cache sized for the longest request ({fmt_int(sc['static_reserved_tokens'])} tokens) "
                     f"leaves {sc['static_waste']:.1%} and holds {fmt_int(sc['static_requests_at_once'])} requests at once")
    if p.step_bound:
        head.add_row("decode bound", f"{p.step_bound * 1e3:.2f} ms per step at the median batch: "
                     f"<= {1 / p.step_bound:,.1f} tokens/s per request")
    if p.latency is not None:
        lt = p.latency

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:,.1f} ms"

        head.add_row("latency (at best)", f"TTFT p50 {ms(lt['ttft_p50_seconds'])}, p90 {ms(lt['ttft_p90_seconds'])}; "
                     f"TPOT p50 {ms(lt['tpot_p50_seconds'])}, p90 {ms(lt['tpot_p90_seconds'])}")
        head.add_row("throughput (at best)", f"{lt['requests_per_s']:,.2f} requests/s, {lt['output_tokens_per_s']:,.0f} "
                     "output tokens/s" + ("" if lt.get("kept_up", True) else
                                          "  [red]queue grows: this instance does not keep up[/red]"))
    if p.prefill_seconds is not None:
        mean_s, max_s = p.prefill_seconds
        head.add_row("prefill bound", f">= {mean_s * 1e3:,.1f} ms for the mean prompt, {max_s * 1e3:,.1f} ms for the "
                     f"longest  [dim]({p.prefill.dtype} {p.prefill.flops / 1e12:g} TFLOPS)[/dim]")
    parts: list[Any] = [Panel(head, title=Text("kvplan plan"), title_align="left")]
    if p.speed_table:
        t = Table(title="decode-step bound by batch (requests at mean prompt + half their output)", title_justify="left")
        for col in ("batch", "weights read", "cache read", "step (ms)", "tok/s per request", "tok/s total"):
            t.add_column(col, justify="right")
        t.add_column("total tok/s (bar)")
        top = max(r.batch / r.step_seconds for r in p.speed_table)
        for r in p.speed_table:
            total = r.batch / r.step_seconds
            bar = "[cyan]" + "█" * max(1, round(24 * total / top)) + "[/cyan]"
            t.add_row(fmt_int(r.batch), fmt_bytes(round(r.weight_read)), fmt_bytes(round(r.cache_read)),
                      f"{r.step_seconds * 1e3:.2f}", f"{r.tokens_per_s_per_request:,.1f}", f"{total:,.0f}", bar)
        parts.append(t)
        if p.crossover_batch:
            parts.append(Text(f"cache reads overtake weight reads from batch {p.crossover_batch:,}", style="dim"))
    fl = p.fleet
    if fl:
        t = label_grid()
        if fl.get("rate") is not None:
            t.add_row("load", f"{fl['rate']:g} requests/s; one instance sustains at most "
                      f"{fl['requests_per_s_per_instance']:,.2f}/s (saturated, step bounds)")
            t.add_row("instances", "-" if fl["instances"] is None else
                      f"{fmt_int(fl['instances'])} x {fl['gpus_per_instance']} GPU = {fmt_int(fl['gpus'])} GPUs (at full load; "
                      "leave headroom for TTFT targets)")
            parts.append(Panel(t, title=Text("fleet"), title_align="left"))
            fl = None
    if fl:
        t.add_row("users", fmt_int(fl["users"]) + (f" at <= {fl['tpot_seconds'] * 1e3:g} ms per output token" if fl["tpot_seconds"] else "")
                  + (f", first token <= {fl['ttft_seconds'] * 1e3:g} ms ({'met by the prefill bound' if fl['ttft_met'] else 'not met'})" if "ttft_seconds" in fl else ""))
        t.add_row("per instance", f"{fmt_int(fl['users_per_instance'])} (memory {fmt_int(fl['users_per_instance_memory'])}"
                  + (f", speed bound {fmt_int(fl['users_per_instance_speed'])}" if fl["users_per_instance_speed"] is not None else "") + ")")
        t.add_row("instances", "cannot serve the target" if fl["instances"] is None else
                  f"{fmt_int(fl['instances'])} x {fl['gpus_per_instance']} GPU = {fmt_int(fl['gpus'])} GPUs")
        parts.append(Panel(t, title=Text("fleet"), title_align="left"))
    for block in (note_block("warnings", p.warnings, "yellow"), note_block("assumptions", p.assumptions, "dim")):
        if block is not None:
            parts.append(block)
    return Group(*parts)
