"""The local scheduler under faults: a reader that goes away, hang-ups and stops, a segfaulting rank whose
siblings left daemons behind, a rank that never joins, and the job's record through all of it.

Each test drives `slurmlaunch submit` as a separate process, as a user's shell would, and then checks the
processes (by pid, through /proc), the logs and `slurmlaunch status`: never the time it took (the bounds
are the tests' timeouts; a process that outlives the job is found by pid, not by waiting)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import DAEMONS, SLEEPERS, alive, no_slurm_env, run_cli, wait_for_files

WRITER = """
import os, sys
rank = int(os.environ["RANK"])
for i in range(20000):
    print(f"line {i} of rank {rank}")
"""


def _submit(tmp_path: Path, script: str, *args: str, stdout: int | None = subprocess.PIPE) -> subprocess.Popen[bytes]:
    path = tmp_path / "job.py"
    path.write_text(script)
    return subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "local",
                             "-o", str(tmp_path / "logs"), *args, str(path), str(tmp_path)],
                            env=no_slurm_env(tmp_path), cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE)


def _record(tmp_path: Path) -> dict[str, object]:
    records = [p for p in (tmp_path / "logs").glob("job-*.json")]
    assert len(records) == 1, records
    data: dict[str, object] = json.loads(records[0].read_text())
    return data


def _status(tmp_path: Path, job_id: str) -> dict[str, object]:
    r = run_cli("status", "--json", job_id, env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data: dict[str, object] = json.loads(r.stdout)
    return data


def test_reader_gone_the_job_ends_and_the_logs_are_complete(tmp_path: Path) -> None:
    # `slurmlaunch submit ... | head -3`: the console's reader goes away after three lines.
    proc = _submit(tmp_path, WRITER, "--tasks-per-node", "2")
    assert proc.stdout is not None and proc.stderr is not None
    for _ in range(3):
        proc.stdout.readline()
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    assert code == 0, err
    assert "console stopped taking output" in err and "Traceback" not in err
    job_id = str(_record(tmp_path)["job_id"])
    for rank in (0, 1):
        lines = (tmp_path / "logs" / f"job-{job_id}.rank-{rank}.log").read_text().splitlines()
        lines = [line for line in lines if not line.startswith("slurmlaunch: OMP_NUM_THREADS=")]  # rank 0's note
        assert lines == [f"line {i} of rank {rank}" for i in range(20000)]
    assert _status(tmp_path, job_id)["state"] == "COMPLETED"


@pytest.mark.parametrize("sig, state_word", [(signal.SIGHUP, "SIGHUP"), (signal.SIGTERM, "SIGTERM"),
                                             (signal.SIGINT, "SIGINT")])
def test_a_stop_signal_stops_every_process_and_is_recorded(tmp_path: Path, sig: int, state_word: str) -> None:
    proc = _submit(tmp_path, SLEEPERS, "--nodes", "2")
    try:
        pid_files = wait_for_files(tmp_path, "pid-*", 2)
        job_id = str(_record(tmp_path)["job_id"])
        assert _status(tmp_path, job_id)["state"] == "RUNNING"
        time.sleep(0.5)  # past the launcher's exec: the ranks are the scripts now
        proc.send_signal(sig)
        _, err_bytes = proc.communicate(timeout=60)
    finally:
        proc.kill()
    err = err_bytes.decode()
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {state_word}" in err and "failed first" not in err, err
    pids = [int(p) for f in pid_files for p in f.read_text().split()]
    assert not [p for p in pids if alive(p)], "a rank or a child it started in its own session survived"
    status = _status(tmp_path, job_id)
    assert (status["state"], status["exit_code"]) == ("CANCELLED", 128 + sig)


def test_segfault_kills_every_process_of_the_job_including_escaped_daemons(tmp_path: Path) -> None:
    proc = _submit(tmp_path, DAEMONS, "--tasks-per-node", "3")
    try:
        _, err_bytes = proc.communicate(timeout=120)  # the daemons would hold the output open for 300 s
    finally:
        proc.kill()
    err = err_bytes.decode()
    assert proc.returncode == 128 + signal.SIGSEGV, err
    assert "rank 1 failed first with exit code 139" in err
    daemons = [int(p.read_text()) for p in tmp_path.glob("daemon-*")]
    assert len(daemons) == 3
    assert not [p for p in daemons if alive(p)], "a daemon a rank started outlived the job"


def test_rdzv_timeout_reaches_the_ranks_and_a_rank_that_never_joins_ends_the_job(tmp_path: Path) -> None:
    # Rank 0 never opens its rendezvous: rank 1's watchdog must stop the job after --rdzv-timeout.
    never = "import time; time.sleep(300)\n"
    proc = _submit(tmp_path, never, "--nodes", "2", "--rdzv-timeout", "2")
    try:
        _, err_bytes = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = err_bytes.decode()
    assert proc.returncode != 0, err
    assert "nothing listened at MASTER_ADDR:MASTER_PORT" in (tmp_path / "logs").joinpath(
        f"job-{_record(tmp_path)['job_id']}.rank-1.log").read_text()


def test_time_limit_warns_then_stops_and_requeue_reruns(tmp_path: Path) -> None:
    # --time 0:3 with --signal USR1@2: the warning comes at ~1 s; the script saves and exits 138
    # (128 + USR1) on its first run, and on the requeued run (SLURM_RESTART_COUNT=1) finishes at once.
    script = """
