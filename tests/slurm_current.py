"""A current Slurm beside Debian's 22.05: SchedMD's 25.11 (tests/install_slurm_current.sh puts it in
/opt/slurm-25.11), brought up as a loopback dev cluster of its own once per session (worker), with its
daemons and clients first on PATH. tests/conftest.py registers the fixtures; tests/real/test_slurm_current.py
runs the end-to-end subset against it and tests/schedulers/test_srun_fidelity.py diffs the local default's
emulated step against a step of each release.

Its job ids start at the "current" block of the worker's slot (tests/helpers.JOB_ID_BLOCKS), apart from the
22.05 cluster's, so the two clusters of one worker never run two jobs of one id at once (the ranks derive
MASTER_PORT from the job id).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmlaunch.app.devcluster import slurm as slurmcluster
from slurmlaunch.core.errors import DevClusterError
from tests.helpers import first_job_id, per_test_env, skip_or_fail

PREFIX = Path(os.environ.get("SLURMLAUNCH_SLURM_CURRENT", "/opt/slurm-25.11"))
VERSION = "25.11"
INSTALL = "bash tests/install_slurm_current.sh"


def bin_path(base: str | None = None) -> str:
    """PATH with the current release's clients and daemons first (a 22.05 sbatch cannot talk to a 25.11
    slurmctld, and the dev cluster starts whichever slurmctld/slurmd/slurmdbd PATH finds)."""
    return f"{PREFIX}/bin:{PREFIX}/sbin:{base if base is not None else os.environ.get('PATH', os.defpath)}"


def missing() -> str | None:
    """Why the current release's cluster cannot start here, or None."""
    ctld = PREFIX / "sbin" / "slurmctld"
    if not os.access(ctld, os.X_OK):
        return f"Slurm {VERSION} is not installed in {PREFIX} ({INSTALL} installs it)"
    got = subprocess.run([str(ctld), "-V"], capture_output=True, text=True).stdout.split()
    if len(got) != 2 or not got[1].startswith(VERSION + "."):
        return f"{ctld} -V says {' '.join(got) or 'nothing'}, not Slurm {VERSION} ({INSTALL} installs it)"
    with on_path():
        return slurmcluster.missing_requirements() or slurmcluster.accounting_missing()


@contextlib.contextmanager
def on_path() -> Iterator[None]:
    """This process's PATH with the current release first, for as long as the block runs: the dev cluster
    finds its daemons and clients through os.environ's PATH."""
    before = os.environ.get("PATH")
    os.environ["PATH"] = bin_path(before)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


@pytest.fixture(scope="session")
def slurm_current_cluster() -> Iterator[dict[str, str]]:
    """A loopback dev cluster of Slurm 25.11 (4 nodes x 4 fake GPUs, accounting on MariaDB, as the 22.05
    one): its client environment, PATH included."""
    why = missing()
    if why:
        skip_or_fail(why)
    root = Path(tempfile.mkdtemp(prefix="slurmlaunch-cluster-25.11-"))
    try:
        with on_path():
            env = slurmcluster.up(root, nodes=4, gpus=4, cpus=8, accounting=True,
                                  first_job_id=first_job_id("current"))
    except Exception as e:  # the daemons' logs: a cluster that did not come up is hard to debug
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in (root / "log").glob("*.log"))
        try:
            slurmcluster.down(root)
        except DevClusterError as left:
            logs += f"\n{left}"
        pytest.fail(f"the Slurm {VERSION} dev cluster did not come up: {e}\n{logs}")
    try:
        yield {**os.environ, **env, "PATH": bin_path(), "SLURMLAUNCH_TEST_CLUSTER_DIR": str(root)}
    finally:
        slurmcluster.down(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def slurm_current_env(slurm_current_cluster: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The 25.11 cluster's client environment with this test's own per-user state (as cluster_env)."""
    return per_test_env(slurm_current_cluster, tmp_path)
