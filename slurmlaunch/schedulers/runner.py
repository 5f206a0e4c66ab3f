"""The one place scheduler commands run (sbatch, squeue, sacct, scontrol, scancel, qsub, qstat, qdel, ...).

Every edge calls :func:`run_command`; it hands the argv to the current :class:`CommandRunner`. The default runs
it here, without a shell; a runner that runs it on a login node over ssh (issue 17) plugs in with
:func:`use_runner`, and the edges need not change."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
from collections.abc import Iterator, Sequence
from typing import Protocol

from ..core.errors import SchedulerError


class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], *, timeout: float, input_text: str | None = None,
            env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` to its end within ``timeout`` seconds; SchedulerError naming the command and its
        output when it cannot start, runs out of time or exits non-zero."""
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


_current: list[CommandRunner] = [LocalRunner()]


def current_runner() -> CommandRunner:
    return _current[-1]


@contextlib.contextmanager
def use_runner(runner: CommandRunner) -> Iterator[CommandRunner]:
    """Run every scheduler command inside the block through ``runner`` (then the previous one again)."""
    _current.append(runner)
    try:
        yield runner
    finally:
        _current.remove(runner)


def run_command(cmd: Sequence[str], timeout: float = 60.0, input_text: str | None = None,
                env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
    """Run a scheduler command through the current runner; failures raise SchedulerError with the command
    and output. ``umask`` (when >= 0) is the command's: sbatch hands its own to the job, whose output files
    Slurm creates with it."""
    return current_runner().run(cmd, timeout=timeout, input_text=input_text, env=env, umask=umask)
