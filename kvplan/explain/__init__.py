"""`kvplan explain LOG`: an engine's start-up log, read line by line, and every KV-related number it printed
reproduced by kvplan (or named with the reason it cannot be).

Each engine has one module that reads its log wording and turns kvplan's runs into findings; common.py holds the
shapes, reproduce.py the model / GPU / options a log implies.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any

from kvplan.errors import InputError
from kvplan.explain.common import DIFFERS, ESTIMATED, NOT_REPRODUCED, REPRODUCED, Finding, LogFacts
from kvplan.explain.reproduce import Context, Overrides, context

# engine -> module; the first whose looks_like() accepts the text reads it (the most specific first: SGLang's own
# lines before TensorRT-LLM's name, which SGLang prints when it picks a TensorRT-LLM attention kernel)
READERS = ("sglang_log", "trtllm_log", "llamacpp_log", "vllm_log")
ENGINE_OF = {"trtllm_log": "trtllm", "sglang_log": "sglang", "llamacpp_log": "llamacpp", "vllm_log": "vllm"}
MAX_LOG_BYTES = 64 << 20


@dataclass
class Explanation:
    context: Context
    findings: list[Finding]
    unread: list[tuple[int, str]] = field(default_factory=list)
    saved: dict[str, Any] | None = None  # the calibration written (--save-calibration)

    @property
    def facts(self) -> LogFacts:
        return self.context.facts

    def count(self, verdict: str) -> int:
        return sum(1 for f in self.findings if f.verdict == verdict)

    @property
    def exit_code(self) -> int:
        """1 when an exact figure kvplan computed differs from the log (estimates never fail)."""
        return 1 if self.count(DIFFERS) else 0

    def to_json(self) -> dict[str, Any]:
        c, f = self.context, self.facts
        return {
            "engine": c.engine,
            "engine_version": f.version,
            "model": c.model,
            "model_source": c.model_why,
            "gpu": c.gpu.gpu.name if c.gpu_known else None,
            "gpu_source": c.gpu_why,
            "tp": f.tp,
            "pp": f.pp,
            "settings": {k: {"value": _plain(getattr(f, k, f.knobs.get(k))), "from": where}
                         for k, where in f.stated.items()},
            "command": c.command(),
            "findings": [x.to_json() for x in self.findings],
            "unread_lines": [{"line": i, "text": t} for i, t in self.unread],
            "counts": {v: self.count(v) for v in (REPRODUCED, DIFFERS, ESTIMATED, NOT_REPRODUCED)},
            "notes": list(f.notes) + list(c.notes),
            **({"calibration_saved": self.saved} if self.saved else {}),
        }


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


# terminal colour codes: a log copied from a terminal or `docker logs` keeps them ("\x1b[0;36m(EngineCore pid=1)")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def read(text: str, engine: str | None = None) -> LogFacts:
    """The log's settings and printed numbers; `engine` (a name, e.g. from --engine) skips detection. Terminal colour
    codes are dropped first (line numbers stay those of the text)."""
    text = ANSI_ESCAPE.sub("", text)
    if engine:
        name = engine.split("@")[0].lower().replace(".", "").replace("-", "").replace("_", "")
        name = {"llamacpp": "llamacpp", "tensorrtllm": "trtllm", "trtllm": "trtllm"}.get(name, name)
        module = next((m for m, e in ENGINE_OF.items() if e == name), None)
        if module is None:
            raise InputError(f"explain reads vLLM, SGLang, llama.cpp and TensorRT-LLM logs; --engine {engine} is none of them")
        return _module(module).read(text)
    for module in READERS:
        mod = _module(module)
        if mod.looks_like(text):
            return mod.read(text)
    raise InputError("this does not look like a vLLM, SGLang, llama.cpp or TensorRT-LLM start-up log (no line kvplan "
                     "knows, such as 'Available KV cache memory' or 'llama_kv_cache'); give --engine to read it as one")


def explain(text: str, overrides: Overrides = Overrides()) -> Explanation:
    facts = read(text, overrides.engine)
    c = context(facts, overrides)
    findings = _module(_reader_of(facts.engine)).reproduce(c)
    findings.sort(key=lambda x: x.printed.line if x.printed else 0)
    return Explanation(c, findings, list(facts.unread))


def save_calibration(x: Explanation, text: str, log_name: str, path: str | None = None) -> None:
    """Save what the log measured besides the cache (calibration.py) for later fit / check / plan runs."""
    from kvplan import calibration

    module = _module(_reader_of(x.facts.engine))
    if not hasattr(module, "calibration"):
        raise InputError(f"calibrations are saved from vLLM and SGLang logs only for now; this is a {x.facts.engine} log")
    cal = module.calibration(x.context, log_name, calibration.sha256_text(text))
    where, replaced = calibration.save(cal, path)
    x.saved = {"path": str(where), "replaced": replaced, "entry": cal.to_dict()}


def _reader_of(engine: str) -> str:
    return next(m for m, e in ENGINE_OF.items() if e == engine)


def _module(name: str):
    return importlib.import_module(f"kvplan.explain.{name}")


__all__ = ["Explanation", "Overrides", "explain", "read", "save_calibration", "MAX_LOG_BYTES"]
