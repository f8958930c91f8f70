"""Oracle: how SGLang splits a hybrid's KV budget between its Mamba state pool and its token pool, run from SGLang's
own source (nothing imported from an installed sglang; the files are executed with their runtime context stubbed
to a default NVIDIA launch: one GPU per attention-TP rank, no speculative decoding, radix cache on):

- the state a request holds: configs/qwen3_next.py Qwen3NextConfig, configs/nemotron_h.py NemotronHConfig,
  configs/lfm2.py Lfm2Config, configs/kimi_linear.py KimiLinearConfig .mamba2_cache_params on the configs, configs/mamba_utils.py Mamba2StateShape and mamba_cache_per_req
  (0.5.23 wheel);
- the split: 0.5.10's model_executor/model_runner_kv_cache_mixin.py handle_max_mamba_cache and 0.5.23's
  mem_cache/kv_cache_configurator.py _handle_max_mamba_cache (K = max_mamba_cache_size and the rest left for
  tokens), then max_total_num_tokens = int(rest x 2^30) // cell, the cell written out from the config (K and V of
  the full-attention layers' KV heads on one rank, in bf16);
- the architectures whose mamba_radix_cache_strategy "auto" becomes "extra_buffer" (0.5.23 arg_groups/overrides.py
  _MAMBA_EXTRA_BUFFER_ARCHS, read as a literal).

    pip download sglang==0.5.23 --no-deps -d /tmp/sg && unzip -q /tmp/sg/sglang-0.5.23-*.whl -d /tmp/sg/src
    pip download sglang==0.5.10.post1 --no-deps -d /tmp/sg10 && unzip -q /tmp/sg10/sglang-*.whl -d /tmp/sg10/src
    KVPLAN_SGLANG_SRC=/tmp/sg/src/sglang KVPLAN_SGLANG_0_5_10_SRC=/tmp/sg10/src/sglang python tests/oracle_sglang_mamba.py
"""
from __future__ import annotations

import ast
import enum
import importlib.util
import json
import logging
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace as NS

SRC = os.environ.get("KVPLAN_SGLANG_SRC", "/tmp/sg/src/sglang")
SRC_0_5_10 = os.environ.get("KVPLAN_SGLANG_0_5_10_SRC", "/tmp/sg10/src/sglang")
ROOT = Path(__file__).resolve().parent.parent
NEEDED = ("srt/configs/mamba_utils.py", "srt/configs/qwen3_next.py", "srt/configs/nemotron_h.py",
          "srt/configs/lfm2.py", "srt/configs/kimi_linear.py",
          "srt/mem_cache/kv_cache_configurator.py", "srt/mem_cache/allocation_sizing.py", "srt/arg_groups/overrides.py")
NEEDED_0_5_10 = ("srt/model_executor/model_runner_kv_cache_mixin.py",)


def available() -> bool:
    return (all(Path(SRC, f).exists() for f in NEEDED)
            and all(Path(SRC_0_5_10, f).exists() for f in NEEDED_0_5_10))


class Env:
    def __init__(self, v):
        self.v = v

    def get(self):
        return self.v


def _module(name: str, **attrs) -> types.ModuleType:
    m = sys.modules.get(name) or types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


_TP = {"tp": 1}


def _load_configs():
    """SGLang's config classes and state shapes, executed from the 0.5.23 source with its runtime stubbed."""
    if hasattr(sys.modules.get("sglang.srt.configs.kimi_linear"), "KimiLinearConfig"):
        return [sys.modules[f"sglang.srt.configs.{n}"] for n in ("qwen3_next", "nemotron_h", "lfm2", "kimi_linear")]
    for name in ("sglang", "sglang.srt", "sglang.srt.configs", "sglang.srt.distributed"):
        _module(name)

    def divide(a, b):
        assert a % b == 0, (a, b)
        return a // b

    _module("sglang.srt.distributed.utils", divide=divide)
    _module("sglang.srt.environ", envs=NS(SGLANG_MAMBA_CONV_DTYPE=Env("bfloat16"), SGLANG_MAMBA_SSM_DTYPE=Env(None)))
    _module("sglang.srt.utils", is_cpu=lambda: False)
    _module("sglang.srt.configs.update_config", adjust_tp_num_heads_if_necessary=lambda *a, **k: None)
    _module("sglang.srt.runtime_context", get_parallel=lambda: NS(attn_tp_size=_TP["tp"]),
            linear_attn_tp_size=lambda: _TP["tp"])
    out = []
    for short in ("mamba_utils", "qwen3_next", "nemotron_h", "lfm2", "kimi_linear"):
        name = f"sglang.srt.configs.{short}"
        spec = importlib.util.spec_from_file_location(name, f"{SRC}/srt/configs/{short}.py")
        m = importlib.util.module_from_spec(spec)
        sys.modules[name] = m
        spec.loader.exec_module(m)
        out.append(m)
    return out[1:]


