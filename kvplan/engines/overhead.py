"""Memory that is neither weights nor KV: the documented estimates the budget rules use, with provenance.

These are estimates (the engines measure them with a profiling run on the real GPU); `--reserve BYTES` replaces
the whole non-KV estimate, `--kv-budget BYTES` skips the budget model. The constants were fixed BEFORE the
engine-log cases were scored (README, "Capacity predictions"); which cases informed each is stated here.
"""

from __future__ import annotations

from kvplan.parallel import cdiv
from kvplan.spec import ModelSpec

MiB, GiB = 1 << 20, 1 << 30

# CUDA context of one process: 287,047,680 B (lazy module loading, the Linux default since CUDA 12.2) to
# 666,632,192 B (eager) per PyTorch PR #86509 (engines.md §6). Charged only where an engine budgets from the
# free memory it sees after starting (SGLang, TensorRT-LLM, transformers, llama.cpp); vLLM takes its baseline
# after the context and budgets a fraction of the TOTAL, so the context sits in the unused (1 - util) share.
CUDA_CONTEXT_BYTES = 512 * MiB

# NCCL communicator buffers per GPU when tp*pp > 1 ("typically a few hundred MiB", engines.md §6).
NCCL_BYTES = 256 * MiB

# vLLM non-torch memory that appears after its baseline (cuBLAS workspaces, NCCL first use): engines.md §1.4
# gives 0.1-0.6 GiB on H100; the llm-d measurements (engine-logs case vllm-mistral-small-3.2-24b) show 0.14 GiB
# on one GPU. We use 0.14 GiB on one GPU and add NCCL_BYTES with tensor/pipeline parallelism.
VLLM_NON_TORCH_BYTES = int(0.14 * GiB)

# vLLM >= 0.20 charges CUDA-graph memory (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default: 0.20.0 envs.py). Public 0.2x
# startup logs print "Estimated CUDA graph memory: 0.26 GiB total" (vllm PR #30515) and "0.36 GiB total"
# (gpustack/runner PR #251); we charge the larger. A 0.21.0 log (RTX A5000, tests/data/wild-logs.yaml) implies
# 0.52 GiB and a 0.19.1 A100 log estimated 2.35 GiB (not charged there): the figure varies with the capture sizes.
VLLM_CUDAGRAPH_BYTES = int(0.36 * GiB)

# vLLM's profile run peak: the larger of the dummy forward over max_num_batched_tokens and the dummy sampler
# run over max_num_seqs requests. Forward: every token's hidden state plus the gate/up/down MLP intermediates
# (this GPU's share) in the model dtype. Sampler: fp32 logits [max_num_seqs, vocab] and three same-sized
# temporaries (softmax/sort for top-p/top-k). Informed by the two cases that state their activation share:
# vllm-mistral-small-3.2-24b-h100 (activation 2.12 GiB with max_num_seqs 1024, vocab 131,072) and
# vllm-qwen2-7b-a100-80gb-tp1 (5.01 GiB left of 0.25 x total after 14.25 GiB of weights).
SAMPLER_FP32_COPIES = 4


