"""The benchmark runs (its numbers are not asserted: machines are noisy)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT


def test_benchmark_quick_run(torch_available: None) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--pairs", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for section in ("Launcher start-up", "A no-op job of 2 ranks", "submit --dry-run", "Node lists",
                    "Scale on paper", "time to first barrier", "whole job", "rendezvous after the last rank"):
        assert section in r.stdout, section
    assert "bijection and one master: yes" in r.stdout
