"""The suite's own fixtures where they can be checked without a cluster: a session-wide cluster's client
environment is made per test (conftest.cluster_env / netns_cluster_env through helpers.per_test_env)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests import ports
from tests.helpers import (
    JOB_ID_BLOCKS,
    JOB_IDS_PER_WORKER,
    StaleShimLockSweeper,
    first_job_id,
    launch_job_id,
    per_test_env,
)


def test_each_test_gets_its_own_per_user_state(tmp_path: Path) -> None:
    cluster = {"SLURM_CONF": "/c/slurm.conf", "PATH": "/c/bin", "XDG_STATE_HOME": "/session/state"}
    first, second = per_test_env(cluster, tmp_path / "a"), per_test_env(cluster, tmp_path / "b")
    assert first["XDG_STATE_HOME"] == str(tmp_path / "a" / "state") and Path(first["XDG_STATE_HOME"]).is_dir()
    assert first["XDG_STATE_HOME"] != second["XDG_STATE_HOME"]
    assert {k: v for k, v in first.items() if k != "XDG_STATE_HOME"} == {"SLURM_CONF": "/c/slurm.conf",
                                                                          "PATH": "/c/bin"}
    assert cluster["XDG_STATE_HOME"] == "/session/state"  # the session's environment is left as it was


def test_slots_get_job_ids_apart_and_no_two_derive_one_port() -> None:
    """Every block of every slot: ids apart, inside the slot, and (what matters) no two live ids of two
    different slots derive the same MASTER_PORT, nor two blocks of one slot."""
    from slurmlaunch.core.envvars import derive_port

    assert first_job_id(slot=0) == 1 and first_job_id(slot=1) == 1 + JOB_IDS_PER_WORKER
    spans = sorted(JOB_ID_BLOCKS.values())
    assert spans[0][0] == 0 and spans[-1][1] == JOB_IDS_PER_WORKER
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)), spans  # a partition: no overlap, no gap
    every = [first_job_id(block, n) + k for n in range(ports.SLOTS) for block, (lo, hi) in JOB_ID_BLOCKS.items()
             for k in range(hi - lo)]
    assert len({derive_port(i) for i in every}) == len(every) == ports.SLOTS * JOB_IDS_PER_WORKER


def test_launchers_outside_a_cluster_get_a_master_port_per_slot() -> None:
    ids = [launch_job_id(n, slot) for slot in range(ports.SLOTS) for n in range(3)]
    assert all(first_job_id("launch", i // 3) <= j < first_job_id("launch", i // 3) + 100 for i, j in enumerate(ids))


_ASK = """
import json, sys
from tests import ports
got = [ports.port() for _ in range(20)] + list(ports.port_block(5))
print(json.dumps({"slot": ports.slot(), "ports": got, "run": ports.run_port()}), flush=True)
sys.stdin.read()  # hold the slot until the test has seen every process's answer
"""


def test_many_test_processes_asking_at_once_never_share_a_slot_or_a_port(tmp_path: Path) -> None:
    """As many processes as there are slots take a slot and 25 ports each at the same moment (in a slot
    directory of their own, so that this run's workers are not in the way): all slots differ, all ports differ,
    every port in its slot's range and outside the kernel's ephemeral range. A ninth asks while they hold every
    slot: it waits, and gets the slot the first to leave gave back."""
    import json
    import sys

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]),
               SLURMLAUNCH_TEST_SLOT_DIR=str(tmp_path / "slots"))
    env.pop(ports.INHERITED, None)

    def ask() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", _ASK], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)

    procs = [ask() for _ in range(ports.SLOTS)]
    try:
        answers = [json.loads(p.stdout.readline()) for p in procs if p.stdout]
        assert sorted(a["slot"] for a in answers) == list(range(ports.SLOTS))
        seen = [port for a in answers for port in a["ports"]]
        assert len(set(seen)) == len(seen) == 25 * ports.SLOTS
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        for a in answers:
            assert all(p in ports.slot_ports(a["slot"]) and not low <= p <= high for p in a["ports"]), a
        runs = {a["run"] for a in answers}  # `slurmlaunch run`'s default port: one per slot, never handed out
        assert len(runs) == ports.SLOTS and not runs & set(seen)
        ninth = ask()
        procs.append(ninth)
        time.sleep(1.5)
        assert ninth.poll() is None  # waiting for a slot, not sharing one
        procs[0].communicate("", timeout=30)
        assert ninth.stdout and json.loads(ninth.stdout.readline())["slot"] == answers[0]["slot"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.communicate("", timeout=30)


def test_run_without_a_port_listens_on_this_test_process_s_own() -> None:
    """Every `slurmlaunch run` a test starts without --master-port reads this process's PET_MASTER_PORT (as
    torchrun would), not torchrun's 29500 that every worker would share."""
    assert os.environ["PET_MASTER_PORT"] == str(ports.run_port())
    handed = {ports.port() for _ in range(ports.PORTS_PER_SLOT)}  # a whole turn of the slot's ports
    assert ports.run_port() in ports.slot_ports() and ports.run_port() not in handed


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
            results[i] = devcluster.up(roots[i], nodes=2, gpus=0, cpus=1,
                                       first_job_id=first_job_id(("faults", "faults-big")[i]))
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


