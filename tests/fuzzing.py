"""Fuzz cases against the CLI's error contract, shared by tests/test_fuzz.py (hypothesis, fixed budget in CI) and
bench/fuzz.py (the 10,000-case run quoted in notes).

A case is (category, argv, files to write first); `run_case` runs it in-process with a time bound and `classify`
names what went wrong, in the classes of the fuzz review (../shared/reviews/fuzz.md): traceback (exit 3 or a
traceback printed), hang, bad-exit (not 0/1/2), spew (an error over several lines, or a line far longer than
its input), suspicious (exit 0 with a byte or token figure that is negative or not an integer), clean.
Every generator takes a random.Random, so a seed reproduces a case.
"""

from __future__ import annotations

import copy
import json
import random
import signal
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import ROOT, run_cli

CONFIG_DIR = ROOT / "model_configs"
BASES = sorted(p.parent.name for p in CONFIG_DIR.glob("*/config.json"))
READ_KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
             "intermediate_size", "vocab_size", "max_position_embeddings", "sliding_window", "tie_word_embeddings",
             "rope_scaling", "layer_types", "architectures", "model_type", "torch_dtype", "kv_lora_rank",
             "qk_rope_head_dim", "num_experts", "num_experts_per_tok", "attention_chunk_size", "quantization_config",
             "text_config", "max_target_positions", "n_positions", "mamba_d_state", "linear_num_value_heads",
             "_name_or_path", "block_configs", "vision_config", "num_nextn_predict_layers")
CATEGORIES = ("config", "flags", "check", "gguf", "names", "quantfile")


@dataclass
class Case:
    category: str
    argv: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)
    stdin: str | None = None

    def write(self, folder: Path) -> list[str]:
        for name, data in self.files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)  # type: ignore[operator]
        return [a.replace("{dir}", str(folder)) for a in self.argv]


# ------------------------------------------------------------------------------------------ hostile values
def hostile(rng: random.Random) -> Any:
    pick = rng.randrange(16)
    if pick == 0:
        return rng.choice([0, -1, 1, -128, 2**31, 2**63, 10**30, -(10**12)])
    if pick == 1:
        return rng.choice([float("nan"), float("inf"), float("-inf"), -0.0, 1e-300, 1.5, 4096.0, 1e300])
    if pick == 2:
        return rng.choice(["", "false", "true", "8", "eight", "[/x]", "a\nb", "4,096", "٤", "\x00", "x" * 3000])
    if pick == 3:
        return rng.choice([True, False, None])
    if pick == 4:
        return [hostile_scalar(rng) for _ in range(rng.randrange(4))]
    if pick == 5:
        return {"factor": hostile_scalar(rng), "rope_type": rng.choice(["yarn", "llama3", 5, None])}
    if pick == 6:
        return rng.randint(-5, 300)
    if pick == 7:
        return rng.choice([{}, [], [[[]]], {"a": {"b": {}}}])
    return rng.choice([rng.randint(0, 2**rng.randrange(1, 40)), rng.uniform(-1e6, 1e6), rng.randint(1, 512)])


def hostile_scalar(rng: random.Random) -> Any:
    value = hostile(rng)
    return value if not isinstance(value, (list, dict)) else 7


def hostile_text(rng: random.Random) -> str:
    pick = rng.randrange(12)
    if pick == 0:
        return str(rng.choice([0, -1, -100000, 10**30, 2**40 + 1]))
    if pick == 1:
        return rng.choice(["nan", "inf", "-inf", "1e9", "0x10", "1_000", "4,096", "4.5k", "٤٠٩٦", "４０９６"])
    if pick == 2:
        return rng.choice(["", " ", "[/x]", "a\nb", "--json", "-h", "x" * 5000, "9" * 5000, "\x00", "💥"])
    if pick == 3:
        return rng.choice(["24GB", "0GB", "-5GB", "1e3GB", "5", "lots", "GB", "1.5TB", "99999999999999TB"])
    if pick == 4:
        return rng.choice(["fp8", "bf16", "int4", "q4_0", "f16", "fp4", "FP8", "bfloat16", "e5m2"])
    return str(rng.choice([rng.randint(1, 200000), rng.randint(-5, 5), rng.randrange(1, 64)])) + rng.choice(
        ["", "", "k", "M", "K", "m", "x"])


