"""`list`'s filters (--state, --since, --before, a name) and --prune, over the index's rows (schedulers/index.py).

Pure where it can be: :func:`parse_when` and :func:`matches` take values and return values; :func:`prune` is
the one place that rewrites the index."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

from ...core.errors import SpecError

# What `list` says of a job whose state it cannot tell, and what it means (said under the table, and in docs).
UNKNOWN_STATES = {
    "?": "its scheduler could not tell the state (the record unreadable, the queue or the server not answering, "
         "its history expired)",
    "ENDED": "gone from the queue without an exit code or accounting: how it ended is not known",
    "record gone": "its record (in its output directory) was moved or deleted",
}
ALIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "QUEUED", "HELD", "WAITING")
_AGO = re.compile(r"(\d{1,6})([mhdw])")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S")


class Filters(NamedTuple):
    """What `list` keeps: states (first words, in capitals; empty: any), submitted at or after ``since`` and
    before ``before`` (Unix times; None: no bound), and ``name``: a glob over the job's name or id (None: any)."""

    states: tuple[str, ...] = ()
    since: float | None = None
    before: float | None = None
    name: str | None = None

    @property
    def by_state(self) -> bool:
        return bool(self.states)


def parse_when(text: str, flag: str, now: float | None = None) -> float:
    """--since/--before WHEN as a Unix time: a date (2026-12-01), a date and time (2026-12-01T10:00[:00], this
    machine's time zone) or an age (30m, 12h, 3d, 2w: that long before ``now``); SpecError naming the forms."""
    m = _AGO.fullmatch(text.strip())
    if m:
        return (time.time() if now is None else now) - int(m.group(1)) * _UNITS[m.group(2)]
    for form in _FORMATS:
        try:
            return datetime.strptime(text.strip(), form).timestamp()
        except ValueError:
            continue
    raise SpecError(f"{flag} {text!r} is not valid (expected a date 2026-12-01, a time 2026-12-01T10:00, or an age "
                    f"such as 30m, 12h, 3d, 2w)")


def parse_states(values: Sequence[str]) -> tuple[str, ...]:
    """--state's values (repeatable, or comma-separated) in capitals: FAILED keeps `FAILED 7` too."""
    return tuple(s.strip().upper() for v in values for s in v.split(",") if s.strip())


def submitted_at(row: Mapping[str, Any]) -> float | None:
    """The row's submission time (the index's "%Y-%m-%dT%H:%M:%S%z") as a Unix time; None when unreadable."""
    try:
        return datetime.strptime(str(row.get("submitted_at", "")), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


def matches_time_and_name(row: Mapping[str, Any], filters: Filters) -> bool:
    """Whether ``row`` passes the filters that need no state (a row without a readable time fails a time bound)."""
    if filters.name is not None and not any(fnmatchcase(str(row.get(k, "")), filters.name) or
                                            str(row.get(k, "")) == filters.name for k in ("name", "job_id")):
        return False
    if filters.since is not None or filters.before is not None:
        when = submitted_at(row)
        if when is None:
            return False
        if filters.since is not None and when < filters.since:
            return False
        if filters.before is not None and when >= filters.before:
            return False
    return True


def matches_state(state: str, filters: Filters) -> bool:
    """Whether a shown state (`FAILED 7`, `COMPLETED`, `?`) is one of --state's (by its first word, or whole)."""
    if not filters.states:
        return True
    word = state.split(" ", 1)[0].upper()
    return word in filters.states or state.upper() in filters.states


def legend(states: Sequence[str]) -> list[str]:
    """The lines that explain the states of :data:`UNKNOWN_STATES` that ``states`` hold, once each."""
    return [f"{shown}: {UNKNOWN_STATES[shown]} (slurmlaunch status JOB says more)"
            for shown in UNKNOWN_STATES if shown in states]


def alive(state: str) -> bool:
    """Whether a shown state is a job that may still run (never pruned)."""
    return state.split(" ", 1)[0] in ALIVE


def prune(path: str, drop: set[tuple[str, str]]) -> int:
    """Remove from the index at ``path`` the rows whose (job_id, record) is in ``drop``; the other lines are
    kept byte for byte (unreadable ones included: `list` warns of them). Written to a new file and renamed over
    the index; a submission appended meanwhile is kept (the rename is redone while the index grew). Returns how
    many rows were removed."""
    import json

    for _ in range(10):
        with open(path, "rb") as f:
            raw = f.read()
        kept: list[bytes] = []
        removed = 0
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                row = None
            if isinstance(row, dict) and (row.get("job_id"), row.get("record")) in drop:
                removed += 1
                continue
            kept.append(line)
        temporary = f"{path}.prune-{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(line + b"\n" for line in kept))
        if os.path.getsize(path) == len(raw):
            os.replace(temporary, path)
            return removed
        os.unlink(temporary)  # a job was submitted meanwhile: read again
    raise SpecError(f"list --prune: {path} keeps changing (jobs being submitted); try again")


def cmd_prune(shown: Sequence[Mapping[str, Any]], filters: Filters) -> int:
    """`list --prune`: the jobs in ``shown`` (`list`'s rows, after ``filters``) that have ended, removed from
    the index; one that may still run is kept and named (so is a `?`, whose scheduler did not say, unless
    --state ? asks for those). Their records and logs stay where they are."""
    import sys

    from ...schedulers.index import index_path

    unsure = "?" not in filters.states
    kept = [r for r in shown if alive(str(r.get("state", ""))) or (unsure and r.get("state") == "?")]
    drop = {(str(r["job_id"]), str(r["record"])) for r in shown if r not in kept and "record" in r}
    removed = prune(index_path(), drop) if drop else 0
    if kept:
        sys.stderr.write(f"slurmlaunch: kept {len(kept)} job(s) that may still run (or whose state is ?): "
                         f"{', '.join(str(r['job_id']) for r in kept)}\n")
    print(f"removed {removed} job(s) from {index_path()} (their logs and records stay in their directories)")
    return 0
