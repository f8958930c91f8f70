"""kvplan/evidence.py: the shift and the likely range `fit` takes from public logs of a setup's class. Synthetic
cases (the file's own content is held to the code by tests/test_wild_budget.py), then fit and check end to end."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from kvplan import evidence as ev

GiB = 1 << 30


def case(source: str, error_gib: float, *, version="0.19.0", gpu="H100-SXM-80GB", tier="datacenter",
         interconnect="nvswitch", tp=1, pp=1, n: int = 0) -> ev.Case:
    return ev.Case(f"{source}-{n}-{error_gib}", source, version, gpu, tier, interconnect, tp, pp, int(error_gib * GiB))


def query(version="0.19.0", tier="datacenter", interconnect="nvswitch", tp=1, pp=1) -> ev.Query:
    return ev.Query("vllm", version, tier, interconnect, tp, pp)


def test_every_source_weighs_the_same_however_many_logs_it_holds():
    """Ten logs of one sweep at +1 GiB against four single-log sources at 0: the median is 0, not +1."""
    cases = [case("sweep", 1.0, n=i) for i in range(10)] + [case(f"user{i}", 0.0) for i in range(4)]
    assert ev.weighted_quantile(cases, ev.MEDIAN) == 0
    assert ev.weighted_quantile(cases, ev.HIGH_QUANTILE) == GiB


def test_a_class_speaks_only_with_enough_sources():
    """Five sources on PCIe tp: their class is used; with four, the estimate backs off and says so."""
    pcie = [case(f"p{i}", 2.0, gpu="L40S", interconnect="pcie", tp=2) for i in range(ev.MIN_SOURCES)]
    rest = [case(f"n{i}", 0.0) for i in range(ev.MIN_SOURCES)]
    e = ev.BudgetEvidence("vllm", tuple(pcie + rest)).estimate(query(interconnect="pcie", tp=2))
    assert e.median == 2 * GiB and not e.backed_off and "tp over PCIe" in e.described
    e = ev.BudgetEvidence("vllm", tuple(pcie[1:] + rest)).estimate(query(interconnect="pcie", tp=2))
    assert e.backed_off and "too few public logs" in e.basis() and e.median in (0, 2 * GiB)


def test_eras_follow_the_engine_versions_their_rules_changed_at():
    assert ev.era("vllm", "0.10.1") == "vllm < 0.19"
    assert ev.era("vllm", "0.19.1") == "vllm 0.19 .. 0.20"
    assert ev.era("vllm", "0.33") == ev.era("vllm", None) == ev.era("vllm", "") == "vllm >= 0.20"
    assert ev.era("sglang", "0.4.3") == "sglang < 0.5"


def test_the_point_lies_inside_its_range():
    cases = [case(f"s{i}", x) for i, x in enumerate((-3, -0.5, 0.1, 0.2, 0.4, 2, 9))]
    e = ev.BudgetEvidence("vllm", tuple(cases)).estimate(query())
    lo, hi = e.budget_range(40 * GiB)
    assert lo <= 40 * GiB - e.median <= hi and e.low <= e.median <= e.high


def _fit(*args: str, env_file=None) -> dict:
    r = run_cli("fit", "llama-3.1-8b", "--gpu", "H100", "--ctx", "8k", "--engine", "vllm@0.19", "--json", *args)
    assert r.code == 0, r.err
    return r.json()["results"][0]


def test_fit_prints_the_shifted_point_inside_its_range_and_names_the_shift():
    r = _fit()
    parts = {p["key"]: p["bytes"] for p in r["budget"][0]["parts"]}
    e = ev.for_engine("vllm").estimate(query())
    assert parts.get("evidence", 0) == -e.shift
    lo, hi = r["kv_budget_range_bytes"]
    assert lo <= r["kv_budget_bytes"] <= hi and lo < hi
    assert "median" in r["kv_budget_range_basis"] and "sources" in r["kv_budget_range_basis"]


def test_a_median_moves_the_point_only_where_the_sources_agree_on_the_direction():
    """Four of five sources (AGREEMENT) saw the engine print less than kvplan's model: the point moves by the
    median. Three of five: one source's miss decides the median, and the model's own figure stands."""
    agree = [case(f"s{i}", x) for i, x in enumerate((-0.2, 0.5, 1, 2, 8))]
    e = ev.BudgetEvidence("vllm", tuple(agree)).estimate(query())
    assert e.agreement >= ev.AGREEMENT and e.median == GiB and e.shift == GiB
    split = [case(f"s{i}", x) for i, x in enumerate((-0.5, -0.2, 0.5, 1, 8))]
    e = ev.BudgetEvidence("vllm", tuple(split)).estimate(query())
    assert e.agreement < ev.AGREEMENT and e.median == GiB // 2 and e.shift == 0
    assert "disagree on the direction" in e.basis()


def test_each_model_kind_is_its_own_class():
    """Five MoE sources far off do not move a dense model's estimate."""
    moe = [case(f"m{i}", 3.0) for i in range(ev.MIN_SOURCES)]
    moe = [ev.Case(c.id, c.source, c.version, c.gpu, c.tier, c.interconnect, c.tp, c.pp, c.error, "moe") for c in moe]
    dense = [case(f"d{i}", 0.0) for i in range(ev.MIN_SOURCES)]
    book = ev.BudgetEvidence("vllm", tuple(moe + dense))
    assert book.estimate(query()).shift == 0
    moe_query = ev.Query("vllm", "0.19.0", "datacenter", "nvswitch", 1, 1, "moe")
    assert book.estimate(moe_query).shift == 3 * GiB


