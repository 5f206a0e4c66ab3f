"""Submitting from a laptop: an ssh destination, one multiplexed connection to it, rsync of the project.

Standard library only. Everything goes through the system OpenSSH client, so ~/.ssh/config (aliases,
ProxyJump, agents, certificates, Kerberos) works as it does for the user's own `ssh`; slurmlaunch handles no
password and never turns host key checking off.

Shells. sshd runs a remote command with the user's login shell as ``$SHELL -c COMMAND``: a non-login,
non-interactive shell (bash reads ~/.bashrc there, nothing reads /etc/profile or ~/.profile). slurmlaunch does
not add ``bash -l``: what a site needs (``module load slurm``, ``source /etc/profile``, a PATH) is said
explicitly with --remote-setup lines, which run, in order, in front of every remote command; the first that
fails stops the command. The login shell must read POSIX quoting (sh, bash, zsh, ksh; not csh or fish).

Strings are data: every argument of a remote command is quoted with shlex.quote, so the remote shell sees
each as one word, byte for byte; only --remote-setup lines are shell code on purpose.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.errors import SchedulerError, SpecError

DEFAULT_PARENT = "slurmlaunch-projects"  # a project without a :DIR goes to ~/slurmlaunch-projects/<its name>
CONTROL_PERSIST_S = 60  # a master left by a crash goes away on its own after this long idle
CONNECT_TIMEOUT_S = 20
COMMAND_TIMEOUT_S = 120.0
DEFAULT_SYNC_LIMIT = 1 << 30
SHIPPED_DIR = ".slurmlaunch"  # in the remote project directory: the slurmlaunch package this laptop sent

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.$-]*")
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.%+-]*")  # a name, an address or a ~/.ssh/config alias
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?")


class RemoteError(SchedulerError):
    """ssh or rsync failed (no connection, a refused key, an unknown host key), or a remote command did.
    A SchedulerError: a follower keeps trying for a while before it gives up on one."""


@dataclass(frozen=True)
class Destination:
    """``[user@]host[:dir]``: ``dir`` relative to the remote home, absolute, or None (the default)."""

    host: str
    user: str | None = None
    directory: str | None = None

    @property
    def target(self) -> str:
        """What ssh and rsync are given as the host."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        where = f":{self.directory}" if self.directory is not None else ""
        return (f"{self.user}@" if self.user else "") + host + where


def parse_destination(text: str) -> Destination:
    """Parse --remote's ``[user@]host[:dir]`` (an IPv6 address in brackets); SpecError, naming the value, for
    anything ssh could read as an option or the shell as more than a name."""
    def bad(why: str) -> SpecError:
        return SpecError(f"--remote {text!r}: {why} (expected [user@]host[:dir], e.g. login or "
                         f"me@cluster.example.org:work/proj)")

    if not text:
        raise bad("empty")
    if any(not c.isprintable() for c in text):
        raise bad("contains a control character")
    user: str | None = None
    rest = text
    at = text.find("@")
    colon = text.find(":")
    if at != -1 and (colon == -1 or at < colon) and not text.startswith("["):
        user, rest = text[:at], text[at + 1:]
        if not _USER.fullmatch(user):
            raise bad(f"user {user!r} is not a user name")
    if rest.startswith("["):
        end = rest.find("]")
        if end == -1:
            raise bad("an opening [ without its ]")
        host, after = rest[1:end], rest[end + 1:]
        if not host or not _IPV6.fullmatch(host):
            raise bad(f"{host!r} in brackets is not an IPv6 address")
        if after and not after.startswith(":"):
            raise bad(f"{after!r} after the address (a directory follows a ':')")
        directory = after[1:] if after else None
    else:
        host, sep, directory_part = rest.partition(":")
        directory = directory_part if sep else None
        if not host:
            raise bad("no host")
        if not _HOST.fullmatch(host):
            raise bad(f"host {host!r} is not a host name, address or ~/.ssh/config alias"
                      + (" (it would read as an ssh option)" if host.startswith("-") else ""))
    if directory is not None:
        if directory.startswith("~/"):
            directory = directory[2:]  # relative to the home is what a relative directory means here
        if directory in ("", "~"):
            directory = None
        elif "\n" in directory or "\0" in directory:
            raise bad("the directory contains a newline")
    return Destination(host, user, directory)


