"""Why slurmlaunch stopped a rank: one line per rank in the job's reasons directory.

When the launcher refuses to start a rank (a malformed variable, a pre-flight check) or its rendezvous
watchdog gives up, it writes one line here before the rank ends, and the rank ends with one of the codes
below. The batch script (Slurm, PBS) and the local scheduler read the directory after the step: the
earliest line names the first failure, its code becomes the job's, its text reaches the batch log and
--wait. Why a file and not the exit status alone: a rank the watchdog stops dies by SIGTERM, which srun
reports as "Terminated" with no code at all, and the reason itself was only in that rank's own log.

Standard library only, and cheap: the launcher imports this on every rank.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping

REASONS_DIR = "SLURMLAUNCH_REASONS_DIR"

# Exit codes of a rank slurmlaunch stopped. The meanings of sysexits.h, all below 128 so that none reads as
# "killed by signal N", and none of the codes slurmlaunch documents elsewhere (2: a bad request, 124:
# --wait-timeout, 130: Ctrl-C, 141: a closed pipe, 128+N: a signal, 140: "requeue me" after USR2; 79: the job's
# ranks died of the warning signal).
BAD_LAUNCH = 2  # `slurmlaunch launch` itself was misused (unknown option, SCRIPT missing): a bad request
MAPPING = 65  # EX_DATAERR: the scheduler's variables are malformed or inconsistent
RDZV_TIMEOUT = 69  # EX_UNAVAILABLE: nothing listened at MASTER_ADDR:MASTER_PORT within the bound
PREFLIGHT = 78  # EX_CONFIG: a check before exec refused (MASTER_ADDR, MASTER_PORT, rank 0's host, GPUs)
# The job's code (not a rank's) when ranks died of the warning signal: no handler, nothing saved. Not 128 + N,
# which is also what a script exits with after saving to ask for a requeue (140 for USR2); past sysexits' range,
# none of whose meanings it is. Rare since the launcher starts scripts with the warning ignored: a warning that
# is a stop signal (TERM, INT, HUP), or a script that put the default action back.
WARNING_KILLED = 79

MAX_TEXT = 900  # bytes of reason kept: the whole line stays under 1 KiB, which is what readers take of a file
READ_BOUND = 1024


class Reason:
    """One stopped rank. A plain class: `dataclasses` would pull `inspect` onto every rank's path (~7 ms)."""

    __slots__ = ("when_ns", "code", "rank", "host", "text")

    def __init__(self, when_ns: int, code: int, rank: int | None, host: str, text: str) -> None:
        self.when_ns = when_ns  # wall clock (time.time_ns) when the rank was stopped: the earliest is first
        self.code = code
        self.rank = rank  # None: the rank could not be worked out (the variables that say it were malformed)
        self.host = host
        self.text = text

    def __repr__(self) -> str:
        return f"Reason({self.when_ns}, {self.code}, {self.rank}, {self.host!r}, {self.text!r})"

    def line(self) -> str:
        """``when code rank host text``: space-separated, the text last (the batch script reads it so)."""
        return f"{self.when_ns} {self.code} {'?' if self.rank is None else self.rank} {self.host or '?'} {self.text}\n"

    def who(self) -> str:
        return f"{'a task' if self.rank is None else f'rank {self.rank}'} on {self.host or 'an unknown host'}"


def one_line(text: str) -> str:
    """The text on one line (any whitespace run becomes a space), cut at MAX_TEXT bytes of UTF-8."""
    flat = " ".join(text.split())
    data = flat.encode("utf-8", errors="replace")
    if len(data) <= MAX_TEXT:
        return flat
    return data[: MAX_TEXT - 3].decode("utf-8", errors="ignore") + "..."


def record(environ: Mapping[str, str], code: int, rank: int | None, host: str, text: str) -> bool:
    """Leave ``text`` as this rank's reason in $SLURMLAUNCH_REASONS_DIR (nothing when unset). The file is
    created new, readable by the owner only, never through a link; a second reason for the same rank (or a
    directory that is gone) is dropped: the first word is the one that counts. True when written."""
    where = environ.get(REASONS_DIR)
    if not where:
        return False
    host = "".join(host.split()) or "?"
    reason = Reason(time.time_ns(), code, rank, host, one_line(text))
    name = str(rank) if rank is not None else f"task-{host}-{os.getpid()}"
    try:
        fd = os.open(os.path.join(where, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False
    try:
        os.write(fd, reason.line().encode("utf-8", errors="replace"))
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def parse(line: str) -> Reason | None:
    """A line as ``record`` writes it, or None for anything else (a truncated or foreign file)."""
    parts = line.rstrip("\n").split(" ", 4)
    if len(parts) != 5 or not parts[0].isdigit() or not parts[1].isdigit() or len(parts[1]) > 3:
        return None
    rank = int(parts[2]) if parts[2].isdigit() and len(parts[2]) < 10 else None
    if rank is None and parts[2] != "?":
        return None
    return Reason(int(parts[0]), int(parts[1]), rank, parts[3], parts[4])


def first(lines: Iterable[str]) -> Reason | None:
    """The earliest reason among ``lines`` (ties: the lowest rank), or None."""
    reasons = [r for r in (parse(line) for line in lines) if r is not None]
    if not reasons:
        return None
    return min(reasons, key=lambda r: (r.when_ns, -1 if r.rank is None else r.rank))


def read_first(directory: str) -> Reason | None:
    """The earliest reason left in ``directory`` (each file read up to READ_BOUND bytes), or None."""
    from .smallfile import read_small  # here, not at the top: the launcher imports this module on every rank

    lines: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in names:
        try:
            lines.append(read_small(os.path.join(directory, name), READ_BOUND).decode("utf-8", errors="replace")
                         .split("\n", 1)[0])
        except OSError:
            continue
    return first(lines)


def stopped_first(first_failed_rank: int | None, directory: str) -> tuple[int, Reason] | None:
    """When a rank failed (``first_failed_rank``, as the supervisor saw it) and slurmlaunch had stopped a rank
    itself (a refusal, the rendezvous time-out: its reason in ``directory``), that rank, with its reason, is
    the first failure and its documented code the job's: a rank the watchdog stopped died by SIGTERM, and its
    143 says nothing. None otherwise. The rule of `slurmlaunch run` and of the batch script alike."""
    if first_failed_rank is None:
        return None
    stopped = read_first(directory)
    if stopped is None:
        return None
    return (stopped.rank if stopped.rank is not None else first_failed_rank), stopped
