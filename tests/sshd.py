"""A real OpenSSH server for the tests (Debian's openssh-server, not the system service) and a "laptop".

The server listens on 127.0.0.1 on a free port, with a host key and a user key generated into a private
temporary directory, root login by key only, its own pid file; it is stopped through that pid. The laptop is
an environment with its own HOME, a ~/.ssh/config alias ``login`` that checks the generated host key
(StrictHostKeyChecking yes, never disabled), and a PATH that has python, ssh, rsync and the basics only: no
Slurm command, so anything Slurm must happen on the far side of ssh.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests import ports

SSHD = "/usr/sbin/sshd"
# What the laptop's PATH holds: enough for ssh, rsync and a shell, and nothing of Slurm's.
LAPTOP_TOOLS = ("rsync", "ssh-keygen", "sh", "bash", "env", "cat", "ls", "mkdir", "rm", "printf", "true", "false")


def missing() -> str | None:
    """Why the real-sshd tests cannot run here, or None."""
    for tool in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen"), shutil.which("rsync")):
        if not tool or not os.access(tool, os.X_OK):
            return "openssh-server, openssh-client and rsync are needed (tests/run.sh installs them)"
    if os.geteuid() != 0:
        return "the test sshd logs in as root (its only user with a home here): run the tests as root"
    return None


def ipv6_loopback() -> bool:
    """Whether ::1 can be listened on here."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@dataclass
