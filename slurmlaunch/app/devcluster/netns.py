"""The dev clusters' networked mode (`dev-cluster up --netns`), for the Slurm and the PBS one alike: a network
namespace per node and a hub with a bridge, on a private subnet claimed by an unreachable route, every step
recorded in the cluster directory's ledger so that `down` undoes exactly what was made; and stopping the
processes left in them."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import DevClusterError


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie has ended (it waits for its parent to read its status, which a
    rank that never waits for its children does only when it ends itself) and no signal can end it again."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")


def _stop_pids(candidates: list[int], timeout: float) -> None:
    """TERM each pid, KILL those still running after ``timeout`` seconds. Each is continued after its TERM
    (SIGCONT, as the shell's kill does): a stopped one (a controller stalled by SIGSTOP) would otherwise keep
    the TERM pending and wait out the whole bound for its KILL."""
    pids = []
    for pid in candidates:
        try:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)
            pids.append(pid)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            if not _running(pid):
                break
            time.sleep(0.05)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ---- the networked mode: namespaces, a bridge, and a record of what was made ----

# Private, and away from the ranges Docker, libvirt and most VPNs hand out first; /24 per cluster.
SUBNET_POOL = ipaddress.IPv4Network("10.213.0.0/16")
LEDGER = "netns-made"  # one "KIND VALUE" line per thing made: route SUBNET, netns NAME, hosts DIR
NET_INFO = "netns.json"


@dataclass(frozen=True)
class Network:
    """Where a networked cluster lives: namespaces PREFIX-hub and PREFIX-node1.., addresses in ``subnet``."""

    prefix: str
    subnet: ipaddress.IPv4Network
    nodes: int

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def node_ns(self, i: int) -> str:
        return f"{self.prefix}-node{i}"

    @property
    def namespaces(self) -> list[str]:
        return [self.hub, *(self.node_ns(i) for i in range(1, self.nodes + 1))]

    @property
    def hub_addr(self) -> str:
        return str(self.subnet.network_address + 1)

    def node_addr(self, i: int) -> str:
        return str(self.subnet.network_address + 10 + i)

    @property
    def inside(self) -> tuple[str, ...]:
        """The prefix that runs a client in the hub namespace, with the cluster's /etc/hosts."""
        return (_tool("ip"), "netns", "exec", self.hub)

    def enter(self, ns: str) -> tuple[str, ...]:
        """The prefix that starts a daemon in namespace ``ns``: the network only, because `ip netns exec`
        mounts a fresh /sys, without the cgroup file system slurmd needs."""
        return ("nsenter", f"--net=/run/netns/{ns}")


def load_network(root: Path) -> Network | None:
    """The network of the cluster in ``root``, or None for a loopback one (or none)."""
    try:
        d = json.loads((root / NET_INFO).read_text())
        return Network(d["prefix"], ipaddress.IPv4Network(d["subnet"]), int(d["nodes"]))
    except (OSError, ValueError, KeyError):
        return None


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("ip"), *args], capture_output=True, text=True)


def _ip_ok(*args: str) -> None:
    r = _ip(*args)
    if r.returncode != 0:
        raise DevClusterError(f"ip {' '.join(args)} failed (exit {r.returncode}): {r.stderr.strip()}")


def _record(root: Path, kind: str, value: str) -> None:
    with open(root / LEDGER, "a") as f:
        f.write(f"{kind} {value}\n")
        f.flush()
        os.fsync(f.fileno())


def networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace routes or has an address in, except the default route."""
    used = []
    routes = json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]")
    for r in routes:
        dst = r.get("dst", "default")
        if dst != "default":
            used.append(ipaddress.IPv4Network(dst, strict=False))
    for link in json.loads(_ip("-j", "-4", "addr").stdout or "[]"):
        for a in link.get("addr_info", []):
            used.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return used


def _claim_subnet(root: Path, wanted: str | None) -> ipaddress.IPv4Network:
    """Add the `unreachable` route of a subnet nobody here uses and record it: adding fails when the route
    exists, so two clusters starting at once cannot claim the same one."""
    if wanted:
        try:
            net = ipaddress.IPv4Network(wanted)
        except ValueError:
            raise DevClusterError(f"subnet {wanted!r} is not valid (expected a private IPv4 network such as "
                               "10.213.7.0/24)") from None
        if not net.is_private or net.prefixlen > 26 or net.prefixlen < 16:
            raise DevClusterError(f"subnet {wanted!r} is not valid (expected a private IPv4 network of /16 to /26, "
                               "such as 10.213.7.0/24)")
        candidates = [net]
    else:
        candidates = list(SUBNET_POOL.subnets(new_prefix=24))
        start = random.randrange(len(candidates))
        candidates = candidates[start:] + candidates[:start]
    for net in candidates:
        clash = [u for u in networks_in_use() if u.overlaps(net)]
        if not clash and _ip("route", "add", "unreachable", str(net)).returncode == 0:
            _record(root, "route", str(net))
            return net
        if wanted:
            used = ", ".join(sorted({str(c) for c in clash})) or "its route exists"
            raise DevClusterError(f"subnet {net} is in use here ({used}): pick another private one, or none to have "
                               "one chosen")
    raise DevClusterError(f"no free /24 in {SUBNET_POOL} (every one is routed or has an address here)")


def make_network(root: Path, nodes: int, subnet: str | None = None) -> Network:
    """The unreachable route first, then the namespaces, the bridge in the hub and one veth pair per node;
    every step recorded in root/netns-made as it happens."""
    root.mkdir(parents=True, exist_ok=True)
    claimed = _claim_subnet(root, subnet)
    why = ""
    for _ in range(20):  # a random name, so that clusters started at once do not meet
        prefix = f"slc{random.getrandbits(24):06x}"
        r = _ip("netns", "add", f"{prefix}-hub")
        if r.returncode == 0:
            break
        why = r.stderr.strip()
    else:
        raise DevClusterError(f"could not create a network namespace slcXXXXXX-hub ({why}; 20 names tried)")
    net = Network(prefix, claimed, nodes)
    _record(root, "netns", net.hub)
    for i in range(1, nodes + 1):
        _ip_ok("netns", "add", net.node_ns(i))
        _record(root, "netns", net.node_ns(i))
    for name in net.namespaces:
        _record(root, "hosts", f"/etc/netns/{name}")
        Path(f"/etc/netns/{name}").mkdir(parents=True, exist_ok=True)
    (root / NET_INFO).write_text(json.dumps({"prefix": prefix, "subnet": str(claimed), "nodes": nodes}) + "\n")
    hub = net.hub
    _ip_ok("-n", hub, "link", "set", "lo", "up")
    _ip_ok("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip_ok("-n", hub, "addr", "add", f"{net.hub_addr}/{claimed.prefixlen}", "dev", "br0")
    _ip_ok("-n", hub, "link", "set", "br0", "up")
    for i in range(1, nodes + 1):
        ns = net.node_ns(i)
        # made inside the hub with its peer moved straight into the node: no link ever exists out here
        _ip_ok("-n", hub, "link", "add", f"veth{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip_ok("-n", hub, "link", "set", f"veth{i}", "master", "br0", "up")
        _ip_ok("-n", ns, "link", "set", "lo", "up")
        _ip_ok("-n", ns, "addr", "add", f"{net.node_addr(i)}/{claimed.prefixlen}", "dev", "eth0")
        _ip_ok("-n", ns, "link", "set", "eth0", "up")
    return net


def _ns_pids(name: str) -> list[int]:
    return [int(p) for p in _ip("netns", "pids", name).stdout.split()]


def remove_network(root: Path, timeout: float = 10.0) -> None:
    """Undo what root/netns-made records, newest first: stop every process still in a namespace (a job step
    outlives slurmd), delete the namespace (its veths and bridge go with it), the hosts files, the route.
    Safe to repeat; raises DevClusterError naming what could not be removed (kept in the record)."""
    ledger = root / LEDGER
    try:
        made = [ln.split(" ", 1) for ln in ledger.read_text().splitlines() if " " in ln]
    except OSError:
        return
    namespaces = [v for k, v in made if k == "netns"]
    _stop_pids([pid for ns in namespaces for pid in _ns_pids(ns)], timeout)
    left = []
    for kind, value in reversed(made):
        if kind == "netns":
            r = _ip("netns", "del", value)
            if r.returncode != 0 and Path(f"/run/netns/{value}").exists():
                left.append((kind, value, r.stderr.strip()))
        elif kind == "hosts" and value.startswith("/etc/netns/slc"):
            shutil.rmtree(value, ignore_errors=True)
            if Path(value).exists():
                left.append((kind, value, "still there"))
        elif kind == "route":
            r = _ip("route", "del", "unreachable", value)
            if r.returncode != 0 and value in _ip("route", "show", "type", "unreachable").stdout:
                left.append((kind, value, r.stderr.strip()))
    if left:
        ledger.write_text("".join(f"{k} {v}\n" for k, v, _ in reversed(left)))
        raise DevClusterError("dev-cluster down left " + "; ".join(f"{k} {v} ({why})" for k, v, why in left))
    ledger.unlink()
    (root / NET_INFO).unlink(missing_ok=True)
