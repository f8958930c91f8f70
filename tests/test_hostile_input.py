"""Every reproduction in the fuzz review (../shared/reviews/fuzz.md, D1-D16) as a regression test.

The contract under test (CONTRACTS.md): bad input is ONE line on stderr and exit 2, never a traceback, a hang or
a silently wrong number. Each case names its defect; a case fixed differently from the review's suggestion says
so in its assertion message.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import hubserver
from conftest import ROOT, run_cli, write_gguf_file
from kvplan import hub

fake_hub = hubserver.fake_hub

CONFIGS = ROOT / "model_configs"
LLAMA = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B" / "config.json").read_text())
GEMMA2 = json.loads((CONFIGS / "google--gemma-2-9b" / "config.json").read_text())
QWEN3 = json.loads((CONFIGS / "Qwen--Qwen3-8B" / "config.json").read_text())
T5 = json.loads((CONFIGS / "google-t5--t5-large" / "config.json").read_text())


def mutated(tmp: Path, base: dict[str, Any], change: Callable[[dict[str, Any]], Any], name: str = "c.json") -> str:
    c = copy.deepcopy(base)
    change(c)
    path = tmp / name
    path.write_text(json.dumps(c))
    return str(path)


def one_line_error(r: Any, needle: str = "") -> None:
    assert r.code == 2, (r.code, r.out[-300:], r.err[-600:])
    assert r.err.count("\n") == 1 and r.err.startswith("kvplan: error: "), r.err
    assert "Traceback" not in r.err
    assert needle in r.err, r.err


class _Alarm(Exception):
    pass


def within(seconds: int, fn: Callable[[], Any]) -> Any:
    """Run fn or fail the test as a hang (a bound, not a timing assertion)."""
    def ring(*_: Any) -> None:
        raise _Alarm

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        return fn()
    except _Alarm:
        pytest.fail(f"hung for {seconds} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------ D2: Ctrl-C, at a real terminal
def test_ctrl_c_at_a_terminal_exits_130_with_one_line(tmp_path):
    """A real pty: ^C typed at the terminal reaches kvplan as SIGINT while it works (here: a deliberately slow
    size), and the process ends with 130 and one line, as a CI step must see it."""
    script = ("import sys, time\nfrom kvplan import cli, sizing\n"
              "def slow(*a, **k):\n    print('working', flush=True)\n    time.sleep(60)\n"
              "sizing.size = slow\ncli.main(['size', 'llama-2-7b'])\n")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))

    def controlling_tty() -> None:
        # A shell's background job starts with SIGINT ignored, and an ignored signal stays ignored across exec
        # (Python then installs no handler): a terminal user's kvplan has it at its default.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-c", script], stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=controlling_tty, env={**os.environ, "PYTHONPATH": str(ROOT)}, close_fds=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"working" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                seen += os.read(master, 4096)
        assert b"working" in seen, seen
        os.write(master, b"\x03")  # the terminal's interrupt character: the line discipline sends SIGINT
        code = proc.wait(timeout=30)
        while select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        proc.kill()
        os.close(master)
    text = seen.decode(errors="replace")
    assert code == 130, text
    assert "Traceback" not in text and "kvplan: error: interrupted" in text


# ------------------------------------------------------------------ D3: invalid config values are refused
@pytest.mark.parametrize("base,change,needle", [
    (LLAMA, {"head_dim": -128}, "config.head_dim must be an integer in 1.."),
    (LLAMA, {"num_key_value_heads": -1}, "num_key_value_heads"),
    (LLAMA, {"num_key_value_heads": 1.5}, "num_key_value_heads"),
    (LLAMA, {"num_key_value_heads": 1e-300}, "num_key_value_heads"),
    (LLAMA, {"num_key_value_heads": -0.0}, "num_key_value_heads"),
    (LLAMA, {"num_key_value_heads": True}, "num_key_value_heads"),
    (LLAMA, {"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, found 'false'"),
    (LLAMA, {"max_position_embeddings": "131072"}, "max_position_embeddings"),
    (LLAMA, {"max_target_positions": 1e-300}, "max_target_positions"),
    (QWEN3, {"rope_scaling": {"rope_type": "yarn", "factor": -4, "original_max_position_embeddings": 32768}},
     "rope_scaling.factor must be a positive number"),
    (LLAMA, {"architectures": "Qwen2ForCausalLM"}, "architectures must be a list of strings"),
    (GEMMA2, {"sliding_window": -4096}, "sliding_window"),
    (GEMMA2, {"sliding_window": 1.5}, "sliding_window"),
    (T5, {"num_heads": 0}, "num_heads"),
    (LLAMA, {"attention_bias": 5}, "attention_bias"),
    (LLAMA, {"attention_bias": "no"}, "attention_bias"),
    (LLAMA, {"attention_bias": [1, 2]}, "attention_bias"),
    (LLAMA, {"mlp_bias": float("inf")}, "mlp_bias"),
    (LLAMA, {"model_type": False}, "model_type must be a string"),
])
def test_d3_invalid_config_values_are_one_line_not_numbers(tmp_path, base, change, needle):
    path = mutated(tmp_path, base, lambda c: c.update(change))
    r = run_cli("size", path, "--json", *(["--ctx", "512"] if base is T5 else []))
    one_line_error(r, needle)


def test_d3_integral_floats_are_integers_and_the_answer_is_unchanged(tmp_path):
    """`num_key_value_heads: 8.0` is 8 (as transformers' config classes take it): same bytes as the original."""
    pristine = run_cli("size", "llama-3.1-8b", "--ctx", "4096", "--json").json()
    path = mutated(tmp_path, LLAMA, lambda c: c.update(num_key_value_heads=8.0, head_dim=128.0))
    r = run_cli("size", path, "--ctx", "4096", "--json")
    assert r.code == 0, r.err
    assert r.json()["kv_bytes"] == pristine["kv_bytes"] == 536_870_912


def test_d3_gguf_metadata_values_are_checked(tmp_path):
    def gguf(name: str, **kv: Any) -> str:
        meta = {"gemma2.block_count": 2, "gemma2.context_length": 8192, "gemma2.embedding_length": 256,
                "gemma2.attention.head_count": 4, "gemma2.attention.head_count_kv": 2,
                "gemma2.attention.key_length": 64, "gemma2.attention.value_length": 64,
                "gemma2.attention.sliding_window": 4096, **kv}
        return str(write_gguf_file(tmp_path / name, "gemma2", meta,
                                   [("token_embd.weight", np.zeros((8, 256), dtype=np.float16), None)]))

    ok = run_cli("size", gguf("ok.gguf"), "--ctx", "8192", "--engine", "llamacpp", "--json")
    assert ok.code == 0 and ok.json()["kv_bytes"] > 0, ok.err
    one_line_error(run_cli("size", gguf("neg.gguf", **{"gemma2.attention.sliding_window": -4096}), "--ctx", "8192"),
                   "sliding_window")
    one_line_error(run_cli("size", gguf("frac.gguf", **{"gemma2.attention.sliding_window": 1.5}), "--ctx", "8192"),
                   "sliding_window")
    one_line_error(run_cli("size", gguf("zero.gguf", **{"gemma2.attention.head_count": 0,
                                                         "gemma2.attention.head_count_kv": 0}), "--ctx", "8192"),
                   "head_count")


# ------------------------------------------------------------------ D4: FIFOs and devices
def _subprocess(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", [["size", "{p}", "--ctx", "4k"], ["fit", "--gpu", "L4", "--model", "{p}"],
                                     ["check", "{p}"]])
