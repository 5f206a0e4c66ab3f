"""A real Slurm cluster of several slurmd nodes on this one machine, for the tests and for people.

    slurmlaunch dev-cluster up [--dir DIR] [--nodes 4] [--gpus-per-node 4] [--accounting]  # prints exports
    slurmlaunch dev-cluster status [--dir DIR]
    slurmlaunch dev-cluster down [--dir DIR]

    slurmlaunch dev-cluster up --netns ...  # nodes on a private network: prints exports, PATH included

Every daemon writes a pid file under DIR; `down` stops exactly those pids (never by name).
Each slurmd runs in its own UTS + mount namespace so that `hostname` inside a job is the node's name and
every node name resolves (a private /etc/hosts is bind-mounted): without that gloo hangs on an
unresolvable MASTER_ADDR. Needs root and Debian's slurmctld, slurmd and slurm-client packages.

Two network modes:
- loopback (the default): every node name resolves to 127.0.0.1, so jobs set SLURMLAUNCH_ALLOW_LOOPBACK=1.
- netns: the nodes are different hosts on a private bridge. The cluster makes one network namespace
  "PREFIX-hub" (the bridge, slurmctld, slurmdbd, MariaDB, and every client) and one "PREFIX-nodeI" per slurmd
  (its own address on a veth pair into the bridge). Names resolve through the cluster's hosts file: bound
  over /etc/hosts for each slurmd as in the loopback mode, and copied to /etc/netns/NAME/hosts, which
  `ip netns exec` mounts there. None of them has a default route, so a packet to anywhere else
  fails at once with "network unreachable"; the root namespace gets an `unreachable` route for the subnet
  (added before anything else, so that a stray packet from here fails at once too) and no address on it.
  DIR/bin holds wrappers of Slurm's clients that enter the hub namespace (and run the client where it is
  when already inside the cluster: an srun in a batch script stays on its node); `DIR/bin/in-cluster CMD`
  runs any command there. What was made is appended to DIR/netns-made before or right after making it, so
  that `down` after a crashed `up` removes exactly that: processes left in those namespaces, the
  namespaces (their links go with them), the hosts files and the route.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ...core.envvars import PORT_BASE, PORT_SPAN
from ...core.errors import DevClusterError
from .netns import LEDGER, Network, _stop_pids, _tool, load_network, make_network, remove_network

PACKAGES = ("slurmctld", "slurmd", "slurm-client")


def missing_requirements(netns: bool = False) -> str | None:
    """Why a cluster (with ``netns``: a networked one) cannot be started here, or None when it can."""
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd, unshare, bind mounts)"
    for tool in ("slurmctld", "slurmd", "sbatch", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install {' '.join(PACKAGES)})"
    for tool in ("ip", "nsenter") if netns else ():
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install iproute2 util-linux)"
    return None


# Where clients put a job's rendezvous port (MASTER_PORT) by formula, never asking whether it is free: a daemon
# of ours there fails their job with EADDRINUSE (seen: idr-torch's 10002 held by a dev cluster's slurmd).
# (who, lowest, highest, how); docs: Tests, "Ports".
CLIENT_PORTS: tuple[tuple[str, int, int, str], ...] = (
    ("slurmlaunch", PORT_BASE, PORT_BASE + PORT_SPAN - 1, f"{PORT_BASE} + (job id + 1009 x step id) mod {PORT_SPAN}"),
    ("idr-torch", 10000, 29999, "10000 + job id mod 20000"),
    ("Lightning, pytorch-ignite", 15000, 24999, "15000 + the job id's last 4 digits"),
    ("Lightning outside Slurm", 12910, 12910, "its fixed default"),
    ("submitit", 20000, 60000, "TorchDistributedEnvironment: random.Random(job id).randint(20000, 60000)"),
    ("torchrun", 29400, 29400, "the default port of --rdzv-endpoint"),
    ("torch, accelerate, DeepSpeed", 29500, 29500, "the default MASTER_PORT"),
)
EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
PORT_STRIDE = 97  # bases tried this far apart (a block's size if larger): blocks never overlap
PORT_LOCK = "/tmp/slurmlaunch-dev-cluster-ports.lock"


def ephemeral_ports(text: str | None = None) -> tuple[int, int]:
    """The kernel's range for outgoing connections (``text``: the file's content, else read from
    EPHEMERAL_FILE; Linux's default 32768-60999 when unreadable)."""
    if text is None:
        try:
            with open(EPHEMERAL_FILE) as f:
                text = f.read()
        except OSError:
            text = ""
    parts = text.split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[0]), int(parts[1])
    return 32768, 60999