def test_without_an_evidence_file_fit_prints_the_model_alone(monkeypatch, tmp_path):
    monkeypatch.setenv(ev.PATH_VARIABLE, str(tmp_path / "none.json"))
    r = _fit()
    assert all(p["key"] != "evidence" for p in r["budget"][0]["parts"])
    assert r["kv_budget_range_bytes"] is None


def test_an_evidence_file_moves_the_estimate(monkeypatch, tmp_path):
    """Five sources that all saw the engine print 2 GiB less than kvplan's model: fit moves its point by 2 GiB."""
    cases = {f"log{i}": {"error_bytes": 2 * GiB, "source": f"repo{i}", "version": "0.19.0", "gpu": "H100-SXM-80GB",
                         "tier": "datacenter", "interconnect": "nvswitch", "tp": 1, "pp": 1}
             for i in range(ev.MIN_SOURCES)}
    path = tmp_path / "evidence.json"
    path.write_text(json.dumps({"engines": {"vllm": {"cases": cases}}}))
    monkeypatch.setenv(ev.PATH_VARIABLE, str(tmp_path / "none.json"))
    alone = _fit()["kv_budget_bytes"]
    monkeypatch.setenv(ev.PATH_VARIABLE, str(path))
    shifted = _fit()
    assert shifted["kv_budget_bytes"] == alone - 2 * GiB
    assert shifted["kv_budget_range_bytes"] == [alone - 2 * GiB, alone - 2 * GiB]


CHECK = """deployments:
  - name: tight
    model: llama-3.1-8b
    gpu: H100
    engine: vllm@0.19
    ctx: 8k
    min_kv_tokens: {tokens}
{extra}"""


@pytest.mark.parametrize("extra, code", [("", 1), ("    estimate: median\n", 0)])
def test_check_gates_on_the_low_end_unless_told_the_median(tmp_path, extra, code):
    """A requirement between the low end and the point estimate fails by default and passes with the median."""
    r = _fit()
    lo_tokens, _ = r["kv_capacity_tokens_range"]
    need = (lo_tokens + r["kv_capacity_tokens"]) // 2
    assert lo_tokens < need < r["kv_capacity_tokens"]
    f = tmp_path / "c.yaml"
    f.write_text(CHECK.format(tokens=need, extra=extra))
    out = run_cli("check", str(f), "--json")
    assert out.code == code, out.out + out.err
    detail = json.dumps(out.json())
    assert ("low end of the estimated budget's likely range" in detail) == (extra == "")


def test_check_refuses_an_unknown_estimate(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(CHECK.format(tokens=1000, extra="    estimate: high\n"))
    out = run_cli("check", str(f))
    assert out.code == 2 and "estimate: 'high' is not one of" in out.err
