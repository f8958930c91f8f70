"""The Hub through the real CLI, in a fresh process (huggingface_hub reads HF_ENDPOINT and HF_HOME at import):
a served repo without safetensors sizes exactly like the same config as a local file; a served repo with
safetensors gives the weight bytes the test computes from the tensors it wrote; pull, then --offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import hubserver
from hubserver import FakeHub

fake_hub = hubserver.fake_hub
REPO_ROOT = Path(__file__).resolve().parents[1]
QWEN = json.loads((REPO_ROOT / "model_configs" / "Qwen--Qwen2.5-7B-Instruct" / "config.json").read_text())
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "max_position_embeddings": 2048, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def kvplan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "kvplan", *args], env=full, capture_output=True, text=True, timeout=60)


def as_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_served_config_sizes_like_the_local_file(fake_hub: FakeHub, tmp_path: Path) -> None:
    commit = fake_hub.add_repo("someorg/qwen-copy", {"config.json": QWEN})
    local = tmp_path / "config.json"
    local.write_text(json.dumps(QWEN))
    served = as_json(kvplan("size", "someorg/qwen-copy", "--ctx", "32k", "--json"))
    direct = as_json(kvplan("size", str(local), "--ctx", "32k", "--json"))
    assert served["model"] == {"requested": "someorg/qwen-copy", "id": "someorg/qwen-copy", "source": "hub",
                               "revision": "main", "commit": commit}
    assert served["weight_source"] == "config"  # the repo has no safetensors
    for key in ("kv_bytes", "kv_bytes_per_token", "params", "weight_bytes", "groups"):
        assert served[key] == direct[key], key
    again = as_json(kvplan("size", "someorg/qwen-copy", "--ctx", "32k", "--json"))
    assert again["model"]["source"] == "cache" and again["kv_bytes"] == served["kv_bytes"]


def test_served_safetensors_give_exact_weight_bytes(fake_hub: FakeHub, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {
        "model.embed_tokens.weight": torch.zeros(512, 64, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64, dtype=torch.float8_e4m3fn),
        "model.layers.0.mlp.gate_up.blocks": torch.zeros(256, 40, dtype=torch.uint8),
        "model.layers.1.mlp.down_proj.weight": torch.zeros(64, 128, dtype=torch.bfloat16),
        "model.norm.weight": torch.zeros(64, dtype=torch.float32),
        "lm_head.weight": torch.zeros(512, 64, dtype=torch.bfloat16),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    expected = sum(t.numel() * t.element_size() for t in tensors.values())
    fake_hub.add_repo("someorg/tiny", {"config.json": TINY})
    fake_hub.add_file("someorg/tiny", tmp_path / "model.safetensors")
    d = as_json(kvplan("size", "someorg/tiny", "--ctx", "1k", "--json"))
    assert d["weight_source"] == "safetensors"
    assert d["weight_bytes"] == d["weight_bytes_safetensors"] == expected
    assert d["weight_bytes_config"] != expected and d["total_bytes"] == expected + d["kv_bytes"]
    assert any("differ from the checkpoint" in a for a in d["assumptions"])


def test_pull_then_size_offline(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("someorg/tiny", {"config.json": TINY})
    out = kvplan("pull", "someorg/tiny", "--json")
    pulled = as_json(out)["pulled"][0]
    assert pulled["id"] == "someorg/tiny" and pulled["commit"]
    requests = len(fake_hub.log)
    d = as_json(kvplan("size", "someorg/tiny", "--ctx", "1k", "--offline", "--json"))
    assert d["model"]["source"] == "cache" and d["model"]["commit"] == pulled["commit"]
    assert len(fake_hub.log) == requests  # offline: no request reached the server
    missing = kvplan("size", "someorg/other", "--offline")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "kvplan pull" in missing.stderr


def test_gated_without_token_is_one_line(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("someorg/gated", {"config.json": TINY}, gated=True, allowed_tokens={"hf_ok"})
    r = kvplan("size", "someorg/gated", "--ctx", "1k")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "gated" in r.stderr.lower()
    assert "hf_ok" not in r.stderr + r.stdout
    ok = kvplan("size", "someorg/gated", "--ctx", "1k", "--token", "hf_ok", "--json")
    assert as_json(ok)["model"]["source"] == "hub" and "hf_ok" not in ok.stdout + ok.stderr
