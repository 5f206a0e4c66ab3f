"""A real multi-host OpenPBS on this one machine, for the tests and for people.

    slurmlaunch dev-cluster up --scheduler pbs [--dir DIR] [--nodes 3] [--cpus 8] [--gpus-per-node 4]
    slurmlaunch dev-cluster status [--dir DIR]
    slurmlaunch dev-cluster down [--dir DIR]

OpenPBS refuses to run on a loopback address (its host-name code skips every 127.0.0.0/8 address), so the
cluster is always the networked kind of the Slurm dev cluster (netns.make_network: a private subnet, no
default route, an `unreachable` route for it in the root namespace first, a record that `down` undoes):
host "head" in namespace PREFIX-hub runs pbs_comm, pbs_server, pbs_sched and the PostgreSQL datastore;
host "nodeI" in PREFIX-nodeI runs one pbs_mom. PBS reads its configuration from fixed places (/etc/pbs.conf,
PBS_HOME=/var/spool/pbs, /etc/hosts), so each host is a process that holds a mount and UTS namespace of its
own, with its host name and DIR/pbs/HOST/{pbs.conf,spool} and DIR/hosts bound over those paths; every PBS
daemon of the host is started inside it (nsenter) and so are the clients: DIR/bin holds wrappers of PBS's
commands that enter the head host from outside and run the command where they are inside the cluster (a
job's pbsdsh stays on its host). `DIR/bin/in-cluster CMD` runs any command on the head host.

Each execution host also runs an OpenSSH server (when openssh-server is installed), as PBS sites let a job's
owner ssh to the hosts the job holds: `slurmlaunch stacks` reaches a job's ranks that way. The keys are the
cluster's own (DIR/ssh, made at `up`): DIR/ssh/ssh_config is bound over /etc/ssh/ssh_config on every host, so
a plain `ssh node1` inside the cluster (DIR/bin/ssh from outside: from the head host, as from a login node)
logs in by key and checks the host key (StrictHostKeyChecking yes).

OpenPBS comes from an existing /opt/pbs, else the shared .deb (apt-get installs its Depends), else it is built
from the shared source tarball; see :func:`install`. Needs root.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...core.errors import DevClusterError
from . import netns as net_mod

PBS_EXEC = Path("/opt/pbs")
# Where the .deb and the source tarball are looked for: SLURMLAUNCH_OPENPBS_DIR, else shared/openpbs beside a
# checkout of this project (where its CI and developers keep them; a fixed path would hold on one machine only).
SOURCE_DIR_VAR = "SLURMLAUNCH_OPENPBS_DIR"
SOURCE_DIR = Path(__file__).resolve().parents[4] / "shared" / "openpbs"
DEB = "openpbs_23.06.06-cd7ab5e_amd64.deb"
TARBALL = "openpbs-cd7ab5e.tar.gz"
# The packages ./configure and make need (Debian 12), as in the shared directory's README.
BUILD_PACKAGES = ("gcc", "g++", "make", "pkg-config", "libtool", "autoconf", "automake", "libhwloc-dev",
                  "libx11-dev", "libxt-dev", "libedit-dev", "libical-dev", "libncurses-dev", "perl", "postgresql",
                  "postgresql-server-dev-all", "python3-dev", "tcl-dev", "tk-dev", "swig", "libexpat1-dev",
                  "libssl-dev", "libxext-dev", "libxft-dev", "libcjson-dev", "expat", "sudo")
HEAD = "head"
MARKER = "pbs-cluster.json"  # {"nodes": N}: this DIR holds a PBS dev cluster (down/status find it by this)
CLIENTS = ("qsub", "qstat", "qdel", "qalter", "qhold", "qrls", "qrerun", "qsig", "qmgr", "qselect", "qmove",
           "qrun", "pbsnodes", "tracejob", "printjob", "pbsdsh", "pbs_tmrsh", "pbs_rstat", "pbs_rsub")
SSHD = Path("/usr/sbin/sshd")
QUIET_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def is_pbs(root: Path) -> bool:
    """Whether the dev cluster in ``root`` (up, or down with its files kept) is a PBS one."""
    try:
        return (root / MARKER).exists()
    except OSError:  # a name too long for the file system: no cluster there (the Slurm path says so)
        return False


def installed() -> bool:
    return (PBS_EXEC / "sbin" / "pbs_server").exists() and (PBS_EXEC / "bin" / "qsub").exists()


def missing_requirements() -> str | None:
    """Why a PBS dev cluster cannot be started here (before any install), or None."""
    if os.geteuid() != 0:
        return "the PBS dev cluster needs root (network namespaces, bind mounts, PBS's daemons)"
    for tool in ("ip", "nsenter", "unshare", "mount"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} not found (apt-get install iproute2 util-linux mount)"
    return None


def _source_dir() -> Path:
    return Path(os.environ.get(SOURCE_DIR_VAR) or SOURCE_DIR)


def _run(argv: list[str], what: str, timeout: float, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise DevClusterError(f"{what}: `{shlex.join(argv)}` did not finish within {timeout:.0f}s") from None
    if r.returncode != 0:
        raise DevClusterError(f"{what}: `{shlex.join(argv)}` failed (exit {r.returncode}): "
                              f"{(r.stdout + r.stderr).strip()[-1500:]}")
    return r.stdout


def _apt_install(packages: list[str], what: str) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    deadline = time.monotonic() + 600
    while True:  # another apt may hold the lock for a while: retry, bounded
        r = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
                           capture_output=True, text=True, env=env, timeout=900)
        if r.returncode == 0:
            return
        if "lock" not in r.stderr or time.monotonic() > deadline:
            raise DevClusterError(f"{what}: apt-get install {' '.join(packages)} failed (exit {r.returncode}): "
                                  f"{r.stderr.strip()[-1000:]}")
        time.sleep(5)


def install(log: Path | None = None) -> str:
    """Make /opt/pbs usable: keep an existing one, else install the shared .deb (its Depends from apt), else
    build the shared source tarball (about 7 minutes on 2 cores); then PBS's own post-install step once (it
    writes /etc/pbs.conf, /etc/init.d/pbs and /var/spool/pbs, which the hosts' own copies are bound over).
    Returns one line saying which and how long it took. Reads SLURMLAUNCH_OPENPBS_DIR (the directory with
    the .deb and the tarball; default shared/openpbs beside the checkout)."""
    t0 = time.monotonic()
    how = "an existing /opt/pbs"
    if not installed():
        src = _source_dir()
        if (src / DEB).exists():
            _apt_install([str(src / DEB)], "installing OpenPBS")  # apt resolves the .deb's Depends
            how = f"the .deb {src / DEB}"
        elif (src / TARBALL).exists():
            _build(src / TARBALL)
            how = f"a build of {src / TARBALL}"
        else:
            raise DevClusterError(f"OpenPBS is not installed (no {PBS_EXEC}/sbin/pbs_server) and neither {DEB} nor "
                                  f"{TARBALL} is in {src} (set {SOURCE_DIR_VAR} to the directory that has them)")
    prepare()
    return f"OpenPBS from {how} ({time.monotonic() - t0:.1f} s)"


def prepare() -> None:
    """PBS's own post-install step, once: /etc/pbs.conf and /var/spool/pbs (which every host of a cluster
    has its own copy of bound over) and /etc/init.d/pbs; pbs_iff and pbs_rcp set-uid root (clients
    authenticate through pbs_iff's reserved port)."""
    if not Path("/etc/pbs.conf").exists() or not Path("/var/spool/pbs").is_dir():
        _run([str(PBS_EXEC / "libexec" / "pbs_postinstall"), "server"], "OpenPBS post-install", 300)
    for tool in ("pbs_iff", "pbs_rcp"):
        (PBS_EXEC / "sbin" / tool).chmod(0o4755)


def _build(tarball: Path) -> None:
    """The shared source built as its README says (PYTHON named: else configure takes the first python on
    PATH, a virtual environment's, and bakes its rpath in) and installed under /opt/pbs."""
    _apt_install(list(BUILD_PACKAGES), "installing OpenPBS's build packages")
    work = Path("/var/tmp/slurmlaunch-openpbs-build")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _run(["tar", "-xzf", str(tarball), "-C", str(work), "--strip-components=1"], "unpacking OpenPBS", 300)
    env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin")
    for argv, limit in ((["./autogen.sh"], 600), (["./configure", "--prefix=/opt/pbs", "PYTHON=/usr/bin/python3"], 900),
                        (["make", f"-j{os.cpu_count() or 2}"], 3600), (["make", "install"], 900)):
        _run(argv, "building OpenPBS", limit, env=env, cwd=work)
    shutil.rmtree(work, ignore_errors=True)


# ---- the hosts ----

def host_dir(root: Path, host: str) -> Path:
    return root / "pbs" / host


def hosts(nodes: int) -> list[str]:
    return [HEAD, *(f"node{i}" for i in range(1, nodes + 1))]


def _pid(root: Path, host: str) -> int | None:
    """The pid of the process that holds ``host``'s namespaces, when it is alive."""
    try:
        pid = int((host_dir(root, host) / "host.pid").read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def enter(root: Path, host: str) -> list[str]:
    """The prefix that runs a command on ``host``: its network, mount and UTS namespaces."""
    pid = _pid(root, host)
    if pid is None:
        raise DevClusterError(f"PBS dev cluster host {host} of {root} is not running")
    return ["nsenter", "-t", str(pid), "-n", "-m", "-u", "--"]


def _conf(host: str) -> str:
    head = host == HEAD
    return "".join(f"{k}={v}\n" for k, v in [
        ("PBS_EXEC", str(PBS_EXEC)), ("PBS_SERVER", HEAD), ("PBS_START_SERVER", int(head)),
        ("PBS_START_SCHED", int(head)), ("PBS_START_COMM", int(head)), ("PBS_START_MOM", int(not head)),
        ("PBS_HOME", "/var/spool/pbs"), ("PBS_CORE_LIMIT", "unlimited"), ("PBS_SCP", "/usr/bin/scp"),
        ("PBS_TMPDIR", "/var/spool/pbs/tmp")])  # not the machine's /var/tmp, which every host shares


def _start_host(root: Path, host: str, ns: str, timeout: float) -> None:
    """The process that holds ``host``'s namespaces: its name, and the cluster's files bound over the paths PBS
    reads, and its own /run/postgresql: the datastore's socket is there, named by its port, the same on every
    head host (without it, the machine's directory holds it and a second cluster's datastore fails to start).
    /usr/bin/systemctl is /bin/false there: PBS's init script asks systemd whether PBS is registered and, if
    so, may think the machine is booting and start the daemons in the background."""
    d = host_dir(root, host)
    (d / "spool" / "tmp").mkdir(parents=True, exist_ok=True)
    (d / "spool" / "tmp").chmod(0o1777)
    (d / "pbs.conf").write_text(_conf(host))
    (d / "pgrun").mkdir(exist_ok=True)
    Path("/run/postgresql").mkdir(mode=0o2775, exist_ok=True)  # where Debian's PostgreSQL puts sockets
    shutil.chown(d / "pgrun", "postgres", "postgres")
    binds = [(root / "hosts", "/etc/hosts"), (d / "spool", "/var/spool/pbs"), (d / "pbs.conf", "/etc/pbs.conf"),
             (d / "pgrun", "/run/postgresql")]
    if (root / "ssh" / "ssh_config").exists() and Path("/etc/ssh/ssh_config").exists():
        binds.append((root / "ssh" / "ssh_config", "/etc/ssh/ssh_config"))
    systemctl = shutil.which("systemctl")
    if systemctl:
        binds.append((Path("/bin/false"), systemctl))
    script = (f"hostname {host} && "
              + " && ".join(f"mount --bind {shlex.quote(str(a))} {shlex.quote(b)}" for a, b in binds)
              + f" && echo $$ > {shlex.quote(str(d / 'host.pid'))} && exec sleep infinity")
    # setsid --fork: not our child, so that once stopped it is gone rather than a zombie `down` waits on
    with open(d / "host.log", "w") as log:
        subprocess.run(["setsid", "--fork", "nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--uts",
                        "--propagation", "private", "--", "sh", "-c", script], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=log, env=QUIET_ENV, check=True, timeout=timeout)
    deadline = time.monotonic() + timeout
    while _pid(root, host) is None:
        if time.monotonic() > deadline:
            raise DevClusterError(f"PBS host {host} did not start within {timeout:.0f}s: "
                                  f"{(d / 'host.log').read_text(errors='replace').strip()}")
        time.sleep(0.05)


def _ssh_keys(root: Path, names: list[str], timeout: float) -> None:
    """DIR/ssh: one host key (every host's) and one user key, the client configuration that uses them."""
    d = root / "ssh"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(mode=0o700)
    for key in ("host_ed25519", "user_ed25519"):
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"slurmlaunch-pbs-{key}", "-f", str(d / key)],
             "making the PBS dev cluster's ssh keys", timeout)
    shutil.copyfile(d / "user_ed25519.pub", d / "authorized_keys")
    kind, key = (d / "host_ed25519.pub").read_text().split()[:2]
    (d / "known_hosts").write_text(f"{','.join(names)} {kind} {key}\n")
    (d / "ssh_config").write_text(f"Host *\n    IdentityFile {d / 'user_ed25519'}\n"
                                  f"    UserKnownHostsFile {d / 'known_hosts'}\n    StrictHostKeyChecking yes\n"
                                  "    BatchMode yes\n")