def vllm_activation(spec: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int, tp: int, dtype_bytes: int,
                    moe_workspace_held: bool = False) -> int:
    w = spec.widths
    forward = max_num_batched_tokens * (w.hidden + 3 * w.intermediate // tp) * dtype_bytes
    sampler = SAMPLER_FP32_COPIES * max_num_seqs * w.vocab * 4
    held = vllm_moe_workspace(spec, max_num_batched_tokens, tp, dtype_bytes) if moe_workspace_held else 0
    return held + max(forward, sampler)


def vllm_moe_workspace(spec: ModelSpec, tokens: int, tp: int, dtype_bytes: int) -> int:
    """vLLM >= 0.13 keeps the fused-MoE scratch in a WorkspaceManager buffer that outlives the forward
    (v1/worker/workspace.py; 0.12 has none), so it is still held when the profile run's sampler peaks. Its size
    for TritonExperts, the unquantized kernel (layers/fused_moe/fused_moe.py workspace_shapes, 0.19), at M tokens,
    top-k, this GPU's expert width I and hidden K: M x k x max(I, K) (shared with the M x K output) plus
    M x k x max(2I, K), each rounded up to 256 bytes. Three 0.19 H100 logs show the activation peak above kvplan's
    by about this: Qwen3-30B-A3B 2.68 GiB logged vs 2.32 (+0.50 here), Mixtral tp 2 1.21 vs 0.49 (+0.66),
    Llama-4-Scout tp 4 3.19 vs 3.08 (+0.16). Quantized experts run other kernels with other scratch: not counted."""
    w = spec.widths
    if not w.experts_per_token or not w.expert_intermediate or spec.quantization is not None:
        return 0
    m, k, i, h = tokens, w.experts_per_token, cdiv(w.expert_intermediate, tp), w.hidden
    first = max(m * k * max(i, h), m * h) * dtype_bytes
    second = m * k * max(2 * i, h) * dtype_bytes
    return cdiv(first, 256) * 256 + cdiv(second, 256) * 256


# vLLM >= 0.19 under tensor parallelism: its profiler's DEBUG line "non-torch forward increase memory" reads 2.06-2.17
# GiB per GPU at tp 2 and 4 (0.24-0.27 GiB at tp 1; pipeline stages alone add next to nothing) in the llm-d
# sweep of tests/data/wild-logs.yaml (vLLM 0.19.0, H100): all-reduce and NCCL buffers. Fixed on the calibration
# part of the hash split used until stop 45 only, the mean of its three tp >= 2 cases (Llama-3.1-8B tp 2 2.07 and tp 4
# 2.13, Mixtral-8x7B tp 2 2.07); scored on the held-out part (README, "Capacity from the GPU alone").
# vLLM's own all-reduce buffers are tens of MiB (custom_all_reduce.py: 8 MiB metadata + the largest of its
# all-reduce / all-gather / reduce-scatter sizes, all_reduce_utils.py, 2-64 MiB), so the 2 GiB is NCCL's: its
# NVLink SHARP (NVLS) multicast buffers, which exist only on Hopper / Blackwell boards on NVSwitch (gpus.json
# `nccl_nvls`). Elsewhere (PCIe cards, A100, NVLink bridges) the older NCCL_BYTES applies.
# The 0.10 logs (tp 2 on A100) fit NCCL_BYTES, so the rule rows decide from which version the 2 GiB applies.
VLLM_TP_NON_TORCH_BYTES = int(2.09 * GiB)


def vllm_non_torch(tp: int, pp: int, tp_buffers_measured: bool = False, nccl_nvls: bool = True) -> int:
    if tp > 1 and tp_buffers_measured and nccl_nvls:
        return VLLM_TP_NON_TORCH_BYTES
    return VLLM_NON_TORCH_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)


# TensorRT-LLM PyTorch backend: the dummy requests at max_num_tokens (default 8192) peak like vLLM's forward.
TRTLLM_MAX_NUM_TOKENS = 8192


def forward_activation(spec: ModelSpec, tokens: int, tp: int, dtype_bytes: int) -> int:
    w = spec.widths
    return tokens * (w.hidden + 3 * w.intermediate // tp) * dtype_bytes


# llama.cpp compute buffer (the graph's scratch at n_ubatch tokens). The ollama case (gemma-3-4b, ubatch 512)
# reports "203 compute" MiB; we scale hidden x ubatch with the factor that case implies (~40 fp32 rows per
# token-width) and add the fit margin llama.cpp keeps (common_fit_params target margin: 1 GiB per device).
LLAMACPP_COMPUTE_ROWS = 40
LLAMACPP_MARGIN_BYTES = 1 * GiB


def llamacpp_compute(spec: ModelSpec, ubatch: int) -> int:
    return ubatch * spec.widths.hidden * 4 * LLAMACPP_COMPUTE_ROWS


def hf_activation(spec: ModelSpec, batch: int, ctx: int, dtype_bytes: int) -> int:
    """transformers generate(): the prefill forward of batch x ctx tokens (hidden + MLP intermediates) and the
    fp32 logits of the last position only (logits_to_keep=1)."""
    w = spec.widths
    return batch * ctx * (w.hidden + 3 * w.intermediate) * dtype_bytes + batch * w.vocab * 4
