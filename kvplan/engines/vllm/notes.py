"""The assumption sentences of vLLM's layout, each with an id: output keeps the text, tests and code read the id.

One function per sentence, taking the figures it states; prepare and the policy functions decide *whether* a note
applies, this module only says it.
"""

from __future__ import annotations

from kvplan.engines.base import Note


def version(text: str) -> Note:
    return Note("vllm.version", text)


def batched_tokens(mbt: int, where: str) -> Note:
    return Note("vllm.max_num_batched_tokens", f"max_num_batched_tokens {mbt} ({where}; --max-num-batched-tokens changes it)")


def window_reserve(inflight: int, why: str) -> Note:
    return Note("vllm.window_reserve",
                f"sliding/chunked layers reserve window + {inflight:,} in-flight tokens per request ({why})")


def minimax_m3(kv_label: str, sparse_layers: int, key_dim: int, block: int) -> Note:
    return Note("vllm.minimax_m3",
                f"MiniMax-M3 sparse attention (models/minimax_m3): every layer's K/V in {kv_label}, and on the "
                f"{sparse_layers} sparse layers one {key_dim}-wide index key per token in bf16 ({2 * key_dim} B; "
                f"indexer_kv_dtype auto), all in one block pool of {block}-token blocks (the sparse backends' page)")


def sparse_attention(where: str, size: int, label: str, sparse_block: int | None) -> Note:
    return Note("vllm.sparse_mla",
                f"DeepSeek sparse attention on {where}: latent {size} B per token per layer"
                f"{' (' + label + ': 512 fp8 + 4 fp32 scales + 64 bf16 RoPE)' if label else ''}, indexer keys fp8 with "
                "fp32 scales; both paged in one block pool"
                + ("" if sparse_block is None else f", block size {sparse_block} (the indexer backend's)"))


def deepseek_v4(inflight: int, why: str) -> tuple[Note, Note]:
    return (Note("vllm.deepseek_v4",
                 "DeepSeek-V4 (models/deepseek_v4): fp8_ds_mla records of 584 B (448 fp8 + 8 B of scales + 64 bf16 "
                 "RoPE) for the 128-token window (block 64) and the compressed latents (block 256: 64 entries at ratio "
                 "4, 2 at 128), indexer keys 132 B per 4 tokens, fp32 compressor states (blocks 4 and 8); pages padded "
                 f"to 576 B; windows and states reserve window - 1 + {inflight:,} in-flight tokens per request ({why})"),
            Note("vllm.compressed_per_token",
                 "per-token figures of compressed layers are averages (an entry per 4 or 128 tokens), rounded down"))


def mla_block(block: int, version: str, where: str) -> Note:
    return Note("vllm.mla_block", f"MLA block size {block} (the attention backend vLLM {version} picks on {where})")


def default_block() -> Note:
    return Note("vllm.block_size", "block size 16 tokens (vLLM default)")


def kda_state(conv: str, recurrent: str, full_rank_gate: bool, flashkda_page: bool) -> Note:
    return Note("vllm.kda_state",
                f"Kimi Delta Attention state: conv window in {conv}, recurrent matrix in {recurrent} "
                + ("(mamba_ssm_cache_dtype: float32 or bfloat16)" if full_rank_gate
                   else "(vLLM's Kimi-Linear layer keeps it in fp32 whatever --mamba-ssm-cache-dtype says)")
                + ("; Kimi-K3's FlashKDA prefill on this GPU keeps one more state page per request in 'align' mode"
                   if flashkda_page else ""))


def lightning(state: str) -> tuple[Note, Note]:
    return (Note("vllm.lightning_state",
                 f"MiniMax-01 lightning-attention state: (heads / tp) x head_dim x head_dim per layer and request in "
                 f"{state} (mamba_cache_dtype, --state-dtype; linear_attention_state_dtype), one MambaSpec page"),
            Note("vllm.minimax01_fp32_head",
                 "vLLM keeps MiniMax-01's lm_head in fp32 (models/minimax_text_01.py lm_head.float()) and its router "
                 "in fp32: the weights here count the lm_head in the model dtype, vocab x hidden x 2 B / tp less than "
                 "vLLM loads"))


def mamba_state(conv: str, ssm: str) -> Note:
    return Note("vllm.mamba_state",
                f"Mamba/linear-attention state: conv window kernel-1, conv state in {conv} (--state-dtype), "
                f"SSM/recurrent state in {ssm} (--mamba-ssm-cache-dtype)")


def prefix_caching_off(version: str) -> Note:
    return Note("vllm.prefix_caching_off",
                f"prefix caching off: vLLM {version} leaves it off for hybrid models unless asked "
                "(is_prefix_caching_supported before 0.26, engine/arg_utils.py before 0.28)")


def mamba_all_mode(version: str, architecture: str, chunk: int, chunk_from_config: bool) -> Note:
    return Note("vllm.mamba_all_mode",
                f"prefix caching on: vLLM {version} puts {architecture} in mamba_cache_mode 'all' (models/config.py "
                "MambaModelConfig, 0.15 to 0.27): a state page for every block of a request, like attention, and "
                f"blocks a multiple of lcm(SSD chunk {chunk}{'' if chunk_from_config else ', the default for a config naming none'}, "
                "the kernel alignment; its per-token figure is a page over a block, rounded down); "
                "--no-enable-prefix-caching gives one state page")


def null_block() -> Note:
    return Note("vllm.null_block", "the null block (block 0) is excluded from usable blocks")


def dcp(size: int) -> Note:
    return Note("vllm.dcp",
                f"decode context parallel {size}: each request's tokens are spread over {size} TP ranks (a GPU holds "
                f"1/{size} of them; blocks per request = ceil(len / (block size x {size})))")


def v2_runner(version: str, by_flag: bool) -> Note:
    return Note("vllm.v2_runner",
                "model runner V2 (--use-v2-model-runner)" if by_flag else
                f"model runner V2 (vLLM {version}'s default for this model; VLLM_USE_V2_MODEL_RUNNER, "
                "--no-use-v2-model-runner, picks V1)")


# what the stage grouping (groups.py) says about the pool it built
def chunked_disables_hybrid() -> Note:
    return Note("vllm.chunked_disables_hybrid",
                "chunked local attention: vLLM disables the hybrid KV cache manager, every layer sized for the full length")


def align_mode(threes: list[str]) -> Note:
    return Note("vllm.mamba_align_mode",
                "prefix caching on a hybrid: state layers in mamba_cache_mode 'align', 2 state pages per request"
                + (f" (3: {'; '.join(threes)})" if threes else "") + "; --no-enable-prefix-caching gives 1")


def block_raised(block: int, mamba_page: int, padded: int) -> Note:
    return Note("vllm.hybrid_block",
                f"attention block size raised to {block} tokens so a page holds one Mamba state "
                f"({mamba_page:,} B, padded to {padded:,} B)")


def padding_layers(padding: int, layers: int) -> Note:
    return Note("vllm.padding_layers",
                f"{padding} padding layer slot(s) in the hybrid KV groups (may waste at most "
                f"{100 * padding / layers:.2f}% of that layer type's KV memory)")


def packed(groups: int, per_block: int, unused: str) -> Note:
    return Note("vllm.packed_pool",
                f"block-outermost packing: {groups} KV groups in one pool, each block {per_block:,} B (the widest "
                f"group's pages; the others leave {unused} B unused)")


def dsv4_uniform_groups(text: str) -> Note:
    return Note("vllm.dsv4_uniform_groups", text)
