"""Step-3.7 (model_type step3p7), checked against the code that runs it.

- Parameters: transformers 5.24's Step3p7ForConditionalGeneration built on the meta device (tests/oracle_hf.py): the
  bundled Step-3.7-Flash file (aiconfigurator's flat, text-only Step3p7FlashForCausalLM: its fields become the
  wrapper's text_config, the tower left out) and small configs in the Hub release's own spelling (nested step3p5
  text_config with moe_num_experts / moe_top_k / num_attention_groups / moe_layers_enum / attention_other_setting,
  layer_types padded with the MTP layers, a perception_encoder vision_config). The MTP layers (part "mtp", outside
  params) against transformers' own MtpModel blocks plus the per-layer head the checkpoint and vLLM's Step3p5MTP hold.
- `--engine hf` bytes: transformers' DynamicCache after a real CPU forward of scaled copies (MoE layers included),
  inside and beyond the sliding window; the full-size file on meta runs in tests/test_oracle_hf.py.
- `--engine vllm` layout: vLLM 0.32's CPU build cannot start Step-3.7 here -- it has no Step3p7FlashForCausalLM;
  Step3p7ForConditionalGeneration needs torchvision to be inspected (absent from the CPU venv) and, with transformers
  5.19's Step3p7TextConfig, stops at AmbiguousGlobalPerLayerAttributeError (num_attention_heads per layer) when the
  sliding layers run other heads. The language model it builds for Step3p7ForConditionalGeneration is
  Step3p5ForCausalLM (model_executor/models/step3p7.py -> init_vllm_registered_model(text_config)), so that class ran
  on scaled vendor-spelled copies; kvplan sized the same geometry written as the bundled file is. Recorded below,
  `-m engine` reruns vLLM live.

Where each rule lives: the docstring of kvplan/architectures/step.py.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, kvjson, run_cli, vllm_cpu_fit, write_config
from kvplan.architectures import normalize
from kvplan.sizing import EngineOptions, ModelOptions, size

BUNDLED = ROOT / "model_configs" / "stepfun-ai--Step-3.7-Flash" / "config.json"
FP8_QUANTIZATION = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


def _load(path: Path = BUNDLED) -> dict:
    return json.loads(path.read_text())



def release_shaped(layers: int = 8, mtp: int = 3, **text) -> dict:
    """A small config in the Hub release's spelling (vendor keys transformers absorbs through attribute_map and
    __post_init__): sliding layers with 6 query heads against the full layers' 4, layer_types and moe_layers_enum
    covering the MTP layers too, a perception_encoder tower, the top-level tie flag unset."""
    types = (["full_attention"] + ["sliding_attention"] * 3) * (layers // 4) + ["full_attention"] * (layers % 4)
    t = {"model_type": "step3p5", "architectures": ["Step3p5ForCausalLM"], "hidden_size": 96,
         "num_hidden_layers": layers, "vocab_size": 300, "num_attention_heads": 4, "num_attention_groups": 2,
         "head_dim": 32, "intermediate_size": 80, "moe_num_experts": 6, "moe_top_k": 2, "moe_intermediate_size": 24,
         "share_expert_dim": 40, "moe_layers_enum": ",".join(str(i) for i in range(3, layers + mtp)),
         "layer_types": types + ["sliding_attention"] * mtp, "sliding_window": 32, "num_nextn_predict_layers": mtp,
         "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 6,
                                     "num_attention_groups": 2, "head_dim": 32},
         "max_position_embeddings": 4096, "use_head_wise_attn_gate": True, "moe_router_activation": "sigmoid",
         "use_moe_router_bias": True, "moe_router_scaling_factor": 3.0, "tie_word_embeddings": False}
    t.update(text)
    return {"architectures": ["Step3p7ForConditionalGeneration"], "model_type": "step3p7", "torch_dtype": "bfloat16",
            "image_token_id": 299, "text_config": t,
            "vision_config": {"model_type": "perception_encoder", "width": 48, "layers": 2, "heads": 4,
                              "image_size": 56, "patch_size": 14, "mlp_ratio": 2.5}}


def resaved(config: dict) -> dict:
    """The same model as transformers 5.24 writes it back (n_routed_experts, mlp_layer_types, per_layer_config,
    num_sliding_attention_heads, mtp_layer_types ...)."""
    from transformers import Step3p7Config

    d = copy.deepcopy(config)
    d.pop("architectures"), d.pop("model_type"), d.pop("torch_dtype")
    out = Step3p7Config(**d).to_dict()
    out["architectures"] = config["architectures"]
    t = out["text_config"]
    assert "per_layer_config" in t and "moe_layers_enum" not in t and "attention_other_setting" not in t
    return out


@pytest.fixture(scope="module")
def oracle():
    pytest.importorskip("torch")
    pytest.importorskip("transformers.models.step3p7")
    import oracle_hf

    return oracle_hf


# ---------------------------------------------------------------------------------------------- parameters
def test_bundled_flash_equals_the_meta_device_count(oracle):
    config = _load()
    spec = normalize(config)
    truth = oracle.hf_param_counts(config)
    assert truth["params"] == spec.params == 195_844_496_640
    assert spec.params_of("text") == spec.params and spec.params_of("vision") == truth["vision_params"] == 0
    assert not spec.tied_embeddings and not truth["tied"] and not spec.warnings
    # transformers will not build this file's MTP model: 45 layer_types and no MTP entries are 'ambiguous' to it
    assert "ambiguous" in truth["mtp_error"]
    assert spec.mtp_layers == 3 and spec.params_of("mtp") == 2_327_114_496


VARIANTS = {
    "release-shaped": lambda: release_shaped(),
    "release-resaved": lambda: resaved(release_shaped()),
    # no vision_config: Step3p7Config builds its default 47-layer, 1,536-wide tower
    "default-tower": lambda: {k: v for k, v in release_shaped().items() if k != "vision_config"},
    # the gate as transformers' gating field spells it: false -> a full-width gate [heads x head_dim]
    "full-width-gate": lambda: release_shaped(gating=False),
    "per-head-gate": lambda: release_shaped(gating="per-head"),
    # biases on q/k/v/o and on every MLP (dense and shared expert); ties by the wrapper's own flag
    "biases-tied": lambda: {**release_shaped(attention_bias=True, mlp_bias=True), "tie_word_embeddings": True,
                            "projector_bias": True},
    # the text_config's tie flag is not what Step3p7ForConditionalGeneration ties by
    "text-tie-ignored": lambda: release_shaped(tie_word_embeddings=True),
    # transformers' own spellings, MoE everywhere but layer 1, no MTP, no layer_types (all full attention)
    "native-spelling": lambda: release_shaped(
        mtp=0, moe_num_experts=None, moe_layers_enum=None, layer_types=None, attention_other_setting=None,
        n_routed_experts=5, num_experts_per_tok=2, mlp_layer_types=["sparse", "dense"] + ["sparse"] * 6,
        num_sliding_attention_heads=8),
    # the flat curated shape, scaled (its num_experts / first_k_dense_replace agree with the engines' reading)
    "flat-curated": lambda: _scaled_flat(8, 32),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_small_configs_equal_the_meta_device_count(oracle, name):
    config = VARIANTS[name]()
    config = json.loads(json.dumps(config))
    for d in (config, config.get("text_config") or {}):
        for k in [k for k, v in d.items() if v is None and k != "vision_config"]:
            d.pop(k)
    spec = normalize(copy.deepcopy(config))
    truth = oracle.hf_param_counts(config)
    assert spec.params == truth["params"]
    assert spec.params_of("vision") == truth["vision_params"]
    assert spec.tied_embeddings == truth["tied"]
    assert not spec.warnings


def test_the_default_tower_figure():
    """Step3p7VisionConfig's defaults (1,536 wide, 47 layers, 728 px / 14, mlp_ratio 8960/1536) and the projector to a
    4,096-wide text model: 1,981,014,784 parameters (transformers 5.24 on meta)."""
    config = {k: v for k, v in release_shaped(hidden_size=4096).items() if k != "vision_config"}
    assert normalize(config).params_of("vision") == 1_981_014_784


def test_mtp_layers_are_transformers_mtp_blocks_plus_their_own_heads(oracle):
    """vLLM's Step3p5MTP and the checkpoint (model.layers.{n+j}: enorm, hnorm, eh_proj, the decoder block,
    shared_head.norm, shared_head.output) against transformers' MtpModel, which builds the same layers but borrows the
    main model's lm_head (its post_norm is the shared_head.norm). Sliding heads = full heads here: transformers'
    MtpModel reads the main layers' per_layer_config by MTP index."""
    import torch
    from transformers.modeling_layers import MtpModel

    config = release_shaped(attention_other_setting=None)
    config["text_config"]["moe_layers_enum"] = "3,4,5,6,7,9,10"  # MTP layer 8 dense, 9 and 10 MoE
    spec = normalize(copy.deepcopy(config))
    model = oracle.build_meta_model(config)
    with torch.device("meta"):
        mtp = MtpModel(model, 3)
    main = {id(p) for p in model.parameters()}
    own = sum(p.numel() for p in mtp.parameters() if id(p) not in main)
    t = config["text_config"]
    assert spec.params_of("mtp") == own + 3 * t["vocab_size"] * t["hidden_size"]
    kinds = {w.layer: w.name for w in spec.weights if w.part == "mtp" and w.name in ("mlp.gate_proj", "mlp.gate")}
    assert kinds == {8: "mlp.gate_proj", 9: "mlp.gate", 10: "mlp.gate"}


