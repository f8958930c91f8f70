"""How vLLM versions lay out a hybrid's state (Mamba-2, Gated DeltaNet) around prefix caching, as read in the
released wheels (0.15.0, 0.17.0, 0.18.1, 0.19.0, 0.21.0, 0.24.0, 0.25.0, 0.26.0, 0.27.0, 0.28.0, 0.31.0, 0.32.0):

- the prefix-caching default for hybrids: off up to 0.27.0 (config/model.py is_prefix_caching_supported False to
  0.25.0; engine/arg_utils.py "supported and not is_hybrid" in 0.26.0 and 0.27.0), on from 0.28.0;
- models/config.py MambaModelConfig: asked-for prefix caching puts the state in mamba_cache_mode 'align' (2 pages a
  request), but a model that SupportsMambaPrefixCaching in 'all' up to 0.27.0 (a state page per block, blocks a
  multiple of lcm(SSD chunk, kernel alignment): platforms/interface.py _align_hybrid_block_size);
- layers/mamba/mamba_mixer2.py get_kv_cache_spec: the third (prefill checkpoint) page from 0.32.0 only;
- models/config.py NemotronHForCausalLMConfig: mamba_ssm_cache_dtype from the config, else float16 (0.13-0.19) or
  float32 (0.20 on); absent from 0.12.0.

Expected figures are written out from the bundled configs here, not read back from kvplan's plan.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml

from conftest import DATA, kvjson, run_cli, write_config
from test_hostile_input import one_line_error
from test_qwen3_5 import ROOT, assert_between, fit_ends, log_capacity, printed

QWEN = json.loads((ROOT / "Qwen--Qwen3.5-35B-A3B" / "config.json").read_text())["text_config"]
NEMOTRON = json.loads((ROOT / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16" / "config.json").read_text())
CTX = 262144


def state_groups(layer_kinds: list[str], state: str, attention: str) -> int:
    """vLLM's hybrid groups: state layers split into groups of the attention layer count."""
    return math.ceil(layer_kinds.count(state) / layer_kinds.count(attention))


QWEN_GROUPS = state_groups(QWEN["layer_types"], "linear_attention", "full_attention")
NEMOTRON_GROUPS = state_groups(list(NEMOTRON["hybrid_override_pattern"]), "M", "*")


def details(model: str, engine: str, *flags: str, ctx: int = CTX) -> dict:
    return kvjson("size", model, "--ctx", str(ctx), "--engine", engine, *flags)["engine_details"]


def pages_per_group(d: dict, ctx: int, groups: int) -> float:
    return (d["blocks_per_request"] - math.ceil(ctx / d["block_size"])) / groups


@pytest.mark.parametrize("engine, flags, pages", [
    ("vllm@0.18.1", (), 1), ("vllm@0.25", (), 1), ("vllm@0.27", (), 1),  # prefix caching off for hybrids unless asked
    ("vllm@0.18.1", ("--enable-prefix-caching",), 2), ("vllm@0.27", ("--enable-prefix-caching",), 2),
    ("vllm@0.28", (), 2), ("vllm@0.32", (), 2),  # on by default from 0.28
    ("vllm@0.28", ("--no-enable-prefix-caching",), 1),
])
def test_gated_deltanet_state_pages_follow_the_prefix_caching_default(engine, flags, pages):
    assert QWEN_GROUPS == 3
    assert pages_per_group(details("qwen3.5-35b-a3b", engine, *flags), CTX, QWEN_GROUPS) == pages


def all_mode_block(state_bytes: int, token_bytes: int, chunk: int, alignment: int = 16) -> int:
    """_align_hybrid_block_size's 'all' branch: the block holding one state, in multiples of lcm(chunk, alignment)."""
    step = math.lcm(chunk, alignment)
    return step * math.ceil(math.ceil(state_bytes / token_bytes) / step)


def nemotron_state(ssm_bytes: int = 4) -> int:
    c = NEMOTRON
    conv_dim = c["mamba_num_heads"] * c["mamba_head_dim"] + 2 * c["n_groups"] * c["ssm_state_size"]
    return (c["conv_kernel"] - 1) * conv_dim * 2 + c["mamba_num_heads"] * c["mamba_head_dim"] * c["ssm_state_size"] * ssm_bytes


JAMBA = json.loads((ROOT / "ai21labs--Jamba-v0.1" / "config.json").read_text())


def jamba_state() -> int:
    """Mamba-1: conv (d_conv - 1) x (expand x hidden) and SSM (expand x hidden) x d_state, both bf16 (no config rule)."""
    c = JAMBA
    inner = c["mamba_expand"] * c["hidden_size"]
    return (c["mamba_d_conv"] - 1) * inner * 2 + inner * c["mamba_d_state"] * 2


