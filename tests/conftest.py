"""Shared test helpers: run the real CLI in-process and read its JSON, build configs from stated facts."""

from __future__ import annotations

import functools
import io
import json
import os
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"

# A developer's own saved calibrations (~/.config/kvplan/calibrations.yaml) must not change the figures tests pin:
# every test (and every kvplan subprocess it starts) reads an empty calibration file unless it names its own.
os.environ["KVPLAN_CALIBRATIONS"] = str(Path(tempfile.gettempdir()) / f"kvplan-test-no-calibrations-{os.getpid()}.yaml")


@functools.lru_cache(maxsize=None)
def declined(model: str, engine: str) -> str | None:
    """Why `engine` cannot size `model` (a bundled alias or Hub id): the engine's NotModelled / Unsupported rows for
    a cache kind the model holds, or a rule set too old for it (both UnsupportedKind); None when it sizes it.
    Catalog-wide tests expect that one-line refusal instead of a figure."""
    from kvplan.engines.layout import UnsupportedKind
    from kvplan.sizing import EngineOptions, ModelOptions, setup

    try:
        setup(ModelOptions(model), EngineOptions(engine=engine))
    except UnsupportedKind as e:
        return str(e)
    return None


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(*args: str) -> CliResult:
    """`kvplan ARGS` through the real entry point (kvplan.cli.main), capturing output and the exit code."""
    from kvplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as e:
            code = int(e.code or 0)
    return CliResult(code, out.getvalue(), err.getvalue())


def kvjson(*args: str) -> dict[str, Any]:
    r = run_cli(*args, "--json")
    assert r.code == 0, r.err
    return r.json()


def vllm_cpu_fit(path: str, block: int) -> dict:
    """`kvplan fit` asked what the vLLM CPU-build oracle cases ask (tests/test_gemma4.py, tests/test_step3p7.py): a
    1 GiB KV budget, ctx and max_model_len 4096, the given block size, 4096 batched tokens, no async scheduling."""
    out = kvjson("fit", "--gpu", "24GB", "--model", path, "--kv-budget", f"{1 << 30}B", "--engine", "vllm@0.32",
                 "--ctx", "4096", "--max-model-len", "4096", "--block-size", str(block),
                 "--max-num-batched-tokens", "4096", "--no-async-scheduling")
    return out["results"][0]


@pytest.fixture(scope="session")
def engine_logs() -> dict[str, dict[str, Any]]:
    """The real engine logs (tests/data/engine-logs.yaml, a copy of shared/reference/cases)."""
    cases = yaml.safe_load((DATA / "engine-logs.yaml").read_text())
    return {c["id"]: c for c in cases}


def write_config(tmp: Path, name: str, config: dict[str, Any]) -> str:
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d / "config.json")


def llama_like(layers: int, heads: int, kv_heads: int, head_dim: int, **extra: Any) -> dict[str, Any]:
    """A decoder config carrying only stated KV facts; width/vocab are placeholders (KV does not read them)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "hidden_size": heads * head_dim, "intermediate_size": 4 * heads * head_dim, "vocab_size": 32000,
        "max_position_embeddings": 131072, "torch_dtype": "bfloat16", **extra,
    }


def write_gguf_file(path: Path, arch: str, kv: dict[str, Any], tensors, **writer: Any) -> Path:
    """A GGUF file written by the `gguf` package's GGUFWriter: metadata by Python type, then the tensors
    [(name, array, raw ggml type or None)]. Shared by the GGUF reader and GGUF-to-ModelSpec tests."""
    from gguf import GGUFWriter

    w = GGUFWriter(path, arch, **writer)
    for key, val in kv.items():
        if isinstance(val, bool):
            w.add_bool(key, val)
        elif isinstance(val, int):  # uint32 as converters write counts; signed or wide values as they must be
            (w.add_int32 if val < 0 else w.add_uint64 if val >= 2**32 else w.add_uint32)(key, val)
        elif isinstance(val, float):
            w.add_float32(key, val)
        elif isinstance(val, str):
            w.add_string(key, val)
        else:
            w.add_array(key, val)
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------- engine tiers
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The vLLM tier's tests run last: its engine child starts in the background when collection ends
    (pytest_collection_finish) and works while the rest of the suite runs."""
    vllm = [i for i in items if i.nodeid.startswith("tests/test_engine_vllm.py")]
    if vllm:
        items[:] = [i for i in items if i not in set(vllm)] + vllm


def pytest_collection_finish(session: pytest.Session) -> None:
    vllm = [i for i in session.items if i.nodeid.startswith("tests/test_engine_vllm.py")]
    if vllm and not session.config.option.collectonly:
        from test_engine_vllm import start_runs

        session.config._vllm_runs = start_runs(session, vllm)  # type: ignore[attr-defined]
