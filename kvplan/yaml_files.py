"""Reading kvplan's own YAML data files (the model catalog, the GPU catalog) fast.

PyYAML's pure-Python parser takes about 40 ms for model_configs/aliases.yaml, a fifth of a cold `kvplan size`;
its LibYAML binding (CSafeLoader, shipped in PyYAML's wheels) reads the same safe subset in a few milliseconds.
The pure-Python SafeLoader stays the fallback where PyYAML was built without LibYAML. User files (`check`
YAML) keep SafeLoader: their error messages quote its line marks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(path: Path) -> Any:
    """The YAML document in `path`, constructed with the safe tags only."""
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER)  # noqa: S506 - a safe loader