def start_sshd(root: Path, host: str, timeout: float = 30.0) -> None:
    """An sshd on execution host ``host``'s address, port 22 (its own network namespace), by key only; it
    daemonises (its pid in DIR/ssh/sshd-HOST.pid), and `down` stops it with the rest of the host's processes."""
    net = net_mod.load_network(root)
    if net is None or not host.removeprefix("node").isdigit():
        raise DevClusterError(f"no execution host {host} in the PBS dev cluster of {root}")
    addr = net.node_addr(int(host.removeprefix("node")))
    d = root / "ssh"
    (d / f"sshd-{host}.conf").write_text("".join(f"{line}\n" for line in [
        "Port 22", f"ListenAddress {addr}", f"HostKey {d / 'host_ed25519'}", f"PidFile {d / f'sshd-{host}.pid'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}", "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        # DIR is often under /tmp (world-writable, sticky): StrictModes would refuse the keys there
        "StrictModes no", "MaxStartups 100:30:200", "MaxSessions 100",
        # a command's bash would source the machine's /root/.bashrc (whoever's it is) at SHLVL < 2
        "SetEnv SHLVL=1"]))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # the privilege separation directory sshd requires
    _in(root, host, [str(SSHD), "-f", str(d / f"sshd-{host}.conf"), "-E", str(d / f"sshd-{host}.log")],
        f"starting sshd on {host}", timeout)


