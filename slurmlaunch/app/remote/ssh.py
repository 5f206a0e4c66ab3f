"""One multiplexed ssh connection to a destination, through the system OpenSSH client.

~/.ssh/config (aliases, ProxyJump, agents, certificates, Kerberos) works as it does for the user's own `ssh`;
slurmlaunch handles no password and never turns host key checking off.

Shells. sshd runs a remote command with the user's login shell as ``$SHELL -c COMMAND``: a non-login,
non-interactive shell (bash reads ~/.bashrc there, zsh ~/.zshenv, nothing reads /etc/profile or ~/.profile).
slurmlaunch does not add ``bash -l``: what a site needs is said with --remote-setup lines. The first command of
a connection also checks the shell (remote_shell.check_shell): it must read POSIX sh, and print nothing on
stdout before the command runs.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from types import FrameType

from .dest import Destination, remote_command, setup_failure, without_marker
from .shell import PROBE, RemoteError, Unreachable, check_shell, ssh_config, ssh_failure, user_master_path

CONTROL_PERSIST_S = 60  # a master left by a crash goes away on its own after this long idle
CONNECT_TIMEOUT_S = 20
COMMAND_TIMEOUT_S = 120.0
# A unix socket's path holds 104 bytes on macOS, 108 on Linux (the terminating NUL included); ssh names
# the socket ControlPath (%C: 40 hex digits) and, while it sets the master up, that plus a 17-byte suffix.
SOCKET_PATH_MAX = 104
_SOCKET_NAME = 1 + 40 + 17


def private_control_dir() -> str:
    """A new private (0700) directory for our control socket: short, under /tmp, not under TMPDIR (macOS's
    /var/folders/.../T/ is long enough to push ControlPath over the socket limit). RemoteError, in one line,
    when its path would still not fit."""
    base = "/tmp" if os.access("/tmp", os.W_OK | os.X_OK) else tempfile.gettempdir()
    directory = tempfile.mkdtemp(prefix=f"sl-{os.getuid()}-", dir=base)
    if len(directory.encode()) + _SOCKET_NAME >= SOCKET_PATH_MAX:
        shutil.rmtree(directory, ignore_errors=True)
        raise RemoteError(f"the ssh control socket would be {directory}/<40 characters>, more than the "
                          f"{SOCKET_PATH_MAX} bytes a socket path may have; make /tmp writable, or give the "
                          f"destination a short ControlPath of your own in ~/.ssh/config")
    return directory


class Connection:
    """One multiplexed ssh connection to a destination. Use it in a ``with``.

    Where the user's ssh configuration already gives the destination a ControlPath and a ControlMaster (their
    own master, typically with ControlPersist, so that a login with a second factor is asked once a day),
    that is used as it is and never stopped. Otherwise slurmlaunch keeps its own master for this one command
    (ControlMaster=auto, its socket in a private 0700 directory), and leaving the ``with`` stops it
    (``ssh -O exit``) and removes the directory: no ssh process outlives the command. Inside the ``with``,
    SIGTERM and SIGHUP (where nobody else handles them) end the command the same way."""

    def __init__(self, dest: Destination, setup: Sequence[str] = (), ssh: str = "ssh",
                 timeout: float = COMMAND_TIMEOUT_S) -> None:
        self.dest = dest
        self.setup = tuple(setup)
        self.ssh = ssh
        self.timeout = timeout
        self.config = ssh_config(ssh, dest.target)
        self.user_master = user_master_path(self.config)
        self.shell_checked = False
        self._signals: dict[int, object] = {}
        # ours (0700), only when the user has no ControlPath of their own
        self.control_dir = "" if self.user_master else private_control_dir()

    def options(self) -> list[str]:
        opts = [] if self.user_master else [
            "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C",
            "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
        opts += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "ServerAliveInterval=10",
                 "-o", "ServerAliveCountMax=3"]
        if self.config.get("loglevel", "INFO").upper() == "INFO":
            # ssh's default level shows an sshd Banner on stderr, mixed into every failing command's text
            # (a LogLevel of the user's own, e.g. DEBUG to find a problem, is left as it is).
            opts += ["-o", "LogLevel=ERROR"]
        if not (sys.stdin.isatty() and os.isatty(2)):
            # No terminal to answer a prompt on: fail at once instead of waiting for a passphrase.
            opts += ["-o", "BatchMode=yes"]
        return opts

    def rsync_shell(self) -> str:
        """rsync's -e: the same client and the same master."""
        return shlex.join([self.ssh, *self.options()])

    def _ssh(self, line: str, input_bytes: bytes | None, limit: float, what: str) -> tuple[int, bytes, bytes]:
        argv = [self.ssh, *self.options(), "-T", "-e", "none", "--", self.dest.target, line]
        try:
            # stderr to a file, not a pipe: a master that ssh forks into the background keeps its copy of
            # the parent's descriptors until ControlPersist ends, and a pipe would not reach EOF before.
            with tempfile.TemporaryFile() as err:
                proc = subprocess.run(argv, input=input_bytes, stdout=subprocess.PIPE, stderr=err,
                                      stdin=None if input_bytes is not None else subprocess.DEVNULL,
                                      timeout=limit)
                err.seek(0)
                return proc.returncode, proc.stdout, err.read()
        except FileNotFoundError:
            raise RemoteError(f"--remote {self.dest}: {self.ssh!r} is not on PATH (install the OpenSSH "
                              f"client)") from None
        except subprocess.TimeoutExpired:
            raise Unreachable(f"--remote {self.dest}: no answer within {limit:.0f}s from the remote command "
                              f"{what}") from None

    def run(self, command: str, *, input_bytes: bytes | None = None, timeout: float | None = None,
            check: bool = True, what: str | None = None) -> subprocess.CompletedProcess[bytes]:
        """Run ``command`` (a line for the remote shell: see remote_command) and return its output.
        Unreachable, in one line, when ssh cannot connect or log in (exit 255) or there is no answer within
        ``timeout`` seconds; RemoteError when the login shell is unusable or (with ``check``) the command
        fails, naming ``what`` (default: the command's last line) or the --remote-setup line that failed."""
        limit = self.timeout if timeout is None else timeout
        what = what or (command.splitlines()[-1] if command else command)
        probing = not self.shell_checked
        code, out, raw_err = self._ssh(PROBE + command if probing else command, input_bytes, limit, what)
        err_text = raw_err.decode(errors="replace")
        if code == 255:
            raise Unreachable(ssh_failure(self.dest, self.config, err_text) or "")
        if probing:
            out = check_shell(self.dest, out, err_text)
            self.shell_checked = True
        failed = setup_failure(self.setup, err_text)
        stderr = without_marker(err_text).encode() if failed is None else raw_err
        if failed is not None and code != 0:
            said = failed[1].replace("\n", " | ") or out.decode(errors="replace").strip() or "(no output)"
            raise RemoteError(f"on {self.dest.target}: {failed[0]} failed (exit {code}): {said}")
        if check and code != 0:
            said = (stderr.decode(errors="replace").strip() or out.decode(errors="replace").strip()
                    or "(no output)").replace("\n", " | ")
            raise RemoteError(f"on {self.dest.target}: {what} failed (exit {code}): {said}")
        return subprocess.CompletedProcess(command, code, out, stderr)

    def run_argv(self, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        """Run ``argv`` remotely, each word data (after the --remote-setup lines)."""
        kwargs.setdefault("what", shlex.join(argv))
        return self.run(remote_command(argv, self.setup), **kwargs)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop our master, if one was started, and remove the socket's directory; the user's own master
        (their ControlPath) is left running, as their configuration asks."""
        for sig in self._signals:
            signal.signal(sig, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
        try:
            if not self.user_master and self.control_dir:
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    if any(os.scandir(self.control_dir)):
                        subprocess.run([self.ssh, "-o", f"ControlPath={self.control_dir}/%C", "-O", "exit",
                                        "--", self.dest.target], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15)
                shutil.rmtree(self.control_dir, ignore_errors=True)
        finally:
            for sig, handler in self._signals.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
            self._signals.clear()

    def __enter__(self) -> Connection:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) == signal.SIG_DFL:
                    self._signals[sig] = signal.signal(sig, _leave)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _leave(signum: int, frame: FrameType | None) -> None:
    """SIGTERM/SIGHUP inside a Connection's ``with``: leave it (its clean-up runs), exit 128 + the signal."""
    raise SystemExit(128 + signum)