def daemon_port_regions(ephemeral: tuple[int, int]) -> list[range]:
    """The ports a loopback cluster's daemons may take: above 1023, outside every range of CLIENT_PORTS and the
    ephemeral range; the highest region first (below 10000 are other services' usual ports)."""
    taken = sorted([(lo, hi) for _, lo, hi, _ in CLIENT_PORTS] + [ephemeral])
    regions, start = [], 1024
    for lo, hi in taken:
        if lo > start:
            regions.append(range(start, lo))
        start = max(start, hi + 1)
    if start <= 65535:
        regions.append(range(start, 65536))
    return sorted(regions, key=lambda r: r.start, reverse=True)


def _free_port_block(count: int, ephemeral: tuple[int, int] | None = None) -> int:
    """A base port such that base..base+count are free now (checked by binding each) and in
    :func:`daemon_port_regions`; call it holding :func:`port_lock` until the daemons listen."""
    ephemeral = ephemeral or ephemeral_ports()
    regions = daemon_port_regions(ephemeral)
    for region in regions:
        for base in range(region.start, region.stop - count, max(PORT_STRIDE, count + 1)):
            socks = []
            try:
                for port in range(base, base + count + 1):
                    s = socket.socket()
                    s.bind(("127.0.0.1", port))
                    socks.append(s)
                return base
            except OSError:
                continue
            finally:
                for s in socks:
                    s.close()
    where = ", ".join(f"{r.start}-{r.stop - 1}" for r in regions) or "none"
    raise DevClusterError(f"no {count + 1} free ports in a row for the cluster's daemons where no client derives "
                          f"a rendezvous port and outside the ephemeral range {ephemeral[0]}-{ephemeral[1]} "
                          f"({EPHEMERAL_FILE}); ports left: {where}")


ACCOUNTING_PACKAGES = ("slurmdbd", "slurm-wlm-mysql-plugin", "mariadb-server-core", "mariadb-client-core")


def accounting_missing() -> str | None:
    for tool in ("slurmdbd", "mariadbd", "mariadb-install-db", "sacctmgr"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} not found (apt-get install {' '.join(ACCOUNTING_PACKAGES)})"
    return None


def db_tmpdir(root: Path) -> Path:
    """The cluster's own directory for MariaDB's temporary tables, not the machine's /tmp: with /tmp shared, the
    clusters that started at the same moment lost each other's ("Could not remove temporary table
    '/tmp/#sql-temptable-...', error: 2", then "Unknown table 'mysql.tmp_user_sys'"): 5 of 18 bootstraps, 6 at
    once, failed so; with a directory each, none of 24."""
    d = root / "dbtmp"
    d.mkdir(parents=True, exist_ok=True)
    return d


def install_db(root: Path, inside: tuple[str, ...] = ()) -> None:
    """MariaDB's system tables in ROOT/db (``inside``: as start_accounting's)."""
    r = subprocess.run([*inside, _tool("mariadb-install-db"), "--no-defaults", f"--datadir={root / 'db'}",
                        f"--tmpdir={db_tmpdir(root)}", "--user=root", "--skip-test-db"], capture_output=True, text=True)
    if r.returncode != 0:  # its own words, or a failed cluster start says only "exit status 1"
        raise DevClusterError(f"mariadb-install-db failed (exit {r.returncode}): {(r.stdout + r.stderr)[-1500:]}")


