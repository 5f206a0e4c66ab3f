"""The moments of a job's start-up, written where they happen (core/timeline.py reads them): the batch step's
start and its command's, each rank's launcher start and exec, and the script's own marks. The rank's runner
(rank_runner.py) writes `import torch` done and init_process_group returned, in the same format, itself.

One file per rank in $SLURMLAUNCH_TIMELINE_DIR, named by the rank, and one for the batch step (core.timeline
JOB_FILE): each moment one line appended with one write (O_APPEND: no locking, and thousands of ranks never
write to one file). On the launcher's path: standard library basics only, and nothing at all when the
variable is unset. Best effort: a moment that cannot be written is lost, the rank goes on.
"""

from __future__ import annotations

import os
import time

TIMELINE_DIR = "SLURMLAUNCH_TIMELINE_DIR"
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def host_name(environ: os._Environ[str] | dict[str, str]) -> str:
    """This node's name as the scheduler says it ($SLURMD_NODENAME; the kernel's otherwise), without blanks."""
    return "".join((environ.get("SLURMD_NODENAME") or os.uname().nodename).split()) or "?"


def line(time_ns: int, host: str, kind: str, name: str = "") -> str:
    name = " ".join(name.split())  # one line, whatever the script named it
    return f"{time_ns} {host} {kind} {name}\n" if name else f"{time_ns} {host} {kind}\n"


def append(directory: str, file: str, text: str) -> None:
    """``text`` (whole lines) appended to ``file`` in ``directory`` with one write; nothing on failure."""
    try:
        fd = os.open(os.path.join(directory, file), _FLAGS, 0o600)
    except OSError:
        return
    try:
        os.write(fd, text.encode("utf-8", errors="replace"))
    except OSError:
        pass
    finally:
        os.close(fd)


def process_start_ns() -> int:
    """When this process started, on time.time_ns()'s clock: the kernel's start time (/proc/self/stat, in clock
    ticks since boot, 10 ms on Linux) against CLOCK_BOOTTIME now. time.time_ns() when /proc cannot say."""
    now = time.time_ns()
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        since_boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        return now - since_boot + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now


def launched(environ: os._Environ[str] | dict[str, str], rank: int, started_ns: int, host: str = "") -> None:
    """The launcher, just before it execs the script: its own start (``started_ns``) and now, in one write."""
    directory = environ.get(TIMELINE_DIR)
    if not directory:
        return
    host = host or host_name(environ)
    append(directory, str(rank), line(started_ns, host, "launch") + line(time.time_ns(), host, "exec"))


def batch_started(environ: os._Environ[str] | dict[str, str], started_ns: int, step: bool = True) -> None:
    """The batch step (or the local scheduler), as it starts the ranks' command: its own start and now; with
    ``step`` False only its start (the ranks' command starts later: :func:`step_started` says when)."""
    directory = environ.get(TIMELINE_DIR)
    if not directory:
        return
    host = host_name(environ)
    append(directory, "batch", line(started_ns, host, "batch") + (line(time.time_ns(), host, "step") if step else ""))


def step_started(environ: os._Environ[str] | dict[str, str]) -> None:
    """The batch step starts the ranks' command now, after work of its own (--stage-env's copy): that work is
    then the chart's "batch step" phase, not part of every rank's task start."""
    directory = environ.get(TIMELINE_DIR)
    if directory:
        append(directory, "batch", line(time.time_ns(), host_name(environ), "step"))


_marked: set[str] = set()


def mark(name: str = "first step") -> None:
    """Record that this rank reached ``name`` now (once per name and process: a call in the training loop
    costs a set lookup after the first). The first mark ends the rank's start-up in `slurmlaunch timeline`.
    A no-op outside a slurmlaunch job (no $SLURMLAUNCH_TIMELINE_DIR, or no $RANK)."""
    if name in _marked:
        return
    _marked.add(name)
    environ = os.environ
    directory, rank = environ.get(TIMELINE_DIR), environ.get("RANK", "")
    if not directory or not rank.isdigit():
        return
    append(directory, rank, line(time.time_ns(), host_name(environ), "mark", name))


def read(directory: str, limit: int = 64 << 10) -> dict[str, str]:
    """The timeline directory's files (name -> text, each at most ``limit`` bytes); {} when there is none."""
    from .smallfile import read_small

    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    out = {}
    for name in names:
        try:
            out[name] = read_small(os.path.join(directory, name), limit).decode("utf-8", errors="replace")
        except OSError:
            continue
    return out
