"""Job commands (list, status, logs, cancel) over the records submit keeps: local and the real cluster."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import alive, no_slurm_env, run_cli, skip_or_fail


def test_local_job_in_list_and_status(tmp_path: Path) -> None:
    env = dict(no_slurm_env(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"))
    script = tmp_path / "hello.py"
    script.write_text("import os; print('hello from', os.environ['RANK'])")
    r = run_cli("submit", "--tasks-per-node", "2", str(script), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = json.loads(run_cli("list", "--json", env=env).stdout)
    assert len(listed) == 1 and listed[0]["scheduler"] == "local" and listed[0]["name"] == "hello.py"
    job = listed[0]["job_id"]
    st = json.loads(run_cli("status", job, "--json", env=env).stdout)
    assert (st["state"], st["exit_code"]) == ("COMPLETED", 0)
    assert run_cli("logs", job, "--rank", "1", env=env).stdout.strip() == "hello from 1"
    c = run_cli("cancel", job, env=env)
    assert (c.returncode, c.stdout) == (0, f"job {job} had already ended (COMPLETED, exit code 0): nothing to "
                                           f"cancel\n"), c.stderr
    r = run_cli("status", "999999", env=env)
    assert r.returncode == 2 and "was not submitted from here" in r.stderr


@pytest.mark.slurm
def test_slurm_status_logs_cancel(cluster_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(cluster_env)
    script = tmp_path / "slow.py"
    script.write_text("import time; print('started', flush=True); time.sleep(120)")
    r = run_cli("submit", "--nodes", "2", str(script), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = json.loads(run_cli("status", job, "--json", env=env).stdout)
        if st["state"] == "RUNNING" and "started" in run_cli("logs", job, "--rank", "1", env=env).stdout:
            break
        time.sleep(0.5)
    assert st["state"] == "RUNNING" and st["nodes"] == "node[1-2]"
    assert run_cli("status", job, env=env).stdout.startswith(f"job {job} (slurm): RUNNING on node[1-2]")
    assert run_cli("cancel", job, env=env).returncode == 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = json.loads(run_cli("status", job, "--json", env=env).stdout)
        if st["state"] == "CANCELLED":
            break
        time.sleep(0.5)
    assert st["state"] == "CANCELLED" and st["exit_code"] != 0
    again = run_cli("cancel", job, env=env)  # scancel would say nothing and exit 0: "cancelled" would be a lie
    assert again.returncode == 0 and again.stdout.startswith(f"job {job} had already ended (CANCELLED"), again
    assert [e["job_id"] for e in json.loads(run_cli("list", "--json", env=env).stdout)] == [job]
    # issue 33.4: list shows the scheduler's state (sacct's) of a job whose script wrote no exit code, not "?"
    assert list_state(env, job) == "CANCELLED"


def list_state(env: dict[str, str], job: str) -> str:
    """`list`'s state of ``job``, once accounting knows how it ended (slurmdbd may lag, 60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        state = next(e["state"] for e in json.loads(run_cli("list", "--json", env=env).stdout) if e["job_id"] == job)
        if state not in ("ENDED?", "?", "RUNNING", "COMPLETING") or time.monotonic() > deadline:
            return str(state)
        time.sleep(0.5)


@pytest.mark.slurm
def test_list_shows_the_state_of_an_ended_array(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """An array has no job-level exit code (its elements have theirs): `list` shows sacct's word for it,
    COMPLETED when every element did, else its first element that did not."""
    env = dict(cluster_env)
    (tmp_path / "el.py").write_text("import os, sys; sys.exit(int(os.environ['SLURM_ARRAY_TASK_ID']) * 3)")
    jobs = []
    for array in ("0", "0-1"):
        r = run_cli("submit", "--array", array, "--wait", "--wait-timeout", "120", "el.py", env=env, cwd=tmp_path,
                    timeout=180)
        assert r.returncode == (0 if array == "0" else 3), r.stdout + r.stderr
        jobs.append(r.stdout.split()[0].split("_")[0])
    assert [list_state(env, job) for job in jobs] == ["COMPLETED", "FAILED"]
    listed = run_cli("list", env=env).stdout
    assert " ? " not in listed and "ENDED?" not in listed, listed


@pytest.mark.slurm
def test_status_after_squeue_and_scontrol_forgot_comes_from_sacct(cluster_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    env = dict(cluster_env)
    (tmp_path / "quick.py").write_text("import time; time.sleep(2)")
    r = run_cli("submit", "--nodes", "2", "--wait", "--wait-timeout", "60", "quick.py", env=env, cwd=tmp_path,
                timeout=90)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[0]
    deadline = time.monotonic() + 60  # MinJobAge is 5 s on the test cluster
    while subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "scontrol still knows the job"
        time.sleep(1)
    st = json.loads(run_cli("status", job, "--json", env=env).stdout)
    assert (st["state"], st["exit_code"], st["nodes"]) == ("COMPLETED", 0, "node[1-2]"), st
    assert re.fullmatch(r"00:00:0[2-9]", st["elapsed"]), st  # sacct's Elapsed
    text = run_cli("status", job, env=env).stdout
    assert text.startswith(f"job {job} (slurm): COMPLETED on node[1-2], elapsed 00:00:0")


@pytest.mark.slurm
def test_dev_cluster_command_up_status_job_down(tmp_path: Path) -> None:
    from slurmlaunch.app.devcluster import slurm as devcluster

    if devcluster.missing_requirements():

        skip_or_fail(str(devcluster.missing_requirements()))
    root = tmp_path / "dc"
    r = run_cli("dev-cluster", "up", "--dir", str(root), "--nodes", "2", "--gpus-per-node", "2", timeout=120)
    try:
        assert r.returncode == 0, r.stderr
        exports = dict(line.removeprefix("export ").split("=", 1) for line in r.stdout.splitlines())
        assert exports["SLURM_CONF"] == str(root / "slurm.conf")
        st = run_cli("dev-cluster", "status", "--dir", str(root))
        assert st.returncode == 0 and "node1 debug* idle gpu:2" in st.stdout and "node2 debug* idle" in st.stdout
        again = run_cli("dev-cluster", "up", "--dir", str(root))
        assert again.returncode == 2 and "already up" in again.stderr
        script = tmp_path / "ok.py"
        script.write_text("import os; print(os.environ['RANK'])")
        job = run_cli("submit", "--nodes", "2", "--wait", str(script), env={**__import__("os").environ, **exports},
                      cwd=tmp_path, timeout=120)
        assert job.returncode == 0, job.stderr
    finally:
        pids = [int(p.read_text()) for p in root.glob("*.pid")]
        assert run_cli("dev-cluster", "down", "--dir", str(root)).returncode == 0

    assert pids and not any(alive(p) for p in pids)


@pytest.mark.slurm
def test_wait_timeout_has_its_own_exit_code_and_points_to_slurmlaunch(cluster_env: dict[str, str],
                                                                     tmp_path: Path) -> None:
    env = dict(cluster_env)
    (tmp_path / "long.py").write_text("import time; time.sleep(120)")
    r = run_cli("submit", "--wait", "--wait-timeout", "2", "long.py", env=env, cwd=tmp_path, timeout=90)
    job = r.stdout.split()[0]
    try:
        assert r.returncode == 124, r.stderr
        assert f"slurmlaunch cancel {job}" in r.stderr and "scancel" not in r.stderr
    finally:
        assert run_cli("cancel", job, env=env, cwd=tmp_path).returncode == 0
