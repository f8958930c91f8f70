"""kvplan.hub against a local fake Hub (tests/hubserver.py); no test reaches the real Hub.

Every call passes endpoint= (huggingface_hub reads HF_ENDPOINT only at import); the subprocess tests set the
environment instead, the way the CLI runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
import hubserver
from hubserver import FakeHub

from kvplan import hub
from kvplan.errors import ConfigError, EnvironmentProblem, InputError, ModelNotFoundError
from kvplan.resolve import resolve

fake_hub = hubserver.fake_hub  # the fixture, under its name in this module
REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64}
GOOD, BAD = "hf_good_token_123", "hf_wrong_token_456"


def ep(fake: FakeHub) -> dict[str, str]:
    return {"endpoint": fake.url}


def count(fake: FakeHub) -> int:
    return len(fake.log)


# --------------------------------------------------------------------------------------------- configs


def test_public_repo_then_cache(fake_hub: FakeHub) -> None:
    commit = fake_hub.add_repo("acme/tiny", {"config.json": TINY})
    got = hub.fetch_config("acme/tiny", **ep(fake_hub))
    assert got.config == TINY
    assert got.ref.to_json() == {
        "requested": "acme/tiny", "id": "acme/tiny", "source": "hub", "revision": "main", "commit": commit,
    }  # fmt: skip
    assert Path(got.ref.path).is_relative_to(hub.hub_cache_dir())
    heads = [e for e in fake_hub.log if e.method == "HEAD"]
    config_heads = [e for e in heads if e.path.endswith("/config.json")]
    assert config_heads and all(e.status == 200 for e in config_heads)
    # config.json has no quantization_config: the ModelOpt file of that commit is asked for (404: once without
    # retries, once through hf_hub_download, which records the answer in the cache)
    assert {e.status for e in heads if e.path.endswith(f"/{commit}/hf_quant_config.json")} == {404}
    assert not got.ref.notes

    before = count(fake_hub)
    again = hub.fetch_config("acme/tiny", **ep(fake_hub))
    assert (again.ref.source, again.ref.commit, again.config) == ("cache", commit, TINY)
    assert count(fake_hub) == before  # cached at that revision, the 404 too: no request
    assert not again.ref.notes

    refreshed = hub.fetch_config("acme/tiny", refresh=True, **ep(fake_hub))
    assert refreshed.ref.source == "hub" and count(fake_hub) > before


def test_resolve_goes_to_hub_for_unknown_ids(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("acme/tiny", {"config.json": TINY})
    got = resolve("acme/tiny", endpoint=fake_hub.url)
    assert got.ref.source == "hub" and got.config == TINY


@pytest.mark.parametrize(
    ("token", "status", "needle"),
    [(None, 401, "set HF_TOKEN, run `hf auth login` or pass --token"), (BAD, 403, "this token has no access")],
)
def test_gated_refusals(fake_hub: FakeHub, token: str | None, status: int, needle: str) -> None:
    fake_hub.add_repo("meta/gated", {"config.json": TINY}, gated=True, allowed_tokens={GOOD})
    with pytest.raises(InputError) as e:
        hub.fetch_config("meta/gated", token=token, **ep(fake_hub))
    msg = str(e.value)
    assert "meta/gated is gated" in msg and needle in msg and f"{fake_hub.url}/meta/gated" in msg
    assert "\n" not in msg and BAD not in msg
    assert {x.status for x in fake_hub.requests_for("meta/gated")} == {status}


def test_gated_with_valid_token_from_argument_env_and_stored_login(fake_hub: FakeHub, monkeypatch) -> None:
    from huggingface_hub import constants

    fake_hub.add_repo("meta/gated", {"config.json": TINY}, gated=True, allowed_tokens={GOOD})
    got = hub.fetch_config("meta/gated", token=GOOD, refresh=True, **ep(fake_hub))
    assert got.ref.source == "hub" and got.config == TINY

    monkeypatch.setenv("HF_TOKEN", GOOD)
    assert hub.fetch_config("meta/gated", refresh=True, **ep(fake_hub)).ref.source == "hub"
    monkeypatch.delenv("HF_TOKEN")

    Path(constants.HF_TOKEN_PATH).write_text(GOOD)  # what `hf auth login` stores
    assert hub.fetch_config("meta/gated", refresh=True, **ep(fake_hub)).ref.source == "hub"
    assert all(e.authorized for e in fake_hub.requests_for("meta/gated"))


def test_gated_falls_back_to_bundled_same_architecture(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("deepseek-ai/DeepSeek-R1", {"config.json": TINY}, gated=True)
    got = hub.fetch_config("deepseek-ai/DeepSeek-R1", **ep(fake_hub))
    assert got.ref.source == "bundled" and got.ref.id == "deepseek-ai/DeepSeek-V3"
    (note,) = got.ref.notes
    assert "is gated" in note and "using the bundled config of deepseek-ai/DeepSeek-V3 (same architecture)" in note


def test_not_found_suggests_close_catalog_names(fake_hub: FakeHub) -> None:
    with pytest.raises(ModelNotFoundError) as e:
        hub.fetch_config("Qwen/Qwen3-8C", **ep(fake_hub))
    msg = str(e.value)
    assert "not found on" in msg and "or private and you are not logged in" in msg and "Qwen/Qwen3-8B" in msg
    assert fake_hub.log[-1].status == 401

    with pytest.raises(ModelNotFoundError, match="or private and this token has no access"):
        hub.fetch_config("acme/nope", token=GOOD, **ep(fake_hub))


def test_repo_without_config_json(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("acme/only-gguf", {"model-Q4_K_M.gguf": b"GGUF\x03\x00\x00\x00"})
    with pytest.raises(ConfigError, match=r"acme/only-gguf@main has no config.json \(a GGUF-only"):
        hub.fetch_config("acme/only-gguf", **ep(fake_hub))


def test_malformed_config(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("acme/broken", {"config.json": b'{"model_type": "llama",'})
    with pytest.raises(ConfigError, match="is not valid JSON"):
        hub.fetch_config("acme/broken", **ep(fake_hub))


def test_revisions(fake_hub: FakeHub) -> None:
    main = fake_hub.add_repo("acme/tiny", {"config.json": TINY})
    v1 = fake_hub.add_repo("acme/tiny", {"config.json": {**TINY, "num_hidden_layers": 1}}, revision="v1")
    got = hub.fetch_config("acme/tiny", revision="v1", **ep(fake_hub))
    assert (got.ref.revision, got.ref.commit, got.config["num_hidden_layers"]) == ("v1", v1, 1)
    by_sha = hub.fetch_config("acme/tiny", revision=main, **ep(fake_hub))
    assert (by_sha.ref.commit, by_sha.config["num_hidden_layers"]) == (main, 2)
    with pytest.raises(ModelNotFoundError, match=r"acme/tiny has no revision 'v9'"):
        hub.fetch_config("acme/tiny", revision="v9", **ep(fake_hub))


def test_offline_from_cache_and_nothing_cached(fake_hub: FakeHub, monkeypatch) -> None:
    commit = fake_hub.add_repo("acme/tiny", {"config.json": TINY})
    hub.fetch_config("acme/tiny", **ep(fake_hub))
    fake_hub.stop()  # nothing answers any more
    before = count(fake_hub)
    got = hub.fetch_config("acme/tiny", offline=True, refresh=True, **ep(fake_hub))
    assert (got.ref.source, got.ref.commit, got.config) == ("cache", commit, TINY)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # set after huggingface_hub was imported: kvplan still honours it
    assert hub.is_offline() is True
    assert hub.fetch_config("acme/tiny", refresh=True, **ep(fake_hub)).ref.source == "cache"
    with pytest.raises(EnvironmentProblem, match=r"offline .* acme/other@main is not in the Hugging Face cache"):
        hub.fetch_config("acme/other", **ep(fake_hub))
    bundled = hub.fetch_config("deepseek-ai/DeepSeek-V3-0324", **ep(fake_hub))
    assert bundled.ref.source == "bundled" and bundled.ref.notes
    assert count(fake_hub) == before


def test_500_is_fast_and_falls_back(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("acme/tiny", {"config.json": TINY})
    hub.fetch_config("acme/tiny", **ep(fake_hub))
    fake_hub.fail_status = 500
    t0 = time.monotonic()
    with pytest.raises(EnvironmentProblem, match=r"failed for acme/other \(HTTP 500"):
        hub.fetch_config("acme/other", timeout=3, **ep(fake_hub))
    cached = hub.fetch_config("acme/tiny", refresh=True, timeout=3, **ep(fake_hub))
    assert cached.ref.source == "cache" and "HTTP 500" in cached.ref.notes[0] and "using the cached config" in cached.ref.notes[0]
    assert time.monotonic() - t0 < 5


def test_500_on_download_after_metadata_is_bounded(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("acme/tiny", {"config.json": TINY})
    fake_hub.fail_status, fake_hub.fault_method = 500, "GET"
    t0 = time.monotonic()
    with pytest.raises(EnvironmentProblem, match=r"HTTP 500"):
        hub.fetch_config("acme/tiny", timeout=2, **ep(fake_hub))
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("method", [None, "GET"])
def test_hanging_hub_is_bounded(fake_hub: FakeHub, method: str | None) -> None:
    fake_hub.add_repo("acme/tiny", {"config.json": TINY})
    fake_hub.add_repo("deepseek-ai/DeepSeek-R1", {"config.json": TINY})
    fake_hub.hang_s, fake_hub.fault_method = 60, method
    t0 = time.monotonic()
    with pytest.raises(EnvironmentProblem, match=r"no complete answer from .* within 1 s"):
        hub.fetch_config("acme/tiny", timeout=1, **ep(fake_hub))
    got = hub.fetch_config("deepseek-ai/DeepSeek-R1", timeout=1, **ep(fake_hub))
    assert got.ref.source == "bundled" and "within 1 s" in got.ref.notes[0]
    assert time.monotonic() - t0 < 5


def test_unreachable_endpoint(fake_hub: FakeHub) -> None:
    url = fake_hub.url
    fake_hub.stop()
    with pytest.raises(EnvironmentProblem, match="cannot reach|no complete answer"):
        hub.fetch_config("acme/tiny", timeout=2, endpoint=url)


def test_a_hub_search_with_the_network_down_fails_at_once(fake_hub: FakeHub) -> None:
    """One request, no retries with back-off: list_models' http_backoff spent the whole deadline (10 s) on a
    connection that is refused at once."""
    url = fake_hub.url
    fake_hub.stop()
    t0 = time.monotonic()
    with pytest.raises(EnvironmentProblem, match="cannot reach"):
        hub.search_models("llama", hub=True, timeout=10, endpoint=url)
    assert time.monotonic() - t0 < 3


def test_timeout_setting(monkeypatch) -> None:
    monkeypatch.delenv("KVPLAN_HUB_TIMEOUT", raising=False)
    assert hub.resolve_timeout() == 10
    monkeypatch.setenv("KVPLAN_HUB_TIMEOUT", "2.5")
    assert hub.resolve_timeout() == 2.5 and hub.resolve_timeout(4) == 4
    monkeypatch.setenv("KVPLAN_HUB_TIMEOUT", "soon")
    with pytest.raises(InputError, match="KVPLAN_HUB_TIMEOUT must be a positive number"):
        hub.resolve_timeout()
    with pytest.raises(InputError, match="--timeout"):
        hub.resolve_timeout("-1")


# ---------------------------------------------------------------------------------- safetensors weights


def _write_safetensors(path: Path, tensors: dict) -> int:
    from safetensors.torch import save_file

    save_file(tensors, str(path))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def test_safetensors_single_file_range_reads_only(fake_hub: FakeHub, tmp_path: Path) -> None:
    import torch

    tensors = {
        "model.embed_tokens.weight": torch.zeros(512, 256, dtype=torch.bfloat16),
        "model.layers.0.mlp.weight": torch.zeros(256, 256, dtype=torch.float32),
        "model.layers.0.attn.weight": torch.zeros(128, 256, dtype=torch.float8_e4m3fn),
        "model.layers.1.mlp.blocks": torch.zeros(256, 90, dtype=torch.uint8),  # packed mxfp4 counts as stored
        "model.norm.weight": torch.zeros(256, dtype=torch.float16),
    }
    expected = _write_safetensors(tmp_path / "model.safetensors", tensors)
    commit = fake_hub.add_repo("acme/st", {"config.json": TINY})
    commit = fake_hub.add_file("acme/st", tmp_path / "model.safetensors")
    size = (tmp_path / "model.safetensors").stat().st_size
    assert size > 300_000

    w = hub.safetensors_weights("acme/st", TINY, commit=commit, **ep(fake_hub))
    assert (w.total_bytes, w.n_tensors, w.excluded_bytes, w.source) == (expected, 5, 0, "hub")
    assert w.bytes_by_dtype == {"BF16": 512 * 256 * 2, "F16": 512, "F32": 256 * 256 * 4, "F8_E4M3": 128 * 256, "U8": 256 * 90}
    gets = [e for e in fake_hub.requests_for("model.safetensors") if e.method == "GET"]
    assert gets and all(e.range and e.bytes_sent <= 100_001 for e in gets)
    assert sum(e.bytes_sent for e in gets) < size / 3

    stored = hub.kvplan_store_dir() / "acme--st" / f"{commit}.json"
    record = json.loads(stored.read_text())
    assert {k: record[k] for k in ("repo", "revision", "commit")} == {"repo": "acme/st", "revision": "main", "commit": commit}
    assert record["date"]
    before = count(fake_hub)
    again = hub.safetensors_weights("acme/st", TINY, commit=commit, offline=True, **ep(fake_hub))
    assert (again.total_bytes, again.source) == (expected, "cache") and count(fake_hub) == before


def test_safetensors_sharded_with_mtp_layers(fake_hub: FakeHub, tmp_path: Path) -> None:
    import torch

    config = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 2, "num_nextn_predict_layers": 1}
    shard1 = {f"model.layers.{i}.w": torch.zeros(64, 64, dtype=torch.bfloat16) for i in range(2)}
    shard2 = {"model.layers.2.w": torch.zeros(64, 32, dtype=torch.bfloat16), "lm_head.weight": torch.zeros(64, 8, dtype=torch.float32)}
    n1 = _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", shard1)
    n2 = _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", shard2)
    index = {
        "metadata": {"total_size": n1 + n2},
        "weight_map": {**dict.fromkeys(shard1, "model-00001-of-00002.safetensors"), **dict.fromkeys(shard2, "model-00002-of-00002.safetensors")},
    }  # fmt: skip
    files = {"config.json": config, "model.safetensors.index.json": index}
    for p in tmp_path.glob("model-*.safetensors"):
        files[p.name] = p.read_bytes()
    commit = fake_hub.add_repo("acme/mtp", files)

    w = hub.safetensors_weights("acme/mtp", config, commit=commit, **ep(fake_hub))
    mtp = 64 * 32 * 2
    assert (w.total_bytes, w.excluded_bytes, w.n_files, w.n_tensors) == (n1 + n2 - mtp, mtp, 2, 3)
    assert "layer 2" in w.excluded_reason and "num_nextn_predict_layers=1" in w.excluded_reason
    full = hub.safetensors_weights("acme/mtp", config, commit=commit, include_mtp=True, **ep(fake_hub))
    assert (full.total_bytes, full.excluded_bytes) == (n1 + n2, 0)


def test_no_safetensors(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("acme/bin", {"config.json": TINY, "pytorch_model.bin": b"\0" * 16})
    with pytest.raises(hub.WeightsUnavailable, match="has no safetensors weights"):
        hub.safetensors_weights("acme/bin", TINY, **ep(fake_hub))
    with pytest.raises(hub.WeightsUnavailable, match="offline and no safetensors metadata stored"):
        hub.safetensors_weights("acme/bin", TINY, offline=True, **ep(fake_hub))


# ------------------------------------------------------------------------------------------ pull, search


def test_pull_then_offline(fake_hub: FakeHub, tmp_path: Path) -> None:
    _write_safetensors(tmp_path / "model.safetensors", {"w": __import__("torch").zeros(8, 8)})
    fake_hub.add_repo("Qwen/Qwen3-8B", {"config.json": TINY})
    commit = fake_hub.add_file("Qwen/Qwen3-8B", tmp_path / "model.safetensors")
    fake_hub.add_repo("acme/no-st", {"config.json": TINY})

    out = tmp_path / "catalog"
    pulled = hub.pull(["qwen3-8b", "acme/no-st"], to=out, **ep(fake_hub))
    assert [(p.repo_id, p.commit, p.weight_bytes) for p in pulled][0] == ("Qwen/Qwen3-8B", commit, 256)
    assert pulled[1].weights_path is None and "stored the config only" in pulled[1].note
    assert json.loads((out / "Qwen--Qwen3-8B" / "config.json").read_text()) == TINY
    assert json.loads((out / "Qwen--Qwen3-8B" / "safetensors.json").read_text())["commit"] == commit
    aliases = yaml.safe_load((out / "aliases.yaml").read_text())["models"]
    assert aliases["Qwen/Qwen3-8B"]["dir"] == "Qwen--Qwen3-8B" and aliases["Qwen/Qwen3-8B"]["aliases"] == ["qwen3-8b"]
    assert aliases["acme/no-st"] == {"dir": "acme--no-st", "aliases": [], "revision": "main", "commit": pulled[1].commit}
    assert (hub.kvplan_store_dir() / "Qwen--Qwen3-8B" / f"{commit}.json").is_file()
    assert hub.load_weights_file(out / "Qwen--Qwen3-8B" / "safetensors.json", TINY).total_bytes == 256

    fake_hub.stop()  # CI, offline, after pull
    cfg = hub.fetch_config("Qwen/Qwen3-8B", offline=True, **ep(fake_hub))
    assert (cfg.ref.source, cfg.ref.commit) == ("cache", commit)
    w = hub.safetensors_weights("Qwen/Qwen3-8B", cfg.config, commit=cfg.ref.commit, offline=True, **ep(fake_hub))
    assert w.total_bytes == 256 and w.source == "cache"
    w2 = hub.safetensors_weights("Qwen/Qwen3-8B", cfg.config, offline=True, **ep(fake_hub))  # commit from refs/main
    assert w2.commit == commit


def test_pull_does_not_fall_back(fake_hub: FakeHub) -> None:
    fake_hub.fail_status = 500
    with pytest.raises(EnvironmentProblem, match="HTTP 500"):
        hub.pull(["deepseek-ai/DeepSeek-R1"], timeout=2, **ep(fake_hub))
    with pytest.raises(ModelNotFoundError, match="cannot pull"):
        hub.pull(["not-an-alias"], **ep(fake_hub))


def test_search(fake_hub: FakeHub) -> None:
    ids = [h.repo_id for h in hub.search_models("qwen3")]
    assert "Qwen/Qwen3-8B" in ids and all("qwen3" in i.lower() for i in ids)
    close = hub.search_models("mistrall-7b")
    assert close and all(h.match == "close" for h in close)
    fake_hub.add_repo("acme/tiny-llama", {"config.json": TINY})
    fake_hub.add_repo("acme/other", {"config.json": TINY})
    found = hub.search_models("tiny", hub=True, limit=5, **ep(fake_hub))
    assert [(h.repo_id, h.source) for h in found] == [("acme/tiny-llama", "hub")]


# ------------------------------------------------------------------------------- the CLI's environment


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60)


def test_environment_read_at_import(fake_hub: FakeHub, tmp_path: Path) -> None:
    """HF_ENDPOINT, HF_HOME, HF_TOKEN and HF_HUB_OFFLINE as a fresh process (the CLI) sees them."""
    fake_hub.add_repo("meta/gated", {"config.json": TINY}, gated=True, allowed_tokens={GOOD})
    home = tmp_path / "sub_home"
    env = {"HF_HOME": str(home), "HF_ENDPOINT": fake_hub.url, "HF_TOKEN": GOOD}
    code = "from kvplan import hub; r = hub.fetch_config('meta/gated'); print(r.ref.source, r.ref.commit)"
    first = _run(code, env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split()[0] == "hub" and first.stderr == ""
    assert (home / "hub" / "models--meta--gated").is_dir()
    offline = _run(code, {**env, "HF_HUB_OFFLINE": "1", "HF_TOKEN": ""})
    assert offline.stdout.split() == ["cache", first.stdout.split()[1]]


def test_import_kvplan_does_not_import_huggingface_hub() -> None:
    code = "import sys, kvplan, kvplan.resolve, kvplan.hub; print('huggingface_hub' in sys.modules)"
    out = _run(code, {})
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_no_error_rule_is_hidden_behind_a_broader_one() -> None:
    """hub/errors.py's table is read in order, first isinstance match wins: a type after one of its own bases
    would never be reached (GatedRepoError after RepositoryNotFoundError would read as 'not found')."""
    from kvplan.hub.errors import errors_table

    kinds = list(errors_table())
    hidden = [(k.__name__, base.__name__) for i, k in enumerate(kinds) for base in kinds[:i]
              if issubclass(k, base) and errors_table()[k] is not errors_table()[base]]
    assert hidden == []
    from huggingface_hub import errors as E

    assert kinds.index(E.GatedRepoError) < kinds.index(E.RepositoryNotFoundError) < kinds.index(E.HfHubHTTPError)
