"""Shared fixtures. The real local Slurm cluster is session-wide: brought up once, torn down by pid files."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from slurmlaunch.app.devcluster import pbs as pbscluster
from slurmlaunch.app.devcluster import slurm as slurmcluster
from slurmlaunch.core.errors import DevClusterError
from tests import ports
from tests import sshd as _sshd
from tests.helpers import StaleShimLockSweeper, first_job_id, per_test_env, skip_or_fail
from tests.slurm_current import slurm_current_cluster, slurm_current_env  # noqa: F401  (fixtures: Slurm 25.11)

pytest_plugins = ["tests.ordering", "tests.cpu_account"]  # the known-slow tests first; CPU per test

# No time limit per generated example: hypothesis's default of 200 ms is a timed test, and beside two busy
# loops one example of the URL masking took 296 ms (CI, Python 3.10's unit layer, 2026-12-07). Each test's
# examples are still bounded by their number (max_examples).
settings.register_profile("slurmlaunch", deadline=None)
settings.load_profile("slurmlaunch")


def pytest_configure(config: pytest.Config) -> None:
    # Submissions append to a per-user index of jobs: keep the suite's out of the real one.
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="slurmlaunch-test-state-")
    # `slurmlaunch run` without --master-port listens on torchrun's default, 29500, as torchrun does: two test
    # processes' runs at once found it held and exited 78 (CI run 19, 2026-12-07). Every run a test process
    # starts defaults to a port of that process's own instead (PET_MASTER_PORT, read by `run` as by torchrun; a
    # --master-port on the command line still wins). Not in xdist's controller, which runs no test.
    controller = getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ
    if not controller and "PET_MASTER_PORT" not in os.environ:
        os.environ["PET_MASTER_PORT"] = str(ports.run_port())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With SLURMLAUNCH_TEST_FAILURES_LOG set (tests/run.sh), each failure as it comes: one line on stderr and the
    whole report in that file. xdist prints failures only when the run ends, and a run stopped before its end
    (a CI time limit, a person) would otherwise leave only its progress letters."""
    log = os.environ.get("SLURMLAUNCH_TEST_FAILURES_LOG")
    if not report.failed or not log or "PYTEST_XDIST_WORKER" in os.environ:  # the controller writes, once
        return
    lines = [line for line in report.longreprtext.splitlines() if line.strip()]
    why = next((line for line in lines if line.startswith("E ")), lines[-1] if lines else "")
    print(f"\n{report.nodeid} ({report.when}) failed: {why[:300]}  (whole: {log})", file=sys.stderr, flush=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"===== {report.nodeid} ({report.when}), {time.strftime('%H:%M:%S')}\n{report.longreprtext}\n")


# The unit layer, by folder: no cluster, no sshd, no torch (it also runs on Python 3.10 and 3.13, tests/run.sh).
# Its tests get the marker `unit` (pytest -m unit selects the layer alone, -m "not unit" the rest); a test there
# that asks for a cluster, the laptop's sshd or torch is a collection error (tests/test_unit_layer.py).
UNIT_LAYER = ("core", "render")
NOT_IN_UNIT_LAYER = frozenset({"slurm_cluster", "netns_cluster", "cluster_env", "netns_cluster_env", "pbs_cluster",
                               "pbs_env", "slurm_current_cluster", "slurm_current_env", "server", "laptop",
                               "torch_available"})
NOT_IN_UNIT_MARKS = frozenset({"slurm", "pbs", "torch", "laptop_env"})


def in_unit_layer(path: Path) -> bool:
    tests = Path(__file__).resolve().parent
    return any(tests / folder in Path(path).resolve().parents for folder in UNIT_LAYER)


def unit_layer_breaches(fixtures: Iterator[str] | list[str], marks: Iterator[str] | list[str]) -> list[str]:
    """What keeps a test out of the unit layer: the fixtures and marks it has that need a cluster, sshd or torch."""
    return sorted({*(f"fixture {f}" for f in fixtures if f in NOT_IN_UNIT_LAYER),
                   *(f"mark {m}" for m in marks if m in NOT_IN_UNIT_MARKS)})


