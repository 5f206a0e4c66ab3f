"""The job commands for jobs that live on a remote Slurm or PBS cluster (a record with a "remote" key).

The laptop keeps the record (the index points at it, with the destination), so `status`, `logs`, `cancel`
and `list` know where to ask. They ask through the scheduler's own edge (schedulers.slurm / schedulers.pbs)
with the ssh runner plugged in (remote_runner.SshRunner): the code that answers for a job of this machine
answers for a remote one. `submit --remote` is remote_submit; following a job, remote_follow.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ...core.errors import JobStateError, SchedulerError, SlurmLaunchError
from ...schedulers import same_job
from ...schedulers.interface import QuickStates, Scheduler
from ...schedulers.runner import READ_LIMIT, use_runner
from ..records import JobRecord, checked_status
from .dest import parse_destination
from .follow import RemoteFollower
from .runner import SshRunner
from .ssh import Connection
from .submit import _project_name, submit_remote

__all__ = ["_project_name", "cancel", "list_row", "logs", "status",
           "submit_remote"]


# -- the job commands, for a record with a "remote" key: the edge of its scheduler, over the ssh runner --

@contextlib.contextmanager
def login_node(record: JobRecord, deadline: float | None = None) -> Iterator[tuple[SshRunner, Scheduler]]:
    """The record's scheduler edge with its commands (and file reads) on the record's login node; every
    command done by ``deadline`` (time.monotonic()) when one is given."""
    from ...schedulers.registry import scheduler

    edge = scheduler(record.scheduler)
    with Connection(parse_destination(str(record.remote)), tuple(record.data.get("remote_setup") or ())) as conn:
        runner = SshRunner(conn, deadline)
        with use_runner(runner):
            yield runner, edge


def status(record: JobRecord) -> dict[str, Any]:
    from ...core.jobfiles import JobFiles
    from ...schedulers import is_final
    from ...schedulers.runner import read_file

    with login_node(record) as (_, edge):
        st = checked_status(record, edge)[0]
        failure = None
        if is_final(st.state) and st.exit_code != 0:  # the first-failure line, as --wait shows it
            data = read_file(JobFiles(record.log_dir, record.tag).failure, limit=4096)
            lines = [line for line in (data or b"").decode("utf-8", errors="replace").splitlines() if line.strip()]
            failure = lines[0].removeprefix("slurmlaunch: ") if lines else None
    return {"job_id": record.shown_id, "scheduler": record.scheduler, "remote": record.remote, "state": st.state,
            "exit_code": st.exit_code, "nodes": st.nodes, "elapsed": st.elapsed,
            **({"note": st.note} if st.note else {}), **({"failure": failure} if failure else {})}


def logs(record: JobRecord, path: str, follow: bool) -> int:
    """Print the remote log ``path`` (with ``follow``: as it grows, until the job ends), in bounded reads."""
    from ..follow import follow as follow_job

    with login_node(record) as (runner, edge):
        if follow:
            return follow_job(record.full_id, RemoteFollower(runner, edge, record.full_id, record.log_dir, path),
                              None)
        offset = 0
        while True:
            data = runner.read(path, offset, READ_LIMIT)
            if data is None and offset == 0:
                raise JobStateError(f"no log {path!r} on {runner.conn.dest.target} yet")
            sys.stdout.buffer.write(data or b"")
            offset += len(data or b"")
            if data is None or len(data) < READ_LIMIT:
                sys.stdout.flush()
                return 0


def cancel(record: JobRecord, ended: Callable[[Scheduler], str | None]) -> tuple[str | None, str]:
    """Cancel the job unless ``ended`` (asked over the same connection) says how it already ended: (that, or
    None; what was cancelled, in words, or "")."""
    from ..follow import cancel_where_it_runs

    with login_node(record) as (_, edge):
        was = ended(edge)
        if was is None:
            return None, cancel_where_it_runs(edge, record.full_id, record.log_dir, record.shown_id)
    return was, ""


def _quick_state(record: JobRecord, job: str, quick: QuickStates | None, here: bool) -> str | None:
    """A job's state from its destination's one `squeue --me` (and `sacct`), or None where `status`'s word is
    needed: the scheduler answers for many jobs at once only where ``quick`` (PBS: never), a live job of that
    id submitted at another time is another job, and where the destination's cluster is not the one the record
    names (``here`` False: started again, replaced), an ended one of that id may be too."""
    if quick is None:
        return None
    if quick.live and job in quick.live:
        return quick.live[job] if same_job(record.data.get("identity"), quick.seen.get(job)) is not False else None
    return quick.ended.get(job) if here else None


LIST_BOUND_S = 30.0  # `list` waits this long in all for every destination's answer


def _destination(records: list[tuple[JobRecord, Mapping[str, Any]]], deadline: float) -> dict[str, str]:
    """One destination's states for `list`, over one connection: its queue's, and for each of ``records``
    the queue no longer shows, its state as `status` reads it there."""
    record, row = records[0]
    states: dict[str, str] = {}  # by row (_row_key): two records of one destination may name one reused id
    with login_node(record, deadline) as (_, edge):
        quick = edge.quick_states(None) if edge.lists_in_one_call else None
        if quick is not None:  # by id, for a row not asked about here (list_row of one row): unchecked
            states.update({**quick.ended, **(quick.live or {})})
        cluster = edge.cluster() if quick is not None else {}
        for record, row in records:
            recorded = record.data.get("cluster")
            here = not cluster or not isinstance(recorded, dict) or \
                {k: v for k, v in recorded.items() if k != "remote"} == cluster
            found = _quick_state(record, str(row["job_id"]), quick, here)
            states[_row_key(row)] = found if found is not None else _job_state(record, edge)
    return states


def prefetch(rows: list[dict[str, Any]], live: dict[str, dict[str, str] | None],
             bound: float = LIST_BOUND_S) -> None:
    """Fill `list`'s per-destination cache ``live`` for the remote ``rows``: every destination asked at the
    same time, each over its own connection, all within ``bound`` seconds; one that has not answered by then
    (or cannot be reached) gets no states, and one line on stderr says why."""
    import threading
    import time

    groups: dict[str, list[tuple[JobRecord, Mapping[str, Any]]]] = {}
    for row in rows:
        record = _record(row)
        if record is not None:
            groups.setdefault(_key(record, row), []).append((record, row))
    deadline = time.monotonic() + bound
    said: dict[str, str] = {}

    def ask(key: str, records: list[tuple[JobRecord, Mapping[str, Any]]]) -> None:
        try:
            live[key] = _destination(records, deadline)
        except (SlurmLaunchError, OSError) as e:  # unreachable now: no quick state, and one line saying why
            said[key] = str(e)

    threads = {key: threading.Thread(target=ask, args=(key, records), name=f"list {key.split(chr(0))[0]}",
                                     daemon=True) for key, records in groups.items()}
    for thread in threads.values():
        thread.start()
    for key, thread in threads.items():
        # each command is bounded by the deadline; closing a connection (ssh -O exit) may take a little more
        thread.join(max(0.0, deadline - time.monotonic()) + 20)
        if key not in live:
            live[key] = None
            target = key.split("\0")[0]
            why = said.get(key) or f"no answer within {bound:.0f}s"
            sys.stderr.write(f"slurmlaunch: list: no states from {target}: {why}\n")


def list_row(row: Mapping[str, Any], live: dict[str, dict[str, str] | None]) -> dict[str, Any]:
    """`list`'s row for a remote job: a quick state from one `squeue --me` (and `sacct`) per destination and
    --remote-setup lines (``live`` caches it; PBS: the job's qstat), its files' place as DEST:DIR. `status`
    asks properly."""
    target = str(row["remote"])
    record = _record(row)
    if record is None:
        return {**row, "state": "record gone", "directory": f"{target}:?"}
    key = _key(record, row)
    if key not in live:
        prefetch([dict(row)], live)
    known = live[key]
    state = "?" if known is None else known.get(_row_key(row)) or known.get(str(row["job_id"]), "ENDED")
    return {**row, "state": state, "directory": f"{target}:{record.log_dir}"}


def _row_key(row: Mapping[str, Any]) -> str:
    return f"{row['record']}\0{row['job_id']}"


def _record(row: Mapping[str, Any]) -> JobRecord | None:
    from ...schedulers.index import read_bounded

    try:
        return JobRecord.from_json(read_bounded(str(row["record"])).decode("utf-8"), str(row["job_id"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _key(record: JobRecord, row: Mapping[str, Any]) -> str:
    """The cache key of a row's destination, one connection each: the setup lines too (another job's may be
    what makes this destination's squeue reachable), and the scheduler (whose edge asks)."""
    setup = "\n".join(record.data.get("remote_setup") or ())
    return f"{row['remote']}\0{setup}\0{record.scheduler}"


def _job_state(record: JobRecord, edge: Scheduler) -> str:
    """`list`'s word for a job the destination's queue (and accounting) does not show (a PBS job: any): as
    `status` reads it there (the exit-code file its script wrote, scontrol's record, qstat), "RUNNING",
    "COMPLETED" or "FAILED 3"; ENDED when none of them says how; "?" when it could not be asked."""
    try:
        st = checked_status(record, edge)[0]
    except SchedulerError:
        return "?"
    return st.state if st.exit_code in (0, None) else f"{st.state} {st.exit_code}"