# ------------------------------------------------------------------------------------------ generators
def _paths(obj: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    out: list[tuple] = []
    if depth > 3:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,), depth + 1)
    elif isinstance(obj, list) and len(obj) <= 8:
        for i, v in enumerate(obj):
            out.append(prefix + (i,))
            out += _paths(v, prefix + (i,), depth + 1)
    return out


def _set(obj: Any, path: tuple, value: Any, delete: bool = False) -> None:
    for key in path[:-1]:
        obj = obj[key]
    if delete and isinstance(obj, dict):
        obj.pop(path[-1], None)
    else:
        obj[path[-1]] = value


def config_case(rng: random.Random) -> Case:
    base = rng.choice(BASES)
    config = json.loads((CONFIG_DIR / base / "config.json").read_text())
    mutated = copy.deepcopy(config)
    for _ in range(rng.randint(1, 3)):
        paths = _paths(mutated)
        if rng.random() < 0.4 or not paths:
            _set(mutated, (rng.choice(READ_KEYS),), hostile(rng))
        else:
            _set(mutated, rng.choice(paths), hostile(rng), delete=rng.random() < 0.2)
    text = json.dumps(mutated)
    command = rng.choice([["size", "{dir}/c.json", "--ctx", rng.choice(["4096", "512", "128k"]), "--json"],
                          ["size", "{dir}/c.json", "--json"],
                          ["size", "{dir}/c.json", "--ctx", "4096"],
                          ["size", "{dir}/c.json", "--ctx", "4096", "--engine", rng.choice(["sglang", "llamacpp",
                                                                                            "trtllm", "hf"]), "--json"],
                          ["fit", "--gpu", rng.choice(["L4", "H100", "24GB"]), "--model", "{dir}/c.json", "--json"]])
    return Case("config", command, {"c.json": text})


QUANT_FILES = sorted(CONFIG_DIR.glob("*/hf_quant_config.json")) + sorted(
    (ROOT / "tests" / "data" / "aic-configs").glob("*_hf_quant_config.json"))


def quantfile_case(rng: random.Random) -> Case:
    """A model directory: a bundled config.json beside a mutated ModelOpt hf_quant_config.json (a genuine one, or a
    MIXED_PRECISION map moved onto another model), read as vLLM and SGLang read it."""
    quant = json.loads(rng.choice(QUANT_FILES).read_text())
    base = rng.choice(BASES)
    config = json.loads((CONFIG_DIR / base / "config.json").read_text())
    if rng.random() < 0.5:
        config.pop("quantization_config", None)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(quant) if len(p) < 4] or [("quantization",)]
        _set(quant, rng.choice(paths), hostile(rng), delete=rng.random() < 0.3)
    command = rng.choice([["size", "{dir}/m", "--json"], ["size", "{dir}/m/config.json", "--ctx", "4096"],
                          ["fit", "--gpu", rng.choice(["H100", "24GB"]), "--model", "{dir}/m", "--json"]])
    return Case("quantfile", command, {"m/config.json": json.dumps(config), "m/hf_quant_config.json": json.dumps(quant)})


FLAGS = ("--ctx", "--batch", "--tp", "--pp", "--kv-dtype", "--weight-dtype", "--block-size", "--page-size",
         "--ubatch", "--tokens-per-block", "--max-num-batched-tokens", "--max-num-seqs", "--encoder-len",
         "--gpu-memory-utilization", "--mem-fraction-static", "--timeout", "--engine", "--kv-budget", "--gpu",
         "--state-dtype", "--k-dtype", "--v-dtype", "--revision", "--mamba-full-memory-ratio", "--max-mamba-cache-size")
