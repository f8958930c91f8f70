"""The documents cannot go stale unnoticed: the generated pages are what their generators write today, every relative
link and every repository path they name points at something that exists, the README stays a front page, and the
pages that state the present carry no milestone history (CHANGELOG.md does)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted([README, ROOT / "CONTRACTS.md", ROOT / "CHANGELOG.md", *DOCS.rglob("*.md")])
README_LIMIT = 15_360  # bytes (issue 37)

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"(?<![\w./-])((?:tests|bench|dev|examples|kvplan|model_configs)/[\w./-]*\w)")


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading.strip()).lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(page: Path) -> set[str]:
    out: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            base = _slug(line.lstrip("#"))
            out.add(base if base not in out else next(f"{base}-{i}" for i in range(1, 100) if f"{base}-{i}" not in out))
    return out


def _prose(page: Path) -> str:
    """The page without its fenced code blocks (commands and pasted output are not links)."""
    return re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_support_matrix_is_what_the_generator_writes():
    """docs/support.md = dev/support_matrix.py's output now: kvplan's own refusals and docs/support-grades.json agree,
    and the page shows both (rerun `python dev/support_matrix.py` after a change to either)."""
    sys.path.insert(0, str(ROOT / "dev"))
    import support_matrix

    assert (DOCS / "support.md").read_text(encoding="utf-8") == support_matrix.generate(), \
        "docs/support.md is out of date: run python dev/support_matrix.py"


@pytest.mark.slow
def test_accuracy_page_is_what_the_evaluation_writes():
    """docs/accuracy.md = `python bench/accuracy_page.py` now (every public log through `kvplan fit`, then again with
    its source left out of the evidence: about a minute on two cores)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import accuracy_page
    import budget_eval
    import budget_loso
    import yaml

    entries = yaml.safe_load(budget_eval.LOGS.read_text())
    rows = budget_loso.leave_one_source_out(entries, sys.executable, 2)
    assert (DOCS / "accuracy.md").read_text(encoding="utf-8") == accuracy_page.docs_page(rows, sys.executable), \
        "docs/accuracy.md is out of date: run python bench/accuracy_page.py"


def test_readme_is_a_front_page():
    size = len(README.read_bytes())
    assert size < README_LIMIT, f"README.md is {size:,} bytes; the limit is {README_LIMIT:,}: move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_point_at_existing_files_and_headings(page):
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {_rel(dest)}")
    assert not broken, f"{_rel(page)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "CHANGELOG.md"], ids=_rel)
def test_repository_paths_named_exist(page):
    """A path such as tests/test_fit.py or kvplan/engines/overhead.py, named in a document, exists (a move must
    update the documents; CHANGELOG.md names the paths of its time). Placeholders and the one generated file the
    repository does not keep are not checked."""
    missing = []
    for name in sorted(set(REPO_PATH.findall(page.read_text(encoding="utf-8")))):
        if "<" in name or "*" in name or name.endswith("/oracle_figures.json"):  # written by dev/oracle_dump.py, not kept
            continue
        candidates = [ROOT / name, page.parent / name]
        if not any(c.exists() for c in candidates):
            missing.append(name)
    assert not missing, f"{_rel(page)} names paths that do not exist: {', '.join(missing)}"


@pytest.mark.parametrize("page", [README, ROOT / "CONTRACTS.md", *sorted(DOCS.glob("*.md"))], ids=_rel)
def test_pages_that_state_the_present_carry_no_milestones(page):
    """Milestone tags ("stop 27") are history: CHANGELOG.md (and a research note about one) may name them."""
    hits = re.findall(r".{0,40}\bstops? \d+\b.{0,20}", page.read_text(encoding="utf-8"), flags=re.I)
    assert not hits, hits


def test_engines_page_lists_every_rule_set():
    """docs/engines.md names each engine's rule sets as kvplan has them (a new rule set needs its line there)."""
    from kvplan import engines

    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)`.*$", (DOCS / "engines.md").read_text(
        encoding="utf-8"), flags=re.M)}
    for name in ("vllm", "sglang", "llamacpp", "trtllm", "hf"):
        engine = getattr(engines.REGISTRY[name], "ENGINE", engines.REGISTRY[name])
        labels = [label for label, _rules in engine.versions]
        missing = [label for label in labels if f"`{label}`" not in rows.get(name, "")]
        assert not missing, f"docs/engines.md's {name} row does not name the rule sets {missing}"