def _in(root: Path, host: str, argv: list[str], what: str, timeout: float) -> str:
    return _run([*enter(root, host), *argv], what, timeout, env=QUIET_ENV)


def _qmgr(root: Path, command: str, timeout: float) -> None:
    _in(root, HEAD, [str(PBS_EXEC / "bin" / "qmgr"), "-c", command], "configuring the PBS server", timeout)


# Server settings: root may run jobs (the tests run as root), finished jobs stay visible to qstat -x, and the
# scheduler runs every few seconds as well as on every event.
# The MoMs' job sampling interval, its first and its longest (mom_priv/config, see up())
MOM_POLL_S = (1, 3)
SERVER_SETTINGS = ("set server acl_roots = root", "set server job_history_enable = True",
                   "set server flatuid = True", "set server scheduler_iteration = 5")


def _add_ngpus(root: Path, timeout: float) -> None:
    """OpenPBS has no GPU resource of its own: sites create `ngpus` and have the scheduler count it (its
    sched_config `resources:` line, re-read on SIGHUP)."""
    _qmgr(root, "create resource ngpus type=long, flag=nh", timeout)
    config = host_dir(root, HEAD) / "spool" / "sched_priv" / "sched_config"
    lines = config.read_text().splitlines(keepends=True)
    lines = [ln.replace('"\n', ', ngpus"\n') if ln.startswith("resources:") else ln for ln in lines]
    config.write_text("".join(lines))
    pid = int((config.parent / "sched.lock").read_text().split()[0])
    os.kill(pid, signal.SIGHUP)


