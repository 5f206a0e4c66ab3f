"""Job commands (list, status, logs, cancel) over the records submit keeps: local and the real cluster."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_submit import no_slurm_env


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
    r = run_cli("status", "999999", env=env)
    assert r.returncode == 2 and "was not submitted from here" in r.stderr


@pytest.mark.slurm
def test_slurm_status_logs_cancel(cluster_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(cluster_env, XDG_STATE_HOME=str(tmp_path / "state"))
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
    assert [e["job_id"] for e in json.loads(run_cli("list", "--json", env=env).stdout)] == [job]
