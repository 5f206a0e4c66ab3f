"""The loopback dev cluster's daemons stay off every port a client derives for a job's rendezvous, and off the
kernel's ephemeral range (README: Tests, "Ports").

The ranges are computed here from each client's own formula over job ids, not taken from devcluster's table,
and Lightning's is checked against Lightning itself; the daemons' ports are read from the running session
cluster: its slurm.conf, what `scontrol show config` reports, and the sockets its daemons listen on.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurmlaunch.app.devcluster import slurm as devcluster
from slurmlaunch.core.envvars import derive_port
from slurmlaunch.core.errors import DevClusterError

JOB_IDS = range(0, 120_000)  # every residue of the formulas below; the suite's ids are far lower


def _lightning_port(job_id: int) -> int:
    return int(str(job_id)[-4:]) + 15000  # Lightning's SLURMEnvironment.main_port and ignite's, as they write it


def derived_ports() -> dict[str, set[int]]:
    """Every port each client can derive from a job id (and its fixed defaults)."""
    return {
        "slurmlaunch": {derive_port(j, step) for j in range(0, 17_000) for step in (0, 1)},
        "idr-torch": {10000 + j % 20000 for j in JOB_IDS},
        "Lightning/ignite": {_lightning_port(j) for j in JOB_IDS} | {12910},
        "submitit": set(range(20000, 60001)),  # random.Random(job id).randint(20000, 60000): any of them
        "torch defaults": {29400, 29500},
    }


def test_lightnings_formula_is_lightnings() -> None:
    env_mod = pytest.importorskip("lightning.fabric.plugins.environments.slurm")
    saved = dict(os.environ)
    try:
        os.environ.pop("MASTER_PORT", None)
        for job_id in (7, 1234, 98765, 4_000_123):
            os.environ["SLURM_JOB_ID"] = str(job_id)
            os.environ.pop("MASTER_PORT", None)
            assert env_mod.SLURMEnvironment().main_port == _lightning_port(job_id)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_submitits_range_is_submitits(monkeypatch: pytest.MonkeyPatch) -> None:
    helpers = pytest.importorskip("submitit.helpers")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    dist = object.__new__(helpers.TorchDistributedEnvironment)  # its port choice alone, without a job
    ports = set()
    for job_id in range(3000):
        dist._job_env = SimpleNamespace(job_id=str(job_id))
        ports.add(dist._get_master_port())
    assert min(ports) >= 20000 and max(ports) <= 60000 and min(ports) < 20100 and max(ports) > 59900


def test_regions_avoid_every_derived_port_and_the_ephemeral_range() -> None:
    derived = set().union(*derived_ports().values())
    for ephemeral in [(32768, 60999), (32768, 65535), (40000, 50000)]:
        regions = devcluster.daemon_port_regions(ephemeral)
        assert regions, ephemeral
        for region in regions:
            assert region.start >= 1024 and region.stop <= 65536
            assert not derived & set(region), (ephemeral, region)
            assert not set(range(ephemeral[0], ephemeral[1] + 1)) & set(region), (ephemeral, region)
    assert devcluster.daemon_port_regions((32768, 60999))[0] == range(61000, 65536)  # above clients, first


def test_no_room_is_said_in_one_message() -> None:
    expect = r"no 7 free ports in a row .* outside the ephemeral range 1024-65535 .*; ports left: none$"
    with pytest.raises(DevClusterError, match=expect):
        devcluster._free_port_block(6, ephemeral=(1024, 65535))


def test_ephemeral_range_is_read_from_the_kernels_file() -> None:
    assert devcluster.ephemeral_ports("32768\t60999\n") == (32768, 60999)
    assert devcluster.ephemeral_ports("garbage") == (32768, 60999)
    lo, hi = devcluster.ephemeral_ports()
    assert (lo, hi) == tuple(map(int, Path(devcluster.EPHEMERAL_FILE).read_text().split()))


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets in /proc/PID/net/tcp{,6} in state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
        except OSError:
            continue
        if m:
            inodes.add(m[1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.slurm
def test_the_running_clusters_daemons_are_off_clients_ports(slurm_cluster: dict[str, str]) -> None:
    root = Path(slurm_cluster["SLURMLAUNCH_TEST_CLUSTER_DIR"])
    if devcluster.load_network(root):
        pytest.skip("a netns cluster's daemons have addresses of their own (Slurm's usual 6817-6819 there)")
    conf = (root / "slurm.conf").read_text()
    configured = {int(p) for p in re.findall(r"^(?:SlurmctldPort|AccountingStoragePort)=(\d+)$", conf, re.M)}
    configured |= {int(p) for p in re.findall(r"^NodeName=\S+ .*\bPort=(\d+)", conf, re.M)}
    shown = subprocess.run(["scontrol", "show", "config"], env=slurm_cluster, capture_output=True, text=True,
                           timeout=60).stdout
    reported = {int(p) for p in re.findall(r"^(?:SlurmctldPort|AccountingStoragePort)\s*=\s*(\d+)", shown, re.M)}
    assert reported and reported <= configured, (reported, configured)
    pids = [int(p.read_text()) for p in [root / "slurmctld.pid", root / "slurmdbd.pid", *root.glob("slurmd-*.pid")]
            if p.exists()]
    listening = set().union(*(_listening_ports(pid) for pid in pids))
    assert len(pids) >= 3 and configured <= listening, (configured, listening)
    lo, hi = devcluster.ephemeral_ports()
    for port in sorted(listening):
        clients = [who for who, ports in derived_ports().items() if port in ports]
        assert not clients, f"a daemon listens on {port}, which {clients} derive for a job's rendezvous"
        assert not lo <= port <= hi, f"a daemon listens on {port}, in the ephemeral range {lo}-{hi}"