def start_accounting(root: Path, conf: Path, dbd_port: int, timeout: float, inside: tuple[str, ...] = ()) -> None:
    """MariaDB on a unix socket only, then slurmdbd on it, then the cluster registered: sacct works.
    ``inside`` prefixes every command (the hub's ``nsenter`` in the networked mode)."""
    db = root / "db"
    sock = root / "mysql.sock"
    if not db.exists():
        install_db(root, inside)
    subprocess.Popen([*inside, _tool("mariadbd"), "--no-defaults", f"--datadir={db}", f"--socket={sock}",
                      "--skip-networking", f"--pid-file={root}/mariadb.pid", "--user=root",
                      f"--tmpdir={db_tmpdir(root)}", f"--log-error={root}/log/mariadb.log"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    _wait_pidfile(root / "mariadb.pid", timeout)
    deadline = time.monotonic() + timeout
    while not sock.exists():
        if time.monotonic() > deadline:
            raise DevClusterError(f"mariadb socket {sock} did not appear within {timeout:.0f}s")
        time.sleep(0.05)
    dbd_conf = conf.parent / "slurmdbd.conf"
    dbd_conf.write_text("\n".join([
        "AuthType=auth/none", "DbdHost=localhost", f"DbdPort={dbd_port}", "SlurmUser=root",
        "StorageType=accounting_storage/mysql", "StorageHost=localhost", "StorageUser=root",
        "StorageLoc=slurm_acct_db", f"PidFile={root}/slurmdbd.pid", f"LogFile={root}/log/slurmdbd.log",
    ]) + "\n")
    dbd_conf.chmod(0o600)
    # libmysqlclient takes its socket from MYSQL_UNIX_PORT when the host is localhost
    env = dict(os.environ, SLURM_CONF=str(conf), MYSQL_UNIX_PORT=str(sock))
    subprocess.run([*inside, _tool("slurmdbd")], env=env, check=True)
    _wait_pidfile(root / "slurmdbd.pid", timeout)
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run([*inside, "sacctmgr", "-i", "add", "cluster", "sltest"], env=env, capture_output=True,
                           text=True)
        if r.returncode == 0 or "already exists" in r.stdout + r.stderr:
            return
        if time.monotonic() > deadline:
            raise DevClusterError(f"slurmdbd did not answer sacctmgr within {timeout:.0f}s: {r.stdout} {r.stderr}")
        time.sleep(0.2)


def write_config(root: Path, nodes: int, gpus: int, cpus: int, accounting: bool = False,
                 net: Network | None = None, first_job_id: int = 1, slurmd_timeout: int | None = None) -> Path:
    """slurm.conf, gres.conf (with /dev/null stand-ins for the fake GPUs) and the cluster's hosts file in
    ``root``; returns slurm.conf's path."""
    for sub in ("state", "spool", "log", "dev", *(f"tmp/node{i}" for i in range(1, nodes + 1))):
        (root / sub).mkdir(parents=True, exist_ok=True)
    # Loopback: every daemon shares this machine's ports, so find free ones. Netns: each has its own
    # address in namespaces nothing else uses, so Slurm's usual ports (ctld 6817, slurmd 6818, dbd 6819).
    base = 6817 if net else _free_port_block(nodes + 2)
    names = [f"node{i}" for i in range(1, nodes + 1)]
    host = socket.gethostname()
    lines = _controller_lines(root, host, base, accounting, net, nodes, first_job_id)
    if slurmd_timeout is not None:  # how soon a silent node is DOWN (Slurm's default: 300 s)
        lines.append(f"SlurmdTimeout={slurmd_timeout}")
    for i, name in enumerate(names, start=1):
        lines.append(
            f"NodeName={name} NodeAddr={net.node_addr(i) if net else '127.0.0.1'} "
            f"Port={base + 1 if net else base + i} CPUs={cpus} RealMemory=4000"
            + (f" Gres=gpu:{gpus}" if gpus else "")
            + " State=UNKNOWN"
        )
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    lines.append(f"PartitionName=first Nodes={names[0]} MaxTime=30 State=UP")  # a second one, for profiles
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    _write_gres(root, nodes, gpus)
    (root / "hosts").write_text(_hosts_text(names, host, net))
    return conf


def _controller_lines(root: Path, host: str, base: int, accounting: bool, net: Network | None,
                      nodes: int, first_job_id: int = 1) -> list[str]:
    """slurm.conf's lines before the nodes: the controller, its files, plugins and the quick timings."""
    dbd_port = base + 2 if net else base + nodes + 1
    return [
        "ClusterName=sltest",
        f"FirstJobId={first_job_id}",
        f"SlurmctldHost={host}({net.hub_addr if net else '127.0.0.1'})",
        f"SlurmctldPort={base}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        # Each node's own: Slurm's PMIx plugin makes its clients' directory there, named by job and step only,
        # so nodes sharing one /tmp (this machine's) collide on it ("File exists"). TMPDIR stays Slurm's /tmp.
        f"TmpFS={root}/tmp/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "AuthType=auth/none",
        "CredType=cred/none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        *(["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
           f"AccountingStoragePort={dbd_port}", "JobCompType=jobcomp/none"]
          if accounting else ["AccountingStorageType=accounting_storage/none"]),
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "GresTypes=gpu",
        "SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2",
        "MinJobAge=5",
        "KillWait=2",
        "AuthInfo=cred_expire=10",  # else a requeued job waits > 120 s before it may start again
        "MessageTimeout=5",
        "ReturnToService=2",
        "MpiDefault=none",
        "InactiveLimit=0",
    ]


