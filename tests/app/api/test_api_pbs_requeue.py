"""The API's PBS jobs and requeue=True: the CLI submits its kept script again at the warning (PBS lets no job's
own user qrerun it), the API keeps no script of ours to submit again, so it refuses requeue=True in one line
before any qsub (the real-server API tests: tests/real/test_api_pbs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CALLER = """
import slurmlaunch
def f(x):
    return x
try:
    job = slurmlaunch.submit(f, 1, scheduler="pbs", nodes=1, time="0:05:00", **OPTIONS)
    print("SUBMITTED", job.job_id)
except slurmlaunch.SpecError as e:
    print("REFUSED", e)
"""


def _call(tmp_path: Path, options: str) -> tuple[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "qsub-calls"
    (bin_dir / "qsub").write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho 5.head\n')
    (bin_dir / "qsub").chmod(0o755)
    (tmp_path / "caller.py").write_text(CALLER.replace("OPTIONS", options))
    r = subprocess.run([sys.executable, "caller.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    return r.stdout, calls.read_text() if calls.exists() else ""


def test_requeue_is_refused_in_one_line_and_nothing_is_submitted(tmp_path: Path) -> None:
    out, calls = _call(tmp_path, "dict(requeue=True, signal='USR1@60')")
    assert out.startswith("REFUSED requeue=True: the Python API's PBS jobs are not submitted again"), out
    assert "slurmlaunch submit --scheduler pbs --requeue" in out and out.count("\n") == 1, out
    assert calls == ""


def test_without_requeue_the_job_is_submitted(tmp_path: Path) -> None:
    out, calls = _call(tmp_path, "dict(signal='USR1@60')")
    assert out.startswith("SUBMITTED 5"), out
    assert calls.count("\n") == 1, calls
