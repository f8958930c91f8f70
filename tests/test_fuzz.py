"""Property-based fuzzing of the error contract (issue #16), with a fixed budget per category so CI time stays
bounded: for every generated case (mutated bundled configs and ModelOpt hf_quant_config.json files, odd flag values,
check files, GGUF metadata, names), no traceback, no hang (20 s per case), an exit code in {0, 1, 2}, one line on
stderr when not 0 (a check file's problems are one line each, then one summary line), and on exit 0 every byte and
token figure of the JSON a non-negative integer. The generators live in tests/fuzzing.py; bench/fuzz.py runs the same cases by the
thousand and prints the table quoted in notes."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fuzzing
from kvplan import hub

pytestmark = pytest.mark.slow  # generated hostile inputs through the whole CLI

BUDGET = {"config": 250, "quantfile": 80, "flags": 150, "check": 120, "gguf": 120, "names": 60}


@pytest.mark.parametrize("category", list(BUDGET))
def test_the_error_contract_holds(category):
    @settings(max_examples=BUDGET[category], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.randoms(use_true_random=False))
    def holds(rng: random.Random) -> None:
        case = fuzzing.GENERATORS[category](rng)
        with tempfile.TemporaryDirectory() as tmp:
            outcome = fuzzing.run_case(case, Path(tmp))
        found = fuzzing.classify(case, outcome)
        assert not found, (found, case.argv, outcome.code, outcome.err[-400:], outcome.out[-400:])

    holds()


def test_the_judge_can_fail():
    """classify is not a rubber stamp: each class it names is reachable."""
    case = fuzzing.Case("config", ["size", "x", "--json"])
    assert fuzzing.classify(case, fuzzing.Outcome(None, "", "", True)) == {"hang"}
    assert "traceback" in fuzzing.classify(case, fuzzing.Outcome(3, "", "kvplan: error: internal error: X\n", False))
    assert "bad-exit" in fuzzing.classify(case, fuzzing.Outcome(7, "", "kvplan: error: x\n", False))
    assert "spew" in fuzzing.classify(case, fuzzing.Outcome(2, "", "kvplan: error: a\nb\n", False))
    assert "suspicious" in fuzzing.classify(case, fuzzing.Outcome(0, '{"kv_bytes": -5}', "", False))
    assert "suspicious" in fuzzing.classify(case, fuzzing.Outcome(0, '{"weight_bytes": 9.0}', "", False))
    assert not fuzzing.classify(case, fuzzing.Outcome(0, '{"kv_bytes": 5, "concurrency": 1.5}', "", False))


_ENTRY = st.one_of(
    st.tuples(st.sampled_from(["F16", "BF16", "F32", "I8", "F4", "F8_E4M3", "Q9_X", "", "f16"]),
              st.lists(st.one_of(st.integers(-3, 2**41), st.floats(allow_nan=True), st.booleans(), st.text(max_size=3)),
                       max_size=4),
              st.one_of(st.integers(-(2**63), 2**63), st.floats(), st.none(), st.text(max_size=3))).map(list),
    st.none(), st.text(max_size=5), st.integers(), st.lists(st.integers(), max_size=4),
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.dictionaries(st.text(max_size=20), _ENTRY, max_size=4))
def test_safetensors_headers_give_exact_bytes_or_a_reason(tensors):
    """Any header: either a non-negative integer total that equals the sum of well-formed entries, or
    WeightsUnavailable (kvplan then uses the config's figure and says why)."""
    record = {"format": hub.RECORD_FORMAT, "files": {"model.safetensors": {"metadata": {}, "tensors": tensors}}}
    try:
        w = hub.weights_from_record(record, {"num_hidden_layers": 2})
    except hub.WeightsUnavailable as e:
        assert str(e) and "\n" not in str(e)
        return
    assert isinstance(w.total_bytes, int) and w.total_bytes >= 0 and w.n_tensors == len(tensors)
