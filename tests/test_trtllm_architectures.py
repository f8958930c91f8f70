"""kvplan sizes a model for TensorRT-LLM only if TensorRT-LLM can load its architecture.

Oracle: TensorRT-LLM's own two model registries, recorded in tests/data/trtllm-architectures.yaml (the PyTorch
backend's _torch/models/_arch_index.py MODEL_ARCH_TO_MODULE and the TensorRT-engine flow's tensorrt_llm/models
MODEL_MAP, read in NVIDIA/TensorRT-LLM main). Over every genuine config kvplan has (the bundled catalog and
tests/data/wild-configs): a config `--engine trtllm` sizes has its `architectures[0]` in one of them, and a config it
refuses as "TensorRT-LLM has no ... model" has it in neither. Until this test, Jamba and MiMo-V2-Flash were sized by
the generic Mamba / window rules though TensorRT-LLM has no model for either.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = yaml.safe_load((ROOT / "tests/data/trtllm-architectures.yaml").read_text())
LOADABLE = set(REGISTRY["pytorch"]) | set(REGISTRY["tensorrt_engine"])
GENUINE = sorted([*ROOT.glob("model_configs/*/config.json"), *ROOT.glob("tests/data/wild-configs/*/config.json")])
NO_MODEL = "TensorRT-LLM has no "


def _architecture(path: Path) -> str | None:
    archs = json.loads(path.read_text()).get("architectures") or []
    return archs[0] if archs else None


@pytest.mark.parametrize("path", GENUINE, ids=lambda p: p.parent.name)
def test_sized_only_when_tensorrt_llm_can_load_it(path):
    arch = _architecture(path)
    if arch is None:
        pytest.skip("config names no architecture")
    r = run_cli("size", str(path.parent), "--ctx", "1024", "--engine", "trtllm")
    if r.code == 0:
        assert arch in LOADABLE, f"{arch} sized for TensorRT-LLM, which lists no such model"
    else:
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
        if NO_MODEL in r.err:
            assert arch not in LOADABLE, f"{arch} refused as absent, but TensorRT-LLM lists it"


def test_the_refusals_name_architectures_transformers_defines_and_tensorrt_llm_lacks():
    """Each family refused as absent names the Hub class its configs carry (a transformers class, so a typo fails
    here) and none of those is in TensorRT-LLM's registries."""
    transformers = pytest.importorskip("transformers")
    from kvplan.engines import trtllm

    for family, (_, archs, types) in trtllm._NO_MODEL.items():
        for arch in archs.split(" / "):
            assert hasattr(transformers, arch), (family, arch)
            assert arch not in LOADABLE, (family, arch)
        for t in types:
            assert trtllm.REFUSED[t].why.startswith(NO_MODEL) and trtllm.REFUSED[t].name == family


@pytest.mark.parametrize("model, name", [("jamba-v0.1", "Jamba"), ("mimo-v2-flash", "MiMo-V2-Flash"),
                                         ("lfm2-1.2b", "LFM2")])
def test_fit_refuses_too(model, name):
    r = run_cli("fit", model, "--gpu", "H100", "--engine", "trtllm", "--ctx", "8192")
    assert r.code == 2 and f"{NO_MODEL}{name} model" in r.err and len(r.err.strip().splitlines()) == 1, r.err
