"""`--requeue` (`#PBS -r y`) and `qrerun` against the real OpenPBS 23.06 of the session (tests/conftest.py
pbs_cluster): what the server does to a running job it is told to rerun, and what `submit --wait`, `status`,
`logs` and the job's own files say across the rerun.

Seen on this server (and held here): qrerun stops the running job (its batch shell gets SIGTERM, its ranks are
gone) and queues it again, job_state Q, substate 10, Exit_status -11 (JOB_EXEC_RERUN), run_count still the
stopped run's; the next start is run_count + 1, from the start of the script, in the same job id; with -k doe
the output file keeps the first run's lines and the second run's follow them. A job qsub'd with `-r n` is
refused by qrerun ("job is not rerunnable", exit 190); one qsub'd with no -r at all is rerunnable: OpenPBS's
default is y.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import alive, run_cli, wait_for_files
from tests.real.test_pbs_real import AS_ROOT, _qsub, _raw, _until
from tests.real.test_pbs_real_more import _status_until

pytestmark = pytest.mark.pbs

# Each rank notes its run (1, 2, ...) and pid; the first run waits to be stopped, a later one exits with argv[2].
RERUN = """
import os, sys, time
d, rank = sys.argv[1], int(os.environ["RANK"])
runs = os.path.join(d, "runs-%d" % rank)
n = len(open(runs).read().splitlines()) + 1 if os.path.exists(runs) else 1
with open(runs, "a") as f:
    f.write("%d %d\\n" % (n, os.getpid()))
os.write(1, ("RUN %d rank %d\\n" % (n, rank)).encode())
if n == 1:
    time.sleep(300)
sys.exit(int(sys.argv[2]))
"""


def _qmgr(env: dict[str, str], command: str) -> None:
    subprocess.run(["qmgr", "-c", command], env=env, check=True, capture_output=True, timeout=60)


def _runs(tmp_path: Path, rank: int) -> list[list[int]]:
    return [[int(w) for w in line.split()] for line in (tmp_path / f"runs-{rank}").read_text().splitlines()]


def test_qrerun_of_a_requeue_job_reruns_it_and_the_second_run_has_the_last_word(pbs_env: dict[str, str],
                                                                                tmp_path: Path) -> None:
    """--requeue is -r y (Rerunable True); qrerun of the running job: its ranks are stopped, status reads
    PENDING with PBS's reason while it waits (the scheduler is paused for the test so that the wait can be
    seen), then RUNNING as run 2; `submit --wait` follows through it and ends with run 2's exit code (3), the
    stopped run writing none of its own; logs hold both runs."""
    script = tmp_path / "rerun.py"
    script.write_text(RERUN)
    said = tmp_path / "wait.err"  # --wait's stderr, read while it runs
    with open(said, "w") as err_file:
        wait = subprocess.Popen(
            [sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "pbs", "--requeue", "--nodes", "2",
             "--tasks-per-node", "1", *AS_ROOT, "--wait", "--wait-timeout", "300", str(script), str(tmp_path), "3"],
            env=pbs_env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err_file, text=True)
    paused = False
    try:
        wait_for_files(tmp_path, "runs-*", 2, timeout=180)
        job = json.loads(run_cli("list", "--json", env=pbs_env, cwd=tmp_path).stdout)[-1]["job_id"]
        short = job.split(".", 1)[0]
        assert _raw(pbs_env, job)["Rerunable"] == "True"
        first = [_runs(tmp_path, r)[0][1] for r in (0, 1)]
        _qmgr(pbs_env, "set server scheduling = False")
        paused = True
        subprocess.run(["qrerun", job], env=pbs_env, check=True, capture_output=True, timeout=60)
        raw = _until(pbs_env, job, lambda r: r["job_state"] == "Q")
        assert (raw["substate"], raw["Exit_status"], raw["run_count"]) == (10, -11, 1), raw
        st = _status_until(pbs_env, tmp_path, short, lambda s: s["state"] == "PENDING", "PENDING after qrerun")
        assert st["note"] == "PBS stopped run 1 and queued it again to rerun (qrerun)", st
        deadline = time.monotonic() + 60
        while any(alive(p) for p in first) or " PENDING (" not in said.read_text():
            assert time.monotonic() < deadline, \
                f"60 s after qrerun: ranks {first} alive {[alive(p) for p in first]}, --wait said {said.read_text()!r}"
            time.sleep(0.2)
        _qmgr(pbs_env, "set server scheduling = True")
        paused = False
        wait.wait(timeout=300)
    finally:
        if paused:
            _qmgr(pbs_env, "set server scheduling = True")
        if wait.poll() is None:
            wait.kill()
            wait.wait()
    err = said.read_text()
    assert wait.returncode == 3, err
    assert [[n for n, _ in _runs(tmp_path, r)] for r in (0, 1)] == [[1, 2], [1, 2]]
    lines = [ln.split("] ", 1)[1] for ln in err.splitlines() if ln.startswith("slurmlaunch: [")]
    assert f"job {job} PENDING (PBS stopped run 1 and queued it again to rerun (qrerun))" in lines, err
    assert any(ln.startswith(f"job {job} RUNNING on ") and ln.endswith("(run 2: PBS reran it from the start)")
               for ln in lines), err
    assert f"slurmlaunch: job {job} ended FAILED, exit code 3 (logs: " in err, err
    raw = _raw(pbs_env, job)
    assert (raw["job_state"], raw["run_count"], raw["Exit_status"]) == ("F", 2, 3), raw
    st = json.loads(run_cli("status", short, "--json", env=pbs_env, cwd=tmp_path).stdout)
    assert (st["state"], st["exit_code"], st.get("note")) == ("FAILED", 3, None), st
    logs = run_cli("logs", short, env=pbs_env, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    assert [ln.split(">:", 1)[-1] for ln in logs.stdout.splitlines() if "RUN " in ln and "rank 0" in ln] == \
        ["RUN 1 rank 0", "RUN 2 rank 0"], logs.stdout
    assert re.search(r"slurmlaunch: the job was stopped \d+s into its run \(SIGTERM\): qdel or qrerun",
                     logs.stdout), logs.stdout  # run 1's shell, by qrerun (no walltime asked)


def test_without_requeue_openpbs_reruns_by_default_and_r_n_is_refused(pbs_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """What --requeue adds on OpenPBS: nothing but the word. A job with no -r (slurmlaunch's script without
    --requeue) is rerunnable, as the server's default says; only -r n makes qrerun refuse."""
    script = tmp_path / "rerun.py"
    script.write_text(RERUN)
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "1", "--tasks-per-node", "1", *AS_ROOT, str(script),
                str(tmp_path), "0", env=pbs_env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    plain = _raw(pbs_env, job)
    never = _qsub(pbs_env, tmp_path, "-r", "n", "--", "/bin/sleep", "300")
    try:
        assert plain["Rerunable"] == "True", plain
        _until(pbs_env, never, lambda raw: raw["job_state"] == "R")
        refused = subprocess.run(["qrerun", never], env=pbs_env, capture_output=True, text=True, timeout=60)
        assert (refused.returncode, refused.stderr.strip()) == (190, f"qrerun: job is not rerunnable {never}")
    finally:
        subprocess.run(["qdel", job, never], env=pbs_env, capture_output=True, timeout=60)