def up(root: Path, nodes: int = 3, cpus: int = 8, gpus: int = 0, timeout: float = 120.0) -> dict[str, str]:
    """Start the head host (comm, datastore, server, scheduler) and ``nodes`` execution hosts (one MoM
    each) on a private network; return the variables a client needs (PATH with DIR/bin first). OpenPBS must
    be installed (:func:`install`). After a failure, `down(root)` removes what was started and made."""
    why = missing_requirements() or (None if installed() else f"OpenPBS is not installed in {PBS_EXEC}")
    if why:
        raise DevClusterError(why)
    prepare()
    root = root.resolve()
    shutil.rmtree(root / "pbs", ignore_errors=True)  # a fresh server: no jobs or nodes of an earlier cluster
    (root / "log").mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text(json.dumps({"nodes": nodes}) + "\n")
    net = net_mod.make_network(root, nodes)
    names = hosts(nodes)
    (root / "hosts").write_text(
        f"127.0.0.1 localhost\n{net.hub_addr} {HEAD}\n"
        + "".join(f"{net.node_addr(i)} node{i}\n" for i in range(1, nodes + 1)) + "::1 localhost ip6-localhost\n")
    for ns in net.namespaces:
        shutil.copyfile(root / "hosts", f"/etc/netns/{ns}/hosts")
    if SSHD.exists():
        _ssh_keys(root, names, timeout)
    for host, ns in zip(names, net.namespaces, strict=True):
        _start_host(root, host, ns, timeout)
    for host in names:  # PBS_HOME's tree, as PBS's installer makes it; its own pbs.conf is thrown away
        kind = "server" if host == HEAD else "execution"
        _in(root, host, ["env", f"PBS_CONF_FILE={host_dir(root, host)}/postinstall.conf",
                         str(PBS_EXEC / "libexec" / "pbs_postinstall"), kind], f"PBS_HOME of {host}", timeout)
    for i in range(1, nodes + 1):
        # $usecp: every host sees the same file system, so output files are copied, never sent by scp.
        # $min/max_check_poll: how often the MoM samples its jobs, which is when it finds one past its
        # walltime; by default every 10 s after a job starts, then 6 s later each time up to 120 s (a 10 s
        # walltime was enforced at about 26 s). A dev cluster runs short jobs: every 1-3 s.
        (host_dir(root, f"node{i}") / "spool" / "mom_priv" / "config").write_text(
            f"$clienthost {HEAD}\n$usecp *:/ /\n$logevent 0x1ff\n$min_check_poll {MOM_POLL_S[0]}\n"
            f"$max_check_poll {MOM_POLL_S[1]}\n")
    init = str(PBS_EXEC / "libexec" / "pbs_init.d")
    _start_head(root, init, max(timeout, 180))
    _wait_server(root, timeout)
    for setting in SERVER_SETTINGS:
        _qmgr(root, setting, timeout)
    if gpus:
        _add_ngpus(root, timeout)
    for i in range(1, nodes + 1):
        _in(root, f"node{i}", [init, "start"], f"starting the MoM of node{i}", timeout)
        _qmgr(root, f"create node node{i}", timeout)
        _qmgr(root, f"set node node{i} resources_available.ncpus = {cpus}", timeout)
        if gpus:
            _qmgr(root, f"set node node{i} resources_available.ngpus = {gpus}", timeout)
    if SSHD.exists():
        for i in range(1, nodes + 1):
            start_sshd(root, f"node{i}", timeout)
    _write_clients(root, net)
    _wait_free(root, nodes, timeout)
    return {"PATH": f"{root}/bin:{os.environ.get('PATH', os.defpath)}"}