@pytest.mark.slurm
def test_accounting_databases_made_at_the_same_moment_all_come_up(tmp_path: Path) -> None:
    """The workers' clusters make their MariaDB system tables together (start_accounting): with the machine's
    /tmp as every bootstrap's tmpdir, they lost each other's temporary tables and some failed (CI run 28, and 5
    of 18 bootstraps in rounds of 6 at once). Each now has a directory of its own: rounds of 6 all succeed."""
    from concurrent.futures import ThreadPoolExecutor

    from slurmlaunch.app.devcluster import slurm as devcluster
    from tests.helpers import skip_or_fail

    why = devcluster.accounting_missing()
    if why:
        skip_or_fail(why)
    for round_ in range(2):
        roots = [tmp_path / f"r{round_}-{i}" for i in range(6)]
        with ThreadPoolExecutor(len(roots)) as pool:
            failed = [str(e) for e in pool.map(_made_or_error, roots) if e is not None]
        assert failed == [], failed
        assert all((root / "db" / "mysql").is_dir() for root in roots)


def _made_or_error(root: Path) -> Exception | None:
    from slurmlaunch.app.devcluster import slurm as devcluster

    try:
        devcluster.install_db(root)
    except Exception as e:  # every failure is reported, not only the first
        return e
    return None


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


def test_a_clusters_few_tests_run_on_one_worker_under_loadgroup(tmp_path: Path) -> None:
    """tests/conftest.py groups the tests of a cluster few tests use (SHARED_BY_ONE_WORKER) on one xdist worker,
    so it is brought up once per run: through real xdist workers, as tests/run.sh runs them (pytest 9.2 with
    xdist 3.8 spread every group over the workers until the conftest put the group back in the node ids)."""
    import sys

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "conftest.py").write_text(
        "import pytest\nfrom tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
        "@pytest.fixture(scope='session')\ndef netns_cluster():\n    return {}\n")
    (tmp_path / "test_toy.py").write_text(
        "import os, pytest\n@pytest.mark.parametrize('i', range(8))\ndef test_netns(netns_cluster, i):\n"
        "    print('WORKER', os.environ['PYTEST_XDIST_WORKER'])\n"
        "@pytest.mark.parametrize('i', range(8))\ndef test_free(i):\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "3",
                        "--dist", "loadgroup", "-v", "-o", "addopts=", "test_toy.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(root)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    grouped = [line.split()[0] for line in r.stdout.splitlines() if "PASSED test_toy.py::test_netns" in line]
    assert len(grouped) == 8 and len(set(grouped)) == 1, r.stdout  # all 8 passed, all on one worker
    assert r.stdout.count("PASSED test_toy.py::test_netns[0]@netns-slurm") == 1, r.stdout
