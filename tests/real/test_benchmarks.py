"""The benchmark runs (its numbers are not asserted: machines are noisy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ports
from tests.helpers import ROOT


def test_benchmark_quick_run(torch_available: None) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--pairs", "1"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, **ports.child_env(200)))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for section in ("Launcher start-up", "A no-op job of 2 ranks", "submit --dry-run", "Node lists",
                    "Scale on paper", "time to first barrier", "whole job", "rendezvous after the last rank",
                    "The rendezvous watchdog beside a rank", "to finish importing torch"):
        assert section in r.stdout, section
    assert "bijection and one master: yes" in r.stdout


@pytest.mark.slurm
def test_api_benchmark_runs(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """benchmarks/api.py against the dev cluster: both contenders, the ratio, the counted queries."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "api.py"), "--pairs", "1", "--jobs", "2",
                        "--count-queries", "2"], capture_output=True, text=True, timeout=600,
                       env=dict(cluster_env, PYTHONPATH=str(ROOT)), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for section in ("API vs submitit: one 2x1 function", "map_array of 2 2x1 functions", "paired ratio",
                    "Scheduler queries of a 2-job map_array"):
        assert section in r.stdout, (section, r.stdout)


def test_timeline_benchmark_runs(torch_available: None) -> None:
    """benchmarks/timeline.py: the pieces, their sum and the end-to-end pair."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "timeline.py"), "--pairs", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for section in ("piece by piece", "sum: a rank's cost", "end to end", "paired ratio"):
        assert section in r.stdout, (section, r.stdout)
