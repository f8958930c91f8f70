"""Gemma 1/2/3: explicit head_dim, 4 norms per layer from Gemma-2 on, local/global layer patterns, tied embeddings.

Gemma-3 configs (the multimodal text_config especially) omit fields that come from Gemma3TextConfig class
defaults; architectures/defaults.py holds them.
"""

from __future__ import annotations

from kvplan.architectures import decoder
from kvplan.architectures.base import Cfg

_QUIRKS = {
    "gemma": decoder.Quirks(mlp_bias=False, tied_default=True, sliding="none"),
    "gemma2": decoder.Quirks(mlp_bias=False, norms_per_layer=4, tied_default=True),
    "gemma3_text": decoder.Quirks(mlp_bias=False, norms_per_layer=4, qk_norm="head_dim", tied_default=True),
}


def _pattern(c: Cfg, model_type: str, n: int) -> list[str]:
    """Gemma-2: layer i is sliding iff (i+1) % 2; Gemma-3: full iff (i+1) % sliding_window_pattern == 0 (default 6)."""
    if model_type == "gemma2":
        period = 2
    else:
        period = int(c.raw.get("sliding_window_pattern") or c.raw.get("_sliding_window_pattern") or 6)
    return ["sliding" if (i + 1) % period else "full" for i in range(n)]


def build(top: Cfg, c: Cfg):
    model_type = str(c.get("model_type", default="gemma"))
    if model_type == "gemma3":
        model_type = "gemma3_text"
    q = _QUIRKS.get(model_type, _QUIRKS["gemma"])
    if model_type != "gemma" and c.raw.get("layer_types") is None:
        kinds = _pattern(c, model_type, c.need_int("num_hidden_layers"))
        c = Cfg({**c.raw, "layer_types": [f"{k}_attention" for k in kinds]}, c.defaults, c.where)
    return decoder.build(top, c, q)
