"""Cohere2 (Command-R7B, Command-A; model_type cohere2): interleaved sliding-window attention.

transformers 5.24 models/cohere2 (configuration_cohere2.py Cohere2Config.__post_init__, modeling_cohere2.py):
* layer kinds: layer_types when the file has them, else layer i slides iff (i + 1) % sliding_window_pattern != 0
  (the constructor pops sliding_window_pattern, default 4): three sliding (RoPE) layers, then one full-attention
  layer without positional embedding (NoPE); the window is sliding_window (class default 4096).
* head_dim is always hidden_size // num_attention_heads (__post_init__ overwrites whatever the file says).
* the block is parallel: one weight-only LayerNorm per layer feeds attention and the SwiGLU MLP side by side;
  q/k/v/o carry attention_bias, the MLP has no bias; tied embeddings (class default), logits x logit_scale (a
  scalar, no parameter).

vLLM 0.32 (model_executor/models/commandr.py) and SGLang 0.5.10 (srt/models/commandr.py) read the same config
object but build q/k/v/o without bias and a q/k LayerNorm when use_qk_norm is set (transformers' Cohere2 builds
none): such files are refused here, as the engines and transformers would not hold the same model.
"""

from __future__ import annotations

from kvplan.architectures import decoder
from kvplan.architectures.base import Cfg
from kvplan.errors import ConfigError

QUIRKS = decoder.Quirks(mlp_bias=False, norms_per_layer=1, tied_default=True)
DEFAULT_PATTERN = 4  # Cohere2Config.__post_init__: kwargs.pop("sliding_window_pattern", 4)


def layer_types(c: Cfg, n: int) -> list[str]:
    """The config's layer_types, or the ones Cohere2Config.__post_init__ writes from sliding_window_pattern."""
    if c.raw.get("layer_types") is not None:
        return list(c.raw["layer_types"])
    period = c.raw.get("sliding_window_pattern", DEFAULT_PATTERN)
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        raise ConfigError(f"{c.where}: sliding_window_pattern must be a positive layer count for Cohere2 "
                          f"(transformers computes (i + 1) % sliding_window_pattern), found {period!r}")
    return ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(n)]


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
    n, hidden, heads = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("num_attention_heads")
    if "sliding_window" in c.raw and c.raw["sliding_window"] in (None, 0):
        raise ConfigError(f"{c.where}: sliding_window is {c.raw['sliding_window']!r}: Cohere2's sliding layers need a "
                          "window (vLLM's commandr.py adds 1 to it, transformers masks with it)")
    head_dim = hidden // heads
    if c.raw.get("head_dim") is not None and int(c.raw["head_dim"]) != head_dim:
        raise ConfigError(f"{c.where}: head_dim {c.raw['head_dim']} is not hidden_size // num_attention_heads "
                          f"({head_dim}): transformers' Cohere2Config overwrites it with {head_dim}, while vLLM / "
                          "llama.cpp conversions may read the file's value")
    for key, why in (("attention_bias", "q/k/v/o biases"), ("use_qk_norm", "a q/k LayerNorm")):
        if c.get(key, default=False):
            builder = "transformers builds them, vLLM and SGLang (commandr.py) do not" if key == "attention_bias" \
                else "vLLM and SGLang (commandr.py) build it, transformers' Cohere2 does not"
            raise ConfigError(f"{c.where}: {key} true asks for {why}: {builder}; kvplan will not size two different "
                              "models under one name")
    c = Cfg({**c.raw, "head_dim": head_dim, "layer_types": layer_types(c, n)}, c.defaults, c.where)
    return decoder.build(top, c, QUIRKS)
