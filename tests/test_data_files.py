"""kvplan's bundled JSON data (model_configs/aliases.json, kvplan/data/gpus.json, kvplan/data/budget_evidence.json):
each file holds what its reader needs, every field it uses is documented next to it and read by its module, and
a cold `size` or catalog `fit` imports no PyYAML (the reason the files are JSON)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan import catalog, evidence, gpus

ROOT = Path(__file__).resolve().parent.parent
DATA_README = ROOT / "kvplan" / "data" / "README.md"
CATALOG_README = ROOT / "model_configs" / "README.md"


def _load(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _documented_fields(readme: Path, heading: str) -> set[str]:
    """The `field` names in the first column of the table under `heading`."""
    section = readme.read_text(encoding="utf-8").split(heading, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE))


def test_aliases_entries_point_at_shipped_configs_and_names_are_unique():
    models = _load(catalog.catalog_dir() / catalog.ALIASES)["models"]
    assert len(models) == len(catalog.bundled_models()) > 50
    seen: dict[str, str] = {}
    for repo_id, entry in models.items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id), repo_id
        assert (catalog.catalog_dir() / entry["dir"] / "config.json").is_file(), repo_id
        assert all(isinstance(a, str) and a for a in entry.get("aliases", [])), repo_id
        for name in (repo_id, *entry.get("aliases", [])):
            assert seen.setdefault(name.lower(), repo_id) == repo_id, f"{name} names {seen[name.lower()]} and {repo_id}"
    fields = {k for entry in models.values() for k in entry}
    assert fields == _documented_fields(CATALOG_README, "# The bundled model catalog")


def test_gpu_entries_have_what_the_catalog_needs():
    doc = _load(gpus.CATALOG_PATH)
    assert set(doc) == {"gpus", "ambiguous"}
    for entry in doc["gpus"]:
        for key in ("name", "display", "vendor", "source"):
            assert isinstance(entry[key], str) and entry[key], (entry.get("name"), key)
        assert entry["vendor"] in ("nvidia", "amd")
        for key in ("nvml_bytes", "cuda_total_bytes"):  # whole MiB, as the driver reports them
            value = entry.get(key)
            assert value is None or (isinstance(value, int) and value > 0 and value % (1 << 20) == 0), (entry["name"], key)
        assert entry.get("nvml_bytes") or entry.get("cuda_total_bytes"), entry["name"]
    assert [g.name for g in gpus.load_catalog()] == [e["name"] for e in doc["gpus"]]


def test_every_gpu_field_is_documented_and_read():
    """A misspelt field ("bandwith_gbps") would be ignored by the reader: each one the file uses is in
    kvplan/data/README.md's table and spelt in kvplan/gpus.py."""
    used = {k for entry in _load(gpus.CATALOG_PATH)["gpus"] for k in entry}
    documented = _documented_fields(DATA_README, "## gpus.json")
    assert used <= documented, used - documented
    source = Path(gpus.__file__).read_text(encoding="utf-8")
    unread = {k for k in documented if f'"{k}"' not in source}
    assert unread == set(), unread


def test_budget_evidence_names_catalog_gpus_and_sources_for_every_log():
    engines = _load(evidence.EVIDENCE_PATH)["engines"]
    by_name = {g.name: g for g in gpus.load_catalog()}
    assert {"vllm", "sglang"} <= set(engines)
    for engine, row in engines.items():
        for cid, case in row["cases"].items():
            gpu = by_name[case["gpu"]]
            assert isinstance(case["error_bytes"], int) and case["source"], (engine, cid)
            assert isinstance(case["tp"], int) and case["tp"] >= 1 and case["pp"] >= 1, (engine, cid)
            assert (case["tier"], case["interconnect"]) == (gpu.tier, gpu.interconnect), (engine, cid)
        assert len(evidence.for_engine(engine).cases) == len(row["cases"])


def test_every_catalog_gpu_has_a_tier_and_an_interconnect():
    """fit's evidence class (evidence.py) and vLLM's NCCL charge (overhead.vllm_non_torch) read them."""
    for gpu in gpus.load_catalog():
        assert gpu.tier in ("datacenter", "workstation", "consumer"), gpu.name
        assert gpu.interconnect in ("nvswitch", "nvlink", "pcie", "xgmi"), gpu.name
        assert not gpu.nccl_nvls or gpu.interconnect == "nvswitch", gpu.name


@pytest.mark.parametrize("args, shown", [
    (["size", "llama-2-7b", "--ctx", "4096"], "2,147,483,648"),
    (["fit", "--gpu", "24GB"], "llama-3.1-8b"),
])
def test_a_cold_run_imports_no_yaml(args, shown):
    code = ("import sys; from kvplan.cli import main\n"
            f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(' '.join(m for m in sys.modules if m == 'yaml' or m.startswith('yaml.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert shown in proc.stdout
    assert proc.stderr.strip() == ""
