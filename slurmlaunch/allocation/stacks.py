"""Collecting the ranks' stacks on this node, without ptrace: the launcher's RUNNER armed faulthandler on
DUMP_SIGNAL in every rank and wrote RANK.pid ("PID START HOST") in $SLURMLAUNCH_STACKS_DIR; this signals the
ranks of this node whose process is still that one, and reads what each appended to RANK.dump, within a
bound. `slurmlaunch stacks-node DIR` runs it on a node (one srun --overlap step per node under Slurm) and
prints one JSON line per rank; the local scheduler calls :func:`collect` directly.

Standard library only; not on the launcher's path (the RUNNER spells the file names itself).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Collection, Mapping, Sequence

from ..core import STACKS_DUMP_SUFFIX, STACKS_ENDED_SUFFIX, STACKS_PID_SUFFIX, STACKS_STOP_SUFFIX, STACKS_SUMMARY_NAME
from ..core.stacks import RankStacks, complete, group, parse
from .smallfile import read_small

DUMP_SIGNAL = signal.SIGWINCH  # why this one: script_runner's comment on the RUNNER
DUMP_LIMIT = 1 << 20  # bytes read of one dump: faulthandler stops at 100 threads x 100 frames anyway
SETTLE_S = 1.0  # a dump without the RUNNER's last frame (a stack cut at 100 frames) counts once it stops growing
SAVED_WAIT_S = 2.0  # at most this long the summary after a stop waits for the dumps stopped ranks still write


class Armed:
    """A rank's pid file: which process to signal, on which node."""

    __slots__ = ("rank", "pid", "start", "host")

    def __init__(self, rank: int, pid: int, start: str, host: str) -> None:
        self.rank, self.pid, self.start, self.host = rank, pid, start, host


def this_host() -> str:
    """The node's name as the RUNNER writes it: $SLURMD_NODENAME (Slurm, the local scheduler), else uname."""
    return "".join((os.environ.get("SLURMD_NODENAME") or os.uname().nodename).split()) or "?"


def armed(directory: str) -> list[Armed]:
    """Every rank's pid file in ``directory``, by rank; a file that is not one (half written, foreign) is skipped."""
    out: list[Armed] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        rank = name.removesuffix(STACKS_PID_SUFFIX)
        if not name.endswith(STACKS_PID_SUFFIX) or not rank.isdigit() or len(rank) > 9:
            continue
        try:
            text = read_small(os.path.join(directory, name), 512).decode("utf-8", errors="replace")
        except OSError:
            continue
        parts = text.split()
        if not text.endswith("\n") or len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        out.append(Armed(int(rank), int(parts[0]), parts[1], parts[2]))
    return sorted(out, key=lambda a: a.rank)


