"""A job id is not a job (issue 40, items 1 and 4), on the real schedulers: a second cluster that hands out the
ids the first one did (Slurm: started with the FirstJobId the first one just used; PBS: a fresh server numbers
from 0 again, as one started again does), side by side with the first and sharing its per-user index and output
directory. What is checked is what a user sees (the CLI's lines and exit codes) against what the scheduler
itself says (squeue, qstat): the job another user submitted under the reused id is never cancelled nor
reported as ours; a job the scheduler forgot reads from its own files; a new job of a reused id gets files of
its own and the old job's files keep their bytes; the batch log is created by slurmlaunch, never through a link.

The second clusters are this test's own and short-lived; the first Slurm one is the session's."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmlaunch.app.devcluster import pbs as pbscluster
from slurmlaunch.app.devcluster import slurm as slurmcluster
from slurmlaunch.core.errors import DevClusterError
from tests import sshd
from tests.helpers import run_cli, skip_or_fail
from tests.sshd import masters_left, on_laptop, setup_for

AS_ROOT = ["--env", "OMPI_ALLOW_RUN_AS_ROOT=1", "--env", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]
SCRIPT = ("import os, sys\nprint('run', sys.argv[1], 'rank', os.environ['RANK'], flush=True)\n"
          "sys.exit(int(sys.argv[2]))\n")


def submitted(stderr: str) -> str:
    m = re.search(r"submitted job (\S+)", stderr)
    assert m, stderr
    return m[1]


def files_of(directory: Path) -> dict[str, bytes]:
    """Every file directly in ``directory`` and its bytes (a job's own directory is a subdirectory)."""
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


@contextlib.contextmanager
def slurm_cluster_from(first_job_id: int) -> Iterator[dict[str, str]]:
    why = slurmcluster.missing_requirements()
    if why:
        skip_or_fail(why)
    root = Path(tempfile.mkdtemp(prefix="slurmlaunch-reuse-"))
    try:
        try:
            env = slurmcluster.up(root, nodes=1, gpus=0, cpus=4, first_job_id=first_job_id)
        except Exception as e:
            logs = "".join(p.read_text(errors="replace")[-2000:] for p in (root / "log").glob("*.log"))
            pytest.fail(f"the second Slurm cluster did not come up: {e}\n{logs}")
        yield env
    finally:
        with contextlib.suppress(DevClusterError):
            slurmcluster.down(root)
        shutil.rmtree(root, ignore_errors=True)


def test_slurm_ids_reused_by_a_second_cluster(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """Slurm: jobs N and N+1 of the session cluster, then a second cluster whose ids start at N, sharing the
    index and the output directory. There a foreign sbatch takes N: status says the job is gone and another
    has its id, and reads FAILED 3 from its own files; cancel deletes nothing (squeue: still running); list
    shows FAILED 3. slurmlaunch's next job there is N+1: its files go to a directory of their own, and the
    first N+1's keep their bytes. On the first cluster, job N is still ours."""
    (tmp_path / "run.py").write_text(SCRIPT)
    env_a = {**cluster_env}
    common = ["submit", "--nodes", "1", "--tasks-per-node", "1", "--wait", "--wait-timeout", "120", "run.py"]
    first = run_cli(*common, "first", "3", env=env_a, cwd=tmp_path, timeout=180)
    assert first.returncode == 3, first.stderr
    job_n = submitted(first.stderr)
    second = run_cli(*common, "second", "0", env=env_a, cwd=tmp_path, timeout=180)
    assert second.returncode == 0, second.stderr
    job_n1 = submitted(second.stderr)
    assert int(job_n1) == int(job_n) + 1, (job_n, job_n1)  # nothing else submits to this worker's cluster here
    logs = tmp_path / "slurmlaunch-logs"
    record = json.loads((logs / f"job-{job_n}.json").read_text())
    assert record["identity"]["submitted"] and record["identity"]["comment"] and record["cluster"]["controller"]
    before = files_of(logs)
    assert f"job-{job_n1}.batch.log" in before and b"run second rank 0" in before[f"job-{job_n1}.rank-0.log"]

    with slurm_cluster_from(int(job_n)) as second_env:
        env_b = {**cluster_env, **second_env}  # the same per-user index (XDG_STATE_HOME) and directory
        foreign = subprocess.run(["sbatch", "--parsable", "-J", "sleeper.sh", "-o", "/dev/null", "--wrap",
                                  "sleep 300"], env=env_b, capture_output=True, text=True, timeout=60)
        assert foreign.returncode == 0 and foreign.stdout.strip() == job_n, foreign.stdout + foreign.stderr
        try:
            st = run_cli("status", job_n, env=env_b)
            assert st.returncode == 0, st.stderr
            assert f"job {job_n} is gone; another job now has that id on Slurm" in st.stdout, st.stdout
            assert "FAILED" in st.stdout and "exit code 3" in st.stdout and "RUNNING" not in st.stdout, st.stdout
            c = run_cli("cancel", job_n, env=env_b)
            assert c.returncode == 0 and "nothing cancelled" in c.stdout, c.stdout + c.stderr
            state = subprocess.run(["squeue", "-h", "-j", job_n, "-o", "%T %j"], env=env_b, capture_output=True,
                                   text=True, timeout=30).stdout.split()
            assert state[1:] == ["sleeper.sh"] and state[0] in ("PENDING", "RUNNING"), state  # untouched
            listed = {row["job_id"]: row["state"] for row in json.loads(run_cli("list", "--json", env=env_b).stdout)}
            assert listed[job_n] == "FAILED 3", listed
            # on the first cluster, job N is still the recorded one
            mine = run_cli("status", job_n, "--json", env=env_a)
            assert json.loads(mine.stdout)["state"] == "FAILED" and "gone" not in mine.stdout, mine.stdout

            third = run_cli(*common, "third", "0", env=env_b, cwd=tmp_path, timeout=180)
            assert third.returncode == 0, third.stderr
            assert submitted(third.stderr) == job_n1, third.stderr  # the id the first cluster gave the second job
            own = [p for p in logs.iterdir() if p.is_dir() and re.fullmatch(rf"job-{job_n1}\.[0-9a-f]{{8}}",
                                                                             p.name)]
            assert len(own) == 1 and f"this job's are in {own[0]}" in third.stderr, third.stderr
            assert f"(logs: {own[0]})" in third.stderr and "run second" not in third.stderr, third.stderr
            assert files_of(logs) == before  # the first job N+1's files keep their bytes; nothing new beside them
            assert b"run third rank 0" in (own[0] / f"job-{job_n1}.rank-0.log").read_bytes()
            assert (own[0] / f"job-{job_n1}.batch.log").is_file() and (own[0] / f"job-{job_n1}.exitcode").is_file()
            shown = run_cli("logs", job_n1, "--rank", "0", env=env_b)
            assert "run third" in shown.stdout and "run second" not in shown.stdout, shown.stdout
            st = run_cli("status", job_n1, "--json", env=env_b)
            assert json.loads(st.stdout)["state"] == "COMPLETED", st.stdout + st.stderr
            # the index holds job N+1 of each cluster: each cluster's client is shown its own
            for env, run in ((env_a, "second"), (env_b, "third")):
                st = run_cli("status", job_n1, "--json", env=env)
                assert json.loads(st.stdout)["state"] == "COMPLETED" and "gone" not in st.stdout, st.stdout
                assert f"run {run}" in run_cli("logs", job_n1, "--rank", "0", env=env).stdout
        finally:
            subprocess.run(["scancel", job_n], env=env_b, capture_output=True, timeout=30)


def _squeue(env: dict[str, str], job: str, fields: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", fields], env=env, capture_output=True, text=True,
                          timeout=30).stdout.strip()


def _until(what: str, check: Callable[[], bool], limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"waited {limit:.0f}s for {what}"
        time.sleep(0.5)


def test_a_requeued_slurm_job_is_still_ours(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """Slurm gives a requeued job (its requeue after NODE_FAIL, Lightning's `scontrol requeue`) a new submit
    time: the token submit put in its comment still says it is the recorded job. status reads Slurm's state,
    not the job's files and no "another job now has that id"; list shows the queue's state; cancel cancels it."""
    (tmp_path / "run.py").write_text("import time\ntime.sleep(300)\n")
    r = run_cli("submit", "--nodes", "1", "--tasks-per-node", "1", "--time", "5", "run.py", env=cluster_env,
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    try:
        _until(f"job {job} to run", lambda: _squeue(cluster_env, job, "%T") == "RUNNING")
        first = _squeue(cluster_env, job, "%V")
        req = subprocess.run(["scontrol", "requeue", job], env=cluster_env, capture_output=True, text=True,
                             timeout=30)
        assert req.returncode == 0, req.stderr
        _until(f"job {job}'s requeue to give it a new submit time",
               lambda: _squeue(cluster_env, job, "%V") not in ("", first))
        st = run_cli("status", job, "--json", env=cluster_env)
        assert st.returncode == 0, st.stderr
        shown = json.loads(st.stdout)
        assert shown["state"] in ("PENDING", "RUNNING", "REQUEUED") and "gone" not in st.stdout, st.stdout
        listed = {row["job_id"]: row["state"] for row in json.loads(run_cli("list", "--json", env=cluster_env,
                                                                            cwd=tmp_path).stdout)}
        assert listed[job] in ("PENDING", "RUNNING", "REQUEUED"), listed
        c = run_cli("cancel", job, env=cluster_env)
        assert c.returncode == 0 and "nothing cancelled" not in c.stdout, c.stdout + c.stderr
        _until(f"job {job} to be cancelled", lambda: _squeue(cluster_env, job, "%T") in ("", "CANCELLED"), 60)
    finally:
        subprocess.run(["scancel", job], env=cluster_env, capture_output=True, timeout=30)


def test_the_batch_log_is_created_by_submit_not_through_a_link(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """Item 4: slurmd opens the batch log following links; submit creates it itself (O_EXCL|O_NOFOLLOW) while
    the job is held. A link planted where the next job's batch log goes makes the job's files go to a directory
    of their own; the link's target is never written."""
    (tmp_path / "run.py").write_text(SCRIPT)
    logs = tmp_path / "slurmlaunch-logs"
    logs.mkdir()
    target = tmp_path / "victim"
    target.write_text("untouched\n")
    # the next id is not known before sbatch answers: plant at the next few the session cluster could give
    probe = subprocess.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"], env=cluster_env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    subprocess.run(["scancel", probe.stdout.strip()], env=cluster_env, timeout=30)
    base = int(probe.stdout.strip())
    for job in range(base + 1, base + 4):
        (logs / f"job-{job}.batch.log").symlink_to(target)
    r = run_cli("submit", "--nodes", "1", "--tasks-per-node", "1", "--wait", "--wait-timeout", "120", "run.py",
                "planted", "0", env=cluster_env, cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr
    job = submitted(r.stderr)
    assert base < int(job) < base + 4, (base, job)
    own = next(p for p in logs.iterdir() if p.is_dir() and re.fullmatch(rf"job-{job}\.[0-9a-f]{{8}}", p.name))
    assert target.read_text() == "untouched\n"
    batch_log = own / f"job-{job}.batch.log"
    assert batch_log.is_file() and not batch_log.is_symlink()
    assert (logs / f"job-{job}.batch.log").is_symlink()  # left as it was: not ours


def test_a_remote_destinations_reused_id(laptop: sshd.Laptop, cluster_env: dict[str, str], tmp_path: Path) -> None:
    """--remote: a job submitted from the laptop over ssh ends FAILED 5; then the login host's Slurm is another
    cluster that gave the job's id to a foreign job (its slurm.conf changed: the record's setup names the second
    cluster's). From the laptop, over ssh: status says another job has the id and reads exit code 5 from the
    job's own files there; cancel deletes nothing (squeue: still there); list shows FAILED 5."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "run.py").write_text(SCRIPT)
    r = on_laptop(laptop, "submit", "--remote", f"login:{tmp_path / 'remote'}", *setup_for(cluster_env), "--python",
                  sys.executable, "--nodes", "1", "--tasks-per-node", "1", "--wait", "--wait-timeout", "120",
                  "run.py", "remote", "5", cwd=project)
    assert r.returncode == 5, r.stderr
    job = r.stdout.split()[0]
    index = Path(laptop.env["XDG_STATE_HOME"]) / "slurmlaunch" / "jobs.jsonl"
    path = Path(json.loads(index.read_text().splitlines()[-1])["record"])
    record = json.loads(path.read_text())
    assert record["identity"]["submitted"] and record["cluster"]["remote"] == "login", record
    with slurm_cluster_from(int(job)) as second_env:
        env_b = {**cluster_env, **second_env}
        foreign = subprocess.run(["sbatch", "--parsable", "-J", "sleeper.sh", "-o", "/dev/null", "--wrap",
                                  "sleep 300"], env=env_b, capture_output=True, text=True, timeout=60)
        assert foreign.returncode == 0 and foreign.stdout.strip() == job, foreign.stdout + foreign.stderr
        try:
            record["remote_setup"] = [line.replace(cluster_env["SLURM_CONF"], second_env["SLURM_CONF"])
                                      for line in record["remote_setup"]]
            path.write_text(json.dumps(record))
            st = on_laptop(laptop, "status", job, cwd=project)
            assert f"job {job} is gone; another job now has that id on Slurm" in st.stdout, st.stdout + st.stderr
            assert "exit code 5" in st.stdout and "RUNNING" not in st.stdout, st.stdout
            c = on_laptop(laptop, "cancel", job, cwd=project)
            assert c.returncode == 0 and "nothing cancelled" in c.stdout, c.stdout + c.stderr
            state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %j"], env=env_b, capture_output=True,
                                   text=True, timeout=30).stdout.split()
            assert state[1:] == ["sleeper.sh"] and state[0] in ("PENDING", "RUNNING"), state
            listed = json.loads(on_laptop(laptop, "list", "--json", cwd=project).stdout)
            assert [row["state"] for row in listed if row["job_id"] == job] == ["FAILED 5"], listed
        finally:
            subprocess.run(["scancel", job], env=env_b, capture_output=True, timeout=30)
    assert masters_left(laptop) == []


def _pbs_up(root: Path) -> dict[str, str]:
    try:
        return pbscluster.up(root, nodes=1, cpus=4)
    except Exception as e:
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((root / "pbs").glob("*/spool/*_logs/*")))
        pytest.fail(f"an OpenPBS dev cluster did not come up: {e}\n{logs}")


def test_pbs_a_fresh_server_numbers_from_0_again(tmp_path: Path) -> None:
    """PBS: jobs 0 (exit 7) and 1 of a first server; then a second, fresh server (as one started again: it
    numbers from 0), side by side, sharing the index and the output directory. Before it has any job, status 0
    reads the old job's own files (no 'qstat: Unknown Job Id'); once a foreign qsub took 0, status says another
    job has that id, cancel deletes nothing (qstat: still there, no substate 91), list shows FAILED 7; the first
    server's client still sees its job 0 as ours. slurmlaunch's next job there is 1: files of its own."""
    why = pbscluster.missing_requirements() or (None if pbscluster.installed() else "OpenPBS is not installed")
    if why:
        skip_or_fail(why)
    (tmp_path / "run.py").write_text(SCRIPT)
    state = tmp_path / "state"
    state.mkdir()
    roots = [Path(tempfile.mkdtemp(prefix="slurmlaunch-pbs-reuse-")) for _ in range(2)]
    try:
        env1 = {**os.environ, **_pbs_up(roots[0]), "XDG_STATE_HOME": str(state)}
        common = ["submit", "--scheduler", "pbs", "--nodes", "1", *AS_ROOT, "--wait", "--wait-timeout", "200",
                  "run.py"]
        first = run_cli(*common, "first", "7", env=env1, cwd=tmp_path, timeout=300)
        assert first.returncode == 7, first.stderr
        job0 = submitted(first.stderr)
        second = run_cli(*common, "second", "0", env=env1, cwd=tmp_path, timeout=300)
        assert second.returncode == 0, second.stderr
        job1 = submitted(second.stderr)
        assert (job0.split(".")[0], job1.split(".")[0]) == ("0", "1"), (job0, job1)
        logs = tmp_path / "slurmlaunch-logs"
        before = files_of(logs)
        assert any(name.startswith(f"{job1}.") and b"run second" in data for name, data in before.items()), before

        env2 = {**os.environ, **_pbs_up(roots[1]), "XDG_STATE_HOME": str(state)}
        forgotten = run_cli("status", job0, env=env2)
        assert forgotten.returncode == 0, forgotten.stderr
        assert f"job {job0} is gone: PBS no longer knows it" in forgotten.stdout, forgotten.stdout
        assert "FAILED" in forgotten.stdout and "exit code 7" in forgotten.stdout, forgotten.stdout

        sleeper = subprocess.run(["qsub", "-N", "sleeper.sh", "--", "/bin/sleep", "300"], env=env2,
                                 capture_output=True, text=True, timeout=60)
        assert sleeper.returncode == 0 and sleeper.stdout.strip() == job0, sleeper.stdout + sleeper.stderr
        st = run_cli("status", job0, env=env2)
        assert f"job {job0} is gone; another job now has that id on PBS" in st.stdout, st.stdout + st.stderr
        assert "exit code 7" in st.stdout and "RUNNING" not in st.stdout, st.stdout
        c = run_cli("cancel", job0, env=env2)
        assert c.returncode == 0 and "nothing cancelled" in c.stdout, c.stdout + c.stderr
        shown = json.loads(subprocess.run(["qstat", "-x", "-f", "-F", "json", job0], env=env2, capture_output=True,
                                          text=True, timeout=60).stdout)["Jobs"][job0]
        assert shown["Job_Name"] == "sleeper.sh" and shown["job_state"] in ("Q", "R"), shown  # not deleted
        listed = {row["job_id"]: row["state"] for row in json.loads(run_cli("list", "--json", env=env2).stdout)}
        assert listed[job0] == "FAILED 7", listed
        mine = run_cli("status", job0, "--json", env=env1)  # side by side: the first server's job 0 is ours
        assert json.loads(mine.stdout)["exit_code"] == 7 and "gone" not in mine.stdout, mine.stdout + mine.stderr

        third = run_cli(*common, "third", "0", env=env2, cwd=tmp_path, timeout=300)
        assert third.returncode == 0, third.stderr
        assert submitted(third.stderr) == job1, third.stderr
        assert "run second" not in third.stderr  # --wait follows this job's output, not the old one's
        own = [p for p in logs.iterdir() if p.is_dir() and re.fullmatch(r"job-1\.[0-9a-f]{8}", p.name)]
        assert len(own) == 1, list(logs.iterdir())
        assert files_of(logs) == before  # the first job 1's files keep their bytes
        out = run_cli("logs", job1, env=env2)
        assert "run third" in out.stdout and "run second" not in out.stdout, out.stdout + out.stderr
        assert json.loads(run_cli("status", job1, "--json", env=env2).stdout)["state"] == "COMPLETED"
    finally:
        for root in roots:
            with contextlib.suppress(DevClusterError):
                pbscluster.down(root)
            shutil.rmtree(root, ignore_errors=True)
