"""transformers config-class defaults for fields that real config.json files omit.

config.json stores only what differs from the class defaults, so a sparse file (the Gemma-3 multimodal
text_config has no head counts) is read with the defaults of the class that would load it. Values copied from
transformers 5.23 models/<family>/configuration_<family>.py.
"""

from __future__ import annotations

CLASS_DEFAULTS: dict[str, dict[str, object]] = {
    "gemma3_text": {
        "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
        "sliding_window": 4096,
    },
    # Gemma4TextConfig (transformers 5.24); global_head_dim is a constructor argument, not a field (default 512)
    "gemma4_text": {
        "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
        "sliding_window": 512, "global_head_dim": 512, "hidden_size_per_layer_input": 256,
        "vocab_size_per_layer_input": 262_144,
    },
    # Gemma3nTextConfig (transformers 5.24)
    "gemma3n_text": {
        "vocab_size": 262_400, "hidden_size": 2048, "intermediate_size": 16_384, "num_hidden_layers": 35,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 32_768,
        "sliding_window": 512, "num_kv_shared_layers": 15, "hidden_size_per_layer_input": 256,
        "vocab_size_per_layer_input": 262_144, "laurel_rank": 64, "altup_num_inputs": 4,
    },
    "gemma2": {"sliding_window": 4096, "head_dim": 256, "max_position_embeddings": 8192},
    "gemma": {"head_dim": 256, "max_position_embeddings": 8192},
    # FalconConfig: the RefinedWeb-era configs carry no length key
    "falcon": {"max_position_embeddings": 2048},
    "gpt_oss": {"sliding_window": 128, "max_position_embeddings": 131_072},
    "llama4_text": {"attention_chunk_size": 8192},
    # Zamba2Config (transformers 5.24): its length when the config states none (use_long_context: 16384, zamba2.py)
    "zamba2": {"max_position_embeddings": 4096},
    # Cohere2Config (transformers 5.24): Command-R7B / Command-A files state their sizes; the window is a class default
    "cohere2": {
        "vocab_size": 256_000, "hidden_size": 8192, "intermediate_size": 22_528, "num_hidden_layers": 40,
        "num_attention_heads": 64, "max_position_embeddings": 8192, "sliding_window": 4096,
    },
    # SmolLM3Config (transformers 5.24): four KV heads unless the file says otherwise (None alone means MHA)
    "smollm3": {
        "vocab_size": 128_256, "hidden_size": 2048, "intermediate_size": 11_008, "num_hidden_layers": 36,
        "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 32_768,
        "no_rope_layer_interval": 4,
    },
    # MllamaTextConfig (transformers 5.24; cross_attention_layers' default is architectures/mllama.py's)
    "mllama_text_model": {
        "vocab_size": 128_256, "hidden_size": 4096, "intermediate_size": 14_336, "num_hidden_layers": 40,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131_072,
        "rope_theta": 500_000.0,
    },
    # Step3p7TextConfig (transformers 5.24), which AutoConfig also loads for model_type step3p5 (the Hub release's
    # text_config); the flat aiconfigurator file says model_type step3p7
    "step3p5": {
        "vocab_size": 128_815, "hidden_size": 4096, "intermediate_size": 11264, "num_hidden_layers": 45,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 128_000,
        "num_experts_per_tok": 8, "n_routed_experts": 288, "moe_intermediate_size": 1280, "share_expert_dim": 1280,
    },
    # MiniMaxConfig (transformers 5.24 models/minimax): a re-saved -hf config.json omits fields equal to these; the
    # remote-code MiniMaxText01Config / MiniMaxM1Config take the same defaults
    "minimax": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131_072,
        "num_local_experts": 8, "num_experts_per_tok": 2,
    },
}

ALIASES = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon", "gemma3": "gemma3_text", "gemma3n": "gemma3n_text",
           "gemma4": "gemma4_text", "step3p7": "step3p5", "mllama": "mllama_text_model", "minimax_text_01": "minimax",
           "minimax_m1": "minimax"}


def for_model_type(model_type: str) -> dict[str, object]:
    return CLASS_DEFAULTS.get(ALIASES.get(model_type, model_type), {})
