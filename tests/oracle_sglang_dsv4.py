"""Oracle: SGLang 0.5.23's own DSV4PoolConfigurator (model_executor/pool_configurator.py) and the
deepseek_v4_memory_pool.py helpers it calls, executed from the 0.5.23 wheel's source with the runtime context
(get_schedule / get_exec / envs ...) stubbed to what a DeepseekV4ForCausalLM launch on NVIDIA resolves: flashmla,
SGLANG_DSV4_KV_LAYOUT v4, fp32 compress state, no speculative decoding, no HiSparse, radix cache on, page 256,
swa_full_tokens_ratio 0.1 recorded as explicitly set (model_overrides/deepseek_v4.py, kv_cache_hook.py). Only the
named classes and functions are taken from the files (ast), nothing is imported from sglang.

    pip download sglang==0.5.23 --no-deps -d /tmp/sg && unzip -q /tmp/sg/sglang-0.5.23-*.whl -d /tmp/sg/src
    KVPLAN_SGLANG_SRC=/tmp/sg/src/sglang python tests/oracle_sglang_dsv4.py --record

--record rewrites tests/data/sglang-dsv4-oracle.yaml, which tests/test_dsv4_sglang023.py reads.
"""
import ast, json, os, sys, types, importlib.util
from pathlib import Path
from types import SimpleNamespace as NS

SRC = os.environ.get("KVPLAN_SGLANG_SRC", "/tmp/sg/src/sglang")
ROOT = Path(__file__).resolve().parent.parent

def load_kvlayout():
    spec = importlib.util.spec_from_file_location("kv_layout", f"{SRC}/kernels/ops/attention/dsv4/kv_layout.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

def pick(path, names):
    tree = ast.parse(open(path).read())
    keep = [n for n in tree.body if getattr(n, "name", None) in names or
            (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in names for t in n.targets))]
    return compile(ast.Module(body=keep, type_ignores=[]), path, "exec")

class Env:
    def __init__(self, v): self.v = v
    def get(self): return self.v
    def is_set(self): return False