def test_d4_a_fifo_is_refused_not_read(tmp_path, command):
    fifo = tmp_path / ("p.yaml" if command[0] == "check" else "p.json")
    os.mkfifo(fifo)
    p = _subprocess(*[a.format(p=fifo) for a in command])  # a hang here is a timeout failure
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "not a regular file" in p.stderr and p.stderr.count("\n") <= 2 and "Traceback" not in p.stderr


@pytest.mark.parametrize("command", [["size", "/dev/zero", "--ctx", "4k"], ["check", "/dev/zero"]])
def test_d4_a_device_is_refused_not_read(command):
    r = within(20, lambda: run_cli(*command))
    assert r.code == 2 and "not a regular file" in r.err and "Traceback" not in r.err, r.err


def test_d4_an_oversized_config_is_refused_before_reading(tmp_path):
    big = tmp_path / "config.json"
    with open(big, "wb") as f:
        f.truncate(65 << 20)  # sparse: 65 MiB without writing them
    one_line_error(run_cli("size", str(big)), "more than the")


# ------------------------------------------------------------------ D5: layer counts are bounded
@pytest.mark.parametrize("layers", [10**7, 1e30, 5000])
def test_d5_absurd_layer_counts_are_refused_at_once(tmp_path, layers):
    path = mutated(tmp_path, LLAMA, lambda c: c.update(num_hidden_layers=layers))
    r = within(20, lambda: run_cli("size", path, "--ctx", "4k", "--json"))
    one_line_error(r, "num_hidden_layers must be an integer in 1..4,096")


