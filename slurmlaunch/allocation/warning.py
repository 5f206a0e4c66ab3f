"""The time limit's warning: when it is due (the one timer of the batch step and the local supervisor), and
its delivery to the ranks of one node, only to those that listen for it.

A rank whose script installed a handler for the warning signal (Python's ``signal.signal``, Lightning's,
submitit's) gets it; one that did not is left alone and runs on to the time limit, as it would have without
slurmlaunch (issue 40). A rank left alone is watched (:class:`LateWatch`) until the job's limit: one whose
script installs its handler after the warning came (Lightning's at ``trainer.fit``, after a slow import) is
sent it then. A rank listens when the signal's bit is set in ``SigCgt`` of /proc/PID/status (the kernel's
"caught" mask). The ranks keep the default action otherwise (no SIG_IGN at start: Lightning reads an
inherited SIG_IGN as a user's handler and then never arms its requeue). The stop signals (TERM, INT, HUP) asked
for as the warning go to every rank: they are meant to stop it.

Which processes are the ranks of a node: their RANK.pid files in $SLURMLAUNCH_STACKS_DIR (allocation/stacks.py
reads them for `slurmlaunch stacks`). `slurmlaunch warn-node DIR SIGNAL [UNTIL]` runs this on a node (the
batch step starts one per node: an srun --overlap step, pbs_tmrsh, this host's own) and writes DIR/HOST.warned,
JSON lines: the first the ranks warned and left alone, then one per rank sent it late; it watches the ranks left
alone until each has been sent it or has ended, and never past UNTIL (the job's end, Unix time) when given.
Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence

from ..core.errors import SpecError
from ..core.parse import signal_number
from ..core.signals import STOP_SIGNALS

REPORT_SUFFIX = ".warned"  # HOST.warned in the stacks directory: what warn-node did on HOST
WARN_NODE_USAGE = ("usage: slurmlaunch warn-node DIR SIGNAL [UNTIL] (SIGNAL: the warning's name, as USR2; UNTIL: "
                   "the job's end, in seconds since the epoch)")
WATCH_POLL_S = 0.25  # how often a rank left alone is looked at again: a late handler gets the warning this soon


class WarningTimer:
    """When the warning is due: ``before`` seconds before ``limit`` seconds after ``started`` (readings of one
    clock); never when either is None. One of these serves the batch step (a thread, PBS: nobody else sends
    the warning) and the local supervisor (polled from its loop)."""

    def __init__(self, started: float, limit: float | None, before: float | None) -> None:
        self.at = started + max(0.0, limit - before) if limit is not None and before is not None else None
        self.fired = False

    def due(self, now: float) -> bool:
        """True once, the first time it is asked at or after the warning's time."""
        if self.at is None or self.fired or now < self.at:
            return False
        self.fired = True
        return True

    def start(self, now: float, fire: Callable[[], None]) -> None:
        """Call ``fire`` from a daemon thread at the warning's time (``now``: the clock's reading)."""
        if self.at is None:
            return
        import threading

        def run() -> None:
            if self.due(self.at or 0.0):
                fire()

        timer = threading.Timer(max(0.0, self.at - now), run)
        timer.daemon = True
        timer.start()


def handles(pid: int, signum: int) -> bool | None:
    """Whether process ``pid`` has a handler installed for ``signum`` (its SigCgt bit); None when the process
    cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def deliver(ranks: Iterable[tuple[int, int]], signum: int, to_all: bool = False) -> tuple[list[int], list[int]]:
    """Send ``signum`` to each (rank, pid) whose process handles it (every one with ``to_all``); (the ranks
    sent it, the ranks left alone: no handler). A process gone in between is in neither."""
    warned: list[int] = []
    left: list[int] = []
    for rank, pid in ranks:
        listens = handles(pid, signum)
        if listens is None:
            continue
        if not (listens or to_all):
            left.append(rank)
            continue
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            continue
        warned.append(rank)
    return warned, left


class LateWatch:
    """The ranks left alone at the warning (no handler yet), watched until each installs a handler (then sent
    ``signum`` at once), ends, or the job's limit ``until`` passes (a reading of the caller's clock; None: the
    ranks' own end, which a job's limit brings). Standard library only: warn-node's loop and the local
    supervisor's poll it."""

    def __init__(self, signum: int, left: Iterable[int], until: float | None = None) -> None:
        self.signum, self.left, self.until = signum, set(left), until

    def over(self, now: float) -> bool:
        """Whether nothing is left to watch: every rank sent it or gone, or the limit passed."""
        return not self.left or (self.until is not None and now >= self.until)

    def poll(self, alive: Iterable[tuple[int, int]], now: float) -> list[int]:
        """Send the warning to each watched rank of ``alive`` (rank, pid: the ranks running now, each still the
        process it was) whose handler is installed now; a watched rank not in ``alive`` has ended and is
        forgotten. The ranks sent it, by rank."""
        if self.over(now):
            return []
        running = dict(alive)
        self.left &= set(running)
        sent: list[int] = []
        for rank in sorted(self.left):
            if not handles(running[rank], self.signum):
                continue
            self.left.discard(rank)
            try:
                os.kill(running[rank], self.signum)
            except (ProcessLookupError, PermissionError):
                continue
            sent.append(rank)
        return sent


