"""vLLM 0.32's own spec classes for MiniMax-M3's layers (no model, no forward): page sizes and grouping."""
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, UniformTypeKVCacheSpecs, SparseCacheRole
from vllm.v1.core.kv_cache_utils import is_kv_cache_spec_uniform
import json, sys
cfg = json.load(open(sys.argv[1]))
tp = int(sys.argv[2]); dt = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[sys.argv[3]]
sa = cfg["sparse_attention_config"]
kv = max(1, cfg["num_key_value_heads"] // tp)
specs = {}
for i in range(cfg["num_hidden_layers"]):
    specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(block_size=128, num_kv_heads=kv, head_size=cfg["head_dim"],
                                                                head_size_v=cfg["head_dim"], dtype=dt)
    if sa["sparse_attention_freq"][i]:
        specs[f"model.layers.{i}.self_attn.attn.index_cache"] = MLAAttentionSpec(
            block_size=128, num_kv_heads=1, head_size=sa["sparse_index_dim"], dtype=torch.bfloat16,
            cache_role=SparseCacheRole.INDEXER)
u = UniformTypeKVCacheSpecs.from_specs(specs)
print(json.dumps({"uniform_spec": is_kv_cache_spec_uniform(specs), "uniform_type": u is not None,
                  "pages": sorted({s.page_size_bytes for s in specs.values()}),
                  "group_page_bytes": u.page_size_bytes if u else None}))