def remote_command(argv: Sequence[str], setup: Sequence[str] = ()) -> str:
    """The command line the remote login shell runs: the --remote-setup lines (shell code, each must
    succeed), then ``argv`` with every word quoted, so that no byte of it is read by the shell."""
    body = shlex.join(argv)
    if not setup:
        return body
    lines = "".join(f"{line}\n" for line in setup)
    return f"set -e\n{lines}set +e\n{body}"


def shell_command(script: str, setup: Sequence[str] = ()) -> str:
    """Like remote_command for a short shell snippet of ours (its values already quoted)."""
    if not setup:
        return script
    lines = "".join(f"{line}\n" for line in setup)
    return f"set -e\n{lines}set +e\n{script}"


def _ssh_failure(dest: Destination, stderr: str) -> str | None:
    """One line naming what ssh itself could not do, from its stderr; None when ssh got through."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else "(no output)"
    name = str(dest)
    if "Could not resolve hostname" in text:
        return (f"--remote {name}: host {dest.host!r} cannot be resolved ({last}); check the name, or its Host "
                f"entry in ~/.ssh/config")
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        return (f"--remote {name}: the host key of {dest.host} has CHANGED since it was recorded in known_hosts "
                f"(someone may be in between, or the host was reinstalled); if the change is expected, remove "
                f"the old key with ssh-keygen -R and connect once with plain ssh. slurmlaunch never turns host "
                f"key checking off")
    if "Host key verification failed" in text or re.search(r"No \S+ host key is known", text):
        return (f"--remote {name}: the host key of {dest.host} is not known (not in known_hosts); connect once "
                f"with plain `ssh {dest.target}` to check and record it. slurmlaunch never turns host key "
                f"checking off")
    if "Permission denied" in text:
        return (f"--remote {name}: the server refused the login ({last}); add your key to ssh-agent or name "
                f"it with IdentityFile in ~/.ssh/config (slurmlaunch asks for no password)")
    for words in ("Connection refused", "Connection timed out", "No route to host", "Network is unreachable",
                  "Connection closed", "Connection reset", "Broken pipe", "connect to host",
                  "Control socket connect", "mux_client"):
        if words in text:
            return f"--remote {name}: cannot reach {dest.host} over ssh ({last})"
    return None


def user_control_path(ssh: str, target: str) -> str | None:
    """The ControlPath the user's ssh configuration gives ``target`` (``ssh -G`` prints the resolved
    configuration; nothing is connected), or None: no ControlPath, or an ssh that cannot say."""
    try:
        shown = subprocess.run([ssh, "-G", "--", target], stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=15, text=True, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if shown.returncode != 0:
        return None
    fields = dict(line.partition(" ")[::2] for line in shown.stdout.splitlines())
    path = fields.get("controlpath", "none").strip()
    return None if path.lower() == "none" or not path else path


class Connection:
    """One multiplexed ssh connection to a destination. Use it in a ``with``.

    Where the user's ssh configuration already gives the destination a ControlPath (their own ControlMaster,
    typically with ControlPersist, so that a login with a second factor is asked once a day), that is used as
    it is and never stopped. Otherwise slurmlaunch keeps its own master for this one command
    (ControlMaster=auto, its socket in a private 0700 directory of this process), and leaving the ``with``
    stops it (``ssh -O exit``): no ssh process outlives the command."""

    def __init__(self, dest: Destination, setup: Sequence[str] = (), ssh: str = "ssh",
                 timeout: float = COMMAND_TIMEOUT_S) -> None:
        self.dest = dest
        self.setup = tuple(setup)
        self.ssh = ssh
        self.timeout = timeout
        self.user_master = user_control_path(ssh, dest.target)
        # ours (0700), only when the user has no ControlPath of their own
        self.control_dir = "" if self.user_master else tempfile.mkdtemp(prefix="slurmlaunch-ssh-")

    def options(self) -> list[str]:
        opts = [] if self.user_master else [
            "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C",
            "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
        opts += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "ServerAliveInterval=10",
                 "-o", "ServerAliveCountMax=3"]
        if not (sys.stdin.isatty() and os.isatty(2)):
            # No terminal to answer a prompt on: fail at once instead of waiting for a passphrase.
            opts += ["-o", "BatchMode=yes"]
        return opts

    def rsync_shell(self) -> str:
        """rsync's -e: the same client and the same master."""
        return shlex.join([self.ssh, *self.options()])

    def run(self, command: str, *, input_bytes: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> subprocess.CompletedProcess[bytes]:
        """Run ``command`` (a line for the remote shell: see remote_command) and return its output.
        RemoteError, in one line, when ssh cannot connect or log in, after ``timeout`` seconds, or (with
        ``check``) when the command fails."""
        limit = self.timeout if timeout is None else timeout
        argv = [self.ssh, *self.options(), "-T", "-e", "none", "--", self.dest.target, command]
        try:
            # stderr to a file, not a pipe: a master that ssh forks into the background keeps its copy of
            # the parent's descriptors until ControlPersist ends, and a pipe would not reach EOF before.
            with tempfile.TemporaryFile() as err:
                proc = subprocess.run(argv, input=input_bytes, stdout=subprocess.PIPE, stderr=err,
                                      stdin=None if input_bytes is not None else subprocess.DEVNULL,
                                      timeout=limit)
                err.seek(0)
                stderr = err.read()
        except FileNotFoundError:
            raise RemoteError(f"--remote {self.dest}: {self.ssh!r} is not on PATH (install the OpenSSH "
                              f"client)") from None
        except subprocess.TimeoutExpired:
            raise RemoteError(f"--remote {self.dest}: no answer within {limit:.0f}s from the remote command "
                              f"{shlex.quote(command.splitlines()[-1] if command else command)}") from None
        proc = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, stderr)
        if proc.returncode == 255:
            why = _ssh_failure(self.dest, stderr.decode(errors="replace"))
            if why:
                raise RemoteError(why)
        if check and proc.returncode != 0:
            said = (stderr.decode(errors="replace").strip() or proc.stdout.decode(errors="replace").strip()
                    or "(no output)").replace("\n", " | ")
            raise RemoteError(f"on {self.dest.target}: {command.splitlines()[-1]} failed (exit "
                              f"{proc.returncode}): {said}")
        return proc

    def run_argv(self, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        """Run ``argv`` remotely, each word data (after the --remote-setup lines)."""
        return self.run(remote_command(argv, self.setup), **kwargs)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop our master, if one was started, and remove the socket's directory; the user's own master
        (their ControlPath) is left running, as their configuration asks."""
        if self.user_master:
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if any(os.scandir(self.control_dir)):
                subprocess.run([self.ssh, "-o", f"ControlPath={self.control_dir}/%C", "-O", "exit", "--",
                                self.dest.target], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=15)
        shutil.rmtree(self.control_dir, ignore_errors=True)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve_directory(conn: Connection, directory: str | None, project: str, create: bool) -> str:
    """The absolute remote directory for ``directory`` (relative to the remote home; None: the default for
    ``project``), created (0700) when ``create``; one round trip."""
    where = directory if directory is not None else f"{DEFAULT_PARENT}/{project}"
    q = shlex.quote(where)
    # `cd` alone goes home: a --remote-setup line may have changed directory.
    # umask 077: the directories mkdir -p creates on the way are private too, not only the last one.
    script = f"cd && umask 077 && mkdir -p -- {q} && cd -- {q} && pwd -P" if create else \
        f"cd && if cd -- {q} 2>/dev/null; then pwd -P; else printf '%s/%s\\n' \"$(pwd -P)\" {q}; fi"
    out = conn.run(shell_command(script, conn.setup)).stdout.decode("utf-8", errors="surrogateescape")
    path = out.rstrip("\n").rsplit("\n", 1)[-1]
    if not path.startswith("/"):
        raise RemoteError(f"--remote {conn.dest}: could not resolve the remote directory {where!r} (got "
                          f"{path!r})")
    return path if not where.startswith("/") or create else where


def parse_size(text: str, what: str = "--sync-limit") -> int:
    """``N``, ``N[KMGT]`` (powers of 1024) in bytes."""
    m = re.fullmatch(r"(\d{1,15})([KMGT]?)i?B?", text, re.IGNORECASE)
    if not m:
        raise SpecError(f"{what} {text!r} is not a size (expected bytes or N with K, M, G or T, e.g. 500M)")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


@dataclass(frozen=True)
class SyncSummary:
    files: int  # regular files in the project (after the excludes)
    sent_files: int  # those that were new or changed
    sent_bytes: int  # their size
    wire_bytes: int  # what rsync sent over the connection, lists and checksums included

    def line(self, dest: str) -> str:
        if not self.sent_files:
            return f"slurmlaunch: synced to {dest}: nothing changed ({self.files} files up to date)"
        return (f"slurmlaunch: synced to {dest}: {self.sent_files} of {self.files} files new or changed "
                f"({_human(self.sent_bytes)}; {_human(self.wire_bytes)} over the connection)")


def _stat(stats: str, label: str) -> int:
    m = re.search(rf"^{re.escape(label)}: ([\d,]+)", stats, re.MULTILINE)
    return int(m.group(1).replace(",", "")) if m else 0


def _regular_files(stats: str) -> int:
    """rsync's "Number of files: 1,003 (reg: 1,000, dir: 3)": the regular ones."""
    m = re.search(r"^Number of files: [\d,]+ \(reg: ([\d,]+)", stats, re.MULTILINE)
    return int(m.group(1).replace(",", "")) if m else _stat(stats, "Number of files")


def sync_argv(conn: Connection, local_dir: str, remote_dir: str, excludes: Sequence[str],
              dry_run: bool = False) -> list[str]:
    """rsync of ``local_dir`` into ``remote_dir``: .gitignore files honoured as rsync reads them (each
    directory's own, `:- .gitignore`), .git/ and ``excludes`` left out; nothing on the remote is deleted."""
    # --chmod=go-rwx: what is sent is private to the user there, whatever its permissions here (-a copies
    # them, and a laptop's umask is usually 022).
    argv = ["rsync", "-a", "--chmod=go-rwx", "--stats", "-s", "-e", conn.rsync_shell(),
            "--filter=:- .gitignore", "--exclude=/.git/", f"--exclude=/{SHIPPED_DIR}/",
            *(f"--exclude={e}" for e in excludes)]
    if dry_run:
        argv.append("--dry-run")
    return [*argv, "--", local_dir.rstrip("/") + "/", f"{conn.dest.target}:{remote_dir}/"]


def _rsync(conn: Connection, argv: list[str], timeout: float) -> str:
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        raise RemoteError("rsync is not on PATH here (install it, or --no-sync)") from None
    except subprocess.TimeoutExpired:
        raise RemoteError(f"--remote {conn.dest}: rsync did not finish within {timeout:.0f}s") from None
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        why = _ssh_failure(conn.dest, err)
        last = err.strip().splitlines()[-1] if err.strip() else "(no output)"
        raise RemoteError(why or f"--remote {conn.dest}: rsync failed (exit {proc.returncode}): {last}")
    return proc.stdout.decode(errors="replace")


def sync(conn: Connection, local_dir: str, remote_dir: str, excludes: Sequence[str] = (),
         limit: int = DEFAULT_SYNC_LIMIT, timeout: float = 3600.0) -> SyncSummary:
    """Send what changed in ``local_dir``. Counted first (a dry run): more than ``limit`` bytes to send is
    refused with one line, before anything is sent."""
    counted = _rsync(conn, sync_argv(conn, local_dir, remote_dir, excludes, dry_run=True), COMMAND_TIMEOUT_S)
    to_send = _stat(counted, "Total transferred file size")
    if to_send > limit:
        raise SpecError(
            f"sync of {local_dir!r} to {conn.dest.target}:{remote_dir} would send "
            f"{_stat(counted, 'Number of regular files transferred')} files, {_human(to_send)}, more than the "
            f"limit {_human(limit)}; leave out what is not code (.gitignore or --remote-exclude), raise "
            f"--sync-limit, or --no-sync")
    if not _stat(counted, "Number of regular files transferred"):
        return SyncSummary(_regular_files(counted), 0, 0, _stat(counted, "Total bytes sent"))
    done = _rsync(conn, sync_argv(conn, local_dir, remote_dir, excludes), timeout)
    return SyncSummary(_regular_files(done), _stat(done, "Number of regular files transferred"),
                       _stat(done, "Total transferred file size"), _stat(done, "Total bytes sent"))


# -- the launcher travels with the job ----------------------------------------------------------------------
# The remote side needs Python 3 and the training environment only. This installation's package is sent
# to <remote project>/.slurmlaunch/pkg/<version>-<content hash>/slurmlaunch (the project directory is the
# one place the ranks are sure to see), and the batch script puts that directory first on PYTHONPATH: the
# ranks' `python -m slurmlaunch launch` (and torchrun-node's children, which inherit the environment) run the
# very code that rendered the script, whether or not another slurmlaunch is installed there. The path the
# launcher imports is standard library only, so nothing else has to travel.

def package_dir() -> str:
    """This installation's ``slurmlaunch`` package directory."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources() -> list[str]:
    """What is sent: the package and, in a source checkout, the templates beside it (an installed package
    holds them; --allocate's probe job is rendered there)."""
    from ..render.jinja import shipped_template_dir

    templates = str(shipped_template_dir())
    inside = templates.startswith(package_dir() + os.sep)
    return [package_dir()] if inside or not os.path.isdir(templates) else [package_dir(), templates]


def _package_files() -> list[str]:
    found = []
    for root in _sources():
        for parent, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            found += [os.path.join(parent, f) for f in sorted(files) if not f.endswith((".pyc", ".pyo"))]
    return found


def package_tag() -> str:
    """``<version>-<12 hex digits of the package's content>``: a new directory for every change, so a job
    still queued keeps the code it was rendered with while a newer one is sent beside it."""
    from ..core import __version__

    digest = hashlib.sha256()
    top = os.path.dirname(package_dir())
    for path in _package_files():
        digest.update(os.path.relpath(path, top).encode("utf-8", "surrogateescape") + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", __version__)
    return f"{safe}-{digest.hexdigest()[:12]}"


def shipped_path(remote_dir: str, tag: str | None = None) -> str:
    """Where the package goes in ``remote_dir``: the directory to put on the ranks' PYTHONPATH."""
    return f"{remote_dir.rstrip('/')}/{SHIPPED_DIR}/pkg/{tag or package_tag()}"


def ship_argv(conn: Connection, remote_dir: str, tag: str | None = None) -> list[str]:
    """The rsync that sends the package (its sources, no byte code) to shipped_path, private to the user."""
    return ["rsync", "-a", "--chmod=go-rwx", "-s", "-e", conn.rsync_shell(), "--exclude=__pycache__/",
            "--exclude=*.py[co]", "--", *(path.rstrip("/") for path in _sources()),
            f"{conn.dest.target}:{shipped_path(remote_dir, tag)}/"]


def ship_package(conn: Connection, remote_dir: str) -> str:
    """Send the package (nothing, when this version is there already) and return the directory for
    PYTHONPATH. ``remote_dir`` must exist (resolve_directory with create)."""
    tag = package_tag()
    where = shipped_path(remote_dir, tag)
    q = shlex.quote(where)
    # rsync creates one level only; umask 077 keeps .slurmlaunch/pkg private.
    conn.run(shell_command(f"umask 077 && mkdir -p -- {q}", conn.setup))
    _rsync(conn, ship_argv(conn, remote_dir, tag), COMMAND_TIMEOUT_S)
    return where


def pythonpath_setup(path: str) -> str:
    """The batch script's line that puts the shipped package first on the ranks' PYTHONPATH (keeping what
    --env, the site or a --setup line set)."""
    return f'export PYTHONPATH={shlex.quote(path)}"${{PYTHONPATH:+:$PYTHONPATH}}"'