def test_d5_gguf_block_count_is_bounded(tmp_path):
    meta = {"llama.block_count": 2**32 - 1, "llama.context_length": 4096, "llama.embedding_length": 256,
            "llama.attention.head_count": 4}
    path = write_gguf_file(tmp_path / "m.gguf", "llama", meta,
                           [("token_embd.weight", np.zeros((8, 256), dtype=np.float16), None)])
    r = within(20, lambda: run_cli("size", str(path), "--ctx", "4k"))
    one_line_error(r, "block_count must be an integer in 1..4,096")


# ------------------------------------------------------------------ D6: YAML merge-key bomb
def test_d6_a_merge_key_bomb_is_read_in_linear_time(tmp_path):
    lines = ["x-a0: &a0 {engine: vllm}"]
    lines += [f"x-a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 10)}]}}" for i in range(1, 9)]
    lines += ["defaults: {<<: *a8}", "deployments: [{name: a, model: llama-3.2-1b, gpu: L4, ctx: 8192}]"]
    path = tmp_path / "k.yaml"
    path.write_text("\n".join(lines) + "\n")
    r = within(20, lambda: run_cli("check", str(path), "--format", "json"))
    assert r.code == 0, r.err
    assert r.json()["deployments"][0]["engine"].startswith("vllm")  # the merged default still applies


# ------------------------------------------------------------------ D7: engine knobs in `size`
@pytest.mark.parametrize("args,flag", [
    (["gemma-2-9b", "--engine", "llamacpp", "--ubatch", "-100000"], "--ubatch"),
    (["gemma-2-9b", "--max-num-batched-tokens", "-100000"], "--max-num-batched-tokens"),
    (["llama-3.1-8b", "--engine", "sglang", "--page-size", "-5"], "--page-size"),
    (["llama-3.1-8b", "--block-size", "0"], "--block-size"),
    (["llama-3.1-8b", "--engine", "trtllm", "--tokens-per-block", "0"], "--tokens-per-block"),
    (["llama-3.1-8b", "--engine", "trtllm", "--tokens-per-block=-5"], "--tokens-per-block"),
])
def test_d7_size_refuses_non_positive_knobs_like_fit(args, flag):
    one_line_error(run_cli("size", *args, "--ctx", "4096", "--json"), flag)


# ------------------------------------------------------------------ D8: safetensors headers are checked
def _record(tensors: dict[str, list[Any]]) -> dict[str, Any]:
    return {"format": hub.RECORD_FORMAT, "files": {"model.safetensors": {"metadata": {}, "tensors": tensors}}}


