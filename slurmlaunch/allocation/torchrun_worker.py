"""The start of every --mode torchrun worker: its Slurm task variables made torchrun's (core.workerenv), then
exec of the worker's command. Standard library only, like the launcher: it runs once per worker."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping, Sequence

from ..core.workerenv import torchrun_worker_slurm

# `python -c AS_WORKER ARGV...`: ARGV is the worker's command (the interpreter's options and SCRIPT, or with
# --no-python the executable and its arguments). The first line is for torchrun, which names a failed worker
# by its first argument without a leading "-": the script, not this code.
AS_WORKER = """-0  # torchrun names a failed worker by its first argument without a leading "-": the script, not this
from slurmlaunch.allocation.torchrun_worker import exec_worker
exec_worker()
"""


def as_worker(environ: MutableMapping[str, str]) -> None:
    """Applies core.workerenv's changes to ``environ`` (os.environ: what the exec'd worker inherits)."""
    for name, value in torchrun_worker_slurm(environ).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


def worker_argv(argv: Sequence[str]) -> list[str]:
    """The command AS_WORKER (and the line relay) run: options first mean the interpreter's."""
    return [sys.executable, *argv] if argv and argv[0].startswith("-") else list(argv)


def exec_worker() -> None:
    """AS_WORKER's body: the worker's variables, then exec of sys.argv[1:]."""
    as_worker(os.environ)
    argv = worker_argv(sys.argv[1:])
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write(f"slurmlaunch: cannot run {argv[0]!r}: {e.strerror}\n")
    os._exit(127)
