"""The one place scheduler commands run (sbatch, squeue, sacct, scontrol, scancel, qsub, qstat, qdel, ...).

Every edge calls :func:`run_command`; it hands the argv to the current :class:`CommandRunner`. The default runs
it here, without a shell; the ssh runner (app/remote/__init__.py's SshRunner) runs it on a login node, plugged in with
:func:`use_runner`, and the edges need not change. What an edge reads of the machine the scheduler is on (a
job's exit-code file, whether sacct is installed) goes through the same runner: :func:`read_file`,
:func:`which`."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterator, Sequence
from typing import Protocol

from ..core.errors import SchedulerError

READ_LIMIT = 1 << 20  # the most one read returns: a log is read in chunks, never whole


class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], *, timeout: float, input_text: str | None = None,
            env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` to its end within ``timeout`` seconds; SchedulerError naming the command and its
        output when it cannot start, runs out of time or exits non-zero."""
        ...

    def read(self, path: str, offset: int = 0, limit: int = READ_LIMIT, *, timeout: float = 30.0) -> bytes | None:
        """At most ``limit`` bytes of the file ``path`` from byte ``offset`` on (fewer at its end); None when
        there is no such readable file. SchedulerError when the machine cannot be asked."""
        ...

    def which(self, name: str) -> bool:
        """Whether the command ``name`` is on that machine's PATH."""
        ...


class LocalRunner:
    """Runs the command on this machine: an argv list, no shell, output captured as text."""

    def run(self, argv: Sequence[str], *, timeout: float, input_text: str | None = None,
            env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input_text,
                                  env=env, errors="replace", umask=umask)
        except FileNotFoundError:
            raise SchedulerError(f"{cmd[0]!r} not found on PATH (is the scheduler's client installed?)") from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(f"no answer within {timeout:.0f}s from: {shlex.join(cmd)}") from None
        if proc.returncode != 0:
            output = (proc.stderr.strip() or proc.stdout.strip() or "(no output)").replace("\n", " | ")
            raise SchedulerError(f"{shlex.join(cmd)} failed (exit {proc.returncode}): {output}")
        return proc

    def read(self, path: str, offset: int = 0, limit: int = READ_LIMIT, *, timeout: float = 30.0) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO planted there must not block us
        except OSError:
            return None
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            chunks: list[bytes] = []
            left = limit
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 16))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def which(self, name: str) -> bool:
        return shutil.which(name) is not None


_current: list[CommandRunner] = [LocalRunner()]  # the main thread's, which other threads use too ...
_threads = threading.local()  # ... unless they set their own (`list` asks each destination in a thread)


def current_runner() -> CommandRunner:
    own: list[CommandRunner] | None = getattr(_threads, "stack", None)
    return own[-1] if own else _current[-1]


@contextlib.contextmanager
def use_runner(runner: CommandRunner) -> Iterator[CommandRunner]:
    """Run every scheduler command inside the block through ``runner`` (then the previous one again). Set in
    the main thread, it is every thread's that has not set one of its own; set in another thread, that
    thread's alone."""
    if threading.current_thread() is threading.main_thread():
        stack = _current
    else:
        if not hasattr(_threads, "stack"):
            _threads.stack = []
        stack = _threads.stack
    stack.append(runner)
    try:
        yield runner
    finally:
        stack.remove(runner)


def run_command(cmd: Sequence[str], timeout: float = 60.0, input_text: str | None = None,
                env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
    """Run a scheduler command through the current runner; failures raise SchedulerError with the command
    and output. ``umask`` (when >= 0) is the command's: sbatch hands its own to the job, whose output files
    Slurm creates with it."""
    return current_runner().run(cmd, timeout=timeout, input_text=input_text, env=env, umask=umask)


def read_file(path: str, offset: int = 0, limit: int = READ_LIMIT) -> bytes | None:
    """Read (at most ``limit`` bytes from ``offset``) a file of the machine the current runner runs commands
    on: the job's files, which live where the scheduler is; None when there is none."""
    return current_runner().read(path, offset, limit)


def which(name: str) -> bool:
    """Whether ``name`` is on PATH where the current runner runs commands."""
    return current_runner().which(name)
