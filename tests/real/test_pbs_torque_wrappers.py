"""PBS submission, status and cancel end to end through REAL Torque-style commands: Debian's slurm-wlm-torque
(Slurm's own qsub/qstat/qdel wrappers, Perl over libslurm) in front of the real local Slurm cluster.

What this proves: slurmlaunch's qsub command line is accepted and becomes a job, its printed id is parsed,
qstat -f's output (a Torque-style qstat: no -x, no exit status) is read into states, and qdel stops a
waiting job. What it does not: the jobs carry Slurm's environment, not PBS_NODEFILE, so the in-job mapping is
not run; and the wrapper hands `-o DIR/` to sbatch, which cannot open a file named after a directory, so the
job ends without running the script (real PBS writes DIR/<id>.OU): its exit code is not checked here.

The wrappers are used from /usr/bin when the package is installed, else from $SLURMLAUNCH_TORQUE_WRAPPERS
(default /opt/slurm-wlm-torque, where tests/run.sh unpacks the package with `dpkg -x`, its Perl libraries
installed from apt), a directory slurm-wlm-torque (and, without apt, libslurm-perl, libslurmdb-perl and
libslurm38) was unpacked into, with usr/bin/{sbatch,salloc,srun} linked to the real ones: its qsub runs the
sbatch beside it. Unpacked, not installed: installed, its qsub would be /usr/bin/qsub on every test's PATH and
its mpirun an alternative to Open MPI's. Missing, the test skips, and fails under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, run_cli, skip_or_fail

pytestmark = pytest.mark.slurm


def _wrappers_env(base: dict[str, str]) -> dict[str, str]:
    if Path("/usr/share/man/man1/qsub.1.gz").exists() and Path("/usr/bin/qsub").exists() and \
            "Slurm" in Path("/usr/bin/qsub").read_text(errors="replace"):
        return dict(base)
    root = os.environ.get("SLURMLAUNCH_TORQUE_WRAPPERS", "/opt/slurm-wlm-torque")
    if not (Path(root) / "usr/bin/qsub").exists():
        skip_or_fail(f"slurm-wlm-torque is not installed nor unpacked in {root} (tests/run.sh unpacks it there; "
                     "or unpack it elsewhere and set SLURMLAUNCH_TORQUE_WRAPPERS)")
    env = {**base, "PATH": f"{root}/usr/bin:{base['PATH']}"}
    perl = next((str(p) for p in (Path(root) / "usr/lib/x86_64-linux-gnu/perl5").glob("*")), None)
    if perl:  # the Perl libraries unpacked beside the wrappers, not installed
        env |= {"PERL5LIB": perl, "LD_LIBRARY_PATH": f"{root}/usr/lib/x86_64-linux-gnu"}
    return env


def _status(env: dict[str, str], cwd: Path, job: str) -> dict[str, object]:
    r = run_cli("status", job, "--json", env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def _until(env: dict[str, str], cwd: Path, job: str, states: tuple[str, ...], limit: float = 90) -> dict[str, object]:
    deadline = time.monotonic() + limit
    while True:
        st = _status(env, cwd, job)
        if st["state"] in states or time.monotonic() > deadline:
            return st
        time.sleep(0.5)


def test_submit_status_cancel_through_slurms_torque_commands(cluster_env: dict[str, str], tmp_path: Path) -> None:
    env = _wrappers_env(cluster_env)
    common = ["submit", "--scheduler", "pbs", "--pbs-flavour", "torque", "--time", "5"]
    r = run_cli(*common, str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    assert job.isdigit() and (tmp_path / "slurmlaunch-logs" / f"job-{job}.json").exists()
    st = _until(env, tmp_path, job, ("COMPLETED", "FAILED"))
    assert st["state"] in ("COMPLETED", "FAILED"), st  # read from `qstat -f` after `qstat -x -f` was refused

    # Every node busy with a job of Slurm's own: ours waits, and is cancelled while it waits.
    blocker = subprocess.run(["sbatch", "--parsable", "-N", "4", "--exclusive", "-t", "5", "-o", "/dev/null",
                              "--wrap", "sleep 300"], env=env, capture_output=True, text=True, timeout=60)
    assert blocker.returncode == 0, blocker.stderr
    try:
        r = run_cli(*common, str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        job = r.stdout.strip()
        assert _status(env, tmp_path, job)["state"] == "PENDING"
        r = run_cli("cancel", job, env=env, cwd=tmp_path)
        assert r.returncode == 0 and f"cancelled job {job}" in r.stdout, r.stderr
        assert _until(env, tmp_path, job, ("COMPLETED", "FAILED"))["state"] in ("COMPLETED", "FAILED")
    finally:
        subprocess.run(["scancel", blocker.stdout.strip().split(";")[0]], env=env, timeout=60)