@pytest.mark.parametrize("entry,needle", [
    (["F16", [-1000000, 4096], 0], "malformed"),
    (["F16", [1.5, 3], 9], "malformed"),
    (["F32", [2**40, 2**40], 2**82], "malformed"),
    (["Q9_X", [10], 2**62], "malformed"),
    (["Q9_X", [10], -100], "malformed"),
    (["F16", [4096, 4096], 100], "data span"),
    (["F16", "4096", 100], "malformed"),
    ("F16", "malformed"),
])
def test_d8_a_broken_header_is_not_exact_weights(entry, needle):
    with pytest.raises(hub.WeightsUnavailable, match=needle):
        hub.weights_from_record(_record({"w": entry}), LLAMA)


def test_d8_no_tensors_is_not_zero_weights():
    with pytest.raises(hub.WeightsUnavailable, match="no tensors"):
        hub.weights_from_record(_record({}), LLAMA)


def test_d8_a_genuine_header_still_sums_exactly():
    w = hub.weights_from_record(_record({"a": ["BF16", [4096, 4096], 2 * 4096 * 4096], "b": ["F32", [7], 28],
                                         "c": ["F4", [3], 2]}), LLAMA)
    assert w.total_bytes == 2 * 4096 * 4096 + 28 + 2 and w.n_tensors == 3


def _safetensors_bytes(header: dict[str, Any], data: int = 0) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data


def test_d8_size_from_the_hub_falls_back_to_the_config_and_says_why(fake_hub, tmp_path, monkeypatch):
    header = {"w": {"dtype": "F16", "shape": [-1000000, 4096], "data_offsets": [0, 0]}}
    fake_hub.add_repo("acme/broken", {"config.json": LLAMA, "model.safetensors": _safetensors_bytes(header)})
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    r = run_cli("size", "acme/broken", "--ctx", "4096", "--json")
    assert r.code == 0, r.err
    data = r.json()
    pristine = run_cli("size", "llama-3.1-8b", "--ctx", "4096", "--json").json()
    assert data["weight_bytes"] == pristine["weight_bytes"] == 16_060_522_496
    assert any("weights from the config" in a for a in data.get("assumptions", []) + data.get("warnings", [])), data


