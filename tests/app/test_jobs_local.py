"""Job commands over local jobs: `status` of an array shows every element, `list` has a header, a state
and the directory; the error family is importable where users look."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import slurmlaunch
from slurmlaunch.core import errors
from tests.helpers import no_slurm_env, run_cli


def test_error_family_is_exported_at_the_top() -> None:
    for name in ("SlurmLaunchError", "SpecError", "SchedulerError", "HostlistError", "PreflightError"):
        assert getattr(slurmlaunch, name) is getattr(errors, name)
        assert name in slurmlaunch.__all__


def test_local_array_status_shows_every_element_and_list_has_columns(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    (tmp_path / "job.py").write_text("import os, sys; sys.exit(int(os.environ['SLURM_ARRAY_TASK_ID']) == 1)\n")
    r = run_cli("submit", "--scheduler", "local", "--array", "0-2", "-o", "logs", "job.py", env=env, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "array job" in r.stderr and "_1: FAILED 1" in r.stderr and "_2: COMPLETED 0" in r.stderr
    assert "the other ranks were stopped" not in r.stderr  # one rank per element: there are no others
    job = json.loads(run_cli("list", "--json", env=env, cwd=tmp_path).stdout)[-1]["job_id"]
    status = json.loads(run_cli("status", "--json", job, env=env, cwd=tmp_path).stdout)
    assert (status["state"], status["exit_code"]) == ("FAILED", 1)
    assert status["elements"] == {"0": "COMPLETED 0", "1": "FAILED 1", "2": "COMPLETED 0"}
    one = json.loads(run_cli("status", "--json", f"{job}_2", env=env, cwd=tmp_path).stdout)
    assert (one["state"], one["exit_code"]) == ("COMPLETED", 0)
    listed = run_cli("list", env=env, cwd=tmp_path).stdout.splitlines()
    assert listed[0].split()[:4] == ["JOB", "ID", "SCHED", "STATE"]
    assert job in listed[1] and "FAILED" in listed[1] and listed[1].endswith(str(tmp_path / "logs"))


def test_list_keeps_its_columns_when_a_record_is_gone(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    (tmp_path / "job.py").write_text("print('hi')\n")
    for out in ("kept", "removed"):
        assert run_cli("submit", "--scheduler", "local", "-o", out, "job.py", env=env, cwd=tmp_path).returncode == 0
    shutil.rmtree(tmp_path / "removed")
    listed = run_cli("list", env=env, cwd=tmp_path).stdout.splitlines()
    assert "record gone" in listed[2] and "COMPLETED" in listed[1], listed
    starts = {line.index("SUBMITTED") if i == 0 else line.index(" 20") + 1 for i, line in enumerate(listed)}
    assert len(starts) == 1, listed  # the submission time under its heading on every row (a job id may hold "20")


def test_list_shows_control_characters_escaped_and_keeps_its_columns(tmp_path: Path) -> None:
    """An index line edited by hand (or a remote login node's answer) with a terminal escape, a newline or a
    carriage return in the job's id, name or directory: `list` shows them escaped, one row a job, every row's
    submission time under its heading; --json keeps the values as they are."""
    env = no_slurm_env(tmp_path)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    (tmp_path / "job.py").write_text("print('hi')\n")
    assert run_cli("submit", "--scheduler", "local", "-o", "kept", "job.py", env=env, cwd=tmp_path).returncode == 0
    name = "\x1b]0;pwned\x07evil\x1b[2J\r\nx"
    planted = {"job_id": "9\r\x1b[1A", "scheduler": "local", "record": str(tmp_path / "gone\n\x1b[31m" / "job.json"),
               "name": name, "submitted_at": "2026-12-02T18:00:00+0000"}
    with open(tmp_path / "state" / "slurmlaunch" / "jobs.jsonl", "a") as f:
        f.write(json.dumps(planted) + "\n")
    r = run_cli("list", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = r.stdout.splitlines()
    assert len(listed) == 3 and "\x1b" not in r.stdout and "\r" not in r.stdout and "\x07" not in r.stdout, listed
    assert listed[2].lstrip().startswith("9\\r\\x1b[1A  local ") and "\\x1b]0;pwned\\x07evil\\x1b[2J\\r\\nx" in \
        listed[2] and listed[2].endswith("gone\\n\\x1b[31m"), listed
    starts = {line.index("SUBMITTED") if i == 0 else line.index(" 20") + 1 for i, line in enumerate(listed)}
    assert len(starts) == 1, listed
    assert json.loads(run_cli("list", "--json", env=env, cwd=tmp_path).stdout)[-1]["name"] == name


def test_list_without_jobs_says_so(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    r = run_cli("list", env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("no jobs submitted yet")


def test_logs_of_a_rank_the_job_does_not_have_names_the_ranks(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    (tmp_path / "job.py").write_text("print('hi')\n")
    assert run_cli("submit", "--scheduler", "local", "--nodes", "2", "--tasks-per-node", "2", "job.py", env=env,
                   cwd=tmp_path).returncode == 0
    job = json.loads(run_cli("list", "--json", env=env, cwd=tmp_path).stdout)[-1]["job_id"]
    r = run_cli("logs", job, "--rank", "9", env=env, cwd=tmp_path)
    assert r.returncode == 2 and f"job {job} has ranks 0-3" in r.stderr, r.stderr
    r = run_cli("logs", job, "--rank", "3", env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "hi\n", r.stderr


def test_a_dry_run_needs_no_scheduler_client(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)  # no sbatch, no qsub on PATH
    (tmp_path / "job.py").write_text("print('hi')\n")
    for scheduler, marker in (("pbs", "#PBS"), ("slurm", "#SBATCH")):
        r = run_cli("submit", "--scheduler", scheduler, "--dry-run", "job.py", env=env, cwd=tmp_path)
        assert r.returncode == 0 and marker in r.stdout, r.stderr
