"""The Python API on a real OpenPBS (the session's 3-host PBS dev cluster, tests/conftest.py pbs_cluster), through
submitit's plugin interface (app/api/pbs.py): every rank's value, a rank's exception named quickly, a qdel'd job
read as cancelled, map_array and submit_script.

Each case runs a small driver program with the cluster's client environment (its qsub/qstat/qdel first on
PATH); the driver's functions travel pickled by value, as a user's script's do. The tests run as root, so every
job gets Open MPI's two run-as-root variables through env= (PBS passes nothing else from the submitting shell).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import slurmlaunch

PRELUDE = """
import json, os, socket, sys, time
import slurmlaunch
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
OPTIONS = dict(nodes=2, tasks_per_node=1, scheduler="pbs", env=AS_ROOT, time="00:10:00")

def where(x):
    return [int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"],
            socket.gethostname(), x]
"""


def drive(body: str, pbs_env: dict[str, str], tmp_path: Path, timeout: float = 300) -> dict[str, object]:
    """Run PRELUDE + body (which prints one JSON line last) with the cluster's clients; its JSON."""
    driver = tmp_path / "driver.py"
    driver.write_text(PRELUDE + body)
    r = subprocess.run([sys.executable, str(driver)], env=pbs_env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


@pytest.mark.pbs
def test_every_rank_s_value_from_two_hosts(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """2 hosts x 1 rank: results() has each rank's value, from its own host, with the distributed variables."""
    out = drive("""
job = slurmlaunch.submit(where, 7, **OPTIONS)
print(json.dumps({"job": job.job_id, "values": job.results(), "first": job.result(), "state": job.state}))
""", pbs_env, tmp_path)
    values = out["values"]
    assert isinstance(values, list) and [v[:2] for v in values] == [[0, 2], [1, 2]], out
    hosts = [v[3] for v in values]
    assert len(set(hosts)) == 2 and set(hosts) <= {"node1", "node2", "node3"}, out
    assert all(v[2] == hosts[0] and v[4] == 7 for v in values), out  # MASTER_ADDR: rank 0's host
    assert out["first"] == values[0] and out["state"] == "COMPLETED", out


@pytest.mark.pbs
def test_a_rank_s_exception_reaches_the_caller_naming_it(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """Rank 1 raises while rank 0 would sleep 10 minutes: mpiexec stops rank 0, the job ends, and result()
    raises RankFailed for rank 1 with its traceback, long before rank 0's sleep (or the walltime) would end."""
    out = drive("""
def boom():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one says no")
    time.sleep(600)

job = slurmlaunch.submit(boom, **OPTIONS)
t0 = time.monotonic()
try:
    job.result()
    print(json.dumps({"raised": None}))
except slurmlaunch.RankFailed as e:
    print(json.dumps({"raised": type(e).__name__, "rank": e.rank, "text": str(e), "state": job.state,
                      "waited": time.monotonic() - t0, "host": e.host}))
""", pbs_env, tmp_path, timeout=400)
    assert out["raised"] == "RankFailed" and out["rank"] == 1, out
    assert str(out["text"]).startswith(f"rank 1 on {out['host']} failed") and out["host"] in ("node1", "node2", "node3")
    assert "ValueError: rank one says no" in str(out["text"]), out
    assert out["state"] == "FAILED", out
    # bounded by the failure, not by rank 0's 600 s sleep (generous: a loaded machine)
    assert float(str(out["waited"])) < 300, out


@pytest.mark.pbs
def test_a_cancelled_job_reads_as_cancelled(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """qdel through job.cancel(): the job reads CANCELLED (PBS leaves Exit_status 0 there), and result()
    says it was cancelled instead of returning or waiting for result files that will not come."""
    out = drive("""
def sleeper():
    print("SLEEPING", flush=True)
    time.sleep(600)

job = slurmlaunch.submit(sleeper, **OPTIONS)
deadline = time.monotonic() + 180
while "SLEEPING" not in job.logs(0):
    assert time.monotonic() < deadline, f"rank 0 did not start within 180 s: {job.state}"
    time.sleep(0.5)
job.cancel()
try:
    job.result()
    print(json.dumps({"raised": None}))
except slurmlaunch.SlurmLaunchError as e:
    print(json.dumps({"raised": type(e).__name__, "text": str(e), "state": job.state}))
""", pbs_env, tmp_path, timeout=400)
    assert out["raised"] == "SlurmLaunchError" and out["state"] == "CANCELLED", out
    assert "was cancelled" in str(out["text"]), out


@pytest.mark.pbs
def test_the_warning_signal_comes_before_the_walltime(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """PBS sends no signal before the walltime: the batch step does, as in the CLI's script. With a walltime of
    90 s and signal="USR1@60", every rank sees SIGUSR1 (about 30 s in) and returns, well before the walltime."""
    out = drive("""
import signal, threading
def await_warning():
    got = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: got.set())
    print("WAITING", flush=True)
    return got.wait(85)

job = slurmlaunch.submit(await_warning, **dict(OPTIONS, time="00:01:30", signal="USR1@60"))
print(json.dumps({"values": job.results(), "state": job.state}))
""", pbs_env, tmp_path, timeout=400)
    assert out["values"] == [True, True] and out["state"] == "COMPLETED", out


@pytest.mark.pbs
def test_map_array_of_three_calls(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """map_array: one PBS job array (qsub -J), one distributed job per element, each its own world; batch's
    calls likewise."""
    out = drive("""
jobs = slurmlaunch.map_array(where, [10, 20, 30], **OPTIONS)
with slurmlaunch.batch(**OPTIONS) as b:
    b.submit(where, "a")
    b.submit(where, "b")
print(json.dumps({"ids": [j.job_id for j in jobs], "values": [j.results() for j in jobs],
                  "batch": [[v[4] for v in j.results()] for j in b.jobs]}))
""", pbs_env, tmp_path)
    assert out["batch"] == [["a", "a"], ["b", "b"]], out
    ids = [str(i) for i in out["ids"]]  # type: ignore[attr-defined]
    assert len({i.split("_")[0] for i in ids}) == 1 and [i.split("_")[1] for i in ids] == ["0", "1", "2"], out
    values = out["values"]
    assert isinstance(values, list)
    assert [[v[0] for v in job] for job in values] == [[0, 1]] * 3, out
    assert [[v[4] for v in job] for job in values] == [[10, 10], [20, 20], [30, 30]], out


@pytest.mark.pbs
def test_submit_script_runs_the_script_on_every_rank(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """submit_script: the script through the launcher on both hosts; each rank's line in its own log."""
    (tmp_path / "hello.py").write_text("import os\nprint('HELLO', os.environ['RANK'], os.environ['WORLD_SIZE'])\n")
    out = drive("""
job = slurmlaunch.submit_script("hello.py", **OPTIONS)
print(json.dumps({"values": job.results(), "logs": [job.logs(r) for r in range(2)]}))
""", pbs_env, tmp_path)
    assert out["values"] == [0, 0], out
    logs = out["logs"]
    assert isinstance(logs, list) and "HELLO 0 2" in logs[0] and "HELLO 1 2" in logs[1], out


@pytest.mark.pbs
def test_a_rank_that_dies_without_an_exception_is_named(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """Rank 1 ends by os._exit(7) (no Python exception, no result file): the batch step's failure file names it, and
    RankFailed says rank 1 and code 7, not a rank that was merely stopped after it."""
    out = drive("""
def dies():
    if os.environ["RANK"] == "1":
        os._exit(7)
    time.sleep(600)

job = slurmlaunch.submit(dies, **OPTIONS)
try:
    job.result()
    print(json.dumps({"raised": None}))
except slurmlaunch.RankFailed as e:
    print(json.dumps({"raised": type(e).__name__, "rank": e.rank, "code": e.returncode, "text": str(e),
                      "state": job.state}))
""", pbs_env, tmp_path, timeout=400)
    assert out["raised"] == "RankFailed" and out["rank"] == 1 and out["code"] == 7, out
    # the batch step's word (its failure file: Open MPI named the rank, the node file its host)
    assert re.search(r"\(exit code 7 on \S+\), without a Python exception", str(out["text"])), out


def test_what_pbs_cannot_carry_out_is_refused_before_anything_is_written(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's refusals, from the API, before submitit writes a file; a missing qsub is one line too."""
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "qsub").write_text("#!/bin/sh\nexit 99\n")
    (bin_dir / "qsub").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(slurmlaunch.SpecError, match="--qos high: the pbs scheduler cannot carry it out"):
        slurmlaunch.submit(print, nodes=2, scheduler="pbs", qos="high")
    with pytest.raises(slurmlaunch.SpecError, match="--mem 0: Slurm reads 0 as all"):
        slurmlaunch.submit(print, nodes=2, scheduler="pbs", mem="0")
    assert not (tmp_path / "slurmlaunch-logs" / "submitit").exists()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(slurmlaunch.SpecError, match="--scheduler pbs: qsub is not on PATH"):
        slurmlaunch.submit(print, nodes=2, scheduler="pbs")