# ------------------------------------------------------------------ D10: type confusion
@pytest.mark.parametrize("change,needle", [
    ({"architectures": 5}, "architectures"),
    ({"architectures": {"a": 1}}, "architectures"),
    ({"num_key_value_heads": "eight"}, "num_key_value_heads"),
    ({"num_attention_heads": float("inf")}, "num_attention_heads"),
    ({"num_attention_heads": float("nan")}, "num_attention_heads"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": "128"}}, "weight_block_size"),
    ({"layer_types": [1, 2]}, "layer_types"),
    ({"intermediate_size": -1}, "intermediate_size"),
    ({"hidden_size": [1, 2]}, "hidden_size"),
    ({"rope_scaling": {"rope_type": "linear", "factor": None}}, "rope_scaling.factor"),  # fuzz seed 3401010874
])
def test_d10_wrong_types_are_one_line(tmp_path, change, needle):
    one_line_error(run_cli("size", mutated(tmp_path, LLAMA, lambda c: c.update(change)), "--ctx", "4k"), needle)


def test_d10_zero_intermediate_size_with_int8_weights_is_a_number(tmp_path):
    """An MLP of width 0 is legal (0 bytes there); int8 per-channel scales no longer divide by it."""
    path = mutated(tmp_path, LLAMA, lambda c: c.update(intermediate_size=0))
    r = run_cli("size", path, "--ctx", "4096", "--weight-dtype", "int8", "--json")
    assert r.code == 0, r.err
    assert isinstance(r.json()["weight_bytes"], int) and r.json()["weight_bytes"] > 0


# ------------------------------------------------------------------ D11: parser limits
def test_d11_deep_json_and_long_integers_are_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    one_line_error(run_cli("size", str(deep)), "nested too deeply")
    big = tmp_path / "big.json"
    big.write_text('{"a": ' + "9" * 5000 + "}")
    one_line_error(run_cli("size", str(big)), "digits")


def test_d11_deep_yaml_is_a_problem_line(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("deployments: " + "[" * 5000 + "]" * 5000)
    r = run_cli("check", str(path))
    assert r.code == 2 and "nested too deeply" in r.err and "Traceback" not in r.err, r.err


# ------------------------------------------------------------------ D12: rich markup in user text
def test_d12_markup_in_a_path_is_printed_as_text(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a short relative path: the table shows it whole
    for name in ("m[/x]", "models[v2]"):
        Path(name).mkdir(parents=True)
        Path(name, "config.json").write_text(json.dumps(LLAMA))
        r = run_cli("size", f"{name}/config.json", "--ctx", "4k")
        assert r.code == 0, r.err
        assert f"{name}/config.json" in r.out, r.out


def test_d12_markup_in_config_and_check_names(tmp_path):
    r = run_cli("size", mutated(tmp_path, LLAMA, lambda c: c.update(_name_or_path="[/x]")), "--ctx", "4k")
    assert r.code == 0 and "[/x]" in r.out, r.err
    path = tmp_path / "k.yaml"
    path.write_text('deployments:\n  - {name: "[/x] [bold]b", model: llama-3.2-1b, gpu: L4, ctx: 8192}\n')
    r = run_cli("check", str(path))
    assert r.code == 0 and "[/x] [bold]b" in r.out, (r.err, r.out)


# ------------------------------------------------------------------ D13: huge numbers
@pytest.mark.parametrize("args,needle", [
    (["size", "llama-3.1-8b", "--ctx", "9" * 5000], "--ctx"),
    (["size", "llama-3.1-8b", "--ctx", "9" * 400], "--ctx"),
    (["size", "llama-3.1-8b", "--ctx", str(10**30)], "--ctx"),
    (["size", "llama-3.1-8b", "--batch", str(10**30)], "--batch"),
    (["size", "llama-3.1-8b", "--tp", str(10**30)], "--tp"),
    (["fit", "--gpu", "9" * 5000 + "xL4", "--model", "llama-3.1-8b"], "count before 'x'"),
    (["fit", "--gpu", "100000000000000000000000xH100", "--model", "llama-3.1-8b"], "count before 'x'"),
    (["fit", "--gpu", "L4", "--model", "llama-3.1-8b", "--kv-budget", "9" * 5000 + "GB"], "--kv-budget"),
])
def test_d13_huge_numbers_are_one_line(args, needle):
    r = run_cli(*args)
    one_line_error(r, needle)
    assert len(r.err) < 400, "the error echoes a short form of the value, not 5,000 digits"


def test_d13_absurd_config_sizes_are_refused(tmp_path):
    one_line_error(run_cli("size", mutated(tmp_path, LLAMA, lambda c: c.update(vocab_size=10**30)), "--ctx", "4k"),
                   "vocab_size")


# ------------------------------------------------------------------ D14: Hub and environment edges
def test_d14_a_malformed_hf_endpoint_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://[::1")
    one_line_error(run_cli("size", "org/name", "--ctx", "4k"), "HF_ENDPOINT")


def test_d14_search_results_with_odd_fields_are_listed(fake_hub, monkeypatch):
    fake_hub.add_repo("acme/tiny", {"config.json": LLAMA})
    fake_hub.model_extra = {"downloads": "many", "gated": 7}
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    for extra in ([], ["--json"]):
        r = run_cli("models", "--search", "tiny", "--hub", *extra)
        assert r.code == 0 and "acme/tiny" in r.out and "Traceback" not in r.err, r.err


def test_d14_a_failing_hub_search_is_one_line_without_retry_noise(fake_hub):
    fake_hub.fail_status = 500
    p = subprocess.run([sys.executable, "-m", "kvplan", "models", "--search", "llama", "--hub", "--timeout", "3"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "HF_ENDPOINT": fake_hub.url})
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "Retrying" not in p.stderr, p.stderr


# ------------------------------------------------------------------ D15: verify's allocation failure
def test_d15_an_allocation_failure_is_one_line(monkeypatch):
    pytest.importorskip("torch")
    from kvplan.verify import allocate

    def refuse(backend, plan):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 17179869184 bytes")

    monkeypatch.setattr(allocate, "allocate_plan", refuse)
    one_line_error(run_cli("verify", "llama-3.2-1b", "--ctx", "1024"), "can't allocate memory")


# ------------------------------------------------------------------ D16: minor
def test_d16_a_very_long_path_is_one_line():
    one_line_error(run_cli("size", "x" * 5000), "")


def test_d16_a_newline_in_a_name_stays_on_one_line():
    one_line_error(run_cli("size", "x\ny.json"), "x\\ny.json")


def test_d16_a_nul_byte_in_yaml_is_one_problem_line_with_its_position(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("deployments:\n  - {name: a\x00, model: llama-3.2-1b}\n")
    r = run_cli("check", str(path))
    assert r.code == 2, r.err
    problem = [line for line in r.err.splitlines() if "unacceptable character" in line]
    assert len(problem) == 1 and f"{path}:2:" in problem[0], r.err


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_d16_an_invalid_timeout_is_refused_even_for_a_bundled_model(value):
    one_line_error(run_cli("size", "llama-3.1-8b", f"--timeout={value}"), "--timeout")


def test_d16_an_invalid_timeout_variable_is_refused(monkeypatch):
    monkeypatch.setenv("KVPLAN_HUB_TIMEOUT", "abc")
    one_line_error(run_cli("size", "llama-3.1-8b"), "KVPLAN_HUB_TIMEOUT")


@pytest.mark.parametrize("digits", ["٤٠٩٦", "４０９６"])
def test_d16_only_ascii_digits_are_numbers(digits):
    one_line_error(run_cli("size", "llama-3.1-8b", "--ctx", digits), "--ctx")


def test_ctx_as_kvplan_prints_it_is_accepted():
    assert run_cli("size", "llama-3.1-8b", "--ctx", "4,096", "--json").json()["ctx"] == 4096


def test_d16_an_endpoint_without_hub_headers_is_named_as_such(fake_hub, monkeypatch):
    """A server that answers 200 without ETag / X-Repo-Commit (a proxy, a static site) is not the Hub: say that,
    not "the Hub cannot be reached"."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Plain(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _answer(self, head: bool) -> None:
            body = json.dumps(LLAMA).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")  # fake_hub isolates the rest
    try:
        one_line_error(run_cli("size", "acme/plain", "--ctx", "4k", "--timeout", "5"),
                       "does not answer like the Hugging Face Hub")
    finally:
        server.shutdown()


def test_an_unknown_kv_dtype_is_bad_input_even_over_the_whole_catalog():
    """fit over the catalog used to list the same dtype error under every model and exit 0."""
    one_line_error(run_cli("fit", "--gpu", "24GB", "--k-dtype", "bogus"), "--k-dtype: unknown KV dtype 'bogus'")


def test_mamba_dt_rank_is_an_integer_or_auto(tmp_path):
    jamba = json.loads((CONFIGS / "ai21labs--Jamba-v0.1" / "config.json").read_text())
    one_line_error(run_cli("size", mutated(tmp_path, jamba, lambda c: c.update(mamba_dt_rank=[])), "--ctx", "4k"),
                   "mamba_dt_rank must be an integer in 1..16,777,216 or 'auto'")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm", "llamacpp", "hf"])
@pytest.mark.parametrize("gpu", ["1 k", "1MiB", "100MiB"])
def test_a_device_smaller_than_any_reserve_is_an_answer_not_a_crash(engine, gpu):
    """A size below what an engine reserves for itself (SGLang's mem_fraction_static reserve divided by zero on a
    1 KiB device): the weights do not fit, said as such, exit 0."""
    r = run_cli("fit", "llama-3.2-1b", "--gpu", gpu, "--engine", engine, "--json")
    assert r.code == 0, r.err
    assert r.json()["results"][0]["weights_fit"] is False
