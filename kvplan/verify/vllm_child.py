"""The vLLM side of `kvplan verify --run vllm` and of the vLLM engine-oracle tier: a script that runs in an
interpreter with vLLM installed (`KVPLAN_VLLM_PYTHON`, else the current one) and imports nothing from kvplan.

``python vllm_child.py SPEC.json OUT.jsonl``: SPEC holds a list of {id, env, kwargs}; for each, ``LLM(**kwargs)`` is
started with ``env`` set and one JSON line per start is appended to OUT: what vLLM decided, read from its own
objects (the KV budget it was handed, block count, KV cache groups with their specs, block sizes, pages and blocks
per request, the resolved scheduler and cache settings) and the printed ``KV cache size`` line, or vLLM's own error.
The child only observes vLLM (wrapped functions record and pass through), with three time savers that decide
nothing about the cache: architecture inspection runs in-process, the start ends once the engine core (KV config,
allocation, scheduler) exists, and the `*_once` log caches are cleared per start.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

CHILD_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # EngineCore in this process: its objects are readable
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
PRINTED = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    # pydantic wraps a validator's error after a header line; keep the part that says why
    m = re.search(r"Value error, (.*?)(?: \[type=| For further information|$)", text)
    if m:
        text = m.group(1)
    return f"{type(e).__name__}: {text}"[:400]


class _Decided(Exception):
    """Raised once the engine core exists: everything the KV cache depends on has been decided and checked."""


def _child(spec_path: str, out_path: str) -> int:
    t0 = time.monotonic()
    todo = json.loads(Path(spec_path).read_text())
    out = open(out_path, "a")

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        import logging
        import traceback

        import vllm
        from vllm import LLM
        from vllm.logger import _print_info_once, _print_warning_once
        from vllm.model_executor.models import registry as model_registry
        from vllm.platforms import current_platform
        from vllm.utils.math_utils import cdiv
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.engine import core as engine_core_mod
        from vllm.v1.engine import core_client as core_client_mod
        from vllm.v1.worker import gpu_model_runner as runner_mod
    except Exception as e:  # noqa: BLE001 - the test reports it as a failure, with this text
        emit({"id": "__import__", "error": _one_line(e)})
        return 3
    import torch

    host = {"amx": bool(torch.cpu._is_amx_tile_supported()), "avx512": bool(torch.cpu._is_avx512_supported()),
            "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported())}
    emit({"id": "__import__", "seconds": round(time.monotonic() - t0, 2), "version": vllm.__version__, "host": host})

    # Observe (never change) what the engine decides: the block size before the platform's hybrid alignment, the
    # per-worker KV cache configs with the memory they were computed from, and the bytes it allocated.
    seen: dict[str, Any] = {}
    cls = type(current_platform)
    orig_update = cls.update_block_size_for_backend
    orig_configs = engine_core_mod.get_kv_cache_configs
    orig_init_kv = engine_core_mod.EngineCore._initialize_kv_caches
    orig_allocate = runner_mod.allocate_kv_cache
    orig_client_init = core_client_mod.InprocClient.__init__

    def update_block_size_for_backend(vllm_config):
        seen["platform_block_size"] = vllm_config.cache_config.block_size
        return orig_update(vllm_config)

    def get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory):
        seen["vllm_config"] = vllm_config
        seen["available_memory"] = list(available_memory)
        configs = orig_configs(vllm_config, kv_cache_specs, available_memory)
        seen["worker_configs"] = configs
        return configs

    def initialize_kv_caches(self, vllm_config):
        seen["core"] = self
        return orig_init_kv(self, vllm_config)

    def allocate_kv_cache(*args, **kwargs):
        caches = orig_allocate(*args, **kwargs)
        storages = {}
        for t in caches.values():
            st = t.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
        seen["allocated_bytes"] = sum(storages.values())
        return caches

    def client_init(self, *args, **kwargs):
        orig_client_init(self, *args, **kwargs)
        seen["client"] = self
        # The engine core is built: KV config, allocation, scheduler and its KV cache manager all exist. What
        # LLM() does after this (renderer and tokenizer set-up, chat-template warm-up) decides nothing about the
        # cache and costs seconds per case, so the start ends here.
        raise _Decided()

    cls.update_block_size_for_backend = staticmethod(update_block_size_for_backend)
    engine_core_mod.get_kv_cache_configs = get_kv_cache_configs
    engine_core_mod.EngineCore._initialize_kv_caches = initialize_kv_caches
    runner_mod.allocate_kv_cache = allocate_kv_cache
    core_client_mod.InprocClient.__init__ = client_init
    # vLLM inspects each new architecture in a fresh `python -m vllm.model_executor.models.registry` (to keep CUDA
    # out of the parent): about 9 s per architecture here, most of the tier's time. There is no CUDA on the CPU
    # build, so the same inspection runs in this process; what it returns (_ModelInfo) is unchanged.
    model_registry._run_in_subprocess = lambda fn: fn()

    # vLLM re-applies its logging dictConfig when an engine starts, which drops handlers added to its loggers;
    # a record factory sees every record whatever the handlers are.
    captured: list[Any] = []
    capture_on = [False]
    base_factory = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        rec = base_factory(*args, **kwargs)
        if capture_on[0] and rec.name.startswith("vllm") and rec.levelno >= logging.INFO:
            captured.append(rec)
        return rec

    logging.setLogRecordFactory(factory)

    for item in todo:
        seen.clear()
        for k, v in item["env"].items():
            os.environ[k] = v
        if not item["env"]:
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        _print_info_once.cache_clear()
        _print_warning_once.cache_clear()
        captured.clear()
        capture_on[0] = True
        t = time.monotonic()
        res: dict[str, Any] = {"id": item["id"], "version": vllm.__version__,
                               "version_number": re.match(r"\d+(\.\d+)*", vllm.__version__).group(0)}
        llm = None
        try:
            llm = LLM(**item["kwargs"])
        except _Decided:
            pass
        except Exception as e:  # noqa: BLE001 - vLLM's own refusal is the result
            res["error"] = _one_line(e)
            tb = traceback.extract_tb(e.__traceback__)
            res["error_at"] = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb[-4:]]
            if "logs" in str(e):  # "... failed to be inspected. Please check the logs": the logged cause
                causes = [ln for r in captured if r.levelno >= logging.ERROR for ln in _message_and_exc(r)
                          if re.match(r"\w+(Error|Exception): ", ln)]
                if causes:
                    res["error"] = f"{res['error']} ({causes[-1][:200]})"
        if "error" not in res:
            try:
                res.update(_read_engine(seen, cdiv, kv_cache_utils))
            except Exception as e:  # noqa: BLE001
                res["error"] = f"oracle harness could not read the engine: {_one_line(e)}"
        res["start_seconds"] = round(time.monotonic() - t, 2)
        capture_on[0] = False
        lines = [f"{r.levelname} {_message(r)}" for r in captured]
        printed = [m for m in (PRINTED.search(ln) for ln in lines) if m]
        if printed:
            tok, mml, conc = printed[-1].groups()
            res["printed"] = {"tokens": int(tok.replace(",", "")), "max_model_len": int(mml.replace(",", "")),
                              "concurrency": conc}
        res["log"] = [ln for ln in lines if _relevant(ln)][:40]
        _teardown(llm, seen)  # ends in vLLM's cleanup_dist_env_and_memory (a full gc.collect)
        del llm
        seen.clear()
        res["seconds"] = round(time.monotonic() - t, 2)
        emit(res)
    out.close()
    return 0


def _teardown(llm: Any, seen: dict[str, Any]) -> None:
    """Free the engine (its model, KV cache and process group) before the next case."""
    import gc

    core = seen.get("client").engine_core if seen.get("client") is not None else seen.get("core")
    try:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            return
        if core is not None:
            core.shutdown()
            return
    except Exception:  # noqa: BLE001 - a half-built core (the engine refused): free what exists below
        try:
            if core is not None and getattr(core, "model_executor", None) is not None:
                core.model_executor.shutdown()
        except Exception:  # noqa: BLE001
            pass
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        gc.unfreeze()
        cleanup_dist_env_and_memory()
    except Exception:  # noqa: BLE001
        gc.collect()


def _message(rec: Any) -> str:
    try:
        return rec.getMessage()
    except Exception:  # noqa: BLE001
        return str(rec.msg)


def _message_and_exc(rec: Any) -> list[str]:
    lines = _message(rec).splitlines()
    if rec.exc_info and rec.exc_info[1] is not None:
        e = rec.exc_info[1]
        while e is not None:
            lines += str(e).splitlines() + [f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
            e = e.__cause__ or e.__context__
    return [ln.strip() for ln in lines]


_RELEVANT = ("KV cache", "block size", "block_size", "padding", "Padding", "Hybrid KV", "hybrid", "mamba", "Mamba",
             "sliding", "chunk", "MLA", "fp8", "dtype", "max_num_batched_tokens", "Explicitly set", "concurrency")


def _relevant(line: str) -> bool:
    return any(k in line for k in _RELEVANT) and "Traceback" not in line


def _rope_tables(seen: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The rotary cos/sin tables the model holds as buffers (one per distinct rotary embedding: vLLM's get_rope
    shares an instance between layers), each as rows, columns and dtype; None where the model is not reachable."""
    core = seen.get("core")
    try:
        model = core.model_executor.driver_worker.worker.model_runner.model
    except AttributeError:
        return None
    tables, storages = [], set()
    for name, buf in model.named_buffers():
        if not name.endswith("cos_sin_cache"):
            continue
        ptr = buf.untyped_storage().data_ptr()
        if ptr in storages:
            continue
        storages.add(ptr)
        tables.append({"name": name, "shape": list(buf.shape), "dtype": str(buf.dtype).replace("torch.", ""),
                       "bytes": buf.numel() * buf.element_size()})
    return tables


