"""The scheduler edges' command runner over ssh: ``with use_runner(SshRunner(conn)): EDGE.status(...)`` asks the
login node with the very code that asks this machine.

Each command is one round trip over the destination's connection (remote.Connection): the --remote-setup
lines, then the argv with every word quoted (remote.remote_command), its input on the remote command's
stdin. A job's files are read there in bounded chunks (``tail -c +N | head -c LIMIT``: no interpreter is
started); whether a client is installed is one ``command -v`` for the scheduler clients the edges ask about,
remembered for the connection's life.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import time
from collections.abc import Sequence

from ...core.errors import SchedulerError
from ...schedulers.runner import READ_LIMIT
from .dest import shell_command
from .ssh import Connection

# What an edge asks `which` about; the first question answers all of them (one round trip).
CLIENTS = ("sbatch", "qsub", "sacct", "squeue", "qstat")
_MISSING = 66  # the read snippet's exit status for "no such readable file"
_FOUND = "slurmlaunch-found:"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KILL_AFTER_S = 5  # after the bound's TERM, the KILL of a command that ignores it
_TIMED_OUT = 124  # coreutils timeout's exit status when the bound stopped the command


def bounded(line: str, seconds: float) -> str:
    """``line`` (a command's quoted words) stopped on the login node after ``seconds``, by coreutils' timeout
    where the login node has it (every Linux one): sshd runs a command without a terminal, so the laptop giving
    up (its own bound, the same) closes the session but stops nothing there, and a hung squeue ran on."""
    limit = max(1, math.ceil(seconds))
    return (f"if command -v timeout >/dev/null 2>&1; then timeout -k {KILL_AFTER_S} {limit} {line}; "
            f"else {line}; fi")


class SshRunner:
    """schedulers.runner.CommandRunner on the login node at the other end of ``conn``. A command that runs and
    fails is a SchedulerError naming it (the words as given, not the setup lines) and its output; ssh that
    cannot connect or log in is remote_shell.Unreachable, which a follower retries; a --remote-setup line
    that fails is a RemoteError naming that line."""

    def __init__(self, conn: Connection, deadline: float | None = None) -> None:
        self.conn = conn
        self.deadline = deadline  # time.monotonic() by which every command must be done (`list`'s one bound)
        self._found: dict[str, bool] = {}

    def _limit(self, timeout: float, what: str) -> float:
        """``timeout``, shortened to what is left before the deadline; SchedulerError when nothing is."""
        if self.deadline is None:
            return timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SchedulerError(f"on {self.conn.dest.target}: {what}: not asked, no time left")
        return min(timeout, left)

    def _fail(self, words: Sequence[str], proc: subprocess.CompletedProcess[bytes]) -> SchedulerError:
        said = (proc.stderr.decode(errors="replace").strip() or proc.stdout.decode(errors="replace").strip()
                or "(no output)").replace("\n", " | ")
        return SchedulerError(f"on {self.conn.dest.target}: {shlex.join(words)} failed (exit {proc.returncode}): "
                              f"{said}")

    def run(self, argv: Sequence[str], *, timeout: float, input_text: str | None = None,
            env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
        words = list(argv)
        if env:  # added to the login node's environment (this machine's whole environment means nothing there)
            bad = [key for key in env if not _ENV_KEY.fullmatch(key)]
            if bad:
                raise SchedulerError(f"environment variable name {bad[0]!r} is not valid for a remote command")
            words = ["env", *(f"{key}={value}" for key, value in env.items()), *words]
        line = shlex.join(words)
        timeout = self._limit(timeout, line)
        command = bounded(line, timeout)
        if umask >= 0:
            command = f"umask {umask & 0o777:04o} && {command}"
        proc = self.conn.run(shell_command(command, self.conn.setup, timeout), check=False, timeout=timeout, what=line,
                             input_bytes=input_text.encode() if input_text is not None else None)
        if proc.returncode == _TIMED_OUT and not proc.stdout and not proc.stderr:
            raise SchedulerError(f"on {self.conn.dest.target}: {shlex.join(argv)}: no answer within "
                                 f"{math.ceil(timeout)}s (stopped there)")
        if proc.returncode != 0:
            raise self._fail(argv, proc)
        return subprocess.CompletedProcess(words, 0, proc.stdout.decode(errors="replace"),
                                           proc.stderr.decode(errors="replace"))

    def read(self, path: str, offset: int = 0, limit: int = READ_LIMIT, *, timeout: float = 30.0) -> bytes | None:
        q = shlex.quote(path)
        # Not there: None ("no log yet"); there but not a readable file: a failure naming it.
        script = (f"if [ ! -e {q} ]; then exit {_MISSING}; elif [ -f {q} ] && [ -r {q} ]; then "
                  f"tail -c +{max(offset, 0) + 1} -- {q} | head -c {max(limit, 0)}; "
                  f"else echo 'not a readable file' >&2; exit 1; fi")
        # No setup lines: reading a file needs no module; their output would be mixed into the bytes.
        proc = self.conn.run(script, check=False, timeout=self._limit(timeout, f"read {q}"), what=f"read {q}")
        if proc.returncode == _MISSING:
            return None
        if proc.returncode != 0:
            raise self._fail(["read", path], proc)
        return proc.stdout

    def which(self, name: str) -> bool:
        if name not in self._found:
            if not _NAME.fullmatch(name):
                return False
            names = [name, *(c for c in CLIENTS if c != name and c not in self._found)]
            script = "; ".join(f"command -v {n} >/dev/null 2>&1 && echo {_FOUND}{n}" for n in names) + "; true"
            limit = self._limit(30, "command -v")
            proc = self.conn.run(shell_command(script, self.conn.setup, limit), timeout=limit, check=False,
                                 what=f"command -v {name}")
            if proc.returncode != 0:  # a --remote-setup line failed
                raise self._fail(["command", "-v", *names], proc)
            out = proc.stdout.decode(errors="replace")
            found = {line[len(_FOUND):] for line in out.splitlines() if line.startswith(_FOUND)}
            self._found.update((n, n in found) for n in names)
        return self._found[name]
