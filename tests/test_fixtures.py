"""The suite's own fixtures where they can be checked without a cluster: a session-wide cluster's client
environment is made per test (conftest.cluster_env / netns_cluster_env through helpers.per_test_env)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import JOB_IDS_PER_WORKER, StaleShimLockSweeper, first_job_id, launch_job_id, per_test_env


def test_each_test_gets_its_own_per_user_state(tmp_path: Path) -> None:
    cluster = {"SLURM_CONF": "/c/slurm.conf", "PATH": "/c/bin", "XDG_STATE_HOME": "/session/state"}
    first, second = per_test_env(cluster, tmp_path / "a"), per_test_env(cluster, tmp_path / "b")
    assert first["XDG_STATE_HOME"] == str(tmp_path / "a" / "state") and Path(first["XDG_STATE_HOME"]).is_dir()
    assert first["XDG_STATE_HOME"] != second["XDG_STATE_HOME"]
    assert {k: v for k, v in first.items() if k != "XDG_STATE_HOME"} == {"SLURM_CONF": "/c/slurm.conf",
                                                                          "PATH": "/c/bin"}
    assert cluster["XDG_STATE_HOME"] == "/session/state"  # the session's environment is left as it was


def test_xdist_workers_get_job_ids_apart() -> None:
    assert first_job_id("gw0") == 1 and first_job_id("master") == 1
    assert first_job_id("gw1") == 1 + JOB_IDS_PER_WORKER and first_job_id("gw2") == 1 + 2 * JOB_IDS_PER_WORKER


def test_launchers_outside_a_cluster_get_a_master_port_per_worker() -> None:
    """The job ids of tests that run ranks with step_env: inside the worker's block, apart from the ids its
    clusters hand out, and (what matters) a MASTER_PORT of their own for every worker of the 16 the team's
    sessions and CI use, so that no two sessions' ranks rendezvous on one port of 127.0.0.1."""
    from slurmlaunch.core.envvars import derive_port

    ports = set()
    for worker in (f"gw{i}" for i in range(16)):
        ids = [launch_job_id(n, worker) for n in range(3)]
        assert all(first_job_id(worker) + 3900 <= i < first_job_id(worker) + JOB_IDS_PER_WORKER for i in ids), ids
        ports |= {derive_port(i) for i in ids}
    assert len(ports) == 16 * 3


@pytest.mark.slurm
def test_the_session_cluster_starts_its_job_ids_where_this_worker_says(slurm_cluster: dict[str, str]) -> None:
    # Slurm's own view of its configuration, not the file we wrote.
    shown = subprocess.run(["scontrol", "show", "config"], env=slurm_cluster, capture_output=True, text=True,
                           timeout=30, check=True).stdout
    value = next(line.split("=", 1)[1].strip() for line in shown.splitlines() if line.startswith("FirstJobId"))
    assert int(value) == first_job_id()


@pytest.mark.slurm
def test_two_loopback_clusters_started_at_the_same_moment_both_come_up(tmp_path: Path) -> None:
    """pytest-xdist workers start their clusters together: without devcluster.port_lock they all chose the
    first free block of ports, and all but one slurmd failed with "Address already in use"."""
    import threading

    from slurmlaunch.app.devcluster import slurm as devcluster
    from tests.helpers import skip_or_fail

    why = devcluster.missing_requirements()
    if why:
        skip_or_fail(why)
    roots = [tmp_path / "a", tmp_path / "b"]
    results: dict[int, object] = {}

    def start(i: int) -> None:
        try:
            results[i] = devcluster.up(roots[i], nodes=2, gpus=0, cpus=1, first_job_id=1 + 100 * i)
        except Exception as e:  # reported below, with the other one's result
            results[i] = e

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert all(isinstance(results.get(i), dict) for i in range(2)), results
        ports = [{line for line in (root / "slurm.conf").read_text().splitlines() if "Port=" in line}
                 for root in roots]
        assert not ports[0] & ports[1]
        for root in roots:  # each answers, through Slurm's own client
            shown = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env={**os.environ,
                                   "SLURM_CONF": str(root / "slurm.conf")}, capture_output=True, text=True,
                                   timeout=30)
            words = shown.stdout.split()  # node1 is in two partitions: listed twice
            assert dict(zip(words[0::2], words[1::2], strict=True)) == {"node1": "idle", "node2": "idle"}, words
    finally:
        for t in threads:
            t.join(300)
        for root in roots:
            if (root / "slurm.conf").exists():
                devcluster.down(root)


def test_the_pyenv_lock_sweeper_removes_only_a_stale_lock(tmp_path: Path) -> None:
    lock = tmp_path / ".pyenv-shim"
    sweeper = StaleShimLockSweeper(lock, stale_s=30)
    lock.write_text("a rehash holds it now\n")
    sweeper.sweep()
    assert lock.exists() and sweeper.removed == 0
    old = time.time() - 120  # a rehash killed two minutes ago
    os.utime(lock, (old, old))
    sweeper.sweep()
    assert not lock.exists() and sweeper.removed == 1
    sweeper.sweep()  # nothing there: nothing to do
    assert sweeper.removed == 1