def same_process(a: Armed) -> bool:
    """Whether pid ``a.pid`` is still the process that wrote the file (same start time: not a reused pid)."""
    try:
        with open(f"/proc/{a.pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return len(fields) > 19 and fields[0] != b"Z" and fields[19].decode() == a.start


def _read_from(path: str, offset: int) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        chunks, left = [], DUMP_LIMIT
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def collect(directory: str, host: str | None, timeout: float, ranks: Collection[int] | None = None,
            poll: float = 0.05) -> list[dict[str, object]]:
    """Signal the ranks armed in ``directory`` (those on ``host``, or all with None; only ``ranks`` when
    given) and wait at most ``timeout`` seconds for their dumps. One dict per rank: rank, host, pid, state
    ("ok", "ended": its process is gone, "no answer": nothing came within the bound) and text (the dump)."""
    out: dict[int, dict[str, object]] = {}
    waiting: dict[int, tuple[str, int]] = {}
    for a in armed(directory):
        if (host is not None and a.host != host) or (ranks is not None and a.rank not in ranks):
            continue
        entry: dict[str, object] = {"rank": a.rank, "host": a.host, "pid": a.pid, "state": "ended", "text": ""}
        out[a.rank] = entry
        if not same_process(a):
            continue
        path = os.path.join(directory, f"{a.rank}{STACKS_DUMP_SUFFIX}")
        offset = _size(path)
        try:
            os.kill(a.pid, DUMP_SIGNAL)
        except (ProcessLookupError, PermissionError):
            continue
        entry["state"] = "no answer"
        waiting[a.rank] = (path, offset)
    deadline = time.monotonic() + timeout
    last: dict[int, tuple[int, float]] = {}
    while waiting and time.monotonic() < deadline:
        time.sleep(poll)
        now = time.monotonic()
        for rank, (path, offset) in list(waiting.items()):
            size = _size(path)
            if size <= offset:
                continue
            seen = last.get(rank)
            text = _read_from(path, offset)
            if complete(text) or (seen is not None and seen[0] == size and now - seen[1] >= SETTLE_S):
                out[rank].update(state="ok", text=text)
                del waiting[rank]
            elif seen is None or seen[0] != size:
                last[rank] = (size, now)
    for rank, (path, offset) in waiting.items():  # something came, but it never looked whole: keep it
        text = _read_from(path, offset)
        if text:
            out[rank].update(state="ok", text=text)
    return [out[r] for r in sorted(out)]


def _whole(path: str, a: Armed | None, here: str, deadline: float, poll: float = 0.05) -> str:
    """RANK.stopped once the rank's dump is whole, waiting until ``deadline`` at most. The summary can run while
    a stopped rank still writes it (mpiexec may end before its ranks on the hosts the stop reached last; seen on
    PBS under load: one rank's dump held its thread's header only, another's nothing yet). Whole: the RUNNER's
    last frame is in it; or the rank's process, on this host, has ended (what it wrote is all there is); or, a
    rank of another host, nothing came yet or it stopped growing for SETTLE_S (a stack cut at 100 frames)."""
    text = _read_from(path, 0)
    size, since = len(text), time.monotonic()
    while not (text.strip() and complete(text)) and time.monotonic() < deadline:
        if a is not None and a.host == here:
            if not same_process(a):
                break
        elif not text.strip() or time.monotonic() - since >= SETTLE_S:
            break
        time.sleep(poll)
        text = _read_from(path, 0)
        if len(text) != size:
            size, since = len(text), time.monotonic()
    return text


def saved(directory: str, wait: float = 0.0) -> list[dict[str, object]]:
    """The dumps the ranks wrote when a stop signal reached them (RANK.stopped), with the node from their pid
    file: one dict per rank that has one (rank, host, pid, state "ok", text). A rank stopped after its script
    ended with an exception gives the stack it ended at (RANK.ended) instead. ``wait``: seconds at most, in all,
    for dumps still being written (:func:`_whole`; right after a stop)."""
    hosts = {a.rank: a for a in armed(directory)}
    out: list[dict[str, object]] = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    here, deadline = this_host(), time.monotonic() + wait
    for name in names:
        rank = name.removesuffix(STACKS_STOP_SUFFIX)
        if not name.endswith(STACKS_STOP_SUFFIX) or not rank.isdigit() or len(rank) > 9:
            continue
        text = _whole(os.path.join(directory, name), hosts.get(int(rank)), here, deadline)
        # a rank whose script had already ended with an exception (a peer stopped before it broke its
        # all_reduce) was stopped in its teardown, outside the job's code: where its script was is the stack
        # the RUNNER saved as it ended
        ended = _read_from(os.path.join(directory, f"{rank}{STACKS_ENDED_SUFFIX}"), 0) if text.strip() else ""
        if ended.strip():
            text = ended
        if text.strip():
            a = hosts.get(int(rank))
            out.append({"rank": int(rank), "host": a.host if a else "", "pid": a.pid if a else 0, "state": "ok",
                        "text": text})
    return sorted(out, key=lambda e: int(str(e["rank"])))


NODE_USAGE = "usage: slurmlaunch stacks-node DIR [--timeout SECONDS]"


def node_main(argv: Sequence[str]) -> int:
    """`slurmlaunch stacks-node DIR [--timeout S]`: collect this node's ranks, one JSON line each on stdout."""
    args = list(argv)
    timeout = 10.0
    if "--timeout" in args:
        at = args.index("--timeout")
        try:
            timeout = float(args[at + 1])
        except (IndexError, ValueError):
            sys.stderr.write(f"slurmlaunch: error: stacks-node --timeout needs seconds ({NODE_USAGE})\n")
            return 2
        del args[at:at + 2]
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write(f"slurmlaunch: error: {NODE_USAGE}\n")
        return 2
    for entry in collect(args[0], this_host(), max(0.0, min(timeout, 600.0))):
        sys.stdout.write(json.dumps(entry) + "\n")
    sys.stdout.flush()
    return 0


def source_line(path: str, line: int) -> str | None:
    """Line ``line`` of the file ``path`` when it is readable here (the job's code, on a shared file system)."""
    import linecache

    if not path.startswith("/") or not line:
        return None
    try:
        if os.path.getsize(path) > (8 << 20):
            return None
    except OSError:
        return None
    return linecache.getline(path, line) or None


def answers(entries: Sequence[dict[str, object]], timeout: float) -> list[RankStacks]:
    """The collectors' entries as ranks' answers: the parsed threads, or why there are none."""
    out: list[RankStacks] = []
    for e in entries:
        rank, host, state = int(str(e["rank"])), str(e.get("host", "")), e.get("state")
        if state == "ok":
            threads = tuple(parse(str(e.get("text", ""))))
            out.append(RankStacks(rank, host, threads, None if threads else "its dump holds no stack"))
        elif state == "ended":
            out.append(RankStacks(rank, host, (), "its process has ended"))
        else:
            out.append(RankStacks(rank, host, (), f"no dump within {timeout:g}s (its process is stopped, or "
                                                  f"the script installed its own {DUMP_SIGNAL.name} handler)"))
    return out


def saved_summary(directory: str, lost: Mapping[int, tuple[str, str]] | None = None,
                  wait: float = SAVED_WAIT_S) -> list[str]:
    """One line per group of the stacks the ranks saved when a stop signal reached them ([] when none did),
    also written to ``directory``/summary for `slurmlaunch stacks` and --wait. ``lost``: ranks that could
    save none, rank -> (host, why) (their host was lost), named rather than left out. The file is written
    empty when no rank saved one: --wait waits for it after a stop, and an empty one says the batch step
    looked and found nothing (without it, --wait waited out its whole bound)."""
    ranks = answers(saved(directory, wait), 0)
    ranks += [RankStacks(rank, host, (), why) for rank, (host, why) in sorted((lost or {}).items())
              if all(r.rank != rank for r in ranks)]
    lines = group(ranks, source_line).lines() if ranks else []
    try:
        path = os.path.join(directory, STACKS_SUMMARY_NAME)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(line + "\n" for line in lines))
    except OSError:
        pass
    return lines


SUMMARY_USAGE = "usage: slurmlaunch stacks-summary DIR"


def summary_main(argv: Sequence[str], lost: Mapping[int, tuple[str, str]] | None = None,
                 wait: float = SAVED_WAIT_S) -> int:
    """`slurmlaunch stacks-summary DIR` (the batch script, after the ranks ended): the grouped stacks the
    ranks saved when they were stopped, on stderr, prefixed as the batch log's other lines (``lost``: see
    :func:`saved_summary`)."""
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write(f"slurmlaunch: error: {SUMMARY_USAGE}\n")
        return 2
    lines = saved_summary(argv[0], lost, wait)
    if lines:
        sys.stderr.write(f"slurmlaunch: {STOPPED_HEADER} ({len(lines)} group(s); every thread in {argv[0]}):\n")
        sys.stderr.write("".join(f"slurmlaunch:   {line}\n" for line in lines))
    return 0


STOPPED_HEADER = "where the ranks were when they were stopped"
