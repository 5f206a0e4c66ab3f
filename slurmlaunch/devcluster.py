"""A real Slurm cluster of several slurmd nodes on this one machine, for the tests and for people.

    slurmlaunch dev-cluster up [--dir DIR] [--nodes 4] [--gpus-per-node 4] [--accounting]  # prints exports
    slurmlaunch dev-cluster status [--dir DIR]
    slurmlaunch dev-cluster down [--dir DIR]

Every daemon writes a pid file under DIR; `down` stops exactly those pids (never by name).
Each slurmd runs in its own UTS + mount namespace so that `hostname` inside a job is the node's name and
every node name resolves (a private /etc/hosts is bind-mounted): without that gloo hangs on an
unresolvable MASTER_ADDR. Needs root and Debian's slurmctld, slurmd and slurm-client packages.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client")


def missing_requirements() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd, unshare, bind mounts)"
    for tool in ("slurmctld", "slurmd", "sbatch", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install {' '.join(PACKAGES)})"
    return None


def _free_port_block(count: int) -> int:
    """A base port such that base..base+count are free now (checked by binding each)."""
    for base in range(17000, 29000, 97):
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
    raise RuntimeError("no free block of ports for the test cluster")


ACCOUNTING_PACKAGES = ("slurmdbd", "slurm-wlm-mysql-plugin", "mariadb-server-core", "mariadb-client-core")


def accounting_missing() -> str | None:
    for tool in ("slurmdbd", "mariadbd", "mariadb-install-db", "sacctmgr"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} not found (apt-get install {' '.join(ACCOUNTING_PACKAGES)})"
    return None


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def start_accounting(root: Path, conf: Path, dbd_port: int, timeout: float) -> None:
    """MariaDB on a unix socket only, then slurmdbd on it, then the cluster registered: sacct works."""
    db = root / "db"
    sock = root / "mysql.sock"
    if not db.exists():
        subprocess.run([_tool("mariadb-install-db"), "--no-defaults", f"--datadir={db}", "--user=root",
                        "--skip-test-db"], check=True, capture_output=True)
    subprocess.Popen([_tool("mariadbd"), "--no-defaults", f"--datadir={db}", f"--socket={sock}", "--skip-networking",
                      f"--pid-file={root}/mariadb.pid", "--user=root", f"--log-error={root}/log/mariadb.log"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    _wait_pidfile(root / "mariadb.pid", timeout)
    deadline = time.monotonic() + timeout
    while not sock.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"mariadb socket {sock} did not appear within {timeout:.0f}s")
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
    subprocess.run([_tool("slurmdbd")], env=env, check=True)
    _wait_pidfile(root / "slurmdbd.pid", timeout)
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run(["sacctmgr", "-i", "add", "cluster", "sltest"], env=env, capture_output=True, text=True)
        if r.returncode == 0 or "already exists" in r.stdout + r.stderr:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"slurmdbd did not answer sacctmgr within {timeout:.0f}s: {r.stdout} {r.stderr}")
        time.sleep(0.2)


def write_config(root: Path, nodes: int, gpus: int, cpus: int, accounting: bool = False) -> Path:
    for sub in ("state", "spool", "log", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    base = _free_port_block(nodes + 2)
    names = [f"node{i}" for i in range(1, nodes + 1)]
    host = socket.gethostname()
    lines = [
        "ClusterName=sltest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={base}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
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
           f"AccountingStoragePort={base + nodes + 1}", "JobCompType=jobcomp/none"]
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
    for i, name in enumerate(names, start=1):
        lines.append(
            f"NodeName={name} NodeAddr=127.0.0.1 Port={base + i} CPUs={cpus} RealMemory=4000"
            + (f" Gres=gpu:{gpus}" if gpus else "")
            + " State=UNKNOWN"
        )
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    lines.append(f"PartitionName=first Nodes={names[0]} MaxTime=30 State=UP")  # a second one, for profiles
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    # Slurm drops GPUs without device files (the node goes INVAL): fake them with /dev/null links.
    for g in range(gpus):
        link = root / "dev" / f"nvidia{g}"
        if not link.exists():
            link.symlink_to("/dev/null")
    gres = ["AutoDetect=off"]
    if gpus:
        gres.append(f"NodeName=node[1-{nodes}] Name=gpu File={root}/dev/nvidia[0-{gpus - 1}]")
    (root / "gres.conf").write_text("\n".join(gres) + "\n")
    hosts = "127.0.0.1 localhost " + " ".join(names) + f" {host}\n::1 localhost ip6-localhost\n"
    (root / "hosts").write_text(hosts)
    return conf


def _wait_pidfile(path: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError(f"{path} did not appear within {timeout:.0f}s")


def up(root: Path, nodes: int = 4, gpus: int = 4, cpus: int = 8, timeout: float = 30.0,
       accounting: bool = False) -> dict[str, str]:
    """Start (MariaDB and slurmdbd with ``accounting``,) slurmctld and `nodes` slurmd; return the
    environment variables a client needs."""
    why = missing_requirements() or (accounting_missing() if accounting else None)
    if why:
        raise RuntimeError(why)
    root = root.resolve()
    conf = write_config(root, nodes, gpus, cpus, accounting)
    if accounting:
        port = int(next(ln for ln in conf.read_text().splitlines() if ln.startswith("AccountingStoragePort="))
                   .split("=")[1])
        start_accounting(root, conf, port, timeout)
    env = dict(os.environ, SLURM_CONF=str(conf))
    subprocess.run(["slurmctld", "-f", str(conf), "-c"], env=env, check=True)
    _wait_pidfile(root / "slurmctld.pid", timeout)
    for i in range(1, nodes + 1):
        name = f"node{i}"
        (root / "spool" / name).mkdir(parents=True, exist_ok=True)
        inner = (
            f"hostname {name} && mount --bind {root}/hosts /etc/hosts && "
            f"exec slurmd -f {conf} -N {name} -c"
        )
        subprocess.run(["unshare", "--mount", "--uts", "--", "sh", "-c", inner], env=env, check=True)
    for i in range(1, nodes + 1):
        _wait_pidfile(root / f"slurmd-node{i}.pid", timeout)
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True
        ).stdout.split()
        states = dict(zip(out[0::2], out[1::2], strict=False))  # a node in two partitions is listed twice
        if len(states) == nodes and all(s == "idle" for s in states.values()):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"nodes not idle within {timeout:.0f}s: {out}")
        time.sleep(0.2)
    # Every node of this cluster resolves to 127.0.0.1: the launcher's multi-node loopback check must allow it.
    return {"SLURM_CONF": str(conf), "SLURMLAUNCH_ALLOW_LOOPBACK": "1"}


def _stop(pidfiles: list[Path], timeout: float) -> None:
    pids = []
    for pidfile in pidfiles:
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.05)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for pidfile in pidfiles:
        pidfile.unlink(missing_ok=True)


def down(root: Path, timeout: float = 10.0) -> None:
    """Stop every daemon that has a pid file under root (TERM, then KILL after `timeout`): the nodes, the
    controller, then slurmdbd and MariaDB."""
    for pattern in ("slurmd-*.pid", "slurmctld.pid", "slurmdbd.pid", "mariadb.pid"):
        _stop(sorted(root.glob(pattern)), timeout)


DEFAULT_DIR = "/tmp/slurmlaunch-dev-cluster"


def cmd(action: str, root: Path, nodes: int, gpus: int, cpus: int, accounting: bool) -> int:
    """`slurmlaunch dev-cluster`: up prints the variables to export; status shows sinfo; down stops it."""
    from .errors import SpecError

    if action == "up":
        why = missing_requirements() or (accounting_missing() if accounting else None)
        if why:
            raise SpecError(f"dev-cluster: {why}")
        if (root / "slurmctld.pid").exists():
            raise SpecError(f"dev-cluster: one is already up in {root} (slurmlaunch dev-cluster down --dir {root})")
        try:
            env = up(root, nodes, gpus, cpus, accounting=accounting)
        except (RuntimeError, subprocess.CalledProcessError) as e:
            down(root)
            raise SpecError(f"dev-cluster: did not come up: {e} (daemon logs in {root}/log)") from None
        for k, v in env.items():
            print(f"export {k}={v}")
        return 0
    if action == "down":
        down(root)
        return 0
    if not (root / "slurm.conf").exists():
        raise SpecError(f"dev-cluster: none in {root} (slurmlaunch dev-cluster up --dir {root})")
    env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"))
    return subprocess.run(["sinfo", "-N", "-o", "%N %t %G %c"], env=env).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a local multi-node Slurm cluster")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("dir", type=Path, nargs="?", default=Path(DEFAULT_DIR))
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--cpus", type=int, default=8)
    p.add_argument("--accounting", action="store_true", help="also MariaDB + slurmdbd, so that sacct works")
    a = p.parse_args(argv)
    return cmd(a.action, a.dir, a.nodes, a.gpus, a.cpus, a.accounting)


if __name__ == "__main__":
    sys.exit(main())
