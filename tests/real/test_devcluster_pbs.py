"""The OpenPBS dev cluster: a real pbs_server, scheduler, comm and datastore on a head host and one pbs_mom
per execution host, each host its own network namespace and host name. The oracles are PBS's own commands
(pbsnodes, qsub, qstat, pbsdsh) and the kernel (which namespace a process is in, what `ip` lists).

These need root and OpenPBS (tests/run.sh installs it); they skip without, and fail instead under CI=true.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurmlaunch.app.devcluster import pbs as devcluster_pbs
from slurmlaunch.app.devcluster import slurm as devcluster
from tests.helpers import run_cli, skip_or_fail
from tests.real.test_devcluster_netns import holders, leftovers, ns_inode, root_links

pytestmark = pytest.mark.pbs


def qstat_job(env: dict[str, str], job: str) -> dict[str, object]:
    out = subprocess.run(["qstat", "-x", "-f", "-F", "json", job], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    jobs = json.loads(out.stdout)["Jobs"]
    assert len(jobs) == 1, jobs
    return next(iter(jobs.values()))


def wait_finished(env: dict[str, str], job: str, timeout: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        info = qstat_job(env, job)
        if info["job_state"] == "F":
            return info
        assert time.monotonic() < deadline, f"job {job} not finished (state F) within {timeout}s: {info}"
        time.sleep(0.5)


def test_status_names_every_host_and_its_address(pbs_env: dict[str, str]) -> None:
    root = Path(pbs_env["SLURMLAUNCH_TEST_PBS_DIR"])
    net = devcluster.load_network(root)
    assert net is not None
    st = run_cli("dev-cluster", "status", "--dir", str(root), env=pbs_env)
    assert st.returncode == 0, st.stderr
    assert f"head {net.hub_addr}" in st.stdout and f"node3 {net.node_addr(3)}" in st.stdout, st.stdout
    assert devcluster_pbs.node_states(root) == {"node1": "free", "node2": "free", "node3": "free"}
    sys.stderr.write(f"OpenPBS dev cluster came up in {pbs_env['SLURMLAUNCH_TEST_PBS_UP_S']} s\n")
    # the clients on PATH run on the head host: its name, its address
    here = subprocess.run(["in-cluster", "sh", "-c", "hostname; getent hosts node2"], env=pbs_env,
                          capture_output=True, text=True, timeout=30)
    assert here.stdout.split() == ["head", net.node_addr(2), "node2"], here.stderr


def test_a_job_spans_three_hosts_each_its_own_namespace(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """The real qsub takes a job of one chunk per host; pbsdsh (PBS's own task start) runs a task on each:
    three host names, three network namespaces; the output comes back to the submitting directory."""
    root = Path(pbs_env["SLURMLAUNCH_TEST_PBS_DIR"])
    net = devcluster.load_network(root)
    assert net is not None
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\npbsdsh -- /bin/sh -c 'echo \"task $(hostname) $(ip netns identify $$)\"'\n")
    sub = subprocess.run(["qsub", "-l", "select=3:ncpus=1", "-l", "place=scatter", "-j", "oe", "-o",
                          f"{tmp_path}/", str(script)], env=pbs_env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    assert job.endswith(".head"), job
    info = wait_finished(pbs_env, job)
    assert info["Exit_status"] == 0, info
    assert sorted(str(info["exec_host"]).split("+")) == ["node1/0", "node2/0", "node3/0"], info
    out = (tmp_path / f"{job}.OU").read_text()  # -o DIR/: PBS names the file JOBID.OU inside it
    tasks = sorted(ln for ln in out.splitlines() if ln.startswith("task "))
    assert tasks == [f"task node{i} {net.node_ns(i)}" for i in (1, 2, 3)], out


def test_down_after_a_crashed_up_stops_every_daemon_and_removes_the_network(tmp_path: Path) -> None:
    """`up` killed once the head host's daemons are starting: `down` (without --scheduler: it finds the PBS
    cluster by itself) stops every process in its namespaces and removes the namespaces and the route."""
    if devcluster_pbs.missing_requirements() or not devcluster_pbs.installed():
        skip_or_fail(devcluster_pbs.missing_requirements() or "OpenPBS is not installed (tests/run.sh)")
    links_before = root_links()
    root = tmp_path / "c"
    up = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "dev-cluster", "up", "--scheduler", "pbs",
                           "--nodes", "1", "--dir", str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True)
    try:
        comm_log = root / "pbs" / "head" / "spool" / "comm_logs"
        deadline = time.monotonic() + 120
        while not (comm_log.is_dir() and any(comm_log.iterdir())):  # pbs_comm is running: daemons exist
            assert up.poll() is None, up.communicate()
            assert time.monotonic() < deadline, "the head host's pbs_comm did not start within 120s"
            time.sleep(0.1)
        net = devcluster.load_network(root)
        assert net is not None
        inodes = {ns_inode(n) for n in net.namespaces}
        os.killpg(up.pid, signal.SIGKILL)
        up.wait(timeout=30)
        assert holders(inodes), "nothing left running: the test would not show that down stops it"
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(timeout=30)
    down = run_cli("dev-cluster", "down", "--dir", str(root), timeout=120)
    assert down.returncode == 0, down.stderr
    assert leftovers(net) == [] and root_links() == links_before
    assert holders(inodes) == []
    assert not (root / devcluster.LEDGER).exists()
    st = run_cli("dev-cluster", "status", "--dir", str(root), timeout=60)
    assert st.returncode != 0


def test_up_waits_for_a_server_that_is_not_listening_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race seen on a busy machine (`pbs_init.d start` returned while pbs_server was still initializing, and
    qmgr's first connection was refused), injected on the real head host: once it has started, its pbs_server
    is stopped (qterm) and started again 3 s later. `up` waits for it and goes on."""
    if devcluster_pbs.missing_requirements() or not devcluster_pbs.installed():
        skip_or_fail(devcluster_pbs.missing_requirements() or "OpenPBS is not installed (tests/run.sh)")
    real_start = devcluster_pbs._start_head
    restarts: list[threading.Thread] = []
    refused: list[str] = []

    def start_then_stop_the_server(root: Path, init: str, timeout: float) -> None:
        real_start(root, init, timeout)
        qstat = [*devcluster_pbs.enter(root, devcluster_pbs.HEAD), str(devcluster_pbs.PBS_EXEC / "bin" / "qstat"), "-B"]
        subprocess.run([*devcluster_pbs.enter(root, devcluster_pbs.HEAD),
                        str(devcluster_pbs.PBS_EXEC / "bin" / "qterm"), "-t", "quick"], capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while not refused:  # the fault is in place: a client's connection is refused
            r = subprocess.run(qstat, capture_output=True, text=True, timeout=60, env=devcluster_pbs.QUIET_ENV)
            if devcluster_pbs.SERVER_DOWN in r.stdout + r.stderr:
                refused.append(r.stdout + r.stderr)
            assert time.monotonic() < deadline, f"pbs_server still answers 30 s after qterm: {r.stdout}{r.stderr}"
            time.sleep(0.2)

        def restart() -> None:
            time.sleep(3)
            subprocess.run([*devcluster_pbs.enter(root, devcluster_pbs.HEAD), init, "start"], capture_output=True,
                           timeout=180, env=devcluster_pbs.QUIET_ENV)

        restarts.append(threading.Thread(target=restart))
        restarts[0].start()

    monkeypatch.setattr(devcluster_pbs, "_start_head", start_then_stop_the_server)
    root = tmp_path / "c"
    try:
        env = devcluster_pbs.up(root, nodes=1, cpus=2)
        assert refused and restarts, "the fault was not injected"
        print("refused while stopped:", refused[0].strip())
        assert devcluster_pbs.node_states(root) == {"node1": "free"}
        job = subprocess.run(["qsub", "-l", "select=1:ncpus=1", "--", "/bin/true"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert job.returncode == 0, job.stderr
    finally:
        for t in restarts:
            t.join(timeout=200)
        devcluster_pbs.down(root)