@pytest.mark.parametrize("engine, flags", [
    ("vllm@0.15", ("--enable-prefix-caching",)), ("vllm@0.25", ("--enable-prefix-caching",)),
    ("vllm@0.27", ("--enable-prefix-caching",)),
])
def test_mamba_cache_mode_all_keeps_a_state_page_per_block(engine, flags):
    """'all': blocks a multiple of lcm(the config's chunk_size, 16); every group, state or attention, holds
    cdiv(len, block) blocks a request (MambaSpec.max_memory_usage_bytes)."""
    d = kvjson("size", "nemotron-3-nano", "--ctx", "8192", "--engine", engine, *flags)
    block = all_mode_block(nemotron_state(), 2 * NEMOTRON["num_key_value_heads"] * NEMOTRON["head_dim"] * 2,
                           NEMOTRON["chunk_size"])
    assert d["engine_details"]["block_size"] == block == 2176
    assert d["engine_details"]["blocks_per_request"] == (NEMOTRON_GROUPS + 1) * math.ceil(8192 / block)
    assert any("mamba_cache_mode 'all'" in a for a in d["assumptions"])


def test_mamba1_in_all_mode_aligns_to_the_default_chunk():
    """Jamba names no chunk: get_mamba_chunk_size gives 2048, so its 'all' block is 2048 where 'none' needs 80."""
    per_token = 2 * JAMBA["num_key_value_heads"] * (JAMBA["hidden_size"] // JAMBA["num_attention_heads"]) * 2
    d = kvjson("size", "jamba-v0.1", "--ctx", "8192", "--engine", "vllm@0.26", "--enable-prefix-caching")
    assert d["engine_details"]["block_size"] == all_mode_block(jamba_state(), per_token, 2048) == 2048
    off = kvjson("size", "jamba-v0.1", "--ctx", "8192", "--engine", "vllm@0.26")
    assert off["engine_details"]["block_size"] == 16 * math.ceil(jamba_state() / (16 * per_token)) == 80


def test_a_block_size_given_in_all_mode():
    """From 0.20 the alignment is max(kernel block, --block-size), so the 'all' block is a multiple of the block
    given; 0.15-0.19 align to 16 only, leaving attention and state blocks of different sizes: refused in one line."""
    d = kvjson("size", "nemotron-3-nano", "--ctx", "8192", "--engine", "vllm@0.26", "--enable-prefix-caching",
               "--block-size", "4096")
    assert d["engine_details"]["block_size"] == 4096
    r = run_cli("size", "nemotron-3-nano", "--ctx", "8192", "--engine", "vllm@0.19", "--enable-prefix-caching",
                "--block-size", "4096")
    one_line_error(r, "mamba_cache_mode 'all'")


@pytest.mark.parametrize("engine, flags, pages", [
    ("vllm@0.25", (), 1), ("vllm@0.27", (), 1), ("vllm@0.28", ("--no-enable-prefix-caching",), 1),
    ("vllm@0.28", (), 2), ("vllm@0.31", (), 2),  # 'align' without the Mamba-2 checkpoint
    ("vllm@0.32", (), 3),  # mamba_mixer2's prefill checkpoint page
])
def test_mamba2_pages_by_version(engine, flags, pages):
    assert NEMOTRON_GROUPS == 4
    assert pages_per_group(details("nemotron-3-nano", engine, *flags, ctx=8192), 8192, NEMOTRON_GROUPS) == pages


def nemotron_block(ssm_bytes: int, kv_bytes: int = 2) -> int:
    """The attention block that holds one Nemotron-H state: conv (kernel - 1) x conv_dim in bf16 plus the SSM
    (heads, head_dim, d_state) in the chosen dtype, over a K/V token of 2 x kv_heads x head_dim x kv_bytes, in
    multiples of 16."""
    c = NEMOTRON
    conv_dim = c["mamba_num_heads"] * c["mamba_head_dim"] + 2 * c["n_groups"] * c["ssm_state_size"]
    state = (c["conv_kernel"] - 1) * conv_dim * 2 + c["mamba_num_heads"] * c["mamba_head_dim"] * c["ssm_state_size"] * ssm_bytes
    per_token = 2 * c["num_key_value_heads"] * c["head_dim"] * kv_bytes
    return 16 * math.ceil(state / (16 * per_token))


@pytest.mark.parametrize("engine, ssm_bytes, name", [
    ("vllm@0.10", 2, "bf16"),  # no NemotronHForCausalLMConfig (0.10.1-0.12.0): the conv state's dtype
    ("vllm@0.13", 2, "fp16"), ("vllm@0.19", 2, "fp16"),  # its float16 fallback
    ("vllm@0.20", 4, "fp32"), ("vllm@0.32", 4, "fp32"),  # DEFAULT_MAMBA_SSM_CACHE_DTYPE float32
])
def test_nemotron_h_ssm_dtype_when_the_config_is_silent(tmp_path, engine, ssm_bytes, name):
    silent = {k: v for k, v in NEMOTRON.items() if k != "mamba_ssm_cache_dtype"}
    path = write_config(tmp_path, "nemotron-silent", silent)
    d = kvjson("size", path, "--ctx", "8192", "--engine", engine, "--no-enable-prefix-caching")
    assert any(f"SSM/recurrent state in {name}" in a for a in d["assumptions"]), d["assumptions"]
    assert d["engine_details"]["block_size"] == nemotron_block(ssm_bytes)
    # the config's own float32 wins wherever the rule exists
    said = kvjson("size", "nemotron-3-nano", "--ctx", "8192", "--engine", engine, "--no-enable-prefix-caching")
    expect = 2 if engine == "vllm@0.10" else 4
    assert said["engine_details"]["block_size"] == nemotron_block(expect)


# ---------------------------------------------------------------------------------------------- a log from the wild
@pytest.mark.parametrize("case_id, engine", [
    # 0.19.1 (an H100): tokens = blocks // groups x block (4,819,104 = 1,154 x 4,176)
    ("vllm-nemotron-cascade-2-30b-a3b-nvfp4-1xh100-tp1-len262144-fp8kv-gmu0.95-v0.19.1", "vllm@0.19.1"),
    # 0.20.1rc1: tokens = int(concurrency x max_model_len) (0.20.0 printed blocks // groups x block size)
    ("vllm-nemotron-cascade-2-30b-a3b-nvfp4-1xblackwell-wsl-len256000-fp8kv-gmu0.85", "vllm@0.20.1rc1"),
])
def test_vllm_nemotron_h_logs_without_prefix_caching(case_id, engine):
    """Two Nemotron-Cascade-2-30B-A3B-NVFP4 start-ups (tests/data/wild-logs.yaml; the Nemotron-3-Nano-30B-A3B layout,
    fp8 KV, --mamba-ssm-cache-dtype float32): prefix caching not asked for, so off for this hybrid (one state page a
    group), block 4,176, one padding layer, and the printed tokens and concurrency at both ends of the printed budget."""
    case = {c["id"]: c for c in yaml.safe_load((DATA / "wild-logs.yaml").read_text())}[case_id]
    log = case["log"]
    mml = printed(log, r"Using max model len (\d+)") if "Using max model len" in log else str(case["max_model_len"])
    assert "'enable_prefix_caching'" not in log and "Add 1 padding layers" in log
    block = int(printed(log, r"Setting attention block size to (\d+) tokens"))
    tokens, concurrency = log_capacity(log)
    common = ("--gpu", "H100", "--kv-dtype", "fp8", "--mamba-ssm-cache-dtype", "float32", "--ctx", mml,
              "--max-model-len", mml)
    budget = printed(log, r"Available KV cache memory: ([\d.]+) GiB")
    ends = fit_ends("nemotron-3-nano", budget, *common, "--engine", engine)
    assert_between(ends, tokens, concurrency)
    assert ends[1]["engine_details"]["block_size"] == block == nemotron_block(4, kv_bytes=1)
    assert ends[1]["engine_details"]["blocks_per_request"] == math.ceil(int(mml) / block) + NEMOTRON_GROUPS
    # the other version's count of the same pool misses the printed figure
    other = fit_ends("nemotron-3-nano", budget, *common,
                     "--engine", "vllm@0.20.1" if engine == "vllm@0.19.1" else "vllm@0.20.0")
    assert not other[0]["kv_capacity_tokens"] <= tokens <= other[1]["kv_capacity_tokens"]


def test_all_mode_against_a_report_of_a_0_20_1_dev0_run():
    """The one account found of a Mamba-family hybrid with prefix caching on in vLLM 0.15-0.27: a written report of
    nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4 on a B300 (code index read_file id 62629269619: vllm serve ...
    --max-model-len 32768 --kv-cache-dtype fp8 --enable-prefix-caching on a 0.20.1.dev0 build, quoting the 'all'-mode
    warning). It restates, not copies, the log: KV cache ~33.56 GiB, 2,344,320 tokens, 69.42x. A dev0 build of 0.20.1
    still counts tokens as 0.20.0 did (blocks // groups x block: 2,344,320 = 555 x 4,224), so vllm@0.20.0's rules.
    'all' mode gives block 4,224 (lcm(chunk 128, 16) over the fp8 state page) and 5 x 8 blocks a request: both
    figures; mode 'none' would print 234x."""
    budget = __import__("decimal").Decimal("33.56")
    common = ("--gpu", "B300", "--kv-dtype", "fp8", "--ctx", "32768", "--max-model-len", "32768",
              "--engine", "vllm@0.20.0")
    ends = fit_ends("nemotron-3-nano", budget, *common, "--enable-prefix-caching")
    assert_between(ends, 2_344_320, 69.42)
    block = all_mode_block(nemotron_state(), 2 * NEMOTRON["num_key_value_heads"] * NEMOTRON["head_dim"],
                           NEMOTRON["chunk_size"])
    assert ends[1]["engine_details"]["block_size"] == block == 4224
    assert ends[1]["engine_details"]["blocks_per_request"] == (NEMOTRON_GROUPS + 1) * math.ceil(32768 / block)
    off = fit_ends("nemotron-3-nano", budget, *common)
    assert off[0]["concurrency"] > 3 * 69.42


@pytest.mark.parametrize("case_id, args", [
    # 0.10.2: "Hybrid or mamba-based model detected: disabling prefix caching since it is not yet supported"
    ("vllm-qwen3-next-80b-a3b-instruct-2xh200-tp2-len262144-default-gmu-v0.10.2",
     ("--gpu", "2xH200", "--tp", "2", "--engine", "vllm@0.10.2")),
    # 0.13.0: prefix caching asked for and turned off ("without support for prefix caching: disabling"), fp8 KV
    ("vllm-qwen3-next-80b-a3b-wna16-2xl40s-tp2-len32768-fp8kv-gmu0.92-v0.13.0",
     ("--gpu", "2xL40S", "--tp", "2", "--kv-dtype", "fp8", "--engine", "vllm@0.13.0")),
])
def test_vllm_qwen3_next_logs_before_align_mode(case_id, args):
    """Two Qwen3-Next-80B-A3B start-ups (tests/data/wild-logs.yaml; repositories not resolved, text verified through
    the code index): one state page a group, the SSM state in the conv dtype (no Qwen3-Next config rule), the block
    the log prints, and its tokens and concurrency at both ends of the printed budget."""
    case = {c["id"]: c for c in yaml.safe_load((DATA / "wild-logs.yaml").read_text())}[case_id]
    log = case["log"]
    mml = printed(log, r"Using max model len (\d+)")
    assert "disabling" in log and "prefix caching" in log
    tokens, concurrency = log_capacity(log)
    ends = fit_ends("qwen3-next-80b-a3b", printed(log, r"Available KV cache memory: ([\d.]+) GiB"), *args,
                    "--ctx", mml, "--max-model-len", mml)
    assert_between(ends, tokens, concurrency)
    block = int(printed(log, r"Setting attention block size to (\d+) tokens"))
    assert ends[1]["engine_details"]["block_size"] == block
    # the bundled Thinking config: the same architecture and geometry as the Instruct checkpoint the logs load
    config = json.loads((ROOT / "Qwen--Qwen3-Next-80B-A3B-Thinking" / "config.json").read_text())
    groups = config["full_attention_interval"] - 1  # 3 linear-attention layers for each full one
    assert ends[1]["engine_details"]["blocks_per_request"] == math.ceil(int(mml) / block) + groups


@pytest.mark.slow
def test_the_scheduler_replay_grows_all_mode_state_like_attention():
    """`plan` replays the pool with the 'all'-mode state groups taking a block per block_size tokens (a 2,500-token
    request: 2 blocks in each of the 5 groups) where mode 'none' holds one state block a group."""
    args = ("plan", "nemotron-3-nano", "--gpu", "H100", "--prompt", "2000", "--output", "500")
    on = kvjson(*args, "--engine", "vllm@0.26", "--enable-prefix-caching")
    block = on["pool"]["block_size"]
    assert block == 2176 and on["pool"]["kv_groups"] == NEMOTRON_GROUPS + 1
    assert on["mean_request_blocks"] == (NEMOTRON_GROUPS + 1) * math.ceil(2500 / block)
    off = kvjson(*args, "--engine", "vllm@0.26")
    assert off["mean_request_blocks"] == math.ceil(2500 / off["pool"]["block_size"]) + NEMOTRON_GROUPS
