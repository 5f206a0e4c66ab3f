"""The dev cluster's networked mode: its network is sealed off, refuses a subnet in use, and `down` removes
everything it made, also after a crashed `up`. The oracles are the kernel (errno of a connect, what
`ip` lists, which processes hold a namespace), not our own record.

These need root and iproute2; they skip without, and fail instead under CI=true.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmlaunch.app.devcluster import netns
from slurmlaunch.app.devcluster import slurm as devcluster
from slurmlaunch.core.errors import DevClusterError
from tests.helpers import run_cli, skip_or_fail

pytestmark = pytest.mark.slurm

# connect() and report the errno name (or "connected"); the socket timeout bounds it if a packet did leave
CONNECT = """
import errno, socket, sys
s = socket.socket()
s.settimeout(5)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except OSError as e:
    print(errno.errorcode.get(e.errno, repr(e)))
"""

# listen in one namespace, say so, accept one connection (bounded)
SERVE = """
import socket, sys
srv = socket.create_server((sys.argv[1], 7000))
srv.settimeout(30)
print("listening", flush=True)
conn, peer = srv.accept()
print(peer[0], flush=True)
"""


def _needs_netns() -> None:
    if os.geteuid() != 0 or devcluster.missing_requirements(netns=True):
        skip_or_fail(devcluster.missing_requirements(netns=True) or "the networked dev cluster needs root")


def in_ns(ns: str | None, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=timeout)


def connect(ns: str | None, addr: str, port: int = 9) -> str:
    r = in_ns(ns, sys.executable, "-c", CONNECT, addr, str(port))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def gateway() -> str:
    """Where this machine's stray traffic would go: its default gateway (192.0.2.1 when it has none)."""
    routes = json.loads(in_ns(None, "ip", "-j", "-4", "route", "show", "default").stdout or "[]")
    return str(routes[0]["gateway"]) if routes and "gateway" in routes[0] else "192.0.2.1"


def ns_inode(name: str) -> int:
    return os.stat(f"/run/netns/{name}").st_ino