PLAN_FLAGS = ("--prompt", "--output", "--users", "--tpot", "--bandwidth", "--shared-prefix", "--requests", "--gpu",
              "--max-num-seqs", "--block-size", "--max-model-len", "--kv-budget", "--tp", "--engine")


def flags_case(rng: random.Random) -> Case:
    base = rng.choice([["size", "llama-3.1-8b"], ["size", "gemma-2-9b", "--engine", "llamacpp"],
                       ["size", "qwen3-next-80b-a3b"], ["fit", "--gpu", "L4", "--model", "llama-3.2-1b"],
                       ["fit", "--gpu", "24GB"], ["size", "llama-3.1-8b", "--engine", "sglang"],
                       ["plan", "llama-3.2-1b", "--gpu", "L4", "--prompt", "100-300", "--output", "10-50", "-n", "30"]])
    argv = list(base)
    for _ in range(rng.randint(1, 3)):
        flag = rng.choice(PLAN_FLAGS if base[0] == "plan" else FLAGS)
        value = hostile_text(rng) if flag not in ("--engine",) else rng.choice(
            ["vllm", "vllm@", "vllm@99", "sglang@0.1", "llamacpp", "x", "VLLM", "trtllm@1.0", "hf"])
        argv += [f"{flag}={value}"] if rng.random() < 0.5 else [flag, value]
    if rng.random() < 0.5:
        argv.append("--json")
    return Case("flags", argv)


CHECK_KEYS = ("name", "model", "gpu", "ctx", "batch", "min_batch", "engine", "kv_dtype", "tp", "pp", "headroom",
              "gpu_memory_utilization", "max_num_seqs", "block_size", "kv_budget", "max_ctx", "bogus",
              "prompt", "output", "users", "tpot", "min_running", "max_gpus", "shared_prefix")


def _yaml_scalar(rng: random.Random) -> str:
    pick = rng.randrange(8)
    if pick == 0:
        return json.dumps(hostile_text(rng))
    if pick == 1:
        return rng.choice(["llama-3.2-1b", "gemma-2-9b", "L4", "H100", "8192", "32k", "0.9", "vllm", "fp8"])
    if pick == 2:
        return rng.choice(["~", "null", "yes", "no", "016", "1:30", ".inf", ".nan", "-1", "[]", "{}", "!!binary aGk="])
    if pick == 3:
        return json.dumps(rng.choice(["[/x]", "a\nb\n::add-mask::s", "\x01", "x" * 500]))
    return json.dumps(str(rng.randint(-3, 100000)))


def check_case(rng: random.Random) -> Case:
    lines: list[str] = []
    if rng.random() < 0.3:
        lines.append("x-base: &base {gpu: L4, engine: vllm}")
        lines.append("defaults: {<<: *base" + (f", ctx: {_yaml_scalar(rng)}" if rng.random() < 0.5 else "") + "}")
    lines.append("deployments:")
    for i in range(rng.randint(0, 3)):
        fields = {"name": f'"d{i}"', "model": "llama-3.2-1b", "gpu": "L4", "ctx": "8192"}
        for _ in range(rng.randint(0, 2)):
            fields[rng.choice(CHECK_KEYS)] = _yaml_scalar(rng)
        if rng.random() < 0.1:
            fields.pop(rng.choice(list(fields)))
        lines.append("  - {" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}")
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.15:  # byte-level damage
        pos = rng.randrange(len(text))
        text = text[:pos] + rng.choice(["\x00", "\t", "[", "{", ":", "&", "*", "\n  -", "'"]) + text[pos + 1:]
    fmt = rng.choice(["text", "json", "github", "junit"])
    return Case("check", ["check", "{dir}/k.yaml", "--format", fmt], {"k.yaml": text})


