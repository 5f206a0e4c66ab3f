"""The API's warning harms no function or script that did not ask for it (issue 40 item 3), on the local default:
`time="1"` with `signal="USR2@55"` sends the warning 5 s in. A function without ``checkpoint`` runs on past it
and returns (before: submitit's handler in rank 0 ended the job at the warning, "timed-out and not
checkpointable"); a script through submit_script ignores it unless it handles it. Checkpointable functions
keep submitit's checkpoint and requeue (tests/real/test_api_slurm_faults.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import slurmlaunch

WARNED_AT_5S = dict(scheduler="local", nodes=1, tasks_per_node=2, time="1", signal="USR2@55")


def outlives_the_warning(seconds: float) -> tuple[int, float]:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(0.1)
    return int(os.environ["RANK"]), time.monotonic() - start


SCRIPT = """
import os, signal, sys, time
if os.environ["RANK"] == "1":
    signal.signal(signal.SIGUSR2, lambda *_: (print("GOT SIGUSR2", flush=True), sys.exit(0)))
start = time.monotonic()
while time.monotonic() - start < 9:
    time.sleep(0.1)
print("ALIVE", round(time.monotonic() - start), flush=True)
"""


def test_a_function_without_checkpoint_runs_on_through_the_warning(tmp_path: Path) -> None:
    job = slurmlaunch.submit(outlives_the_warning, 9, output_dir=str(tmp_path / "logs"), **WARNED_AT_5S)
    results = job.results()  # before: raised at the warning (5 s), the job "timed-out and not checkpointable"
    assert [r for r, _ in results] == [0, 1] and all(s >= 9 for _, s in results), results


def test_a_script_ignores_the_warning_unless_it_handles_it(tmp_path: Path) -> None:
    script = tmp_path / "warned.py"
    script.write_text(SCRIPT)
    job = slurmlaunch.submit_script(str(script), output_dir=str(tmp_path / "logs"), **WARNED_AT_5S)
    assert job.results() == [0, 0]
    out = "".join(job._job.task(k).stdout() or "" for k in (0, 1))  # type: ignore[union-attr]
    assert "ALIVE 9" in out and "GOT SIGUSR2" in out, out
