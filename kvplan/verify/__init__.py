"""`kvplan verify`: check kvplan's predictions against a live torch allocation (CUDA, or CPU without a GPU).

This package is the only place kvplan imports torch, and only inside functions: importing it (or kvplan.cli)
loads no torch. Modules:

* measure.py     -- device backends (CUDA, CPU) behind one interface; the CUDA caching-allocator model
* allocate.py    -- allocate a CachePlan, storage / allocator / RSS measurements
* fitcheck.py    -- --fit: the real largest batch or context under the engine budget (CUDA fraction cap,
                    CPU RLIMIT_AS child)
* model_check.py -- --with-model: transformers' own cache on meta and on a scaled real model
* local_gpu.py   -- `kvplan gpus --local`
* core.py        -- VerifyOptions, VerifyResult, run()
"""

from __future__ import annotations

from typing import Any

__all__ = ["VerifyOptions", "VerifyResult", "run", "local_devices"]


def __getattr__(name: str) -> Any:
    if name in ("VerifyOptions", "VerifyResult", "run"):
        from kvplan.verify import core

        return getattr(core, name)
    if name == "local_devices":
        from kvplan.verify.local_gpu import local_devices

        return local_devices
    raise AttributeError(name)