# ---------------------------------------------------------------------------------------------- hf cache
def _scaled_flat(layers: int, window: int) -> dict:
    """The bundled file narrowed (same KV geometry: 8 KV heads x 128, full/sliding pattern; 4 routed experts)."""
    d = _load()
    d["layer_types"] = d["layer_types"][:layers]
    d.update(num_hidden_layers=layers, hidden_size=64, intermediate_size=32, moe_intermediate_size=16,
             share_expert_dim=16, vocab_size=256, sliding_window=window, num_experts=4, n_routed_experts=4,
             num_experts_per_tok=2)
    return d


SCALED = {
    "flash": lambda: _scaled_flat(8, 32),
    "release-shaped": lambda: release_shaped(),
}


@pytest.mark.parametrize("name", sorted(SCALED))
def test_hf_cache_equals_a_real_cpu_forward(oracle, tmp_path, name):
    """Full layers hold every token, sliding layers window - 1 = 31 (DynamicSlidingWindowLayer); the MoE layers run
    their eager expert loop on CPU."""
    config = SCALED[name]()
    path = write_config(tmp_path, name, config)
    for ctx in (20, 50):
        truth = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="float32", device="cpu",
                                      experts_implementation=None)
        assert not truth["meta_dense_mlp"]
        plan = size(ModelOptions(path), EngineOptions(engine="hf", kv_dtype="fp32"), ctx, batch=2).plan
        assert plan.kv_bytes == truth["total"], f"ctx {ctx}"
        kept = {t[1][2] for layer in truth["layers"] if layer["class"] == "DynamicSlidingWindowLayer"
                for t in layer["tensors"]}
        assert kept == {min(ctx, 31)}
        full = [layer for layer in truth["layers"] if layer["class"] == "DynamicLayer"]
        assert len(full) == 2 and all(t[1][2] == ctx for layer in full for t in layer["tensors"])


