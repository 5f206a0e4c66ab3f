"""The API's time to result under Slurm (issue 32): a short job's values come as soon as every rank left
them (one squeue confirms it was not stopped or requeued), not at the next sacct poll; and what that costs
the controller is bounded, counted by a shim in front of squeue and sacct (the real ones answer)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIM = '#!/bin/sh\necho "{name} $*" >> "$COUNT_FILE"\nexec {real} "$@"\n'


def shimmed(env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], Path]:
    """``env`` with squeue and sacct counted: every call appends a line to the returned file."""
    shims = tmp_path / "shims"
    shims.mkdir()
    for name in ("squeue", "sacct"):
        real = shutil.which(name, path=env["PATH"])
        assert real is not None, f"{name} is not on the cluster's PATH"
        (shims / name).write_text(SHIM.format(name=name, real=real))
        (shims / name).chmod(0o755)
    count = tmp_path / "calls"
    count.write_text("")
    return {**env, "PATH": f"{shims}:{env['PATH']}", "COUNT_FILE": str(count)}, count


def run(env: dict[str, str], tmp_path: Path, body: str) -> dict[str, object]:
    code = ("import json, os, sys, time\nimport slurmlaunch\n"
            f"api = dict(scheduler='slurm', output_dir={str(tmp_path / 'logs')!r}, time='5')\n"
            "def f(x):\n    return x * 2\n"
            "out = {}\nstart = time.monotonic()\n" + body +
            "\nout['seconds'] = time.monotonic() - start\nprint('OUT ' + json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(ROOT)), cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return dict(json.loads(r.stdout.split("OUT ", 1)[1]))


@pytest.mark.slurm
def test_a_map_arrays_queries_are_bounded(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """sacct: at most one per 2 s for every job waited for together (and one at the start); squeue: at most
    one confirmation per job (one call confirms every job whose ranks have all returned) and one per 2 s
    for the job waited on while accounting has no record of it."""
    jobs = 12
    env, count = shimmed(cluster_env, tmp_path)
    out = run(env, tmp_path, f"out['values'] = [j.result() for j in slurmlaunch.map_array(f, range({jobs}), "
                             "nodes=1, tasks_per_node=1, **api)]\n")
    assert out["values"] == [2 * x for x in range(jobs)], out
    calls = count.read_text().splitlines()
    sacct = [c for c in calls if c.startswith("sacct")]
    squeue = [c for c in calls if c.startswith("squeue")]
    seconds = float(out["seconds"])  # type: ignore[arg-type]
    print(f"{jobs} jobs in {seconds:.1f} s: {len(sacct)} sacct, {len(squeue)} squeue")  # shown with -s
    assert len(sacct) <= seconds / 2 + 2, (seconds, sacct)
    assert len(squeue) <= seconds / 2 + 2 * jobs, (seconds, squeue)
    # every sacct asks about every job waited for at once (the array's id), not one job a call
    assert all(c.split().count("-j") == 1 for c in sacct), sacct


@pytest.mark.slurm
def test_values_come_without_waiting_for_accounting(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """The values of a job whose every rank returned come without sacct having seen the job's end: sacct is
    shimmed to say RUNNING for ever, and result() still returns; the job's state then follows the scheduler
    (squeue: the job has ended), so done() agrees."""
    env, count = shimmed(cluster_env, tmp_path)
    sacct = Path(env["PATH"].split(":")[0]) / "sacct"
    real = shutil.which("sacct", path=cluster_env["PATH"])
    # sacct's parsable answer for the ids it is asked, always RUNNING (submitit reads JobID|State)
    sacct.write_text('#!/bin/sh\necho "sacct $*" >> "$COUNT_FILE"\n'
                     f'{real} "$@" | sed -e "s/|COMPLETED|/|RUNNING|/" -e "s/|COMPLETED$/|RUNNING/"\n')
    out = run(env, tmp_path, "job = slurmlaunch.submit(f, 21, nodes=2, tasks_per_node=1, **api)\n"
                             "out['values'] = job.results()\nout['asked'] = open(os.environ['COUNT_FILE']).read()\n"
                             "until = time.time() + 60\n"
                             "while not job.done() and time.time() < until:\n    time.sleep(0.2)\n"
                             "out['state'], out['done'] = job.state, job.done()\n")
    assert out["values"] == [42, 42], out
    assert out["state"] in ("COMPLETED", "ENDED") and out["done"] is True, out
    assert "squeue" in str(out["asked"]), out  # the confirmation
