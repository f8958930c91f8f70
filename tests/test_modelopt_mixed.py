"""ModelOpt MIXED_PRECISION exports: each module in the format its quantized_layers entry names.

The byte rules are written out here from vLLM 0.32's modelopt.py, which creates per module: NVFP4 (KNvfp4Static +
KNvfp4Dynamic) weight uint8 [out, in/2], weight_scale fp8 [out, in/group], weight_scale_2 and input_scale fp32;
W4A16_NVFP4 the same without input_scale; FP8 (KFp8StaticTensor) weight fp8 [out, in], weight_scale and
input_scale fp32; MXFP8 (KMxfp8Static) weight fp8 [out, in] + weight_scale uint8 [out, in/32]. A module with no
entry stays 16-bit (ModelOptMixedPrecisionConfig.get_quant_method: UnquantizedLinearMethod).
The genuine exports are NVIDIA's (tests/data/aic-configs/SOURCES.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli

from kvplan import weights
from kvplan.architectures.modelopt_mixed import MIXED_ALGOS
from kvplan.spec import Quantization, WeightPart

DATA = Path(__file__).with_name("data") / "aic-configs"
H, HEADS, KV, HD, INTER, VOCAB = 256, 4, 2, 64, 512, 1024

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "num_attention_heads": HEADS,
    "num_key_value_heads": KV, "intermediate_size": INTER, "num_hidden_layers": 2, "vocab_size": VOCAB,
    "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def mixed(layers: dict, **extra) -> dict:
    return {**TINY, "quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                            "quantized_layers": layers, **extra}}


def size(tmp_path: Path, config: dict, *args: str) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(config))
    r = run_cli("size", str(tmp_path), "--ctx", "1k", "--json", *args)
    assert r.code == 0, r.err
    return r.json()


def nvfp4(out: int, inp: int, scalars: int) -> int:
    return out * inp // 2 + out * inp // 16 + scalars


def test_each_module_in_its_own_format(tmp_path: Path):
    attn = {f"model.layers.0.self_attn.{p}": {"quant_algo": "FP8"} for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    mlp0 = {f"model.layers.0.mlp.{p}": {"quant_algo": "W4A16_NVFP4", "group_size": 16}
            for p in ("gate_proj", "up_proj", "down_proj")}
    mlp1 = {f"model.layers.1.mlp.{p}": {"quant_algo": "NVFP4", "group_size": 16}
            for p in ("gate_proj", "up_proj", "down_proj")}
    out = size(tmp_path, mixed({**attn, **mlp0, **mlp1, "lm_head": {"quant_algo": "MXFP8"}}))
    q, kv, o = (HEADS * HD, H), (KV * HD, H), (H, HEADS * HD)
    gate, down = (INTER, H), (H, INTER)
    layer0 = sum(a * b + 8 for a, b in (q, kv, kv, o)) + 2 * nvfp4(*gate, 4) + nvfp4(*down, 4)
    layer1 = 2 * sum(a * b for a, b in (q, kv, kv, o)) + 2 * nvfp4(*gate, 8) + nvfp4(*down, 8)  # attention 16-bit
    norms = 2 * 2 * (2 * H) + 2 * H
    expected = layer0 + layer1 + norms + 2 * VOCAB * H + (VOCAB * H + VOCAB * H // 32)
    assert out["weight_dtype"] == "mixed" and not out["warnings"]
    assert out["weight_bytes"] == expected


def test_excluded_modules_stay_16_bit(tmp_path: Path):
    layers = {f"model.layers.{i}.mlp.down_proj": {"quant_algo": "FP8"} for i in (0, 1)}
    both = size(tmp_path, mixed(layers))["weight_bytes"]
    one = size(tmp_path, mixed(layers, exclude_modules=["model.layers.1.mlp*"]))["weight_bytes"]
    assert one - both == H * INTER - 8  # layer 1's down_proj back to 2 B a weight, no scales


def test_entries_kvplan_cannot_place_leave_the_export_uncounted(tmp_path: Path):
    layers = {"model.layers.0.mlp.down_proj": {"quant_algo": "FP8"},
              "model.layers.0.block_sparse_moe.experts.0.w1": {"quant_algo": "NVFP4", "group_size": 16}}
    out = size(tmp_path, mixed(layers))
    bf16 = size(tmp_path, TINY)
    assert out["weight_bytes"] == bf16["weight_bytes"] and out["weight_dtype"] == "bf16"
    assert any("1 of its 2 quantized_layers entries" in w and "block_sparse_moe.experts.0.w1" in w
               for w in out["warnings"]), out["warnings"]


def test_an_nvfp4_entry_without_a_usable_group_is_one_line(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(mixed({"model.layers.0.mlp.up_proj": {"quant_algo": "NVFP4",
                                                                                              "group_size": 0}})))
    r = run_cli("size", str(tmp_path))
    assert r.code == 2 and r.err.count("\n") == 1 and "group_size must be a positive integer" in r.err, r.err


def test_a_format_without_a_storage_rule_is_warned(tmp_path: Path):
    out = size(tmp_path, mixed({"model.layers.0.mlp.down_proj": {"quant_algo": "W4A8_AWQ"}}))
    assert out["weight_dtype"] == "bf16" and any("W4A8_AWQ" in w and "upper bound" in w for w in out["warnings"])


def _export(tmp_path: Path, name: str) -> Path:
    shutil.copy(DATA / f"{name}_config.json", tmp_path / "config.json")
    quant = DATA / f"{name}_hf_quant_config.json"
    if quant.exists():
        shutil.copy(quant, tmp_path / "hf_quant_config.json")
    return tmp_path


def test_genuine_exports_map_every_entry(tmp_path: Path):
    """Every quantized_layers entry of three NVIDIA exports lands on a kvplan weight part (else a warning would say
    so): Qwen3.6-27B (per-module, FP8 attention, NVFP4 MLP and lm_head), Qwen3.6-35B-A3B (`mlp.experts` as one
    entry), Nemotron-3.5-Lightning (per-expert entries, in hf_quant_config.json)."""
    for i, name in enumerate(("nvidia--Qwen3.6-27B-NVFP4", "nvidia--Qwen3.6-35B-A3B-NVFP4",
                              "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4")):
        (tmp_path / str(i)).mkdir()
        folder = _export(tmp_path / str(i), name)
        r = run_cli("size", str(folder), "--ctx", "1k", "--json")
        assert r.code == 0, r.err
        out = r.json()
        bf16 = run_cli("size", str(folder), "--ctx", "1k", "--json", "--weight-dtype", "bf16").json()
        assert out["weight_dtype"] == "mixed" and not out["warnings"], (name, out["warnings"])
        assert bf16["weight_bytes"] / 3.6 < out["weight_bytes"] < bf16["weight_bytes"] / 2.4, name


def _qwen36_mtp_bytes(name: str) -> int:
    """The MTP module every Qwen3.6 checkpoint carries, unquantized (the exports' ignore list: `mtp*`), written out
    from the config as vLLM's qwen3_5_mtp.py builds it: fc (2h -> h), two pre-fc norms, one full-attention decoder
    layer (output-gated q, k, v, o, q/k norms; dense MLP or 256-expert MoE with a shared expert and its gate), the
    final norm. kvplan does not count MTP weights (no speculative decoding), vLLM's 'Checkpoint size' does."""
    t = json.loads((DATA / f"{name}_config.json").read_text())["text_config"]
    h, heads, kv, hd = t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    attn = h * heads * hd * 2 + 2 * h * kv * hd + heads * hd * h + 2 * hd
    if t.get("num_experts"):
        e, inter, shared = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
        mlp = e * 3 * h * inter + 3 * h * shared + e * h + h  # experts, shared expert, router, shared-expert gate
    else:
        mlp = 3 * h * t["intermediate_size"]
    return 2 * (2 * h * h + 2 * h + attn + mlp + 2 * h + h)


def test_qwen36_27b_export_matches_vllms_checkpoint_size(tmp_path: Path):
    """vLLM 0.23.1rc1 loading nvidia/Qwen3.6-27B-NVFP4 (99sono/DockerBuildFiles, inference-containers/vllm/
    qwen-3.6-27b-dgx-spark/nvidia-nvfp4/metadata/metadata01_2026_07_02/01_vllm_log_no_mtp.md, TP 1):
    `[weight_utils.py:849] Filesystem type for checkpoints: EXT4. Checkpoint size: 20.42 GiB` (its safetensors files
    summed). kvplan's weights + the unquantized MTP module print the same: 21,921,427,428 B = 20.4159 GiB. With the
    export's `mtp.layers.0*` exclusion read as the decoder's layer 0 (kvplan before this test) it was 20.88 GiB."""
    name = "nvidia--Qwen3.6-27B-NVFP4"
    out = size(tmp_path, json.loads((DATA / f"{name}_config.json").read_text()))
    assert f"{(out['weight_bytes'] + _qwen36_mtp_bytes(name)) / 2**30:.2f}" == "20.42"


def test_qwen36_35b_export_is_within_a_tenth_of_a_percent(tmp_path: Path):
    """The same author's vLLM 0.22.1rc1 start-ups of nvidia/Qwen3.6-35B-A3B-NVFP4 print `Checkpoint size: 21.82 GiB`
    (two boots, .../qwen-3.6-35b-dgx-spark/metadata/metadata_07_2026_06_01/02_vllm_log_normal_frontend.md).
    kvplan + the MTP module come to 21.80 GiB: 17-27 MB short, not explained (the checkpoint's revision is not in the
    log; every quantized_layers entry is placed). Layer 0's experts counted 16-bit would add 1.1 GiB."""
    name = "nvidia--Qwen3.6-35B-A3B-NVFP4"
    out = size(tmp_path, json.loads((DATA / f"{name}_config.json").read_text()))
    total = out["weight_bytes"] + _qwen36_mtp_bytes(name)
    assert 21.815 * 2**30 * 0.998 < total < 21.825 * 2**30


# ---------------------------------------------------------------------------------------------- vLLM itself
ORACLE_SHAPES = [(512, 256), (1856, 2688), (2688, 1856), (6144, 5120), (248320 // 64, 5120)]


@pytest.mark.engine
def test_module_bytes_equal_what_vllm_creates(tmp_path: Path):
    """vLLM 0.32's CPU build builds each module itself (tests/oracle_vllm_modelopt.py: its
    ModelOptMixedPrecisionConfig and a ReplicatedLinear per prefix) and reports the bytes of the parameters it keeps
    after its post-load step; kvplan's per-part rule must give the same for every format and shape."""
    import oracle_vllm as ov

    cases = [{"prefix": f"model.layers.{i}.mlp.m{j}", "algo": algo, "group": 16 if "NVFP4" in algo else None,
              "out": out, "in": inp}
             for i, algo in enumerate(MIXED_ALGOS) for j, (out, inp) in enumerate(ORACLE_SHAPES)]
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    script = Path(__file__).with_name("oracle_vllm_modelopt.py")
    run = subprocess.run([ov.vllm_python(), str(script), str(spec)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    entries = tuple((c["prefix"], (c["algo"], c["group"] or 16)) for c in cases)
    for c, got in zip(cases, measured):
        part = WeightPart(c["prefix"].split(".", 3)[-1], (c["out"], c["in"]), "linear", "text", "column",
                          int(c["prefix"].split(".")[2]))
        quant = Quantization("mixed", "oracle", mixed_entries=entries,
                             part_formats=(((part.name, part.layer, part.part), (c["algo"], c["group"] or 16)),))
        fmt = weights.WeightFormat("mixed", "oracle", quant)
        assert weights.part_bytes(part, fmt, 2) == got["bytes"], (c, got["created"])


def test_a_mixed_config_without_its_map_takes_the_files(tmp_path: Path):
    """vLLM 0.32 (model_loader/weight_utils.py get_quant_config): a MIXED_PRECISION quantization_config without
    quantized_layers falls through to hf_quant_config.json, where older exports keep the per-module map."""
    name = "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
    config = json.loads((DATA / f"{name}_config.json").read_text())
    stub = {**config, "quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                              "kv_cache_quant_algo": "FP8"}}
    with_file, alone, as_shipped = (tmp_path / d for d in ("with_file", "alone", "as_shipped"))
    for folder in (with_file, alone, as_shipped):
        folder.mkdir()
    for folder in (with_file, as_shipped):
        shutil.copy(DATA / f"{name}_hf_quant_config.json", folder / "hf_quant_config.json")
    mapped = size(with_file, stub)
    assert mapped["weight_dtype"] == "mixed" and not mapped["warnings"]
    assert mapped["weight_bytes"] == size(as_shipped, config)["weight_bytes"]
    unmapped = size(alone, stub)
    assert unmapped["weight_dtype"] == "bf16" and any("no quantized_layers" in w for w in unmapped["warnings"])