# ---------------------------------------------------------------------------------------------- figures (no torch)
def test_bundled_flash_sizes_per_engine():
    """12 full + 33 sliding-512 layers, 8 KV heads x 128 (K and V, bf16: 4,096 B per token per layer)."""
    per_layer = 8 * 128 * 2 * 2
    vllm = kvjson("size", "step-3.7-flash", "--ctx", "4096")
    groups = {g["kind"]: g for g in vllm["groups"]}
    assert (groups["full"]["layers"], groups["sliding"]["layers"]) == (12, 33)
    assert groups["sliding"]["window"] == 512 and groups["full"]["kv_heads"] == groups["sliding"]["kv_heads"] == 8
    assert vllm["params"] == 195_844_496_640 and vllm["kv_dtype"] == "bf16"
    # at 4,096 the sliding layers still hold every token (window 511 + 4,096 in flight >= ctx): all 45 layers grow
    assert vllm["kv_bytes_per_token"] == 45 * per_layer == 184_320
    # full: 4,096 tokens; sliding: cdiv(4096, 16) + 1 = 257 blocks of 16 per slot, the 33 layers in 3 groups of 12
    # slots (one group per 12 full layers' page pattern: 3 padding slots)
    assert groups["full"]["bytes"] == 12 * 4096 * per_layer
    assert groups["sliding"]["bytes"] == 3 * 12 * 257 * 16 * per_layer
    assert vllm["kv_bytes"] == 807_665_664
    hf = kvjson("size", "step-3.7-flash", "--ctx", "4096", "--engine", "hf")
    assert hf["kv_bytes"] == (12 * 4096 + 33 * 511) * per_layer == 270_397_440
    assert hf["kv_bytes_per_token"] == 12 * per_layer