import os, signal, sys, time
restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
print(f"run {restarts}", flush=True)
if restarts:
    sys.exit(0)
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(128 + signal.SIGUSR1))
time.sleep(300)
"""
    proc = _submit(tmp_path, script, "--time", "0:3", "--signal", "USR1@2", "--requeue")
    try:
        out, err_bytes = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = err_bytes.decode()
    assert proc.returncode == 0, err
    assert "requeued (restart 1 of at most 3)" in err
    job_id = str(_record(tmp_path)["job_id"])
    assert (tmp_path / "logs" / f"job-{job_id}.rank-0.log").read_text() == "run 0\nrun 1\n"


def test_time_limit_without_requeue_is_a_timeout(tmp_path: Path) -> None:
    proc = _submit(tmp_path, "import time; time.sleep(300)\n", "--time", "0:1", "--signal", "none")
    try:
        _, err_bytes = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "reached its time limit" in err_bytes.decode()
    assert _status(tmp_path, str(_record(tmp_path)["job_id"]))["state"] == "TIMEOUT"


def test_status_of_a_local_job_whose_supervisor_was_killed_is_failed_without_a_code(tmp_path: Path) -> None:
    proc = _submit(tmp_path, SLEEPERS, stdout=subprocess.DEVNULL)
    try:
        pid_files = wait_for_files(tmp_path, "pid-*", 1)
        job_id = str(_record(tmp_path)["job_id"])
        proc.kill()
        proc.wait(timeout=30)
    finally:
        for p in pid_files[0].read_text().split() if "pid_files" in locals() else []:
            try:
                os.kill(int(p), signal.SIGKILL)
            except ProcessLookupError:
                pass
    status = _status(tmp_path, job_id)
    assert (status["state"], status["exit_code"]) == ("FAILED", None)


def test_orphans_that_ended_during_an_element_are_reaped_before_the_next(tmp_path: Path) -> None:
    # Element 0's daemon exits on its own and comes back to the supervisor (a subreaper) as a zombie; by the
    # time element 1 runs, the supervisor must have reaped it rather than collect zombies all job long.
    script = """
import os, sys, time
if os.environ["SLURM_ARRAY_TASK_ID"] == "0":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os._exit(0)
        os._exit(0)
    time.sleep(1)
    sys.exit(0)
supervisor = os.getppid()
children = []
for task in os.listdir(f"/proc/{supervisor}/task"):
    children += open(f"/proc/{supervisor}/task/{task}/children").read().split()
states = [open(f"/proc/{c}/stat").read().rsplit(")", 1)[1].split()[0] for c in children]
sys.exit(3 if "Z" in states else 0)
"""
    proc = _submit(tmp_path, script, "--array", "0-1")
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()