# pbs_db_utility's known race on a busy machine: it takes `pg_ctl status` for PostgreSQL being ready, then
# runs createdb before the socket exists. It then stops the datastore and removes its directory itself, so
# the head host's start can simply be tried again.
DATASTORE_RACE = "Error creating PBS datastore"
HEAD_START_TRIES = 3


def _start_head(root: Path, init: str, timeout: float) -> None:
    """`pbs_init.d start` on the head host, tried again (HEAD_START_TRIES in all) only after the datastore's
    start race; any other failure is said at once."""
    for attempt in range(1, HEAD_START_TRIES + 1):
        try:
            _in(root, HEAD, [init, "start"], "starting the PBS head host", timeout)
            return
        except DevClusterError as e:
            if DATASTORE_RACE not in str(e) or attempt == HEAD_START_TRIES:
                if attempt > 1:
                    raise DevClusterError(f"{e} (try {attempt} of {HEAD_START_TRIES}; the earlier ones met "
                                          "PostgreSQL not yet listening)") from None
                raise
            sys.stderr.write(f"slurmlaunch dev-cluster: PBS's datastore was not listening in time when its "
                             f"database was created (a busy machine); starting the head host again "
                             f"({attempt + 1} of {HEAD_START_TRIES})\n")


# What PBS's clients say while pbs_server is not listening (yet): "Connection refused", then this
SERVER_DOWN = "cannot connect to server"


