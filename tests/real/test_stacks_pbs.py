"""`slurmlaunch stacks` on the real OpenPBS dev cluster (tests/conftest.py pbs_cluster): a hung 2x2 gloo job
where rank 3 sleeps in a function of its own while ranks 0-2 wait in all_reduce. `stacks` reaches the ranks
by ssh to each execution host the job holds (the dev cluster's hosts run sshd, as PBS sites let a job's owner
onto its hosts), names rank 3, its host and its function, and groups the others; a host whose sshd answers
nothing has its ranks named as not reached; qdel, and the walltime, then leave the grouped summary in the
job's output file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.app.test_stacks import HUNG, SLEEPY, _check_hung
from tests.helpers import run_cli, wait_for_files
from tests.real.test_pbs_real import AS_ROOT, submitted

pytestmark = pytest.mark.pbs


def _output_with(tmp_path: Path, job: str, text: str, timeout: float) -> str:
    """The job's output file (PBS Pro's name for qsub -o DIR/, staged out when the job ends) once it has
    ``text``."""
    out = tmp_path / "slurmlaunch-logs" / f"{job}.OU"
    deadline = time.monotonic() + timeout
    while not (out.exists() and text in out.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{text!r} not in {out} within {timeout:g}s: " + (
            out.read_text(errors="replace")[-3000:] if out.exists() else "(no file)")
        time.sleep(0.5)
    return out.read_text(errors="replace")


def test_pbs_hung_job_stacks_then_qdel_leaves_the_summary(pbs_env: dict[str, str], tmp_path: Path,
                                                          torch_available: None) -> None:
    (tmp_path / "hung.py").write_text(HUNG)
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "2", *AS_ROOT, "hung.py",
                str(tmp_path), env=pbs_env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    job = submitted(r.stderr)
    try:
        wait_for_files(tmp_path, "sleeping", 1, timeout=240)
        st = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)
        second = st["nodes"].split("+")[1].split("/")[0]  # exec_host "nodeA/0*2+nodeB/0*2": rank 3 is on B
        deadline = time.monotonic() + 120
        while True:  # ranks 0-2 reach all_reduce soon after rank 3 sleeps; their stack says when
            start = time.monotonic()
            s = run_cli("stacks", job, "--json", env=pbs_env, cwd=tmp_path, timeout=180)
            took = time.monotonic() - start
            assert s.returncode == 0, s.stderr
            data = json.loads(s.stdout)
            if len(data["groups"]) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        print(f"stacks at 2x2 on the PBS dev cluster: {took:.2f}s (collection {data['seconds']}s)")
        assert data["live"] is True
        _check_hung(data, second)
        text = run_cli("stacks", job, env=pbs_env, cwd=tmp_path, timeout=180).stdout
        assert f"rank 3 on {second}: hung.py:6 in load_batch" in text.splitlines()[1], text
        # the second host's sshd answers nothing (as a host that is gone): its ranks are named, in bounded time
        sshd = int((Path(pbs_env["SLURMLAUNCH_TEST_PBS_DIR"]) / "ssh" / f"sshd-{second}.pid").read_text())
        os.kill(sshd, signal.SIGSTOP)
        try:
            start = time.monotonic()
            gone = run_cli("stacks", job, "--timeout", "2", "--json", env=pbs_env, cwd=tmp_path, timeout=120)
            took = time.monotonic() - start
        finally:
            os.kill(sshd, signal.SIGCONT)
        assert gone.returncode == 0, gone.stderr
        groups = json.loads(gone.stdout)["groups"]
        print(f"stacks with {second}'s sshd not answering: {took:.1f}s")
        assert groups[0]["ranks"] == [2, 3] and groups[0]["line"].startswith(
            f"ranks 2-3 on {second}: not reached: {second} did not answer within 32s"), groups
        assert groups[-1]["ranks"] == [0, 1] and "in step: dist.all_reduce(t)" in groups[-1]["line"], groups
        c = run_cli("cancel", job, env=pbs_env, cwd=tmp_path, timeout=120)
        assert c.returncode == 0, c.stderr
    finally:
        subprocess.run(["qdel", job], env=pbs_env, capture_output=True, timeout=60)
    log = _output_with(tmp_path, job, "where the ranks were", 120)
    assert f"rank 3 on {second}: hung.py:6 in load_batch: time.sleep(600)" in log, log
    assert re.search(r"ranks 0-2(?: on \S+)?: hung\.py:8 in step: dist\.all_reduce\(t\)", log), log
    after = run_cli("stacks", job, "--json", env=pbs_env, cwd=tmp_path)  # ended: what the ranks saved
    assert after.returncode == 0, after.stderr
    data = json.loads(after.stdout)
    assert data["live"] is False
    _check_hung(data, second)


def test_pbs_walltime_leaves_the_summary_in_the_batch_log(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """The walltime: the MoM's SIGTERM reaches every rank (each saves its stacks) and the batch shell, which
    prints the grouped summary once mpiexec has ended, before the SIGKILL kill_delay later."""
    (tmp_path / "sleepy.py").write_text(SLEEPY)
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "2", "--time", "0:30",
                "--signal", "none",  # the walltime's SIGTERM alone (the batch step's warning would come first)
                *AS_ROOT, "sleepy.py", str(tmp_path), "3", "0", env=pbs_env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    job = submitted(r.stderr)
    try:
        wait_for_files(tmp_path, "ready-*", 4, timeout=240)
        second = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)["nodes"]
        second = second.split("+")[1].split("/")[0]
        log = _output_with(tmp_path, job, "where the ranks were", 300)
    finally:
        subprocess.run(["qdel", job], env=pbs_env, capture_output=True, timeout=60)
    # The summary runs once mpiexec has ended, which may be before the last rank's dump is written (seen once
    # in CI under load: rank 3's was missing, ranks 0-2's were there): rank 3, when present, is named right.
    # (seen again in CI run 9: rank 1's dump missing): the waiting ranks that are there form one group
    assert re.search(r"ranks? [0-2](?:[,-][0-2])*(?: on \S+)?: sleepy\.py:14 in wait_for_peer", log), log
    assert "rank 3 " not in log or f"rank 3 on {second}: sleepy.py:11 in load_batch: time.sleep(600)" in log, log
    # which stop it was, told by the time against the walltime (issue 40)
    assert re.search(r"slurmlaunch: the job was stopped \d+s into its run \(SIGTERM\): its walltime of 30s ran out\n",
                     log), log
    st = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)
    assert st["state"] == "TIMEOUT", st
