"""The parsed snapshot of kvplan's bundled YAML files (kvplan/_yaml_snapshot.py) against PyYAML reading the files
themselves: equal for every bundled file, never used for a file that changed, and a cold `size` imports no yaml."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from kvplan import yaml_files
from kvplan._yaml_snapshot import SNAPSHOTS

BUNDLED = yaml_files.bundled_files()


@pytest.mark.parametrize("path", BUNDLED, ids=[p.name for p in BUNDLED])
def test_each_bundled_file_has_a_snapshot_equal_to_pyyaml(path):
    """Fails after an edit of a bundled file until `python -m kvplan.yaml_files` is run again."""
    raw = path.read_bytes()
    assert yaml_files._fingerprint(raw) in SNAPSHOTS, (
        f"{path.name} changed since kvplan/_yaml_snapshot.py was written: run `python -m kvplan.yaml_files`")
    assert yaml_files.load(path) == yaml.safe_load(raw.decode("utf-8"))


def test_the_generated_module_is_what_the_generator_writes_now():
    assert yaml_files.SNAPSHOT_MODULE.read_text(encoding="utf-8") == yaml_files.snapshot_source(BUNDLED)


def test_a_changed_file_is_parsed_not_read_from_the_snapshot(tmp_path):
    gpus = next(p for p in BUNDLED if p.name == "gpus.yaml")
    text = gpus.read_text(encoding="utf-8")
    first = yaml.safe_load(text)["gpus"][0]
    edited = text.replace(f"name: {first['name']}", f"name: {first['name']}-edited", 1)
    assert edited != text
    copy = tmp_path / "gpus.yaml"
    copy.write_text(edited, encoding="utf-8")
    assert yaml_files.load(copy)["gpus"][0]["name"] == f"{first['name']}-edited"
    # the same bytes under another name: the snapshot (content decides, not the path)
    same = tmp_path / "other.yaml"
    same.write_bytes(gpus.read_bytes())
    assert yaml_files.load(same) == yaml.safe_load(text)


def test_a_cold_size_imports_no_yaml():
    code = ("import sys; from kvplan.cli import main\n"
            "try:\n    main(['size', 'llama-2-7b', '--ctx', '4096'])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(' '.join(m for m in sys.modules if m == 'yaml' or m.startswith('yaml.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "2,147,483,648" in proc.stdout
    assert proc.stderr.strip() == ""
