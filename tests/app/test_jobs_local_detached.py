"""Detached local jobs (issue 41): `submit --no-wait` on the local scheduler returns at once with a job id, and
the job is then a job like a queued one: `status` (state, nodes, elapsed, exit code), `logs --follow`, `cancel
--stacks`, `cancel` and `list` answer from any other process; killing or hanging up the submitting process
(`--wait`) leaves it running; a record whose supervisor is gone (killed, the machine restarted) reads as ended.

Every test drives the CLI as separate processes, as a user's terminals would; the processes are checked by
pid through /proc, never by how long something took (the bounds are the tests' timeouts)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import alive, no_slurm_env, run_cli, wait_for_files

# Each rank says which process it is (pid-RANK, written whole), then waits for the file "go" (at most 120 s);
# rank 0 then exits with code argv[2], the others with 0 (a failing rank 1 could stop rank 0 before it prints).
# The wait is one line of C calls only, so that every rank's stack is the same wherever a dump finds it: with
# the check and the sleep on two lines (and os.path's Python frames in the check), a loaded machine's dump caught
# one rank in each and `cancel --stacks` showed two groups (CI, 2026-12-07).
WAITER = """
import os, sys, time
d, rank = sys.argv[1], int(os.environ["RANK"])
with open(os.path.join(d, f".pid-{rank}"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(d, f".pid-{rank}"), os.path.join(d, f"pid-{rank}"))
print(f"started {rank}", flush=True)
deadline, go = time.monotonic() + 120, os.path.join(d, "go")
while not os.access(go, os.F_OK) and time.monotonic() < deadline: time.sleep(0.05)
print(f"finished {rank}", flush=True)
sys.exit(int(sys.argv[2]) if rank == 0 else 0)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = no_slurm_env(tmp_path)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    (tmp_path / "job.py").write_text(WAITER)
    return env


def _submit(env: dict[str, str], tmp_path: Path, *args: str, code: int = 0) -> str:
    before = int(time.time())
    r = run_cli("submit", "--scheduler", "local", "--no-wait", "-o", "logs", *args, "job.py", str(tmp_path), str(code),
                env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    assert job.isdigit() and int(job) >= before, r.stdout  # local ids never fall below the Unix time
    assert not (tmp_path / "go").exists()  # it returned while the ranks wait: they run detached
    return job


def _status(env: dict[str, str], job: str) -> dict[str, Any]:
    r = run_cli("status", "--json", job, env=env)
    assert r.returncode == 0, r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def _final_status(env: dict[str, str], job: str, bound: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + bound
    while True:
        st = _status(env, job)
        if st["state"] not in ("RUNNING", "PENDING") or time.monotonic() > deadline:
            return st
        time.sleep(0.2)


def _listed(env: dict[str, str], job: str) -> str:
    rows = json.loads(run_cli("list", "--json", env=env).stdout)
    return str(next(row["state"] for row in rows if row["job_id"] == job))


def _pids(tmp_path: Path, n: int) -> list[int]:
    return [int(p.read_text()) for p in wait_for_files(tmp_path, "pid-*", n)]


def _supervisor(tmp_path: Path, job: str) -> int:
    return int(json.loads((tmp_path / "logs" / f"job-{job}.json").read_text())["supervisor"]["pid"])


def test_a_detached_job_answers_status_list_and_logs_follow_from_another_process(tmp_path: Path) -> None:
    env = _env(tmp_path)
    job = _submit(env, tmp_path, "--nodes", "2", code=3)
    _pids(tmp_path, 2)
    st = _status(env, job)
    assert (st["state"], st["nodes"], st["exit_code"]) == ("RUNNING", "127.0.0.[1-2]", None), st
    assert re.fullmatch(r"\d\d:\d\d:\d\d", st["elapsed"]), st
    assert run_cli("status", job, env=env).stdout.startswith(f"job {job} (local): RUNNING on 127.0.0.[1-2], elapsed ")
    assert _listed(env, job) == "RUNNING"
    follow = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "logs", job, "--follow"], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == "started 0\n"  # what rank 0 printed before the follow began
        (tmp_path / "go").touch()
        out, err = follow.communicate(timeout=120)
    finally:
        follow.kill()
    assert follow.returncode == 3, err
    assert out == "finished 0\n", out
    assert f"job {job} RUNNING on 127.0.0.[1-2]" in err and "failed" in err, err
    assert f"job {job} ended FAILED, exit code 3" in err, err
    st = _status(env, job)
    assert (st["state"], st["exit_code"]) == ("FAILED", 3) and st["elapsed"] is not None, st
    assert _listed(env, job) == "FAILED 3"


def test_cancel_stacks_of_a_detached_job_prints_the_stacks_then_cancels(tmp_path: Path) -> None:
    env = _env(tmp_path)
    job = _submit(env, tmp_path, "--tasks-per-node", "2")
    ranks = _pids(tmp_path, 2)
    c = run_cli("cancel", "--stacks", job, env=env, timeout=120)
    assert c.returncode == 0, c.stderr
    assert f"job {job}: 2 rank(s), stacks now" in c.stdout and "ranks 0-1: job.py:" in c.stdout, c.stdout
    assert c.stdout.endswith(f"cancelled job {job}\n"), c.stdout
    st = _final_status(env, job)
    assert (st["state"], st["exit_code"]) == ("CANCELLED", 128 + signal.SIGTERM), st
    assert not [p for p in ranks if alive(p)]
    assert "stopped by SIGTERM" in (tmp_path / "logs" / f"job-{job}.batch.log").read_text()
    again = run_cli("cancel", job, env=env)
    assert (again.returncode, again.stdout) == (0, f"job {job} had already ended (CANCELLED, exit code 143): "
                                                   f"nothing to cancel\n"), again.stderr
    assert _listed(env, job) == "CANCELLED"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_a_job_survives_its_submitter_killed_or_hung_up(tmp_path: Path, sig: int) -> None:
    # `submit --wait` in a session of its own, as in a terminal; then that whole session gets the signal (a
    # closed terminal's hang-up reaches every process of it): the follower dies, the job goes on to its end.
    env = _env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "local", "--wait", "-o",
                             "logs", "--tasks-per-node", "2", "job.py", str(tmp_path), "0"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        job = proc.stdout.readline().strip()
        ranks = _pids(tmp_path, 2)
        os.killpg(proc.pid, sig)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -sig
    assert all(alive(p) for p in ranks)
    assert _status(env, job)["state"] == "RUNNING"
    (tmp_path / "go").touch()
    st = _final_status(env, job)
    assert (st["state"], st["exit_code"]) == ("COMPLETED", 0), st
    assert (tmp_path / "logs" / f"job-{job}.rank-1.log").read_text() == "started 1\nfinished 1\n"


def test_a_record_whose_supervisor_was_killed_reads_as_ended_and_no_rank_is_left(tmp_path: Path) -> None:
    env = _env(tmp_path)
    job = _submit(env, tmp_path, "--nodes", "2")
    ranks = _pids(tmp_path, 2)
    supervisor = _supervisor(tmp_path, job)
    os.kill(supervisor, signal.SIGKILL)  # the OOM killer, say
    deadline = time.monotonic() + 30
    while alive(supervisor) and time.monotonic() < deadline:  # the signal's delivery, not the test's subject
        time.sleep(0.05)
    st = _status(env, job)
    assert (st["state"], st["exit_code"]) == ("FAILED", None) and st["note"].startswith("lost: "), st
    assert _listed(env, job) == "FAILED"
    deadline = time.monotonic() + 30  # the ranks die with their supervisor (PR_SET_PDEATHSIG)
    while [p for p in ranks if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in ranks if alive(p)], "a rank outlived its supervisor"
    c = run_cli("cancel", job, env=env)
    assert c.returncode == 0 and "had already ended (FAILED)" in c.stdout, (c.stdout, c.stderr)


@pytest.mark.parametrize("field, value", [("boot", "another-boot"), ("start", 1)])
def test_a_record_of_another_boot_or_a_reused_pid_is_not_running(tmp_path: Path, field: str, value: object) -> None:
    # The machine restarted mid-job (another boot id), or the recorded pid now names another process (another
    # start time): the record must not read RUNNING for ever, whatever process holds that pid now.
    env = _env(tmp_path)
    job = _submit(env, tmp_path)
    _pids(tmp_path, 1)
    record = tmp_path / "logs" / f"job-{job}.json"
    data = json.loads(record.read_text())
    supervisor = data["supervisor"]["pid"]
    try:
        assert alive(supervisor)
        data["supervisor"][field] = value
        record.write_text(json.dumps(data))
        st = _status(env, job)
        assert (st["state"], st["exit_code"]) == ("FAILED", None) and "lost" in st["note"], st
        assert _listed(env, job) == "FAILED"
        c = run_cli("cancel", job, env=env)  # never a signal to the process that now holds the pid
        assert c.returncode == 0 and "had already ended" in c.stdout, c.stderr
        assert alive(supervisor)
    finally:
        os.kill(supervisor, signal.SIGTERM)  # the supervisor this test started: it stops its ranks


def api_wait(directory: str) -> int:
    """An API function: says which process it is (pid-RANK), waits for the file "go", then returns its rank."""
    rank = int(os.environ["RANK"])
    with open(os.path.join(directory, f".pid-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(directory, f".pid-{rank}"), os.path.join(directory, f"pid-{rank}"))
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(directory, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return rank


API_CALL = """
import json, sys
import slurmlaunch
from tests.app.test_jobs_local_detached import api_wait
job = slurmlaunch.submit(api_wait, sys.argv[1], scheduler="local", nodes=2, output_dir=sys.argv[1] + "/logs")
print(job.job_id, flush=True)
print(json.dumps(job.results()), flush=True)
"""


def test_an_api_job_on_the_local_scheduler_is_a_local_job(tmp_path: Path) -> None:
    # issue 41: its id was the controller's pid, `list` did not show it and `status` did not know it
    env = _env(tmp_path)
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    before = int(time.time())
    proc = subprocess.Popen([sys.executable, "-c", API_CALL, str(tmp_path)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        job = proc.stdout.readline().strip()
        assert job.isdigit() and int(job) >= before, job
        st = _status(env, job)
        assert (st["state"], st["nodes"], st["exit_code"]) == ("RUNNING", "127.0.0.[1-2]", None), st
        assert _listed(env, job) == "RUNNING"
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and json.loads(out) == [0, 1], err
    st = _status(env, job)
    assert (st["state"], st["exit_code"]) == ("COMPLETED", 0) and st["elapsed"] is not None, st
    assert _listed(env, job) == "COMPLETED"
    assert "Job completed successfully" in run_cli("logs", job, "--rank", "1", env=env).stdout


SUBMIT_AND_LEAVE = """
import pickle, sys
import slurmlaunch
from tests.app.test_jobs_local_detached import api_wait
job = slurmlaunch.submit(api_wait, sys.argv[1], scheduler="local", nodes=2, output_dir=sys.argv[1] + "/logs")
with open(sys.argv[1] + "/handle.pkl", "wb") as f:
    pickle.dump(job, f)
print(job.job_id, flush=True)
"""

RESULTS_ELSEWHERE = """
import json, pickle, sys
with open(sys.argv[1] + "/handle.pkl", "rb") as f:
    job = pickle.load(f)
print(json.dumps([job.results(), job.state]), flush=True)
"""


def test_an_api_job_on_the_local_scheduler_outlives_the_interpreter_that_submitted_it(tmp_path: Path) -> None:
    # issue 41: the API's local job was its submitter's child (a controller that died with it); now the local
    # scheduler's detached job, as `submit --no-wait`'s: the submitter exits, the job runs on, and its handle
    # (pickled) gives its values in another process
    env = _env(tmp_path)
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    r = subprocess.run([sys.executable, "-c", SUBMIT_AND_LEAVE, str(tmp_path)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    ranks = _pids(tmp_path, 2)  # both ranks run, their submitter gone
    assert all(alive(p) for p in ranks)
    st = _status(env, job)
    assert (st["state"], st["nodes"]) == ("RUNNING", "127.0.0.[1-2]"), st
    assert _listed(env, job) == "RUNNING"
    (tmp_path / "go").touch()
    r = subprocess.run([sys.executable, "-c", RESULTS_ELSEWHERE, str(tmp_path)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [[0, 1], "COMPLETED"], r.stdout
    assert _listed(env, job) == "COMPLETED"


def test_cancel_of_an_api_job_on_the_local_scheduler(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    call = API_CALL.replace("print(json.dumps(job.results()), flush=True)",
                            "try:\n    job.results()\nexcept Exception as e:\n    print(type(e).__name__, flush=True)")
    proc = subprocess.Popen([sys.executable, "-c", call, str(tmp_path)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        job = proc.stdout.readline().strip()
        assert _status(env, job)["state"] == "RUNNING"
        c = run_cli("cancel", job, env=env)
        assert (c.returncode, c.stdout) == (0, f"cancelled job {job}\n"), c.stderr
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert out.strip(), err  # the caller's wait ended with an error, not a value
    st = _final_status(env, job)
    assert (st["state"], st["exit_code"]) == ("CANCELLED", 128 + signal.SIGTERM), st


def test_a_foreground_job_is_followed_and_cancelled_from_another_terminal(tmp_path: Path) -> None:
    # without --wait/--no-wait the job runs in the submitting terminal, and is a job all the same: `logs
    # --follow` from another terminal follows it, `cancel` there stops it (issue 41: "Ctrl-C there stops it")
    env = _env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "local", "-o", "logs",
                             "--nodes", "2", "job.py", str(tmp_path), "0"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ranks = _pids(tmp_path, 2)
        job = json.loads(run_cli("list", "--json", env=env).stdout)[-1]["job_id"]
        assert _status(env, job)["nodes"] == "127.0.0.[1-2]"
        follow = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "logs", job, "--follow"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert follow.stdout is not None
            assert follow.stdout.readline() == "started 0\n"
            c = run_cli("cancel", job, env=env)
            assert (c.returncode, c.stdout) == (0, f"cancelled job {job}\n"), c.stderr
            _, follow_err = follow.communicate(timeout=60)
        finally:
            follow.kill()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err, err
    assert f"job {job} ended CANCELLED, exit code 143" in follow_err, follow_err
    assert not [p for p in ranks if alive(p)]
    assert _listed(env, job) == "CANCELLED"


@pytest.mark.parametrize("cancel", [True, False])
def test_ctrl_c_of_a_wait_follows_the_queued_rule(tmp_path: Path, cancel: bool) -> None:
    # as under Slurm: Ctrl-C of `submit --wait` cancels the job with --cancel-on-interrupt (on a terminal it
    # asks), and without it, where nobody can be asked, leaves the job running and says how to reach it
    env = _env(tmp_path)
    flags = ["--cancel-on-interrupt"] if cancel else []
    proc = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "local", "--wait", *flags,
                             "-o", "logs", "job.py", str(tmp_path), "0"], env=env, cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        job = proc.stdout.readline().strip()
        ranks = _pids(tmp_path, 1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    if cancel:
        assert f"cancelled job {job}" in err, err
        assert _final_status(env, job)["state"] == "CANCELLED"
        assert not [p for p in ranks if alive(p)]
    else:
        assert f"job {job} keeps running (slurmlaunch cancel {job} cancels it" in err, err
        assert _status(env, job)["state"] == "RUNNING" and all(alive(p) for p in ranks)
        (tmp_path / "go").touch()
        assert _final_status(env, job)["state"] == "COMPLETED"