def test_the_fp8_export_reads_its_block_scales(tmp_path):
    """stepfun-ai--Step-3.7-Flash-FP8 (aiconfigurator, same commit) is the bundled file plus this quantization_config:
    fp8 linear and expert weights with one fp32 scale per 128 x 128 block; embeddings, lm_head, norms and routers
    bf16."""
    path = write_config(tmp_path, "fp8", {**_load(), "quantization_config": FP8_QUANTIZATION})
    out = kvjson("size", path, "--ctx", "4096")
    assert out["weight_dtype"] == "fp8" and out["params"] == 195_844_496_640

    def fp8(rows, cols, count=1):
        return count * (rows * cols + -(-rows // 128) * -(-cols // 128) * 4)

    h, vocab, experts = 4096, 128_896, 288
    attn = fp8(8192, h) + 2 * fp8(1024, h) + fp8(h, 8192) + fp8(64, h)  # q, k, v, o, g_proj
    norms = 2 * 128 + 2 * h
    dense = 2 * fp8(11264, h) + fp8(h, 11264)
    moe = fp8(2 * 1280, h, experts) + fp8(h, 1280, experts) + 2 * fp8(1280, h) + fp8(h, 1280)
    expected = 3 * (attn + dense) + 42 * (attn + moe) + 45 * norms * 2 + 42 * experts * h * 2 + (2 * vocab * h + h) * 2
    assert out["weight_bytes"] == expected


def test_mtp_weights_only_with_speculative_decoding():
    spec = normalize(_load())
    mtp = [w for w in spec.weights if w.part == "mtp"]
    assert {w.layer for w in mtp} == {45, 46, 47}
    heads = [w for w in mtp if w.name == "shared_head.head"]
    assert len(heads) == 3 and all(w.shape == (128_896, 4096) for w in heads)  # each MTP layer its own head


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("change, words", [
    ({"num_experts": 64}, "num_experts 64 contradicts the 288 routed experts"),
    ({"first_k_dense_replace": 1}, "first_k_dense_replace 1 contradicts"),
    ({"n_shared_experts": 2}, "one shared expert"),
    ({"attention_other_setting": {"num_attention_heads": 96, "num_attention_groups": 4}}, "kvplan will not pick one"),
    ({"attention_other_setting": {"attention_type": "full_attention", "num_attention_heads": 96}}, "attention_type"),
    ({"sparse_attention_config": {"sparse_attention_freq": [1] * 45}}, "lightning indexer"),
    ({"layer_types": ["full_attention"] * 44}, "one entry per layer (45 or 48"),
    ({"layer_types": ["chunked_attention"] * 45}, "full_attention / sliding_attention"),
    ({"moe_layers_enum": "3,4,x"}, "moe_layers_enum must be"),
    ({"gating": "per-token"}, "gating must be"),
])
def test_what_the_engines_read_differently_is_refused(tmp_path, change, words):
    config = {**_load(), **change}
    if "moe_layers_enum" in change:
        config.pop("first_k_dense_replace")
    r = run_cli("size", write_config(tmp_path, "bad", config))
    assert r.code == 2 and r.err.count("\n") == 1 and words in r.err, r.err


def test_curated_fields_that_agree_are_accepted():
    agree = {**_load(), "moe_layers_enum": ",".join(map(str, range(3, 45))), "n_shared_experts": 1}
    assert normalize(agree).params == 195_844_496_640
    explicit = {**_load(), "n_routed_experts": 288, "moe_num_experts": 288}
    assert normalize(explicit).params == 195_844_496_640


# ---------------------------------------------------------------------------------------------- vLLM
def vllm_text(name: str) -> dict:
    """The Step-3.7 language model as vLLM 0.32 builds it (Step3p5ForCausalLM, vLLM's own Step3p5Config): the
    release's text_config spelling, scaled (what ran in vLLM's CPU build)."""
    g = VLLM_MODELS[name]
    n = len(g["layer_types"])
    return {"architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5", "torch_dtype": "bfloat16",
            "hidden_size": 256, "num_hidden_layers": n, "vocab_size": 256, "num_attention_heads": g["heads"],
            "num_attention_groups": g["kv"], "head_dim": g["head_dim"], "intermediate_size": 64,
            "moe_num_experts": 4, "moe_top_k": 2, "moe_intermediate_size": 32, "share_expert_dim": 32,
            "moe_layers_enum": ",".join(str(i) for i in range(3, n)), "layer_types": g["layer_types"],
            "sliding_window": g["window"], "max_position_embeddings": 65536, "use_head_wise_attn_gate": True,
            "rope_theta": 10000.0}


def kvplan_text(name: str) -> dict:
    """The same geometry written as the bundled file is (flat step3p7, Step3p7FlashForCausalLM)."""
    g = VLLM_MODELS[name]
    n = len(g["layer_types"])
    return {"architectures": ["Step3p7FlashForCausalLM"], "model_type": "step3p7", "torch_dtype": "bfloat16",
            "num_hidden_layers": n, "hidden_size": 256, "num_attention_heads": g["heads"],
            "num_key_value_heads": g["kv"], "head_dim": g["head_dim"], "vocab_size": 256,
            "max_position_embeddings": 65536, "intermediate_size": 64, "sliding_window": g["window"],
            "layer_types": g["layer_types"], "first_k_dense_replace": 3, "num_experts": 4, "n_routed_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32, "share_expert_dim": 32}


VLLM_MODELS = {
    # the Flash geometry: its 45 layer_types (12 full + 33 sliding-512), 64 heads / 8 KV heads x 128
    "s37": {"layer_types": _load()["layer_types"], "heads": 64, "kv": 8, "head_dim": 128, "window": 512},
    # another window and KV width: 4 full + 11 sliding-128 layers, 16 heads / 4 KV heads x 64
    "s37-w128": {"layer_types": (["full_attention"] + ["sliding_attention"] * 3) * 3 + ["full_attention"]
                 + ["sliding_attention"] * 2, "heads": 16, "kv": 4, "head_dim": 64, "window": 128},
}
# vLLM 0.32.0 CPU build (vllm_child.py, VLLM_CPU_KVCACHE_SPACE=1, max_model_len 4096, dummy weights): tokens,
# num_gpu_blocks, printed concurrency, bytes per block, groups as (layers, spec, block size, page, blocks/request)
VLLM_032_CPU = {
    ("s37", 128): (5315, 170, "1.30", 6_291_456,
                   [(12, "FullAttentionSpec", 128, 524_288, 32)] + [(11, "SlidingWindowSpec", 128, 524_288, 33)] * 3),
    ("s37", 32): (5424, 682, "1.32", 1_572_864,
                  [(12, "FullAttentionSpec", 32, 131_072, 128)] + [(11, "SlidingWindowSpec", 32, 131_072, 129)] * 3),
    ("s37-w128", 128): (64035, 2048, "15.63", 524_288,
                        [(4, "FullAttentionSpec", 128, 131_072, 32)] + [(4, "SlidingWindowSpec", 128, 131_072, 33)] * 2
                        + [(3, "SlidingWindowSpec", 128, 131_072, 33)]),
    ("s37-w128", 32): (65154, 8192, "15.91", 131_072,
                       [(4, "FullAttentionSpec", 32, 32_768, 128)] + [(4, "SlidingWindowSpec", 32, 32_768, 129)] * 2
                       + [(3, "SlidingWindowSpec", 32, 32_768, 129)]),
}


@pytest.mark.parametrize("name, block", sorted(VLLM_032_CPU))
def test_vllm_layout_equals_vllm_032_cpu(tmp_path, name, block):
    """What vLLM decided for the same geometry: 1 GiB, block 128 (the CPU default) or 32, no async scheduling."""
    tokens, blocks, concurrency, per_block, groups = VLLM_032_CPU[(name, block)]
    r = vllm_cpu_fit(write_config(tmp_path, name, kvplan_text(name)), block)
    d = r["engine_details"]
    assert (r["kv_capacity_tokens"], d["num_gpu_blocks"], f"{r['concurrency']:.2f}") == (tokens, blocks, concurrency)
    assert d["bytes_per_block"] == per_block
    assert d["blocks_per_request"] == sum(g[4] for g in groups)


@pytest.mark.engine
def test_vllm_032_cpu_live(tmp_path):
    """Reruns vLLM (KVPLAN_VLLM_PYTHON, else this interpreter) on the vendor-spelled files and checks the recorded
    table; the flat curated file itself is refused by vLLM (no Step3p7FlashForCausalLM)."""
    import oracle_vllm as ov

    probe = subprocess.run([ov.vllm_python(), "-c", "import vllm"], capture_output=True)
    if probe.returncode:
        pytest.skip("vLLM is not importable here (tests/test_engine_vllm.py says how CI installs it)")
    spec = []
    for name in sorted(VLLM_MODELS):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(vllm_text(name)))
        spec += [{"id": f"{name}-{block}", "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
                  "kwargs": {"model": str(folder), "load_format": "dummy", "skip_tokenizer_init": True,
                             "max_model_len": 4096, "enforce_eager": True, "seed": 0, "block_size": block}}
                 for block in (128, 32)]
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "config.json").write_text(json.dumps(kvplan_text("s37")))
    spec.append({"id": "flat", "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
                 "kwargs": {"model": str(flat), "load_format": "dummy", "skip_tokenizer_init": True,
                            "max_model_len": 4096, "enforce_eager": True}})
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out.jsonl"
    subprocess.run([ov.vllm_python(), ov.vllm_child.__file__, str(tmp_path / "spec.json"), str(out)],
                   env={**os.environ, **ov.CHILD_ENV}, cwd=str(tmp_path), timeout=900, check=False)
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines()) if r["id"] != "__import__"}
    assert "Step3p7FlashForCausalLM" in results["flat"]["error"] and "not supported" in results["flat"]["error"]
    for name, block in sorted(VLLM_032_CPU):
        r = results[f"{name}-{block}"]
        assert "error" not in r, r.get("error")
        tokens, blocks, concurrency, per_block, groups = VLLM_032_CPU[(name, block)]
        assert (r["tokens"], r["num_blocks"], r["printed"]["concurrency"], r["bytes_per_block"]) == (
            tokens, blocks, concurrency, per_block)
        assert [(g["layers"], g["spec"], g["block_size"], g["page_size_bytes"], g["blocks_per_request"])
                for g in r["groups"]] == groups
        assert [g["sliding_window"] for g in r["groups"] if g["spec"] == "SlidingWindowSpec"] == [
            VLLM_MODELS[name]["window"]] * sum(g[1] == "SlidingWindowSpec" for g in groups)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
