"""`kvplan check`: capacity checks for CI pipelines. YAML files -> validated deployments -> fit -> pass/fail.

A file holds `deployments:` (a list of mappings) and optionally `defaults:` (a mapping merged under every
deployment; top-level keys starting with `x-` are ignored, room for YAML anchors). Each deployment names a model,
a GPU and a context, and states requirements that must hold:

    min_batch      requests of ctx tokens that must run at once  (fit's max_batch at ctx; `batch` is the same key)
    min_ctx        the context that must fit at min_batch (or 1) requests  (fit's max_ctx)
    min_kv_tokens  tokens the KV cache must hold  (fit's kv_capacity_tokens)

A deployment may also state its traffic (the keys of `kvplan plan`: prompt, output, requests, shared_prefix, users,
tpot); then ctx may be left out (the longest request), the mix is replayed through vLLM's scheduler (or
llama-server's slots with engine llamacpp, its -np / -c as the keys parallel / ctx_size), and two more
requirements can be stated:

    min_running    requests the replay must run at once (its median over the steady steps)
    max_gpus       GPUs the fleet for `users` users (at `tpot`, when given) may need at most

Every one given must hold; none given means one request of ctx tokens must fit. The figures of a deployment are
`planner.fit_model(...).to_json()`, the very `fit --json` result entry for the same inputs (one code path).

The YAML is read with PyYAML's SafeLoader but only *composed* (yaml.compose): values are converted here from the
nodes, so every problem carries FILE:LINE:COLUMN, duplicate keys are caught, and YAML 1.1 readings that surprise
(`no` read as false, `016` as octal 14, `1:30` as 90) are errors where a string or a number is expected. Every
problem of every file is collected before anything is reported.

    schema.py   the keys and the kind of value each takes      parse.py  YAML nodes -> values, a file -> deployments
    report.py   problems, results and their JSON               solve.py  resolve, fit, judge; run()
"""

from kvplan.check.parse import CONVERTERS, MAX_FILE_BYTES, convert, parse_file
from kvplan.check.report import (
    FORMATS, NO_FLEET, CheckReport, Deployment, DeploymentResult, Field, FileReport, Problem, Requirement,
    outcome_error,
)
from kvplan.check.schema import (
    DTYPE_KEYS, GENERAL_KEYS, KEYS, KNOB_KEYS, PLAN_KEYS, REQUIRED, REQUIREMENT_KEYS, TOP_KEYS,
)
from kvplan.check.solve import run

__all__ = [
    "CONVERTERS", "DTYPE_KEYS", "FORMATS", "GENERAL_KEYS", "KEYS", "KNOB_KEYS", "MAX_FILE_BYTES", "NO_FLEET",
    "PLAN_KEYS", "REQUIRED", "REQUIREMENT_KEYS", "TOP_KEYS", "CheckReport", "Deployment", "DeploymentResult", "Field",
    "FileReport", "Problem", "Requirement", "convert", "outcome_error", "parse_file", "run",
]