def _write_gres(root: Path, nodes: int, gpus: int) -> None:
    # Slurm drops GPUs without device files (the node goes INVAL): fake them with /dev/null links.
    for g in range(gpus):
        link = root / "dev" / f"nvidia{g}"
        if not link.exists():
            link.symlink_to("/dev/null")
    gres = ["AutoDetect=off"]
    if gpus:
        gres.append(f"NodeName=node[1-{nodes}] Name=gpu File={root}/dev/nvidia[0-{gpus - 1}]")
    (root / "gres.conf").write_text("\n".join(gres) + "\n")


def _hosts_text(names: list[str], host: str, net: Network | None) -> str:
    """The cluster's /etc/hosts: every node on its own address (netns), or all on 127.0.0.1."""
    if net:
        return (f"127.0.0.1 localhost\n{net.hub_addr} {host}\n"
                + "".join(f"{net.node_addr(i)} {name}\n" for i, name in enumerate(names, start=1))
                + "::1 localhost ip6-localhost\n")
    return "127.0.0.1 localhost " + " ".join(names) + f" {host}\n::1 localhost ip6-localhost\n"


CLIENTS = ("sbatch", "srun", "salloc", "squeue", "scontrol", "scancel", "sinfo", "sacct", "sacctmgr", "sstat",
           "sattach", "sreport", "sshare", "sprio", "sdiag")


def _write_clients(root: Path, net: Network) -> None:
    """root/bin: Slurm's clients entering the hub from outside, and running where they are inside the cluster
    (a job step's srun must stay on its node); in-cluster runs any command there."""
    bindir = root / "bin"
    bindir.mkdir(exist_ok=True)
    ip = _tool("ip")
    targets = {name: shutil.which(name) for name in CLIENTS}
    for name, real in [*targets.items(), ("in-cluster", "")]:
        if real is None:
            continue
        run = f'{real} "$@"' if real else '"$@"'
        (bindir / name).write_text(
            "#!/bin/sh\n"
            f"# {name} for the dev cluster in {root}: outside its namespaces, enter its hub\n"
            f'case "$({ip} netns identify $$ 2>/dev/null)" in\n'
            f"    {net.prefix}-*) exec {run} ;;\n"
            "esac\n"
            f"exec {ip} netns exec {net.hub} {run}\n")
        (bindir / name).chmod(0o755)


