"""`slurmlaunch doctor --scheduler pbs [--allocate N]` against the real OpenPBS 23.06 of the session
(tests/conftest.py pbs_cluster): the login checks read the real server's qstat -B/-Q and pbsnodes JSON, the
probe job is a qsub script the real server runs on N hosts (ranks started by Open MPI over pbs_tmrsh), and
every rank's report comes back; a queue that does not exist and a probe job that can never run are named.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.pbs

# Open MPI's run-as-root consent, which doctor passes on to a PBS probe job only when it has it itself
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def test_doctor_allocates_a_probe_job_on_two_hosts_of_the_real_server(pbs_env: dict[str, str], tmp_path: Path,
                                                                       torch_available: None) -> None:
    env = {**pbs_env, **AS_ROOT}
    r = run_cli("doctor", "--scheduler", "pbs", "--allocate", "2", "--timeout", "240", "--json", env=env,
                cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    report = json.loads(r.stdout)
    checks = {c["name"]: (c["state"], c["detail"]) for c in report["checks"]}
    assert report["cluster"] == "head" and report["problems"] == [], report
    assert checks["server"] == ("ok", "head: Active, PBS 23.06.06"), checks
    assert checks["queue"] == ("ok", "workq (the default): Execution, enabled True, started True"), checks
    assert checks["nodes"] == ("ok", "3 host(s), 3 free; ncpus 8 ngpus 4"), checks
    assert checks["history"][0] == "ok" and checks["gpu request"][0] == "ok", checks
    job = report["probe_job"]
    assert f"slurmlaunch doctor: probe job {job} COMPLETED after" in r.stderr, r.stderr
    ranks = report["ranks"]
    assert [rank["rank"] for rank in ranks] == [0, 1], ranks
    raw = json.loads(subprocess.run(["qstat", "-x", "-f", "-F", "json", job], env=env, capture_output=True,
                                    text=True, timeout=60).stdout)["Jobs"][job]
    hosts = [part.split("/")[0] for part in raw["exec_host"].split("+")]
    assert [rank["host"] for rank in ranks] == hosts and len(set(hosts)) == 2, (ranks, hosts)
    assert all(rank["resolve"]["ok"] and rank["port"]["ok"] and rank["torch"]["ok"] for rank in ranks), ranks
    assert raw["Job_Name"] == "slurmlaunch-doctor" and raw["Exit_status"] == 0, raw


def test_doctor_names_a_missing_queue_and_a_probe_job_that_never_runs(pbs_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    env = {**pbs_env, **AS_ROOT}
    r = run_cli("doctor", "--scheduler", "pbs", "--partition", "nosuch", env=env, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "--partition nosuch: no such queue here (known: workq)" in r.stdout, r.stdout
    # 4 hosts of 3: the server keeps it queued ("Can Never Run"); doctor stops waiting, cancels it, says so
    r = run_cli("doctor", "--scheduler", "pbs", "--allocate", "4", "--timeout", "15", env=env, cwd=tmp_path,
                timeout=120)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and last.startswith("slurmlaunch: error: doctor: probe job "), r.stderr
    # in PBS's own words (the job's comment), not a guess
    assert "did not finish within 15s (still PENDING; cancelled); PBS's comment: Can Never Run: Not enough total " \
           "nodes available (--timeout S waits longer)" in r.stderr, r.stderr
    job = r.stderr.split("probe job ", 1)[1].split()[0]
    raw = json.loads(subprocess.run(["qstat", "-x", "-f", "-F", "json", job], env=env, capture_output=True,
                                    text=True, timeout=60).stdout)["Jobs"][job]
    assert (raw["job_state"], raw["substate"]) == ("F", 91), raw  # qdel'd: nothing left queued