def node_ranks(directory: str, host: str | None) -> list[tuple[int, int]]:
    """(rank, pid) of each rank armed in ``directory`` on ``host`` (every host with None) whose process is still
    the one that wrote its pid file."""
    from .stacks import armed, same_process

    return [(a.rank, a.pid) for a in armed(directory) if (host is None or a.host == host) and same_process(a)]


def to_all(name: str) -> bool:
    """Whether the warning SIG``name`` goes to every rank: a stop signal (it is meant to end them)."""
    return name in STOP_SIGNALS


def ranks_text(ranks: Sequence[int]) -> str:
    """"rank 0", "ranks 0-3", "ranks 0,2,5-6": the stack summary's ranges (core/stacks.py)."""
    from ..core.stacks import ranges  # here: `re` and dataclasses, which warn-node's start needs not

    return ("rank " if len(set(ranks)) == 1 else "ranks ") + ranges(ranks)


def said(label: str, warned: Sequence[int], left: Sequence[int], unreached: Sequence[str] = ()) -> str:
    """The one line that says which ranks got the warning ``label`` (SIGUSR2) and which were left alone."""
    parts = [f"{label}, the time limit's warning: sent to {ranks_text(warned)} (a handler for it)" if warned
             else f"{label}, the time limit's warning: sent to no rank"]
    if left:
        parts.append(f"left alone: {ranks_text(left)} (no handler yet: each is sent it once its script installs one, "
                     f"else runs on to the time limit)")
    if unreached:
        parts.append("not reached: " + "; ".join(unreached))
    return "; ".join(parts)


def late_said(label: str, ranks: Sequence[int], after: float, host: str | None = None) -> str:
    """The line that says ranks ``ranks`` (on ``host``) were sent the warning ``label`` when their handler came,
    ``after`` seconds after the warning."""
    where = f" on {host}" if host else ""
    return (f"{label}, the time limit's warning: sent to {ranks_text(ranks)}{where} {after:.0f}s after it came "
            f"(its script installed a handler for it then)")


def node_main(argv: Sequence[str]) -> int:
    """`slurmlaunch warn-node DIR SIGNAL [UNTIL]`: warn this node's ranks armed in DIR, then watch those left
    alone (:class:`LateWatch`) until each is sent it or has ended, or UNTIL; what it did into DIR/HOST.warned."""
    from .stacks import this_host

    if len(argv) not in (2, 3) or argv[0].startswith("-"):
        sys.stderr.write(f"slurmlaunch: error: {WARN_NODE_USAGE}\n")
        return 2
    name = argv[1]
    try:
        signum = signal_number(name)
    except SpecError:
        sys.stderr.write(f"slurmlaunch: error: warn-node: {argv[1]!r} is not a signal name ({WARN_NODE_USAGE})\n")
        return 2
    try:
        until = float(argv[2]) if len(argv) == 3 else None
    except ValueError:
        until = None
    if until is not None and not until > 0:  # nan, inf-inf, a negative time: not a moment
        until = None
    if len(argv) == 3 and until is None:
        sys.stderr.write(f"slurmlaunch: error: warn-node: UNTIL {argv[2]!r} is not a time in seconds since the "
                         f"epoch ({WARN_NODE_USAGE})\n")
        return 2
    host = this_host()
    came = time.time()
    warned, left = deliver(node_ranks(argv[0], host), signum, to_all(name))
    # beside the pid files, not on stdout: pbs_tmrsh's task writes into the job's output file, which its
    # caller never reads. Created new, never through a link; each line in one write (the batch step reads it
    # while it grows).
    path = os.path.join(argv[0], host + REPORT_SUFFIX)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND, 0o600)
    except OSError:
        return 0
    try:
        os.write(fd, _line({"host": host, "warned": warned, "left": left, "at": came}))
        watch = LateWatch(signum, left, until)
        while not watch.over(time.time()):
            time.sleep(WATCH_POLL_S)
            sent = watch.poll(node_ranks(argv[0], host), time.time())
            if sent:
                os.write(fd, _line({"host": host, "late": sent, "at": time.time(), "after": time.time() - came}))
    finally:
        os.close(fd)
    return 0


def _line(entry: dict[str, object]) -> bytes:
    return (json.dumps(entry) + "\n").encode()


def reports(directory: str) -> list[dict[str, object]]:
    """What each node's warn-node wrote beside the pid files, by node, in the order written: JSON objects, a
    node's first its delivery ("warned", "left"), then one per late delivery ("late", "after"). A line not yet
    whole is left for the next read."""
    out: list[dict[str, object]] = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if not name.endswith(REPORT_SUFFIX):
            continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                text = f.read(1 << 20)
        except OSError:
            continue
        for line in text.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                entry = json.loads(line)
            except ValueError:
                break
            if isinstance(entry, dict):
                out.append(entry)
    return out