class Sshd:
    root: Path  # private (0700): keys, config, pid file, log
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    extra_config: list[str] = field(default_factory=list)

    @property
    def user_key(self) -> Path:
        return self.root / "user_ed25519"

    @property
    def log(self) -> str:
        try:
            return (self.root / "sshd.log").read_text(errors="replace")
        except OSError:
            return ""

    def _config(self) -> str:
        return "\n".join([
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            *(["ListenAddress ::1"] if ipv6_loopback() else []),  # for the IPv6 destination's test
            f"HostKey {self.root / 'host_ed25519'}",
            f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # The key files live under /tmp, which is world-writable (sticky): StrictModes would refuse them.
            "StrictModes no",
            "LogLevel VERBOSE",
            "MaxSessions 50",
            "MaxStartups 50:30:100",
            # bash sources ~/.bashrc for a command sshd runs when it is the top-level shell (SHLVL < 2): this
            # machine's /root/.bashrc belongs to whoever uses the machine (here it rehashes pyenv under a
            # lock, which a test that cuts connections would leave behind). The test's login node starts
            # with sshd's own environment, and what a test needs it says with --remote-setup.
            "SetEnv SHLVL=1",
            # A laptop's `SetEnv BASH_ENV=FILE` makes the login node's non-interactive bash read FILE first:
            # the tests' stand-in for a user's dotfiles (a chatty ~/.bashrc, a tcsh login shell), which this
            # machine's /root must not be given.
            "AcceptEnv BASH_ENV",
            *self.extra_config,
        ]) + "\n"

    def start(self, timeout: float = 20.0) -> None:
        """Start the listener (again, after stop(): same port, keys and config); wait until it accepts."""
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # the privilege separation directory sshd requires
        for _attempt in range(5):
            if not self.port or self.proc is None:
                self.port = self.port or ports.port()
            (self.root / "sshd_config").write_text(self._config())
            log = open(self.root / "sshd.log", "ab")
            # -D: no daemon (we hold its pid), -e: log to the file, not syslog.
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
            log.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
                time.sleep(0.05)
            self.stop()
            if "Address already in use" in self.log:
                self.port = ports.port()  # taken by a process of this test run's that outlived its test: another
                continue
            raise RuntimeError(f"sshd did not start on 127.0.0.1:{self.port}:\n{self.log[-3000:]}")
        raise RuntimeError(f"sshd found no free port:\n{self.log[-3000:]}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the listener through its pid (sessions already open are its children and stay)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout)
        self.proc = None


    def drop(self) -> None:
        """A network drop as the laptop sees it: the listener stops and every connection it accepted is cut
        (its per-connection sshd processes, descendants of the listener we started, are killed by pid)."""
        if self.proc is None:
            return
        children = _descendants(self.proc.pid)
        self.stop()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """Pids of the processes below ``root`` (from /proc: parent links)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        kids = [child for child, parent in parents.items() if parent == pid]
        found.extend(kids)
        frontier.extend(kids)
    return found


def keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=30)


def start_sshd(extra_config: list[str] | None = None) -> Sshd:
    root = Path(tempfile.mkdtemp(prefix="slurmlaunch-sshd-"))  # mkdtemp: 0700
    keygen(root / "host_ed25519", "test-host")
    keygen(root / "user_ed25519", "laptop-user")
    shutil.copy(root / "user_ed25519.pub", root / "authorized_keys")
    server = Sshd(root, extra_config=list(extra_config or []))
    server.start()
    return server


def known_hosts_line(server: Sshd, alias_port: int | None = None) -> str:
    kind, key = (server.root / "host_ed25519.pub").read_text().split()[:2]
    return f"[127.0.0.1]:{alias_port or server.port} {kind} {key}\n"


@dataclass(frozen=True)
class Laptop:
    home: Path
    bin: Path
    env: dict[str, str]  # the environment a laptop command runs in

    @property
    def ssh_dir(self) -> Path:
        return self.home / ".ssh"


def make_laptop(server: Sshd, where: Path, python: str = sys.executable) -> Laptop:
    """A HOME with ~/.ssh (config alias ``login``, the user key, the host key known) and a PATH without Slurm."""
    home = where / "laptop-home"
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True, mode=0o700)
    shutil.copy(server.user_key, ssh_dir / "id_ed25519")
    (ssh_dir / "id_ed25519").chmod(0o600)
    (ssh_dir / "known_hosts").write_text(known_hosts_line(server))
    (ssh_dir / "config").write_text(
        "Host login\n"
        "    HostName 127.0.0.1\n"
        f"    Port {server.port}\n"
        "    User root\n"
        f"    IdentityFile {ssh_dir / 'id_ed25519'}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {ssh_dir / 'known_hosts'}\n"
        "    StrictHostKeyChecking yes\n"
    )
    (ssh_dir / "config").chmod(0o600)
    bin_dir = where / "laptop-bin"
    bin_dir.mkdir()
    for tool in LAPTOP_TOOLS:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    # OpenSSH reads ~/.ssh/config from the passwd entry's home, never from $HOME: the laptop's ssh is the
    # real client told to read the laptop's file (what a user's own ~/.ssh/config is to them).
    (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F \"$HOME/.ssh/config\" \"$@\"\n")
    (bin_dir / "ssh").chmod(0o755)
    # python: this interpreter (its venv holds slurmlaunch), through a wrapper: a symlinked venv python may not
    # find its pyvenv.cfg.
    for name in ("python", "python3"):
        (bin_dir / name).write_text(f"#!/bin/sh\nexec {python} \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SSH_"))}
    env.update(HOME=str(home), PATH=str(bin_dir), XDG_STATE_HOME=str(home / ".local/state"),
               XDG_CONFIG_HOME=str(home / ".config"))
    env.pop("SLURMLAUNCH_ALLOW_LOOPBACK", None)
    return Laptop(home, bin_dir, env)


def remove(server: Sshd) -> None:
    server.stop()
    shutil.rmtree(server.root, ignore_errors=True)


# -- what the remote tests share (the laptop's commands, what is left behind, the cluster's reach) --

def on_laptop(lap: Laptop, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmlaunch", *args], capture_output=True, text=True,
                          env=lap.env, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)


def processes_naming(text: str) -> list[str]:
    """Command lines of the running processes that name ``text`` (ssh masters name their control path)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


def masters_left(lap: Laptop) -> list[str]:
    """ssh processes left behind by the laptop (their command line names its ssh config)."""
    return [args for args in processes_naming(str(lap.ssh_dir)) if "ssh" in args]


def free_master_port() -> str:
    """A port free now below the ephemeral range: on this shared machine the port derived from job id 1 may
    be another test cluster's rank 0's."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return str(port)
    raise AssertionError("no free port in 20000-32000")


def setup_for(cluster_env: dict[str, str]) -> list[str]:
    """What makes the dev cluster reachable on its login node (a site would say `module load slurm`), and a
    free MASTER_PORT."""
    return ["--remote-setup", f"export SLURM_CONF={shlex.quote(cluster_env['SLURM_CONF'])}",
            "--remote-setup", "export SLURMLAUNCH_ALLOW_LOOPBACK=1", "--master-port", free_master_port()]


def python_without_slurmlaunch(where: Path) -> str:
    """A "training environment" on the cluster: a fresh venv that sees this venv's packages (torch) through
    a .pth line, but not slurmlaunch (the editable install's own .pth is not read from a path a .pth adds)."""
    env_dir = where / "training-env"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "training.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([str(python), "-c", "import torch, slurmlaunch"], capture_output=True, text=True,
                           cwd=where, env=env, timeout=120)
    assert probe.returncode != 0 and "No module named 'slurmlaunch'" in probe.stderr, probe.stderr
    return str(python)


def login_bin(where: Path, stand_ins: dict[str, str], basics: tuple[str, ...] = ("mkdir",)) -> Path:
    """A directory to be the login node's whole PATH (``--remote-setup 'export PATH=DIR'``): the given stand-in
    commands (Python source, run by this interpreter) and links to a few real basics; nothing of Slurm's."""
    bin_dir = where / "login-bin"
    bin_dir.mkdir()
    for name, source in stand_ins.items():
        (bin_dir / name).write_text(f"#!{sys.executable}\n{source}")
        (bin_dir / name).chmod(0o755)
    for tool in basics:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return bin_dir
