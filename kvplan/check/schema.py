"""The keys a `kvplan check` file may hold, and the kind of value each takes (how it is written and read).

Kinds: string, tokens (8192, 8k, 1M), count (a positive integer; k/M accepted too), fraction (0.9 or 90%), ratio
(a positive number such as 1.5), headroom (a fraction in [0, 1)), size (24GB; an integer is bytes), reserve (a size
or 0), bool (true/false), dtype (auto or a dtype name), lengths (1000 or 500-3000), time (30ms, 0.05s). An engine
knob's kind is its Knob.kind (engines/listing.py), so check and the command line read a knob alike.
"""

from __future__ import annotations

from kvplan import engines

# key -> kind (the module docstring lists the kinds)
GENERAL_KEYS: dict[str, str] = {
    "name": "string",
    "model": "string",
    "revision": "string",
    "gpu": "string",
    "engine": "string",
    "tp": "count",
    "pp": "count",
    "ctx": "tokens",
    "min_batch": "count",
    "batch": "count",  # the same key as min_batch
    "min_ctx": "tokens",
    "min_kv_tokens": "tokens",
    "kv_dtype": "string",
    "k_dtype": "string",
    "v_dtype": "string",
    "state_dtype": "string",
    "weight_dtype": "string",
    "kv_budget": "size",
    "reserve": "reserve",
    "headroom": "headroom",
    "require_start": "bool",
    "estimate": "string",  # low (default) | median: which end of an estimated budget the gate solves with
    # traffic (kvplan plan)
    "prompt": "lengths",
    "output": "lengths",
    "requests": "count",
    "shared_prefix": "tokens",
    "users": "count",
    "tpot": "time",
    "min_running": "count",
    "max_gpus": "count",
}
PLAN_KEYS = ("prompt", "output", "requests", "shared_prefix", "users", "tpot", "min_running", "max_gpus")
# engine knobs: fit's flags with _ for -, typed by each engine's Knob.kind (each engine accepts only its own)
KNOB_KEYS: dict[str, str] = {name: knob.kind for name, knob in engines.all_knobs().items()}
KEYS: dict[str, str] = {**GENERAL_KEYS, **KNOB_KEYS}
TOP_KEYS = ("defaults", "deployments")
REQUIRED = ("name", "model", "gpu")
REQUIREMENT_KEYS = ("min_batch", "min_ctx", "min_kv_tokens")
DTYPE_KEYS = ("kv_dtype", "k_dtype", "v_dtype", "state_dtype")

# kind -> how a problem message names what was expected
EXPECTED = {
    "string": "a string",
    "tokens": "a token count such as 8192, 8k or 1M",
    "count": "a positive integer",
    "fraction": "a fraction such as 0.9 or 90%",
    "ratio": "a positive ratio such as 0.9 or 1.5",
    "headroom": "a fraction such as 0.1 or 10%",
    "size": "a size such as 24GB or 512MiB",
    "reserve": "a size such as 1.5GiB, or 0",
    "bool": "true or false",
    "dtype": "auto or a dtype name such as fp32 or bf16",
    "lengths": "a token count such as 1000, or a range such as 500-3000",
    "time": "a time such as 30ms or 0.05s",
}
# string key -> what it names, for an empty or missing value
STRING_WHAT = {
    "name": "a deployment name",
    "model": "a model (alias, Hub id org/name or a path)",
    "gpu": "a GPU (catalog name, a size such as 24GB, or NxGPU such as 2xA10G)",
    "engine": "an engine name[@version] such as vllm or vllm@0.10",
    "revision": "a revision (branch, tag or commit)",
    "estimate": "low or median",
}
