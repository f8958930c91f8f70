#!/usr/bin/env bash
# On a lent CUDA machine (the device tool: one H200, torch 2.11+cu130 with transformers): the CUDA tier of the
# tests (verify on a real caching allocator) and the start-up memory no engine log itemises, measured on that GPU.
# Under 8 minutes, no network. Results go to $OUT (or ./gpu_check_out): gpu_check.json (join it to the evidence,
# labelled with GPU, driver and torch) and the pytest log.
#
#   run(command="bash dev/gpu_check.sh", carry=[".whl"], timeout_s=540)
#
# kvplan's own dependencies travel as wheels in .whl (the device README, "a Python package missing there"):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl typer rich pyyaml huggingface-hub pytest  (plus what they need)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"

echo "== the CUDA tier of the tests (verify on the real allocator)"
timeout 300 python3 -m pytest -q -m cuda tests/test_verify_cuda.py tests/test_verify.py tests/test_verify_run.py \
  -p no:cacheprovider 2>&1 | tee "$OUT/pytest-cuda.log"

echo "== measurements"
timeout 180 python3 - "$OUT/gpu_check.json" <<'PY'
"""What no engine log itemises, on this GPU: torch's CUDA context, cuBLAS workspaces, the caching allocator's
rounding of cache-sized tensors, and a transformers forward's peak against kvplan's hf estimate."""
import json, subprocess, sys

import torch

MiB = 1 << 20
out = {"torch": torch.__version__, "cuda": torch.version.cuda}
free0, total = None, None
# the context: what cudaMemGetInfo says is gone once torch has created it (its first call creates it)
torch.cuda.init()
free0, total = torch.cuda.mem_get_info()
out["device"] = torch.cuda.get_device_name(0)
out["cuda_total_bytes"] = total
smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,driver_version", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout.strip().split(", ")
out["driver"] = smi[1] if len(smi) > 1 else None
out["context_used_bytes_nvidia_smi"] = int(smi[0]) * MiB if smi and smi[0].isdigit() else None
out["free_after_context_bytes"] = free0
# cuBLAS workspaces: free memory lost to the first bf16 / fp32 GEMM beyond their operands
for dtype in (torch.bfloat16, torch.float32):
    a = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info()[0]
    (a @ a).sum().item()
    torch.cuda.synchronize()
    out[f"cublas_first_gemm_{str(dtype).split('.')[-1]}_bytes"] = before - torch.cuda.mem_get_info()[0] - a.nbytes
    del a
torch.cuda.empty_cache()
# the caching allocator: reserved bytes for tensors of cache-block sizes
rounding = {}
for nbytes in (512, 2 * MiB - 1, 2 * MiB + 1, 10 * MiB + 1, 64 * MiB + 3, 1 << 30):
    torch.cuda.empty_cache()
    r0 = torch.cuda.memory_reserved()
    t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    rounding[str(nbytes)] = torch.cuda.memory_reserved() - r0
    del t
out["allocator_reserved_for_request"] = rounding
# a transformers forward's peak at N tokens against kvplan's hf estimate (a config-only model, random weights)
try:
    from transformers import AutoConfig, AutoModelForCausalLM

except Exception as e:  # noqa: BLE001
    out["hf_forward"] = f"skipped: {type(e).__name__}: {e}"
else:
    rows = []
    for path in ("model_configs/Qwen--Qwen2.5-7B-Instruct/config.json",):
        try:
            cfg = AutoConfig.from_pretrained(path.rsplit("/", 1)[0])
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).cuda().eval()
            for tokens in (512, 2048):
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                with torch.no_grad():
                    model(torch.zeros(1, tokens, dtype=torch.long, device="cuda"), logits_to_keep=1)
                rows.append({"config": path, "tokens": tokens, "peak_bytes": torch.cuda.max_memory_allocated() - base})
            del model
        except Exception as e:  # noqa: BLE001
            rows.append({"config": path, "error": f"{type(e).__name__}: {e}"})
    out["hf_forward"] = rows
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out, indent=1))
PY
echo "== kvplan's hf estimate for the same forwards (compare with hf_forward above)"
for n in 512 2048; do
  python3 -m kvplan fit qwen2.5-7b --gpu 1xH200-141GB --engine hf --ctx "$n" --json 2>/dev/null \
    | python3 -c "import json,sys; r=json.load(sys.stdin)['results'][0]; print($n, [p for p in r['budget'][0]['parts'] if p['key'] not in ('total','weights')])" \
    | tee -a "$OUT/kvplan-hf.txt"
done
echo "done: $OUT"