def _mark_unit_layer(items: list[pytest.Item]) -> None:
    """Before -m deselects by marker (the wrapper below runs it before every other implementation)."""
    breaches = []
    for item in items:
        if not in_unit_layer(item.path):
            continue
        item.add_marker(pytest.mark.unit)
        found = unit_layer_breaches(getattr(item, "fixturenames", []), [m.name for m in item.iter_markers()])
        if found:
            breaches.append(f"{item.nodeid}: {', '.join(found)}")
    if breaches:
        raise pytest.UsageError("tests in the unit layer (tests/" + ", tests/".join(UNIT_LAYER) + ") that need a "
                                "cluster, sshd or torch (move them to tests/real/ or tests/app/):\n"
                                + "\n".join(breaches))


# Clusters few tests use, each started once per xdist worker that runs one of them: under --dist loadgroup
# (tests/run.sh) their tests go to one worker, so each is brought up (and its daemons kept running) once per
# run instead of once per worker. A bring-up costs 15-20 s of the two cores (the networked Slurm's was 15 s of
# set-up and 5 s of teardown under a load of 16); PBS (49 tests, many of them walltime and requeue chains) and
# the loopback Slurm (94) stay spread: on one worker they would be the run's longest path.
# the group names: tests/real/test_slurm_current.py already names its own "slurm_current"
SHARED_BY_ONE_WORKER = {"netns_cluster": "netns-slurm", "slurm_current_cluster": "slurm_current"}


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    _mark_unit_layer(items)
    for item in items:
        used = getattr(item, "fixturenames", ())
        group = next((name for fixture, name in SHARED_BY_ONE_WORKER.items() if fixture in used), None)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    yield
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        _group_suffixes(items)


def _group_suffixes(items: list[pytest.Item]) -> None:
    """The "@GROUP" suffix xdist's loadgroup scheduler reads from each grouped test's node id. xdist 3.8 adds it
    by assigning ``item._nodeid``, which pytest 9.2 no longer reads (its ids are structured ``item._id``): every
    group was silently spread over the workers as plain --dist load (pytest-xdist issue 1386, fix pending as
    pull request 1388, which sets the structured id the same way). A no-op once xdist's own suffix shows."""
    try:
        from _pytest.nodeid import NodeId  # pytest >= 9.2; older ones take xdist's own assignment
    except ImportError:
        return

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)


# SLURMLAUNCH_TEST_CLUSTER=netns runs every cluster test on the networked cluster (then only one is started).
DEFAULT_NETNS = os.environ.get("SLURMLAUNCH_TEST_CLUSTER", "loopback") == "netns"


