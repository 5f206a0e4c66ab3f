"""The real-Slurm end-to-end subset against a current release, 25.11 (tests/slurm_current.py), beside the
whole suite on Debian's 22.05: submit --wait on 2 nodes, an array, fail-fast naming the rank, a SIGKILLed
rank, `stacks` of a hung job, the Python API's results and a rank's exception, `dev-cluster up` with it
first on PATH.

The test bodies are the 22.05 suite's own, imported: here ``cluster_env`` and ``netns_cluster_env`` are the
25.11 cluster's (a loopback one: the networked mode is the 22.05 suite's), so one body runs against both.
These skip without root or an installed 25.11 (tests/install_slurm_current.sh), and fail under CI=true.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.app.api.test_api import test_slurm_function_two_nodes_two_tasks  # noqa: F401
from tests.app.test_stacks import test_slurm_hung_job_stacks_then_cancel_leaves_the_summary  # noqa: F401
from tests.helpers import alive, run_cli, skip_or_fail
from tests.real.test_batch_faults import test_slurm_names_a_rank_killed_by_sigkill  # noqa: F401
from tests.real.test_jobs import test_list_shows_the_state_of_an_ended_array  # noqa: F401
from tests.real.test_slurm_cluster import (  # noqa: F401
    test_example_trains_across_two_nodes,
    test_failing_rank_ends_the_job_with_its_code,
)
from tests.slurm_current import PREFIX, VERSION, bin_path, missing

# every 25.11 test on one worker (tests/run.sh: --dist loadgroup): one 25.11 cluster serves them all
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm_current")]


@pytest.fixture
def cluster_env(slurm_current_env: dict[str, str]) -> dict[str, str]:
    return slurm_current_env


@pytest.fixture
def netns_cluster_env(slurm_current_env: dict[str, str]) -> dict[str, str]:
    return slurm_current_env


def _exe(pidfile: Path) -> str:
    return os.readlink(f"/proc/{int(pidfile.read_text())}/exe")


def test_the_cluster_and_its_clients_are_the_current_release(slurm_current_env: dict[str, str]) -> None:
    """What the subset above ran against: every Slurm daemon of the cluster is 25.11's binary, the
    controller says so, and so do the clients on the tests' PATH."""
    root = Path(slurm_current_env["SLURMLAUNCH_TEST_CLUSTER_DIR"])
    daemons = {p.name: _exe(p) for p in root.glob("slurm*.pid")}
    assert len(daemons) == 6 and all(exe.startswith(f"{PREFIX}/sbin/") for exe in daemons.values()), daemons
    config = subprocess.run(["scontrol", "show", "config"], env=slurm_current_env, capture_output=True, text=True,
                            check=True).stdout
    assert f"SLURM_VERSION           = {VERSION}." in config, config[:2000]
    for client in ("sbatch", "srun", "sacct"):
        out = subprocess.run([client, "--version"], env=slurm_current_env, capture_output=True, text=True).stdout
        assert out.startswith(f"slurm {VERSION}."), (client, out)


def test_dev_cluster_up_with_the_current_release_on_path(tmp_path: Path) -> None:
    """`slurmlaunch dev-cluster up` as a user runs it with 25.11 first on PATH: it starts 25.11's daemons,
    a 2-node job runs on them, and `down` stops every one."""
    why = missing()
    if why:
        skip_or_fail(why)
    env = {**os.environ, "PATH": bin_path()}
    root = tmp_path / "dc"
    r = run_cli("dev-cluster", "up", "--dir", str(root), "--nodes", "2", "--gpus-per-node", "1", env=env,
                timeout=120)
    pids = [int(p.read_text()) for p in root.glob("*.pid")]
    try:
        assert r.returncode == 0, r.stderr
        exports = dict(line.removeprefix("export ").split("=", 1) for line in r.stdout.splitlines())
        daemons = {p.name: _exe(p) for p in root.glob("slurm*.pid")}
        assert sorted(daemons) == ["slurmctld.pid", "slurmd-node1.pid", "slurmd-node2.pid"], daemons
        assert all(exe.startswith(f"{PREFIX}/sbin/") for exe in daemons.values()), daemons
        (tmp_path / "ok.py").write_text("import os; print('rank', os.environ['RANK'], os.environ['SLURMD_NODENAME'])")
        job = run_cli("submit", "--nodes", "2", "--wait", "ok.py", env={**env, **exports}, cwd=tmp_path,
                      timeout=120)
        assert job.returncode == 0, job.stdout + job.stderr
        assert "rank 0 node1" in job.stdout.splitlines(), job.stdout  # rank 0's output, followed live
        rank_1 = next((tmp_path / "slurmlaunch-logs").glob("*.rank-1.log")).read_text()
        assert "rank 1 node2" in rank_1.splitlines(), rank_1
    finally:
        assert run_cli("dev-cluster", "down", "--dir", str(root), env=env).returncode == 0
    assert pids and not any(alive(p) for p in pids)
