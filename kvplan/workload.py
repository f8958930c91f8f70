"""A serving workload: the prompt and output lengths of the requests, a shared prefix, and how they arrive.

Lengths are fixed (`512`), a range drawn uniformly (`512-4096`, whole tokens, both ends included, a fixed seed so
the same command gives the same plan), or real requests from a CSV or JSONL file as gateways export them.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import InputError
from kvplan.schedule_sim import SimRequest
from kvplan.units import parse_tokens

PROMPT_KEYS = ("prompt_tokens", "input_tokens", "prompt_len", "input_len", "num_prompt_tokens", "isl", "prompt_length")
OUTPUT_KEYS = ("output_tokens", "completion_tokens", "output_len", "num_output_tokens", "osl", "output_length",
               "max_tokens")
MAX_FILE_BYTES = 256 << 20
MAX_REQUESTS = 20_000  # a replay of more takes longer than planning is worth; a file's first rows are used
SEED = 0


@dataclass(frozen=True)
class Lengths:
    low: int
    high: int

    @property
    def label(self) -> str:
        return f"{self.low:,}" if self.low == self.high else f"{self.low:,}-{self.high:,}"

    @property
    def canonical(self) -> str:
        """As parse_lengths reads it back (the form check stores)."""
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


def parse_lengths(text: str, flag: str, *, minimum: int = 1) -> Lengths:
    """`512`, `2k`, or a range `512-4096` / `1k-8k` (uniform, both ends included)."""
    raw = str(text).strip()
    lo_text, sep, hi_text = raw.partition("-")
    if sep and lo_text.strip() and hi_text.strip():
        lo, hi = parse_tokens(lo_text, flag), parse_tokens(hi_text, flag)
        if lo > hi:
            raise InputError(f"{flag} {raw!r}: the range runs backwards; write LOW-HIGH, e.g. 512-4096")
    else:
        lo = hi = parse_tokens(raw, flag)
    if lo < minimum:
        raise InputError(f"{flag} {raw!r}: lengths start at {minimum}")
    return Lengths(lo, hi)


@dataclass(frozen=True)
class Workload:
    requests: tuple[SimRequest, ...]
    description: str
    shared_prefix: int = 0

    @property
    def longest(self) -> int:
        return max(r.prompt + r.output for r in self.requests)

    def mean(self, attr: str) -> float:
        return sum(getattr(r, attr) for r in self.requests) / len(self.requests)

    def to_json(self) -> dict:
        return {"description": self.description, "requests": len(self.requests), "shared_prefix": self.shared_prefix,
                "mean_prompt": round(self.mean("prompt"), 2), "mean_output": round(self.mean("output"), 2),
                "max_prompt": max(r.prompt for r in self.requests), "max_output": max(r.output for r in self.requests),
                "longest_request": self.longest}


def sampled(count: int, prompt: Lengths, output: Lengths, shared_prefix: int = 0, seed: int = SEED) -> Workload:
    if count > MAX_REQUESTS:
        raise InputError(f"--requests {count:,}: at most {MAX_REQUESTS:,} requests are replayed")
    if shared_prefix > prompt.low:
        raise InputError(f"--shared-prefix {shared_prefix:,} is longer than the shortest prompt ({prompt.low:,})")
    rng = random.Random(seed)
    reqs = tuple(SimRequest(rng.randint(prompt.low, prompt.high), rng.randint(output.low, output.high), shared_prefix)
                 for _ in range(count))
    desc = f"{count:,} requests, prompt {prompt.label}, output {output.label} tokens"
    if prompt.low != prompt.high or output.low != output.high:
        desc += f" (ranges drawn uniformly, seed {seed})"
    return Workload(reqs, desc, shared_prefix)


def from_file(path: str, shared_prefix: int = 0, limit: int | None = None) -> Workload:
    """Requests from a CSV (a header row) or JSONL file: a prompt-length and an output-length column/key
    (PROMPT_KEYS / OUTPUT_KEYS; OpenAI-style `usage` objects too), one request per row in file order."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--requests-file {path}: no such file")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise InputError(f"--requests-file {path}: larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--requests-file {path}: cannot read it as UTF-8 text ({e.__class__.__name__})") from None
    if limit is not None and limit > MAX_REQUESTS:
        raise InputError(f"--requests {limit:,}: at most {MAX_REQUESTS:,} requests are replayed")
    rows = _jsonl_rows(text, path) if text.lstrip().startswith("{") else _csv_rows(text, path)
    pairs, more = [], False
    for n, row in rows:
        if len(pairs) >= (limit or MAX_REQUESTS):
            more = True
            break
        prompt = _length(row, PROMPT_KEYS, path, n, "prompt")
        output = _length(row, OUTPUT_KEYS, path, n, "output")
        if prompt < 1 or output < 1:
            raise InputError(f"--requests-file {path}: row {n} has a length below 1 (prompt {prompt}, output {output})")
        if shared_prefix > prompt:
            raise InputError(f"--shared-prefix {shared_prefix:,} is longer than the prompt of row {n} ({prompt:,})")
        pairs.append(SimRequest(prompt, output, shared_prefix))
    if not pairs:
        raise InputError(f"--requests-file {path}: no requests in it")
    return Workload(tuple(pairs), f"{len(pairs):,} requests from {p.name}" + (" (its first rows)" if more else ""),
                    shared_prefix)


def _jsonl_rows(text: str, path: str):
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"--requests-file {path}: line {n} is not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise InputError(f"--requests-file {path}: line {n} is not a JSON object")
        if isinstance(obj.get("usage"), dict):
            obj = {**obj["usage"], **{k: v for k, v in obj.items() if k != "usage"}}
        yield n, obj


def _csv_rows(text: str, path: str):
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames:
        raise InputError(f"--requests-file {path}: empty; expected a header row naming a prompt and an output column")
    for n, row in enumerate(reader, 2):
        yield n, {(k or "").strip().lower(): v for k, v in row.items()}


def _length(row: dict, keys: tuple[str, ...], path: str, n: int, what: str) -> int:
    for k in keys:
        if k in row and row[k] not in (None, ""):
            v = row[k]
            try:
                if isinstance(v, bool):
                    raise ValueError
                value = int(v) if isinstance(v, int) else int(str(v).strip())
            except (TypeError, ValueError):
                raise InputError(f"--requests-file {path}: row {n}: {k} {str(v)[:40]!r} is not a whole number") from None
            if value > 1 << 24:
                raise InputError(f"--requests-file {path}: row {n}: {k} {value:,} is beyond 16M tokens")
            return value
    raise InputError(f"--requests-file {path}: row {n} has no {what} length; accepted names: {', '.join(keys)}")