def _cluster(netns: bool) -> Iterator[dict[str, str]]:
    why = (slurmcluster.missing_requirements(netns) or slurmcluster.accounting_missing())
    if why:
        skip_or_fail(why)
    root = Path(tempfile.mkdtemp(prefix="slurmlaunch-cluster-"))
    try:
        env = slurmcluster.up(root, nodes=4, gpus=4, cpus=8, accounting=True, netns=netns,
                              first_job_id=first_job_id())
    except Exception as e:  # show the daemons' logs: a cluster that did not come up is hard to debug
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in (root / "log").glob("*.log"))
        try:
            slurmcluster.down(root)
        except DevClusterError as left:  # what the networked mode could not remove: say so too
            logs += f"\n{left}"
        pytest.fail(f"local Slurm cluster did not come up: {e}\n{logs}")
    base = dict(os.environ)
    if netns:  # the point of this cluster: the launcher's checks run as on a real one
        base.pop("SLURMLAUNCH_ALLOW_LOOPBACK", None)
    yield {**base, **env, "SLURMLAUNCH_TEST_CLUSTER_DIR": str(root)}
    slurmcluster.down(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """The cluster most tests run on: loopback (every node is 127.0.0.1), or networked under
    SLURMLAUNCH_TEST_CLUSTER=netns."""
    yield from _cluster(DEFAULT_NETNS)


@pytest.fixture(scope="session")
def netns_cluster(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """A cluster whose nodes are different hosts on a private network (devcluster's netns mode): its
    clients are the wrappers on its PATH, and SLURMLAUNCH_ALLOW_LOOPBACK is not set."""
    if DEFAULT_NETNS:
        yield request.getfixturevalue("slurm_cluster")
    else:
        yield from _cluster(True)


@pytest.fixture
def cluster_env(slurm_cluster: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The cluster's client environment, with this test's own per-user state under its tmp_path (job ids go
    on across tests: the cluster is session-wide)."""
    return per_test_env(slurm_cluster, tmp_path)


@pytest.fixture
def netns_cluster_env(netns_cluster: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The networked cluster's client environment, with this test's own per-user state (as cluster_env)."""
    return per_test_env(netns_cluster, tmp_path)


@pytest.fixture(scope="session")
def pbs_cluster() -> Iterator[dict[str, str]]:
    """A real OpenPBS of a head host and 3 execution hosts (devcluster_pbs), each its own network namespace:
    its clients are the wrappers first on its PATH. Started once per session; tests/run.sh installs OpenPBS.
    SLURMLAUNCH_TEST_PBS_UP_S says how long it took to come up."""
    why = pbscluster.missing_requirements() or (
        None if pbscluster.installed() else f"OpenPBS is not installed in {pbscluster.PBS_EXEC} (tests/run.sh "
        "installs it: python -c 'from slurmlaunch.app.devcluster.pbs import install; print(install())')")
    if why:
        skip_or_fail(why)
    root = Path(tempfile.mkdtemp(prefix="slurmlaunch-pbs-"))
    t0 = time.monotonic()
    try:
        env = pbscluster.up(root, nodes=3, cpus=8, gpus=4)
    except Exception as e:
        logs = "".join(p.read_text(errors="replace")[-2000:]
                       for p in sorted((root / "pbs").glob("*/spool/*_logs/*")))
        try:
            pbscluster.down(root)
        except DevClusterError as left:
            logs += f"\n{left}"
        pytest.fail(f"the OpenPBS dev cluster did not come up: {e}\n{logs}")
    up_s = time.monotonic() - t0
    sweeper = StaleShimLockSweeper()
    sweeper.start()
    try:
        yield {**os.environ, **env, "SLURMLAUNCH_TEST_PBS_DIR": str(root), "SLURMLAUNCH_TEST_PBS_UP_S": f"{up_s:.1f}"}
    finally:
        sweeper.stop()
    pbscluster.down(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pbs_env(pbs_cluster: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The PBS cluster's client environment, with this test's own per-user state (as cluster_env)."""
    return per_test_env(pbs_cluster, tmp_path)


def needs_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        skip_or_fail("torch is not installed (pip install torch==2.13.0)")


@pytest.fixture
def torch_available() -> None:
    needs_torch()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An in-process CLI's world: a working directory with train.py, no config files of the user's, and
    sbatch/qsub/apptainer on PATH that are never run (dry runs), eight visible GPUs (names only)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "qsub", "apptainer"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 99\n")
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")  # GPU options show their effect locally too
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for name in ("SLURMLAUNCH_PROFILE", "SLURMLAUNCH_CONFIG", "SLURMLAUNCH_TEMPLATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- the real OpenSSH server the remote tests use as the cluster's login node (tests/sshd.py) --

@pytest.fixture(scope="session")
def server() -> Iterator[_sshd.Sshd]:
    why = _sshd.missing()
    if why:
        skip_or_fail(why)
    s = _sshd.start_sshd()
    yield s
    _sshd.remove(s)


@pytest.fixture
def laptop(server: _sshd.Sshd, tmp_path: Path, request: pytest.FixtureRequest,
           monkeypatch: pytest.MonkeyPatch) -> _sshd.Laptop:
    """A laptop that reaches the login node `server` by ssh. Under the `laptop_env` mark the test process itself
    runs with the laptop's environment (and nothing else of ours), for remote calls made in this process."""
    lap = _sshd.make_laptop(server, tmp_path)
    if request.node.get_closest_marker("laptop_env"):
        for key in list(os.environ):
            if key not in lap.env:
                monkeypatch.delenv(key)
        for key, value in lap.env.items():
            monkeypatch.setenv(key, value)
    return lap