def holders(inodes: set[int]) -> list[int]:
    """Processes whose network namespace is one of ``inodes``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def root_links() -> set[str]:
    return {link["ifname"] for link in json.loads(in_ns(None, "ip", "-j", "link").stdout)}


def leftovers(net: netns.Network) -> list[str]:
    """Whatever of ``net`` is still on this machine, as the kernel and the file system tell it."""
    left = [f"netns {n}" for n in in_ns(None, "ip", "netns", "list").stdout.split() if n.startswith(net.prefix)]
    left += [f"hosts {p}" for p in Path("/etc/netns").glob(f"{net.prefix}-*")] if Path("/etc/netns").exists() else []
    routes = in_ns(None, "ip", "-4", "route", "show", "table", "all").stdout
    left += [f"route {line.strip()}" for line in routes.splitlines() if str(net.subnet) in line]
    return left


@pytest.fixture
def network(tmp_path: Path) -> Iterator[netns.Network]:
    """The network of a 2-node cluster, without its daemons."""
    _needs_netns()
    net = netns.make_network(tmp_path, 2)
    yield net
    netns.remove_network(tmp_path)


def test_stray_packets_fail_at_once_with_network_unreachable(network: netns.Network) -> None:
    for ns in network.namespaces:
        assert in_ns(ns, "ip", "route", "show", "default").stdout.strip() == "", ns  # no default route
        assert connect(ns, gateway()) == "ENETUNREACH", ns
        assert connect(ns, "192.0.2.1") == "ENETUNREACH", ns
    # this machine's own namespace has only the unreachable route to the cluster's addresses
    for addr in (network.hub_addr, network.node_addr(1)):
        assert connect(None, addr) == "EHOSTUNREACH"
        assert in_ns(None, "ip", "route", "get", addr).returncode != 0
    # the root namespace holds no address of the subnet
    addrs = json.loads(in_ns(None, "ip", "-j", "-4", "addr").stdout)
    assert not [a for link in addrs for a in link["addr_info"]
                if ipaddress.ip_address(a["local"]) in network.subnet]


def test_nodes_reach_each_other_over_the_bridge(network: netns.Network) -> None:
    server = subprocess.Popen(["ip", "netns", "exec", network.node_ns(2), sys.executable, "-c", SERVE,
                               network.node_addr(2)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening", server.stderr
        assert connect(network.node_ns(1), network.node_addr(2), 7000) == "connected"
        out, err = server.communicate(timeout=30)
        assert out.strip() == network.node_addr(1), err  # from node1's own address, through the bridge
        assert connect(network.hub, network.node_addr(2), 7001) == "ECONNREFUSED"  # the hub reaches it too
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)


def test_a_subnet_in_use_is_refused(tmp_path: Path) -> None:
    _needs_netns()
    with pytest.raises(DevClusterError, match=r"subnet 127\.0\.0\.0/24 is in use here \(127\.0\.0\.0/8"):
        netns.make_network(tmp_path / "a", 1, "127.0.0.0/24")
    assert not (tmp_path / "a" / netns.LEDGER).exists()  # nothing made, nothing to undo
    first = netns.make_network(tmp_path / "b", 1)
    try:  # a second cluster cannot take the first one's subnet
        with pytest.raises(DevClusterError, match=f"subnet {first.subnet} is in use here"):
            netns.make_network(tmp_path / "c", 1, str(first.subnet))
        assert not (tmp_path / "c" / netns.LEDGER).exists()
        assert in_ns(None, "ip", "route", "show", "table", "all").stdout.count(str(first.subnet)) == 1
    finally:
        netns.remove_network(tmp_path / "b")


def test_down_after_a_crashed_up_removes_every_namespace_link_and_route(tmp_path: Path) -> None:
    _needs_netns()
    links_before = root_links()
    net = netns.make_network(tmp_path, 2)  # up got this far, then died
    inodes = {ns_inode(n) for n in net.namespaces}
    assert sorted(leftovers(net)) == sorted([*(f"netns {n}" for n in net.namespaces),
                                             *(f"hosts /etc/netns/{n}" for n in net.namespaces),
                                             f"route unreachable {net.subnet}"])
    assert root_links() == links_before  # the veths and the bridge never exist out here
    # a job step that outlived its slurmd keeps a namespace alive after `ip netns del`: down must stop it
    step = subprocess.Popen(["ip", "netns", "exec", net.node_ns(2), "sleep", "300"])
    try:
        assert run_cli("dev-cluster", "down", "--dir", str(tmp_path), timeout=60).returncode == 0
        assert step.wait(timeout=30) != 0
    finally:
        if step.poll() is None:
            step.kill()
            step.wait(timeout=10)
    assert leftovers(net) == [] and root_links() == links_before
    assert holders(inodes) == []  # the namespaces are gone, not just unnamed
    assert not (tmp_path / netns.LEDGER).exists()
    assert run_cli("dev-cluster", "down", "--dir", str(tmp_path), timeout=60).returncode == 0  # again: no-op


def test_cluster_status_and_clients_inside(netns_cluster_env: dict[str, str]) -> None:
    """The wrappers on PATH reach slurmctld in the hub; `in-cluster` runs any command there, with the
    cluster's names resolving to their own addresses; a job step's client runs on its node."""
    root = Path(netns_cluster_env["SLURMLAUNCH_TEST_CLUSTER_DIR"])
    net = netns.load_network(root)
    assert net is not None
    st = run_cli("dev-cluster", "status", "--dir", str(root), env=netns_cluster_env)
    assert st.returncode == 0 and f"node1 {net.node_addr(1)}" in st.stdout and "node4 debug* idle" in st.stdout, \
        st.stderr
    rows = [line for line in st.stdout.splitlines() if line.startswith("node1 ")]  # one per partition, told apart
    assert sorted(row.split()[1] for row in rows) == ["debug*", "first"], st.stdout
    hosts = subprocess.run(["in-cluster", "getent", "hosts", "node2"], env=netns_cluster_env, capture_output=True,
                           text=True, timeout=30)
    assert hosts.stdout.split() == [net.node_addr(2), "node2"], hosts.stderr
    out = subprocess.run(["srun", "-N2", "sh", "-c", 'echo "$(hostname) $(ip netns identify $$)"'],
                         env=netns_cluster_env, capture_output=True, text=True, timeout=60)
    assert sorted(out.stdout.splitlines()) == [f"node1 {net.node_ns(1)}", f"node2 {net.node_ns(2)}"], out.stderr