def _gguf_value(rng: random.Random) -> tuple[int, bytes]:
    """(GGUF value type, packed value): hostile values in the types a converter could write."""
    pick = rng.randrange(7)
    if pick == 0:
        return 5, struct.pack("<i", rng.choice([-4096, -1, 0, 2**31 - 1]))  # INT32
    if pick == 1:
        return 10, struct.pack("<Q", rng.choice([0, 2**32 - 1, 2**40, 2**64 - 1]))  # UINT64
    if pick == 2:
        return 6, struct.pack("<f", rng.choice([1.5, -2.0, float("nan"), float("inf"), 0.0]))  # FLOAT32
    if pick == 3:
        raw = rng.choice([b"", b"8", b"[/x]"])
        return 8, struct.pack("<Q", len(raw)) + raw  # STRING
    if pick == 4:
        return 7, struct.pack("<?", rng.random() < 0.5)  # BOOL
    if pick == 5:
        n = rng.choice([0, 1, 2, 3, 40])
        return 9, struct.pack("<IQ", 5, n) + b"".join(struct.pack("<i", rng.randint(-2, 9)) for _ in range(n))
    return 4, struct.pack("<I", rng.choice([0, 1, 2, 3, 4, 64, 4096, 100000]))  # UINT32


def gguf_bytes(arch: str, meta: dict[str, tuple[int, bytes]]) -> bytes:
    """A GGUF v3 header with the given metadata (type, packed value) and one tiny f16 tensor."""
    def s(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    kv = {"general.architecture": (8, s(arch)), **meta}
    out = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv))
    for key, (vtype, packed) in kv.items():
        out += s(key) + struct.pack("<I", vtype) + packed
    out += s("token_embd.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 8, 4) + struct.pack("<IQ", 1, 0)
    out += b"\0" * ((-len(out)) % 32) + b"\0" * 64
    return out


def gguf_case(rng: random.Random) -> Case:
    arch = rng.choice(["llama", "gemma2", "qwen2", "mamba", "jamba", "deepseek2"])
    meta = {f"{arch}.block_count": (4, struct.pack("<I", 2)), f"{arch}.context_length": (4, struct.pack("<I", 4096)),
            f"{arch}.embedding_length": (4, struct.pack("<I", 64)),
            f"{arch}.attention.head_count": (4, struct.pack("<I", 4)),
            f"{arch}.attention.head_count_kv": (4, struct.pack("<I", 2)),
            f"{arch}.attention.sliding_window": (4, struct.pack("<I", 128)),
            f"{arch}.ssm.conv_kernel": (4, struct.pack("<I", 4)), f"{arch}.ssm.inner_size": (4, struct.pack("<I", 128)),
            f"{arch}.ssm.state_size": (4, struct.pack("<I", 16)),
            f"{arch}.ssm.time_step_rank": (4, struct.pack("<I", 4))}
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(list(meta) + [f"{arch}.attention.key_length", f"{arch}.attention.sliding_window_pattern",
                                        f"{arch}.attention.kv_lora_rank", f"{arch}.attention.key_length_mla"])
        meta[key] = _gguf_value(rng)
    return Case("gguf", ["size", "{dir}/m.gguf", "--ctx", rng.choice(["4096", "512"]), "--engine", "llamacpp",
                         "--json"], {"m.gguf": gguf_bytes(arch, meta)})


def names_case(rng: random.Random) -> Case:
    name = rng.choice([hostile_text(rng), "org/" + hostile_text(rng)[:50], "[/x]", "a/b/c", "../x", "~", "-x",
                       "llama-3.1-8b\n", "x:y.gguf", "o/m:f.gguf", "💥/💥"])
    command = rng.choice([["size", name, "--offline"], ["fit", "--gpu", name], ["models", "--search", name],
                          ["fit", "--gpu", "L4", "--model", name, "--offline"], ["gpus", "--json"]])
    return Case("names", command)


GENERATORS = {"config": config_case, "quantfile": quantfile_case, "flags": flags_case, "check": check_case,
              "gguf": gguf_case, "names": names_case}


# ------------------------------------------------------------------------------------------ running, judging
class Hang(BaseException):
    """Raised by the alarm; a BaseException so kvplan's last-resort handler does not turn it into exit 3."""


@dataclass
class Outcome:
    code: int | None
    out: str
    err: str
    hung: bool


def run_case(case: Case, folder: Path, seconds: int = 20) -> Outcome:
    argv = case.write(folder)

    def ring(*_: Any) -> None:
        raise Hang

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        r = run_cli(*argv)
        return Outcome(r.code, r.out, r.err, False)
    except Hang:
        return Outcome(None, "", "", True)
    except Exception as e:  # escaped kvplan's own boundary: a traceback as a user would see it
        return Outcome(3, "", f"Traceback (escaped main): {type(e).__name__}: {e}"[:2000], False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _figures(obj: Any, key: str = "") -> list[tuple[str, Any]]:
    """(key, value) of every number in a JSON output."""
    if isinstance(obj, dict):  # fit's budget breakdown is signed by design (what each part takes away)
        return [f for k, v in obj.items() if k != "budget" for f in _figures(v, k)]
    if isinstance(obj, list):
        return [f for v in obj for f in _figures(v, key)]
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return [(key, obj)]
    return []


# figures that may be negative: fit's KV budget when the weights do not fit (weights_fit: false says so)
SIGNED_KEYS = {"margin", "difference", "delta", "kv_budget_bytes"}
FRACTION_KEYS = {"concurrency", "gpu_memory_utilization", "mem_fraction_static", "fraction", "headroom", "free_gpu_memory_fraction",
                 "seconds", "ratio", "utilization", "bandwidth_gbps", "tflops", "x", "share",
                 # plan: means over requests and steps, speed bounds
                 "mean_running", "mean_prompt", "mean_output", "mean_request_blocks", "tokens_per_s_per_request",
                 "tokens_per_s_per_request_bound", "step_seconds_bound",
                 # gpus: dense TFLOPS by dtype, as vendors state them (decimals)
                 "bf16", "fp16", "fp8", "flops_per_s",
                 # plan static_comparison: averages and shares
                 "mean_tokens", "paged_reserved_tokens", "paged_waste", "static_waste",
                 # SGLang 0.5.23's DSV4PoolConfigurator prices a token in fractional bytes (compressed entries
                 # every 4 / 128 tokens): bytes_per_full_token 7,086.75 for Flash, as SGLang computes it
                 "bytes_per_full_token", "bytes_per_swa_token"}


def _asks_json(argv: list[str]) -> bool:
    """--json as a flag (not as the value of the flag before it), or check's --format json."""
    return "json" in argv or any(a == "--json" and (i == 0 or argv[i - 1] not in FLAGS) for i, a in enumerate(argv))


def classify(case: Case, o: Outcome) -> set[str]:
    """The classes an outcome shows (empty = clean)."""
    found: set[str] = set()
    if o.hung:
        return {"hang"}
    if o.code == 3 or "Traceback" in o.err or "Traceback" in o.out:
        found.add("traceback")
    elif o.code not in (0, 1, 2):
        found.add("bad-exit")
    if o.code not in (0, None):
        lines = [line for line in o.err.splitlines() if line.strip()]
        problem_lines = [line for line in lines if not line.startswith("kvplan: error: ")]
        if case.category != "check" and len(lines) != 1 or case.category == "check" and len(
                [line for line in lines if line.startswith("kvplan: error: ")]) > 1:
            found.add("spew")
        longest = max((len(line) for line in lines), default=0)
        if longest > 2 * sum(len(a) for a in case.argv) + 600 and case.category != "check":
            found.add("spew")
        del problem_lines
    if o.code == 0 and _asks_json(case.argv):
        try:
            data = json.loads(o.out)
        except ValueError:
            return found | {"suspicious"}
        for key, value in _figures(data):
            if key in FRACTION_KEYS or key.endswith(("_fraction", "_seconds", "_s", "_gbps", "_ratio")):
                continue
            if isinstance(value, float) or (value < 0 and key not in SIGNED_KEYS and not key.startswith("margin")):
                found.add("suspicious")
                break
    return found
