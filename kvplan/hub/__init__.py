"""The Hugging Face Hub: configs, safetensors headers, GGUF headers (fetch_gguf), `pull` and model search.

The only kvplan package that imports huggingface_hub, and only inside functions, so `import kvplan` stays fast.

Order of a lookup (fetch_config): the HF cache at that revision (unless refresh), then one short metadata request
(HEAD on config.json, no retries), then the download, then, when config.json has no quantization_config, the
same for hf_quant_config.json at that commit (a ModelOpt export's quantization); all of it under one deadline
(--timeout, KVPLAN_HUB_TIMEOUT, default 10 s), because huggingface_hub alone retries a failing Hub for minutes.
When the Hub fails: the cache, then a bundled config that aliases.json marks as the same architecture, with a
one-line note. Failures are told apart by huggingface_hub's exception types (errors.py, the one table that turns
them into kvplan errors).

    client.py       settings (offline, timeout, endpoint, cache folders) and the bounded waits on threads
    errors.py       exception type -> kvplan error and what may stand in
    configs.py      config.json (+ hf_quant_config.json)     gguf_remote.py  GGUF headers by range requests
    safetensors.py  weight bytes from safetensors headers    pull.py, search.py  `kvplan pull`, `models --search`
"""

from kvplan.hub.client import hub_cache_dir, is_offline, kvplan_store_dir, resolve_endpoint, resolve_timeout
from kvplan.hub.configs import fetch_config
from kvplan.hub.errors import WeightsUnavailable, hub_error
from kvplan.hub.gguf_remote import fetch_gguf, gguf_header
from kvplan.hub.pull import WEIGHTS_FILE, Pulled, pull
from kvplan.hub.safetensors import (
    RECORD_FORMAT, SafetensorsWeights, load_weights_file, safetensors_weights, weights_from_record,
)
from kvplan.hub.search import ModelHit, search_models

__all__ = [
    "ModelHit",
    "Pulled",
    "RECORD_FORMAT",
    "SafetensorsWeights",
    "WEIGHTS_FILE",
    "WeightsUnavailable",
    "fetch_config",
    "fetch_gguf",
    "gguf_header",
    "hub_cache_dir",
    "hub_error",
    "is_offline",
    "kvplan_store_dir",
    "load_weights_file",
    "pull",
    "resolve_endpoint",
    "resolve_timeout",
    "safetensors_weights",
    "search_models",
    "weights_from_record",
]