def _read_engine(seen: dict[str, Any], cdiv: Any, kv_cache_utils: Any) -> dict[str, Any]:
    """What vLLM decided, from its own objects."""
    vc = seen["vllm_config"]
    cc, sc, mc = vc.cache_config, vc.scheduler_config, vc.model_config
    workers = seen.get("worker_configs") or []
    wc = workers[0] if workers else None
    groups = []
    if wc is not None:
        for g in wc.kv_cache_groups:
            spec = g.kv_cache_spec
            inner = list(spec.kv_cache_specs.values()) if hasattr(spec, "kv_cache_specs") else [spec]
            first = inner[0]
            mem = spec.max_memory_usage_bytes(vc)
            groups.append({
                "layers": len(g.layer_names),
                "spec": type(spec).__name__,
                "layer_spec": type(first).__name__,
                "block_size": spec.block_size,
                "page_size_bytes": spec.page_size_bytes,
                "layer_page_sizes": sorted({s.page_size_bytes for s in inner}),
                "sliding_window": getattr(first, "sliding_window", None),
                "attention_chunk_size": getattr(first, "attention_chunk_size", None),
                "dtype": str(getattr(first, "dtype", getattr(first, "dtypes", ""))).replace("torch.", ""),
                "max_memory_usage_bytes": mem,
                "blocks_per_request": cdiv(mem, spec.page_size_bytes),
            })
    bytes_per_block = None
    if wc is not None and wc.kv_cache_groups:
        bytes_per_block = kv_cache_utils._pool_bytes_per_block(vc, wc.kv_cache_groups)
    avail = seen.get("available_memory") or [None]
    return {
        "rope_tables": _rope_tables(seen),
        "budget_bytes": avail[0],
        "num_blocks": cc.num_gpu_blocks,
        "worker_num_blocks": wc.num_blocks if wc is not None else None,
        "tokens": cc.kv_cache_size_tokens,
        "concurrency_value": cc.kv_cache_max_concurrency,
        "block_size": cc.block_size,
        "platform_block_size": seen.get("platform_block_size", cc.block_size),
        "bytes_per_block": bytes_per_block,
        "allocated_bytes": seen.get("allocated_bytes"),
        "groups": groups,
        "kv_cache_layout": str(getattr(wc, "kv_cache_layout", None)),
        "max_model_len": mc.max_model_len,
        "model_dtype": str(mc.dtype).replace("torch.", ""),
        "cache_dtype": cc.cache_dtype,
        "mamba_ssm_cache_dtype": getattr(cc, "mamba_ssm_cache_dtype", None),
        "mamba_page_size_padded": getattr(cc, "mamba_page_size_padded", None),
        "is_hybrid": bool(getattr(mc, "is_hybrid", False)),
        "use_mla": bool(getattr(mc, "use_mla", False)),
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_num_seqs": sc.max_num_seqs,
        "async_scheduling": bool(sc.async_scheduling),
        "max_in_flight_tokens": getattr(vc, "max_in_flight_tokens", None),
        "disable_hybrid_kv_cache_manager": bool(sc.disable_hybrid_kv_cache_manager),
        "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
        "enable_prefix_caching": bool(cc.enable_prefix_caching),
        "mamba_cache_mode": getattr(cc, "mamba_cache_mode", None),
    }




if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