def run(cfg, available, mrr=256, stage=None, max_total=None, swa_ratio=0.1, dp=1):
    import torch

    kvl = load_kvlayout()
    envs = NS(SGLANG_DSV4_COMPRESS_STATE_DTYPE=Env("float32"), SGLANG_OPT_USE_ONLINE_COMPRESS=Env(False),
              SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=Env(False), SGLANG_DSV4_KV_LAYOUT=Env("v4"),
              SGLANG_DSV4_COMPRESSED_KV_LAYOUT=Env("auto"), SGLANG_SWA_EVICTION_INTERVAL=Env(128))
    exec_ = NS(kernel=NS(dsv4_attn_backend="flashmla", enable_deepseek_v4_fp4_indexer=False),
               features=NS(enable_encoder_swa_bounded_replay=False))
    schedule = NS(_swa_full_tokens_ratio_explicitly_set=True, swa_full_tokens_ratio=swa_ratio,
                  max_running_requests=mrr, swa_prefix_tails=None, chunked_prefill_size=8192,
                  disable_overlap_schedule=False, page_size=256)
    g = dict(torch=torch, envs=envs, get_exec=lambda: exec_, get_schedule=lambda: schedule,
             get_memory=lambda: NS(enable_hisparse=False, disable_radix_cache=False),
             get_spec=lambda: NS(speculative_algorithm=None, speculative_num_draft_tokens=None),
             get_disagg=lambda: NS(disaggregation_mode="null", disaggregation_decode_extra_slots=0),
             max_speculative_num_draft_tokens=lambda: None, _is_hip=False, _is_npu=False, ONLINE_C128=False,
             ceil_div=lambda a, b: -(-a // b), ceil_align=lambda x, a: -(-x // a) * a, KVLayout=kvl.KVLayout,
             logger=NS(info=lambda *a, **k: None, warning=lambda *a, **k: None),
             dataclass=__import__("dataclasses").dataclass, Optional=__import__("typing").Optional,
             List=list, Tuple=tuple, Sequence=list, TYPE_CHECKING=False, is_gfx95_supported=lambda: False,
             resolve_hip_flashmla_backend=lambda: None, KVCacheConfigurator=object)
    g["__builtins__"] = __builtins__
    exec(pick(f"{SRC}/srt/mem_cache/deepseek_v4_memory_pool.py", {
        "get_dsv4_indexer_bytes_per_token", "get_compress_state_ring_size", "resolve_compress_state_ring_size",
        "collect_sources_by_ratio", "get_compress_state_write_pad", "uses_draft_swa_ring", "get_draft_swa_ring_size",
        "get_swa_ring_size", "_num_dsv4_physical_kv_pages", "resolve_compressed_kv_layout", "select_dsv4_kv_layout",
        "dsv4_unified_row_bytes"}), g)
    g["DSV41_INDEX_PAGE_SIZE"] = 64
    mp = types.ModuleType("sglang.srt.mem_cache.deepseek_v4_memory_pool"); mp.__dict__.update(g)
    gate = types.ModuleType("sglang.srt.layers.attention.dsv4.unified_kv_gate")
    gate.is_unified_kv_fp8 = lambda: False; gate.is_unified_kv_triton = lambda: False
    for name in ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.layers", "sglang.srt.layers.attention",
                 "sglang.srt.layers.attention.dsv4"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[mp.__name__] = mp; sys.modules[gate.__name__] = gate
    exec(pick(f"{SRC}/srt/model_executor/pool_configurator.py", {
        "MemoryPoolConfig", "MemoryPoolConfigurator", "_get_dsv4_compress_state_dtype_sizes",
        "check_dsv4_unified_fp8_pd_supported", "compute_swa_request_cap", "DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO",
        "_operator_swa_full_tokens_ratio", "_DSV4PoolSizes", "DSV4PoolConfigurator"}), g)
    n = cfg["num_hidden_layers"]
    start, end = stage or (0, n)
    model_config = NS(qk_nope_head_dim=cfg["head_dim"] - cfg["qk_rope_head_dim"], qk_rope_head_dim=cfg["qk_rope_head_dim"],
                      index_head_dim=cfg["index_head_dim"], context_len=cfg["max_position_embeddings"],
                      compress_ratios=cfg["compress_ratios"], window_size=cfg["sliding_window"],
                      hf_config=NS(kv_source_layer_ids=[]))
    kvc = NS(kv_cache_dtype_str="fp8_e4m3", model_config=model_config, spec_algorithm=NS(is_dspark=lambda: False),
             layer_info=NS(start_layer=start, end_layer=end), pp_size=1, collect=None,
             sliding_window_size=cfg["sliding_window"], page_size=256, attn_dp_size=dp, spec_aux_config=None)
    c = g["DSV4PoolConfigurator"](kvc)
    config = c.calculate_pool_sizes(available, 256)
    if max_total is not None and max_total < config.max_total_num_tokens:
        config = c.calculate_pool_sizes_from_max_tokens(max_total, 256)
    tokens = config.max_total_num_tokens
    est = max(min(int(tokens / model_config.context_len * 512), 4096), 2048)
    config.max_running_requests = min(max(1, mrr // dp), tokens // 2) if mrr is not None else min(est, tokens // 2)
    config = c.finalize_with_max_running_requests(config)
    return dict(bytes_per_full_token=c.bytes_per_full_token, bytes_per_swa_token=c.bytes_per_swa_token,
                c128_fixed=c._get_c128_state_fixed_bytes(c._resolve_max_running_requests_per_worker(available)),
                full=config.full_max_total_num_tokens, swa=config.swa_max_total_num_tokens,
                c4=config.c4_max_total_num_tokens, c128=config.c128_max_total_num_tokens,
                c4_state=config.c4_state_pool_size, c128_state=config.c128_state_pool_size,
                max_running_requests=config.max_running_requests)

CASES = [  # (config dir, KV budget per GPU in bytes, --max-running-requests, stage layers or None, --max-total-tokens)
    ("deepseek-ai--DeepSeek-V4-Flash", 112_424_859_834, 256, None, None),
    ("deepseek-ai--DeepSeek-V4-Flash", 5_000_000_000, 256, None, None),
    ("deepseek-ai--DeepSeek-V4-Flash", 5_000_000_000, 64, None, None),
    ("deepseek-ai--DeepSeek-V4-Flash", 40_000_000_000, 256, (0, 22), None),
    ("deepseek-ai--DeepSeek-V4-Flash", 40_000_000_000, 256, (22, 43), None),
    ("deepseek-ai--DeepSeek-V4-Flash", 40_000_000_000, 256, None, 1_000_000),
    ("deepseek-ai--DeepSeek-V4-Pro", 23_621_572_938, 256, None, None),
    ("deepseek-ai--DeepSeek-V4-Pro", 60_000_000_000, 32, None, None),
]


def record() -> list[dict]:
    out = []
    for name, budget, mrr, stage, cap in CASES:
        cfg = json.loads((ROOT / "model_configs" / name / "config.json").read_text())
        got = run(cfg, budget, mrr, stage, cap)
        got["max_running_requests_resolved"] = got.pop("max_running_requests")
        out.append({"config": name, "kv_budget": budget, "max_running_requests": mrr,
                    "stage": list(stage) if stage else None, "max_total_tokens": cap, **got})
    return out


if __name__ == "__main__":
    import yaml

    rows = record()
    if "--record" in sys.argv:
        path = ROOT / "tests" / "data" / "sglang-dsv4-oracle.yaml"
        path.write_text("# SGLang 0.5.23 DSV4PoolConfigurator, run by tests/oracle_sglang_dsv4.py --record\n"
                        + yaml.safe_dump(rows, sort_keys=False))
    else:
        print(yaml.safe_dump(rows, sort_keys=False))
