"""Engine oracle (runs in vLLM's interpreter): the bytes vLLM's ModelOpt MIXED_PRECISION linear method creates for
one module, after its own post-load step that drops what it does not keep.

``python tests/oracle_vllm_modelopt.py CASES.json`` reads [{"prefix", "algo", "group", "out", "in"}, ...] and prints
one JSON list: for each module, every parameter vLLM registered to load it (name, shape, dtype, bytes), and their
sum after ``FormatScheme.post_process`` (W4A16 NVFP4 drops the input_scale slot older checkpoints carried). The
module is built by vLLM itself: ``ModelOptMixedPrecisionConfig.from_config`` and a ``ReplicatedLinear`` with that
prefix (tensor parallelism 1). Two calls are stubbed because vLLM's CPU build has no NVFP4 / FP8 GEMM kernels, and
neither decides a tensor: ``select_linear_kernel`` (runs after the parameters are registered) and
``expose_input_quant_key``. Nothing from kvplan is imported here.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def main(path: str) -> int:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    cases = json.loads(open(path).read())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
        import vllm.model_executor.layers.quantization.modelopt as modelopt
        from vllm.model_executor.layers.linear import ReplicatedLinear

        modelopt.select_linear_kernel = lambda *a, **k: None
        modelopt.expose_input_quant_key = lambda *a, **k: None
        layers = {c["prefix"]: {"quant_algo": c["algo"], **({"group_size": c["group"]} if c.get("group") else {})}
                  for c in cases}
        config = modelopt.ModelOptMixedPrecisionConfig.from_config(
            {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers,
             "kv_cache_quant_algo": None, "exclude_modules": []})
        out = []
        for c in cases:
            layer = ReplicatedLinear(c["in"], c["out"], bias=False, quant_config=config, prefix=c["prefix"],
                                     params_dtype=torch.bfloat16)
            created = [(n, list(p.shape), str(p.dtype), p.numel() * p.element_size())
                       for n, p in layer.named_parameters()]
            fmt = getattr(layer.quant_method, "fmt", None)
            if fmt is not None:
                fmt.post_process(layer)
            kept = sum(p.numel() * p.element_size() for p in layer.parameters())
            out.append({"prefix": c["prefix"], "created": created, "bytes": kept})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.exit(main(sys.argv[1]))
