"""The unit layer is selectable alone (issue 39 step 5): one folder rule (conftest.UNIT_LAYER) gives its tests
the marker `unit`, so `pytest -m unit` runs exactly those folders; a test there that needs a cluster, the
laptop's sshd or torch fails the collection; tests/run.sh's unit runs on other Pythons name the same folders."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import UNIT_LAYER, unit_layer_breaches
from tests.helpers import ROOT


def test_the_rule_finds_what_needs_a_cluster() -> None:
    assert unit_layer_breaches(["tmp_path", "cluster_env"], ["parametrize"]) == ["fixture cluster_env"]
    assert unit_layer_breaches(["laptop"], ["slurm"]) == ["fixture laptop", "mark slurm"]
    assert unit_layer_breaches(["tmp_path", "monkeypatch", "site"], ["parametrize"]) == []


def _collected(*args: str) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0",
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return {line.split("::")[0] for line in r.stdout.splitlines() if "::" in line}


def test_the_unit_marker_selects_the_unit_folders_alone() -> None:
    """Collected with -m unit: every test file of the unit folders, and no other (collection itself would fail
    on a test there that asks for a cluster)."""
    files = {str(p.relative_to(ROOT)) for folder in UNIT_LAYER for p in (ROOT / "tests" / folder).glob("test_*.py")}
    assert files and _collected("-m", "unit", *(f"tests/{f}" for f in UNIT_LAYER), "tests/schedulers") == files


def test_run_sh_runs_the_same_folders_on_the_other_pythons() -> None:
    text = (ROOT / "tests" / "run.sh").read_text()
    runs = re.findall(r"-m pytest [^\n]*\\\n\s*(tests/[^>\n]*?)\s*>", text)
    assert runs and all(run.split() == [f"tests/{f}" for f in UNIT_LAYER] for run in runs), runs