def _wait_pidfile(path: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise DevClusterError(f"{path} did not appear within {timeout:.0f}s")


@contextlib.contextmanager
def port_lock(timeout: float) -> Iterator[None]:
    """This machine's loopback clusters choose their ports one at a time: held from the choice until the
    daemons listen. Clusters started at the same moment (pytest-xdist workers) would otherwise all take the
    first free block, and all but one slurmd fail with "Address already in use"."""
    fd = os.open(PORT_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DevClusterError(f"waited {timeout:.0f}s for another dev cluster to finish starting "
                                          f"(it holds {PORT_LOCK})") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # releases the lock


def up(root: Path, nodes: int = 4, gpus: int = 4, cpus: int = 8, timeout: float = 30.0,
       accounting: bool = False, netns: bool = False, subnet: str | None = None,
       first_job_id: int = 1, slurmd_timeout: int | None = None) -> dict[str, str]:
    """Start (MariaDB and slurmdbd with ``accounting``,) slurmctld and `nodes` slurmd, with ``netns`` each
    node on its own address of a private network (``subnet``, or a free /24 of 10.213.0.0/16); return the
    environment variables a client needs; job ids start at ``first_job_id`` (clusters side by side apart).
    ``slurmd_timeout``: SlurmdTimeout, the seconds after which Slurm marks a silent node DOWN (it pings
    every third of it); Slurm's 300 s unless given (a fault test sets less, to see a lost node named soon).
    After a failure, `down(root)` removes what was started and made. A loopback cluster holds
    :func:`port_lock` while it starts (a netns one has its own addresses)."""
    why = missing_requirements(netns) or (accounting_missing() if accounting else None)
    if why:
        raise DevClusterError(why)
    with contextlib.nullcontext() if netns else port_lock(max(120.0, 6 * timeout)):
        return _start(root.resolve(), nodes, gpus, cpus, timeout, accounting, netns, subnet, first_job_id,
                      slurmd_timeout)


def _start(root: Path, nodes: int, gpus: int, cpus: int, timeout: float, accounting: bool, netns: bool,
           subnet: str | None, first_job_id: int, slurmd_timeout: int | None = None) -> dict[str, str]:
    net = make_network(root, nodes, subnet) if netns else None
    inside = net.enter(net.hub) if net else ()
    conf = write_config(root, nodes, gpus, cpus, accounting, net, first_job_id, slurmd_timeout)
    if net:
        for name in net.namespaces:
            shutil.copyfile(root / "hosts", f"/etc/netns/{name}/hosts")
        _write_clients(root, net)
    if accounting:
        port = int(next(ln for ln in conf.read_text().splitlines() if ln.startswith("AccountingStoragePort="))
                   .split("=")[1])
        start_accounting(root, conf, port, timeout, inside)
    env = dict(os.environ, SLURM_CONF=str(conf))
    subprocess.run([*inside, "slurmctld", "-f", str(conf), "-c"], env=env, check=True)
    _wait_pidfile(root / "slurmctld.pid", timeout)
    for i in range(1, nodes + 1):
        name = f"node{i}"
        (root / "spool" / name).mkdir(parents=True, exist_ok=True)
        inner = (
            f"hostname {name} && mount --bind {root}/hosts /etc/hosts && "
            f"exec slurmd -f {conf} -N {name} -c"
        )
        subprocess.run([*(net.enter(net.node_ns(i)) if net else ()), "unshare", "--mount", "--uts", "--",
                        "sh", "-c", inner], env=env, check=True)
    for i in range(1, nodes + 1):
        _wait_pidfile(root / f"slurmd-node{i}.pid", timeout)
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            [*inside, "sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True
        ).stdout.split()
        states = dict(zip(out[0::2], out[1::2], strict=False))  # a node in two partitions is listed twice
        if len(states) == nodes and all(s == "idle" for s in states.values()):
            break
        if time.monotonic() > deadline:
            raise DevClusterError(f"nodes not idle within {timeout:.0f}s: {out}")
        time.sleep(0.2)
    if net:  # the clients in root/bin enter the hub; nothing loopback to allow
        return {"SLURM_CONF": str(conf), "PATH": f"{root}/bin:{os.environ.get('PATH', os.defpath)}"}
    # Every node of this cluster resolves to 127.0.0.1: the launcher's multi-node loopback check must allow it.
    return {"SLURM_CONF": str(conf), "SLURMLAUNCH_ALLOW_LOOPBACK": "1"}


def _stop(pidfiles: list[Path], timeout: float) -> None:
    pids = []
    for pidfile in pidfiles:
        try:
            pids.append(int(pidfile.read_text().strip()))
        except (OSError, ValueError):
            pass
    _stop_pids(pids, timeout)
    for pidfile in pidfiles:
        pidfile.unlink(missing_ok=True)


def step_daemons(root: Path) -> list[int]:
    """The pids of this cluster's step daemons (slurmstepd, which slurmd starts and leaves behind: after a
    controller stall one goes on retrying to report its step). They have no pid file; each keeps its node's
    log file under ``root`` open, which tells this cluster's from another's on the same machine."""
    inside = str(root.resolve()) + "/"
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/comm") as f:
                if f.read().strip() != "slurmstepd":
                    continue
            fds = os.listdir(f"/proc/{entry.name}/fd")
        except OSError:  # gone meanwhile, or not ours to look at
            continue
        if any(_fd_target(f"/proc/{entry.name}/fd/{fd}").startswith(inside) for fd in fds):
            pids.append(int(entry.name))
    return pids


def descendants(pids: list[int]) -> list[int]:
    """Every process below ``pids`` in the process tree (by the parent pid in /proc/PID/stat), not ``pids``."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
                parents[int(entry.name)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
    found: set[int] = set()
    frontier = set(pids)
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return sorted(found - set(pids))


def _fd_target(link: str) -> str:
    try:
        return os.readlink(link)
    except OSError:  # closed meanwhile
        return ""


def down(root: Path, timeout: float = 10.0) -> None:
    """Stop every daemon that has a pid file under root (TERM, then CONT for a stopped one; KILL after
    `timeout`): the nodes, their step daemons (found by step_daemons) and every process below them, the
    controller, then slurmdbd and MariaDB; then remove what the networked mode made (remove_network)."""
    _stop(sorted(root.glob("slurmd-*.pid")), timeout)
    # A step daemon whose slurmd is gone (killed: a "lost" node) is never told to end its step, and TERM ends
    # it alone: its tasks (the ranks, their watchdogs) would live on under init until their script ends, and
    # proctrack/linuxproc, which follows the process tree, loses them. So they are found while the tree holds.
    steps = step_daemons(root)
    _stop_pids([*descendants(steps), *steps], timeout)
    for pattern in ("slurmctld.pid", "slurmdbd.pid", "mariadb.pid"):
        _stop(sorted(root.glob(pattern)), timeout)
    remove_network(root, timeout)


DEFAULT_DIR = "/tmp/slurmlaunch-dev-cluster"


def _controller_running(root: Path) -> bool:
    """Whether the slurmctld of the pid file under root is alive (`down` removes the pid files)."""
    try:
        pid = int((root / "slurmctld.pid").read_text().strip())
        os.kill(pid, 0)
    except PermissionError:
        return True  # alive, another user's
    except (OSError, ValueError):
        return False
    return pid > 0


def cmd(action: str, root: Path, nodes: int, gpus: int, cpus: int, accounting: bool,
        netns: str | None = None) -> int:
    """`slurmlaunch dev-cluster`: up prints the variables to export; status shows sinfo; down stops it.
    ``netns``: None for the loopback mode, "auto" or a subnet for the networked one."""
    if action == "up":
        why = missing_requirements(netns is not None) or (accounting_missing() if accounting else None)
        if why:
            raise DevClusterError(f"dev-cluster: {why}")
        if (root / "slurmctld.pid").exists() or (root / LEDGER).exists():
            raise DevClusterError(f"dev-cluster: one is already up in {root} "
                                  f"(slurmlaunch dev-cluster down --dir {root})")
        try:
            env = up(root, nodes, gpus, cpus, accounting=accounting, netns=netns is not None,
                     subnet=None if netns in (None, "auto") else netns)
        except (DevClusterError, subprocess.CalledProcessError) as e:
            try:
                down(root)
            except DevClusterError as left:
                e = DevClusterError(f"{e}; {left}")
            raise DevClusterError(f"dev-cluster: did not come up: {e} (daemon logs in {root}/log)") from None
        for k, v in env.items():
            # PATH: the shell's own at the time of export, with the cluster's clients first
            print(f'export PATH="{root.resolve()}/bin:$PATH"' if k == "PATH" else f"export {k}={v}")
        return 0
    if action == "down":
        try:
            down(root)
        except DevClusterError as e:
            raise DevClusterError(f"dev-cluster: {e} (see {root}/{LEDGER})") from None
        return 0
    if not (root / "slurm.conf").exists():
        raise DevClusterError(f"dev-cluster: none in {root} (slurmlaunch dev-cluster up --dir {root} starts one; "
                              f"add --scheduler pbs for OpenPBS)")
    if not _controller_running(root):  # `down` keeps slurm.conf: sinfo would print a raw connection error
        sys.stderr.write(f"slurmlaunch: dev-cluster in {root} is down: its controller is not running "
                         f"(slurmlaunch dev-cluster up --dir {root} starts one)\n")
        return 1
    env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"))
    net = load_network(root)
    if net:
        print(f"network {net.subnet}: controller {net.hub_addr} in namespace {net.hub}, "
              + ", ".join(f"node{i} {net.node_addr(i)}" for i in range(1, net.nodes + 1))
              + f"; run commands inside with {root}/bin/in-cluster CMD", flush=True)
    # a row per node and partition: node1 is in two ("debug" and "first"), so its rows differ by the partition
    return subprocess.run([*(net.inside if net else ()), "sinfo", "-N", "-o", "%N %P %t %G %c"], env=env).returncode
