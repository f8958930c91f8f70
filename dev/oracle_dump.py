"""Dump oracle figures (params + KV-cache bytes from real transformers code on meta).

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python dev/oracle_dump.py                # all configs -> dev/oracle_figures.json
    HF_HUB_OFFLINE=1 .venv/bin/python dev/oracle_dump.py NAME [NAME..]  # subset, merged into the JSON
    HF_HUB_OFFLINE=1 .venv/bin/python dev/oracle_dump.py --validate-real  # meta vs real-CPU spot check

batch=1, dtype float16, ctx_short=16, ctx_long=min(8200, max_forward_positions(config)).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import oracle_hf as o  # noqa: E402

OUT = ROOT / "dev" / "oracle_figures.json"
CTX_SHORT = 16
CTX_CAP = 8200
DTYPE = "float16"


def cache_entry(rep: dict) -> dict:
    def layer_rows(layers):
        return [[[t[0], list(t[1]), t[2], t[3]] for t in l["tensors"]] for l in layers]

    e = {
        "total": rep["total"],
        "self_bytes": rep["self_bytes"],
        "cross_bytes": rep["cross_bytes"],
        "aux_bytes_excluded": rep["aux_bytes"],
        "cache_class": rep["cache_class"],
        "encoder_len": rep["encoder_len"],
        "per_layer_bytes": [l["bytes"] for l in rep["layers"]],
        "per_layer_class": [l["class"] for l in rep["layers"]],
        "per_layer_tensors": layer_rows(rep["layers"]),
        "patches": rep["patches"],
    }
    if rep["cross_layers"]:
        e["cross_per_layer_bytes"] = [l["bytes"] for l in rep["cross_layers"]]
        e["cross_per_layer_tensors"] = layer_rows(rep["cross_layers"])
    if rep["extra_tensors"]:
        e["extra_tensors"] = [[n, list(s), d, b] for n, s, d, b in rep["extra_tensors"]]
    return e


def dump_one(name: str) -> dict:
    if not o.buildable(name):
        return {"error": "unsupported: " + o.SKIP_REMOTE_CODE.get(name, "no config.json")}
    cfg = o.load_config(name)
    rec: dict = {"seconds": {}}
    try:
        t = time.perf_counter()
        p = o.hf_param_counts(cfg)
        rec["seconds"]["params"] = round(time.perf_counter() - t, 3)
        rec.update({k: p[k] for k in ("class", "params", "tied", "tie_word_embeddings_cfg", "vision_params",
                                        "encoder_params", "mtp_params", "mtp_in_main_class",
                                        "num_mtp_layers_cfg", "buffers_numel", "shared_params", "by_prefix")})
    except Exception as e:  # pragma: no cover - recorded, not raised
        rec["error"] = f"params: {e!r}"
        rec["traceback"] = traceback.format_exc(limit=-4)
        return rec
    lim = o.max_forward_positions(cfg)
    ctx_long = CTX_CAP if lim is None else min(CTX_CAP, lim)
    rec["max_forward_positions"] = lim
    rec["ctx"] = [CTX_SHORT, ctx_long]
    rec["cache"] = {}
    for ctx in (CTX_SHORT, ctx_long):
        try:
            t = time.perf_counter()
            rep = o.hf_cache_bytes(cfg, 1, ctx, DTYPE)
            rec["seconds"][f"cache_{ctx}"] = round(time.perf_counter() - t, 3)
            rec["seconds"][f"cache_{ctx}_detail"] = rep["seconds"]
            rec["cache"][str(ctx)] = cache_entry(rep)
        except Exception as e:
            rec.setdefault("errors", {})[str(ctx)] = repr(e)
            rec["error"] = f"cache ctx={ctx}: {e!r}"
    return rec


# --------------------------------------------------------------------------- meta vs real check
# Reduced copies of bundled configs (fewer layers / experts / smaller vocab / shorter windows so a
# real CPU forward is cheap).  Per-layer attention/SSM dims are untouched.  For each case the cache
# from a REAL float16 CPU forward (default "eager" experts, random weights, random token ids) is
# compared tensor-by-tensor (layer class, tensor name, shape, dtype) with the meta oracle.
import copy as _copy  # noqa: E402

VALIDATE_CASES = [
    # (dirname, ctx, overrides applied to text config (or top-level), top-level overrides)
    ("openai-community--gpt2", 20, {"n_layer": 2}, {}),
    ("google--gemma-3-1b-it", 40, {"num_hidden_layers": 7, "sliding_window": 16, "vocab_size": 1024}, {}),
    ("google--gemma-2-9b", 40, {"num_hidden_layers": 2, "sliding_window": 16, "vocab_size": 1024}, {}),
    ("mistralai--Mistral-7B-v0.1", 40, {"num_hidden_layers": 2, "sliding_window": 16, "vocab_size": 1024}, {}),
    ("openai--gpt-oss-20b", 40, {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"],
                                 "sliding_window": 16, "num_local_experts": 4}, {}),
    ("meta-llama--Llama-4-Scout-17B-16E-Instruct", 40, {"num_hidden_layers": 4, "attention_chunk_size": 16,
                                                        "num_local_experts": 2}, {}),
    ("deepseek-ai--DeepSeek-V2-Lite", 16, {"num_hidden_layers": 2, "n_routed_experts": 8, "vocab_size": 1024}, {}),
    ("deepseek-ai--DeepSeek-V3", 16, {"num_hidden_layers": 2, "first_k_dense_replace": 1, "n_routed_experts": 16,
                                      "vocab_size": 1024}, {}),
    ("state-spaces--mamba-2.8b-hf", 16, {"num_hidden_layers": 2, "vocab_size": 1024}, {}),
    ("ai21labs--Jamba-v0.1", 16, {"num_hidden_layers": 8, "num_experts": 2, "vocab_size": 1024}, {}),
    ("Qwen--Qwen3-Next-80B-A3B-Thinking", 16, {"num_hidden_layers": 4, "num_experts": 16, "vocab_size": 1024}, {}),
    ("nvidia--Nemotron-H-56B-Base-8K", 16, {"num_hidden_layers": 9, "hybrid_override_pattern": "M-M-M-M*-",
                                            "vocab_size": 1024}, {}),
    ("tiiuae--falcon-7b", 16, {"n_layer": 2, "vocab_size": 1024}, {}),
    ("bigscience--bloom-7b1", 16, {"n_layer": 2, "vocab_size": 1024}, {}),
    ("mosaicml--mpt-7b-instruct", 16, {"n_layers": 2, "vocab_size": 1024}, {}),
    ("google-t5--t5-large", 16, {"num_layers": 2, "num_decoder_layers": 2, "vocab_size": 1024}, {}),
    ("openai--whisper-large-v3", 16, {"encoder_layers": 1, "decoder_layers": 2}, {}),
    ("google--gemma-3-4b-it", 40, {"num_hidden_layers": 6, "sliding_window": 16, "vocab_size": 1024}, {}),
]


def _reduced(cfg, text_over, top_over):
    c = _copy.deepcopy(cfg)
    tgt = c["text_config"] if isinstance(c.get("text_config"), dict) else c
    tgt.update(text_over)
    c.update(top_over)
    if "vision_config" in c and isinstance(c["vision_config"], dict):
        for k in ("num_hidden_layers", "depth"):
            if k in c["vision_config"] or k == "num_hidden_layers":
                c["vision_config"][k] = 1
    return c


def _sig(rep):
    return [(l["class"], [(t[0], tuple(t[1]), t[2]) for t in l["tensors"]])
            for l in rep["layers"] + rep["cross_layers"]]


def validate_real(argv):
    names = [a for a in argv if not a.startswith("-")]
    ok = True
    for name, ctx, text_over, top_over in VALIDATE_CASES:
        if names and name not in names:
            continue
        cfg = _reduced(o.load_config(name), text_over, top_over)
        t = time.perf_counter()
        try:
            meta = o.hf_cache_bytes(cfg, 1, ctx, DTYPE)
            real = o.hf_cache_bytes(cfg, 1, ctx, DTYPE, device="cpu", experts_implementation=None)
            same = _sig(meta) == _sig(real) and meta["total"] == real["total"]
            ok &= same
            print(f"{name:45s} ctx={ctx:3d} meta={meta['total']} real={real['total']} "
                  f"{'MATCH' if same else 'MISMATCH'} [{time.perf_counter() - t:.1f}s]", flush=True)
            if not same:
                for a, b in zip(_sig(meta), _sig(real)):
                    if a != b:
                        print("   meta", a, "\n   real", b)
            else:
                seen = set()
                for cls, ts in _sig(real):
                    key = (cls, tuple(ts))
                    if key not in seen:
                        seen.add(key)
                        print("    ", cls, ts)
        except Exception as e:
            ok = False
            print(f"{name:45s} ERROR {e!r}"[:400], flush=True)
            traceback.print_exc(limit=-3)
    return 0 if ok else 1


def main(argv):
    names = [a for a in argv if not a.startswith("-")]
    all_names = sorted(d.name for d in o.CONFIG_ROOT.iterdir() if (d / "config.json").is_file())
    todo = names or all_names
    data = {}
    if names and OUT.exists():
        data = json.loads(OUT.read_text())
    data.setdefault("_meta", {})
    import torch
    import transformers

    data["_meta"] = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "batch": 1,
        "dtype": DTYPE,
        "ctx_short": CTX_SHORT,
        "ctx_cap": CTX_CAP,
        "device": "meta",
        "notes": "see docs/research/ORACLE_NOTES.md; total excludes 0-d bookkeeping tensors (aux_bytes_excluded)",
    }
    t_all = time.perf_counter()
    for n in todo:
        t = time.perf_counter()
        data[n] = dump_one(n)
        c = data[n].get("cache", {})
        print(f"{n:45s} params={data[n].get('params')} "
              + " ".join(f"ctx{k}={v['total']}" for k, v in c.items())
              + (f" ERROR={data[n]['error'][:120]}" if "error" in data[n] else "")
              + f" [{time.perf_counter() - t:.1f}s]", flush=True)
    data["_meta"]["wall_seconds_last_run"] = round(time.perf_counter() - t_all, 1)
    ordered = {"_meta": data.pop("_meta")}
    ordered.update({k: data[k] for k in sorted(data)})
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"wrote {OUT} in {time.perf_counter() - t_all:.1f}s")


if __name__ == "__main__":
    if "--validate-real" in sys.argv:
        sys.exit(validate_real(sys.argv[1:]))
    main(sys.argv[1:])
