"""RankFailed, and the mark a failing task puts first in its error (which rank, and when)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ...core.errors import SlurmLaunchError

_MARK = "slurmlaunch-rank-failure"


class RankFailed(SlurmLaunchError):
    """A rank of a distributed job failed; ``rank`` is the first to fail, ``trace`` what it reported (its
    traceback, or how its process ended and its last log lines). How its process ended, where known (the
    local scheduler always knows, Slurm from srun's report): ``returncode`` as subprocess has it (-N: killed
    by signal N) and ``signal_name`` ("SIGSEGV"); None otherwise. ``at``: when it failed, where known."""

    def __init__(self, rank: int, trace: str, returncode: int | None = None, at: float | None = None,
                 host: str | None = None) -> None:
        self.rank = rank
        self.trace = trace
        self.returncode = returncode
        self.at = at  # when it failed (time.time()), where known
        self.host = host  # where it ran, where known (as the CLI's failure line names it: "rank 3 on node2")
        self.signal_name = _signal_name(-returncode).split()[0] if returncode is not None and returncode < 0 else None
        how = ("" if returncode is None else f" (killed by {_signal_name(-returncode)})" if returncode < 0
               else f" (exit code {returncode})")
        super().__init__(f"rank {rank}{f' on {host}' if host else ''} failed{how}:\n{trace}")

    def __reduce__(self) -> tuple[Any, ...]:
        # the API with remote= brings it back from the login node pickled: rebuilt from its fields
        return (RankFailed, (self.rank, self.trace, self.returncode, self.at, self.host))


def _mark() -> str:
    """The first line of the error a task raises, so that the caller can tell the first failure from its
    consequences in the other ranks: the rank, the time (taken before formatting a traceback) and the host."""
    host = "".join((os.environ.get("SLURMD_NODENAME") or os.uname().nodename).split()) or "?"
    return f"{_MARK} rank={os.environ.get('RANK', '?')} at={time.time():.6f} host={host}\n"


def _failure(message: str) -> RuntimeError:
    return RuntimeError(_mark() + message)


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"