def cache_params(config: dict, tp: int):
    """SGLang's config object and its mamba2_cache_params for a config.json at attention TP `tp`."""
    qwen3_next, nemotron_h, lfm2, kimi_linear = _load_configs()
    _TP["tp"] = tp
    text = config.get("text_config") or config
    classes = {"qwen3_next": qwen3_next.Qwen3NextConfig, "qwen3_5": qwen3_next.Qwen3NextConfig,
               "qwen3_5_moe": qwen3_next.Qwen3NextConfig, "nemotron_h": nemotron_h.NemotronHConfig,
               "lfm2": lfm2.Lfm2Config, "kimi_linear": kimi_linear.KimiLinearConfig}
    cls = classes[config["model_type"]]
    keep = {k: v for k, v in text.items() if k not in ("architectures", "model_type", "auto_map")}
    c = cls(**keep)
    return c, c.mamba2_cache_params


def _pick(path: str, cls: str | None, names: set[str]):
    """Named top-level definitions, or methods of class `cls`, from a source file (ast), compiled."""
    tree = ast.parse(Path(path).read_text())
    body = tree.body
    if cls:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    keep = [n for n in body if getattr(n, "name", None) in names or
            (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in names for t in n.targets))]
    return compile(ast.Module(body=keep, type_ignores=[]), path, "exec")


def split_0_5_23(per_req: int, rest_gib: float, arch: str, ratio_r: float = 0.9, pp: int = 1,
                 radix_off: bool = False, max_running_requests: int | None = None):
    """0.5.23 KVCacheConfigurator._handle_max_mamba_cache and _calculate_mamba_ratio: (K, rest left in GiB, slots
    a running request takes)."""
    path = f"{SRC}/srt/mem_cache/kv_cache_configurator.py"
    extra = literal_frozenset(f"{SRC}/srt/arg_groups/overrides.py", "_MAMBA_EXTRA_BUFFER_ARCHS")
    schedule = NS(max_mamba_cache_size=None, mamba_full_memory_ratio=ratio_r, max_running_requests=max_running_requests,
                  disable_overlap_schedule=False)
    g = dict(get_schedule=lambda: schedule, get_memory=lambda: NS(disable_radix_cache=radix_off),
             get_exec=lambda: NS(mamba=NS(enable_linear_replayssm_spec=False,
                                          enable_mamba_extra_buffer=arch in extra and not radix_off,
                                          enable_mamba_extra_buffer_lazy=False)),
             get_spec=lambda: NS(speculative_num_draft_tokens=None),
             get_context=lambda: NS(override=lambda _why, **kw: schedule.__dict__.update(kw)),
             envs=NS(SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=Env(False)), get_pp_indices=None,
             _pd_prefill_skips_mamba_spec_state=lambda: False, logger=logging.getLogger("oracle"))
    exec(_pick(path, None, {"MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO", "MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP",
                            "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER"}), g)
    exec(_pick(f"{SRC}/srt/mem_cache/allocation_sizing.py", None, {"get_mamba_tracking_slots"}), g)
    exec(_pick(path, "KVCacheConfigurator", {"_handle_max_mamba_cache", "_calculate_mamba_ratio"}), g)
    params = NS(mamba_cache_per_req=per_req, layers=[0], replayssm_ring_bytes_per_req=lambda **k: 0)
    me = NS(mambaish_config=NS(mamba2_cache_params=params), pp_size=pp, fused_entry_bytes=lambda _: None,
            spec_algorithm=NS(is_none=lambda: True), hybrid_gdn_config=None, hybrid_kda_config=None,
            extra_mamba_cache_bytes_per_req=0, attn_dp_size=1, model_config=NS(num_hidden_layers=1))
    rest = g["_handle_max_mamba_cache"](me, rest_gib)
    return schedule.max_mamba_cache_size, rest, g["_calculate_mamba_ratio"](me)


def split_0_5_10(per_req: int, rest_gib: float, ratio_r: float = 0.9):
    """0.5.10 ModelRunnerKVCacheMixin.handle_max_mamba_cache: (K, rest left in GiB)."""
    path = f"{SRC_0_5_10}/srt/model_executor/model_runner_kv_cache_mixin.py"
    g: dict = {}
    exec(_pick(path, "ModelRunnerKVCacheMixin", {"handle_max_mamba_cache"}), g)
    args = NS(max_mamba_cache_size=None, disable_radix_cache=False, max_running_requests=None,
              mamba_full_memory_ratio=ratio_r, enable_dp_attention=False, dp_size=1)
    me = NS(mambaish_config=NS(mamba2_cache_params=NS(mamba_cache_per_req=per_req)), server_args=args,
            spec_algorithm=NS(is_none=lambda: True))
    rest = g["handle_max_mamba_cache"](me, rest_gib)
    return args.max_mamba_cache_size, rest


def literal_frozenset(path: str, name: str) -> frozenset:
    tree = ast.parse(Path(path).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == name
                                                                            for t in n.targets))
    return frozenset(ast.literal_eval(node.value.args[0]))


def load_config(dirname: str) -> dict:
    return json.loads((ROOT / "model_configs" / dirname / "config.json").read_text())


if __name__ == "__main__":
    for name in ("Qwen--Qwen3-Next-80B-A3B-Thinking", "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
                 "Qwen--Qwen3.5-27B"):
        cfg, params = cache_params(load_config(name), 1)
        per = params.mamba_cache_per_req
        arch = load_config(name)["architectures"][0]
        print(name, arch, per, split_0_5_23(per, 40.0, arch), split_0_5_10(per, 40.0))