def _wait_server(root: Path, timeout: float) -> None:
    """Wait (``timeout`` seconds at most) until the head host's pbs_server answers a client. `pbs_init.d start`
    returns once the daemons are started, and on a busy machine pbs_server was still initializing then: the
    first qmgr's connection was refused. Any other failure is said at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _in(root, HEAD, [str(PBS_EXEC / "bin" / "qstat"), "-B"], "asking the PBS server", timeout)
            return
        except DevClusterError as e:
            if SERVER_DOWN not in str(e):
                raise
            if time.monotonic() > deadline:
                raise DevClusterError(f"the PBS server on {HEAD} did not accept a connection within {timeout:.0f}s "
                                      f"of its start: {e}") from None
        time.sleep(0.3)


def node_states(root: Path, timeout: float = 30.0) -> dict[str, str]:
    """Every node's state as `pbsnodes -a -F json` says it."""
    out = _in(root, HEAD, [str(PBS_EXEC / "bin" / "pbsnodes"), "-a", "-F", "json"], "pbsnodes", timeout)
    return {name: str(n.get("state", "")) for name, n in json.loads(out).get("nodes", {}).items()}


def _wait_free(root: Path, nodes: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        states = node_states(root)
        if len(states) == nodes and all(s == "free" for s in states.values()):
            return
        if time.monotonic() > deadline:
            raise DevClusterError(f"PBS nodes not free within {timeout:.0f}s: {states}")
        time.sleep(0.3)


def _write_clients(root: Path, net: net_mod.Network) -> None:
    """DIR/bin: PBS's commands entering the head host from outside the cluster (in the directory they were
    called from), and running where they are inside it; in-cluster runs any command on the head host."""
    bindir = root / "bin"
    bindir.mkdir(exist_ok=True)
    ip = net_mod._tool("ip")
    pidfile = shlex.quote(str(host_dir(root, HEAD) / "host.pid"))
    for name in (*CLIENTS, "in-cluster", "ssh"):
        real = {"in-cluster": "", "ssh": shutil.which("ssh") or "/usr/bin/ssh"}.get(name, str(PBS_EXEC / "bin" / name))
        if real and not Path(real).exists():
            continue
        run = f'{real} "$@"' if real else '"$@"'
        (bindir / name).write_text(
            "#!/bin/sh\n"
            f"# {name} for the PBS dev cluster in {root}: outside its namespaces, enter its head host\n"
            f'case "$({ip} netns identify $$ 2>/dev/null)" in\n'
            f"    {net.prefix}-*) exec {run} ;;\n"
            "esac\n"
            f"pid=$(cat {pidfile} 2>/dev/null) || {{ echo \"{name}: the PBS dev cluster in {root} is down\" >&2; "
            "exit 1; }\n"
            f'exec nsenter -t "$pid" -n -m -u -- /bin/sh -c \'cd "$1" 2>/dev/null; shift; exec "$@"\' sh "$PWD" '
            f"{run}\n")
        (bindir / name).chmod(0o755)


def down(root: Path, timeout: float = 10.0) -> None:
    """Stop every process of the cluster (the hosts' holders, PBS's daemons, the datastore, jobs: all live in
    the cluster's network namespaces) and remove what the record says was made (netns.remove_network)."""
    net_mod.remove_network(root.resolve(), timeout)
    for host in hosts(_nodes(root)):
        (host_dir(root, host) / "host.pid").unlink(missing_ok=True)
    (root / MARKER).unlink(missing_ok=True)


def _nodes(root: Path) -> int:
    try:
        return int(json.loads((root / MARKER).read_text())["nodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def cmd(action: str, root: Path, nodes: int, cpus: int, gpus: int) -> int:
    """`slurmlaunch dev-cluster ... --scheduler pbs` (and down/status of a PBS one)."""
    if action == "up":
        why = missing_requirements()
        if why:
            raise DevClusterError(f"dev-cluster: {why}")
        if (root / net_mod.LEDGER).exists() or (root / "slurmctld.pid").exists():
            raise DevClusterError(f"dev-cluster: one is already up in {root} "
                                  f"(slurmlaunch dev-cluster down --dir {root})")
        sys.stderr.write(install() + "\n")
        t0 = time.monotonic()
        try:
            env = up(root, nodes, cpus, gpus)
        except (DevClusterError, subprocess.CalledProcessError) as e:
            try:
                down(root)
            except DevClusterError as left:
                e = DevClusterError(f"{e}; {left}")
            raise DevClusterError(f"dev-cluster: did not come up: {e} (logs in {root}/pbs/HOST/spool)") from None
        sys.stderr.write(f"PBS dev cluster up in {time.monotonic() - t0:.1f} s\n")
        assert env["PATH"].startswith(f"{root.resolve()}/bin:")
        print(f'export PATH="{root.resolve()}/bin:$PATH"')  # the shell's own PATH at the time of export
        return 0
    if action == "down":
        try:
            down(root)
        except DevClusterError as e:
            raise DevClusterError(f"dev-cluster: {e} (see {root}/{net_mod.LEDGER})") from None
        return 0
    net = net_mod.load_network(root)
    if net is None or _pid(root, HEAD) is None:
        sys.stderr.write(f"slurmlaunch: PBS dev cluster in {root} is down: its head host is not running "
                         f"(slurmlaunch dev-cluster up --scheduler pbs --dir {root} starts one)\n")
        return 1
    print(f"network {net.subnet}: head {net.hub_addr} in namespace {net.hub}, "
          + ", ".join(f"node{i} {net.node_addr(i)}" for i in range(1, net.nodes + 1))
          + f"; run commands inside with {root}/bin/in-cluster CMD", flush=True)
    return subprocess.run([*enter(root, HEAD), str(PBS_EXEC / "bin" / "pbsnodes"), "-aS"]).returncode
