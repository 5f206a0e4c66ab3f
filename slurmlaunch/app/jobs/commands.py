"""Job commands over the records `submit` keeps: list, status, logs, cancel.

Every submission appends one line to a per-user index ($XDG_STATE_HOME/slurmlaunch/jobs.jsonl, by default
~/.local/state/slurmlaunch/jobs.jsonl) pointing at the record beside the job's logs.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ...core.errors import JobStateError, SchedulerError, SlurmLaunchError, SpecError
from ...core.jobfiles import JobFiles
from ...schedulers import same_job
from ...schedulers.index import index_path, read_bounded
from ...schedulers.registry import NAMES, scheduler
from ..records import (
    GONE,
    OTHER,
    UNVERIFIED,
    JobRecord,
    checked_status,
    element_id,
    gone_line,
    unverified_line,
    whose,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...core.spec import JobSpec
    from ...schedulers.interface import QuickStates, Scheduler
    from .listing import Filters


_FIELDS = ("job_id", "scheduler", "record")


def entries() -> list[dict[str, Any]]:
    """The index's submissions, oldest first. A line that is not one of ours (truncated by a full disk,
    binary, edited by hand, of the wrong JSON type) is skipped, and the skips are said once on stderr with
    the file and the first bad line's number: one bad line must not hide every job."""
    path = index_path()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return []
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            bad.append(number)
            continue
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) and row[k] for k in _FIELDS):
            bad.append(number)
            continue
        row.setdefault("name", "")
        row.setdefault("submitted_at", "")
        rows.append(row)
    if bad:
        sys.stderr.write(f"slurmlaunch: warning: skipped {len(bad)} unreadable line(s) of {path} (first: line "
                         f"{bad[0]}); the other jobs are listed\n")
    return rows


def find(job_id: str, gone_ok: bool = False) -> JobRecord:
    """The record of ``job_id`` (the latest submission of that id: ids restart on a new cluster).
    ARRAYID_INDEX names one element of a job array (its record's ``element``). ``gone_ok``: where the
    record was removed (with its submit directory), a job of a queued scheduler on this machine is still
    the scheduler's to answer for: a record holding only what the index knows, ``record_gone`` its path.
    A later run's id of a job submitted again at the warning (PBS; not in the index) names the first job's
    record, with ``named`` and ``run`` saying which run it is."""
    from ...core.limits import MAX_ARRAY_INDEX, is_digits, parse_count

    pbs_element = re.fullmatch(r"(\d+)\[(\d+)\](?:\.[\w.-]+)?", job_id)  # qstat's spelling: 1234[3].server
    if pbs_element:
        return find(f"{pbs_element[1]}_{pbs_element[2]}", gone_ok)
    base, sep, element = job_id.partition("_")
    if sep and is_digits(element):
        array = find(base)
        indices = array_indices(array)
        if parse_count(f"job {base}: array element", element, 0, MAX_ARRAY_INDEX) not in indices:
            raise JobStateError(f"job {job_id!r}: job {base} has no array element {element} "
                                f"(its elements: {_shown_indices(indices)})")
        return array.of_element(element)
    rows = entries()
    named = [entry for entry in reversed(rows) if _names(entry["job_id"], job_id)]
    if named:
        return _load(_of_this_cluster(named), job_id, gone_ok)
    for entry in reversed(rows):
        later = _later_run(entry, job_id)
        if later is not None:
            return replace(_load(entry, entry["job_id"], gone_ok), named=later[0], run=later[1])
    raise JobStateError(f"job {job_id!r} was not submitted from here (slurmlaunch list shows those that were)")


def _of_this_cluster(named: list[dict[str, Any]]) -> dict[str, Any]:
    """Of the index's submissions of one id (newest first), the newest of the cluster this machine's client talks
    to, where they were submitted to different clusters (two clusters side by side share one index); else the
    newest. The cluster is asked only then."""
    if len(named) == 1:
        return named[0]
    records = [(entry, _list_record(entry)) for entry in named if not entry.get("remote")]
    clusters = {json.dumps(record.data.get("cluster"), sort_keys=True) for _, record in records if record}
    if len(clusters) < 2:
        return named[0]
    here = {name: _cluster_here(name) for name in {entry["scheduler"] for entry, _ in records}}
    return next((entry for entry, record in records if record is not None and here[entry["scheduler"]]
                 and record.data.get("cluster") == here[entry["scheduler"]]), named[0])


def _names(full_id: str, job_id: str) -> bool:
    """Whether ``job_id`` names the job the scheduler printed as ``full_id`` (PBS: 1234.server, 1234[].server;
    1234 names them too)."""
    return full_id == job_id or full_id.split(".", 1)[0].removesuffix("[]") == job_id


def _later_run(entry: Mapping[str, Any], job_id: str) -> tuple[str, int] | None:
    """(its full id, which run) when ``job_id`` names a resubmission at the warning of the index's job
    ``entry`` (PBS: the batch step lists them in the first job's job-ID.requeued, beside its record; they have
    no line of their own in the index); None otherwise, and for a remote job, whose files are not here."""
    if entry.get("remote") or entry["scheduler"] not in NAMES:
        return None
    edge = scheduler(entry["scheduler"])
    if not edge.queued:
        return None
    chain = edge.resubmissions(entry["job_id"], os.path.dirname(entry["record"]))
    return next(((full, at + 2) for at, full in enumerate(chain) if _names(full, job_id)), None)


def _load(entry: Mapping[str, Any], job_id: str, gone_ok: bool) -> JobRecord:
    """The record an index line points at (see :func:`find`)."""
    try:
        data = json.loads(read_bounded(entry["record"]).decode("utf-8"))
    except FileNotFoundError:
        if gone_ok and entry["scheduler"] in NAMES and scheduler(entry["scheduler"]).queued and \
                not entry.get("remote"):
            return JobRecord.from_data({"job_id": entry["job_id"].split(".", 1)[0].removesuffix("[]"),
                                        "scheduler": entry["scheduler"], "record_gone": entry["record"],
                                        "log_dir": os.path.dirname(entry["record"])}, entry["job_id"])
        raise JobStateError(f"job {job_id}: its record {entry['record']!r} is gone") from None
    except (OSError, ValueError) as e:
        raise JobStateError(f"job {job_id}: its record {entry['record']!r} cannot be read ({e})") from None
    try:
        return JobRecord.from_data(data, entry["job_id"])
    except ValueError:
        raise JobStateError(f"job {job_id}: {entry['record']!r} is not a slurmlaunch job record") from None


def _edge(record: JobRecord) -> Scheduler:
    return scheduler(record.scheduler)


def recorded_spec(record: JobRecord) -> JobSpec:
    """The job description a record holds, as far as the job commands need it (layout, array, mode)."""
    from ...core.spec import JobSpec

    saved = record.data.get("spec", {})
    keep = ("nodes", "gpus_per_node", "tasks_per_node", "array", "mode", "nproc_per_node", "output_dir")
    sweep = tuple((k, tuple(v)) for k, v in saved.get("sweep", ()))
    return JobSpec.of(script="", sweep=sweep, **{k: saved[k] for k in keep if k in saved})


def array_indices(record: JobRecord) -> list[int]:
    """The indices of a recorded job array's elements ([] for a plain job)."""
    return recorded_spec(record).array_indices


def _shown_indices(indices: list[int]) -> str:
    return ", ".join(map(str, indices[:10])) + (", ..." if len(indices) > 10 else "")


def status(record: JobRecord) -> dict[str, Any]:
    if record.remote:
        from ..remote import jobs as remote_jobs

        return remote_jobs.status(record)
    shown_id = record.shown_id
    indices = array_indices(record) if record.element is None else []
    edge = _edge(record)
    st, verdict = checked_status(record, edge, indices)
    if verdict == UNVERIFIED:
        st = replace(st, note="; ".join(filter(None, (st.note, f"not verified: {unverified_line(record, edge)}"))))
    info: dict[str, Any] = {"job_id": shown_id, "scheduler": record.scheduler, "state": st.state,
                            "exit_code": st.exit_code, "nodes": st.nodes, "elapsed": st.elapsed}
    if st.elements is not None:
        info["elements"] = st.elements
    if record.named is not None:  # a later run's id: the chain's state, and which run the id is
        info.update(named=record.named, run=record.run)
        said = f"run {record.run}: resubmitted at the warning as job {record.named}"
        if st.note is None or not st.note.startswith(said):  # the latest run's note names it already
            info["note"] = f"job {record.named} is its {said.partition(':')[0]}"
    if st.note:
        info["note"] = f"{info['note']}; {st.note}" if "note" in info else st.note
    failure = first_failure(record, st.state, st.exit_code)
    if failure:
        info["failure"] = failure
    return info


def first_failure(record: JobRecord, state: str, code: int | None) -> str | None:
    """The job's first-failure line as --wait shows it ("rank 3 on node2 failed first with exit code 7; ..."),
    from the file the batch step left, once the job has ended badly; None otherwise."""
    from ...schedulers import is_final
    from ..follow import failure_lines

    if not is_final(state) or code == 0 or record.element is None and array_indices(record):
        return None  # a whole array's elements each say their own
    found = failure_lines(record.log_dir, record.tag)
    return found[0].removeprefix("slurmlaunch: ") if found else None


def _exit_file(record: JobRecord) -> tuple[int, str | None] | None:
    """(exit code, state) from the job's exit file: "CODE" or, from the local scheduler, "CODE\\nSTATE"."""
    try:
        text = read_bounded(JobFiles(record.log_dir, record.tag).exit_code, 4096).decode()
        lines = text.split()
        return int(lines[0]), (lines[1] if len(lines) > 1 else None)
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None


def log_path(record: JobRecord, rank: int | None) -> str:
    log_dir, job = record.log_dir, record.tag
    indices = array_indices(record)
    if indices and record.element is None:
        raise SpecError(f"job {job} is an array of {len(indices)} jobs: name one, e.g. {job}_{indices[0]} "
                        f"(its elements: {_shown_indices(indices)})")
    edge = scheduler(record.scheduler)
    if rank is not None and edge.shared_output:
        raise SpecError(f"logs --rank: {edge.shared_output} (leave out --rank)")
    spec = recorded_spec(record)
    if rank is not None and not 0 <= rank < spec.world_size:
        raise SpecError(f"logs --rank {rank}: job {job} has ranks 0-{spec.world_size - 1}")
    files = JobFiles(log_dir, job, spec.log_unit, spec.ranks_per_log)
    if rank is not None:  # in torchrun mode one file per node holds all its ranks
        return files.rank_log(rank)
    printed = str(record.data.get(f"{record.scheduler}_job_id", job))  # as submit printed it (PBS: 1234.server)
    return edge.output_log(log_dir, job, printed) or files.log(0)


def _same_cluster(record: JobRecord, current: Mapping[str, str] | None) -> bool:
    """Whether ``current`` (the cluster the scheduler's client here talks to) may be the one the record's job
    was submitted to: True where either is not known (an older record, a scheduler that cannot say)."""
    recorded = record.data.get("cluster")
    return not recorded or not current or dict(recorded) == dict(current)


def _list_state(row: Mapping[str, Any], quick: Mapping[str, QuickStates | None],
                clusters: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """A quick state for `list` (``clusters``: by scheduler, the cluster its client here talks to): a local
    job's from its edge (its files and supervisor); a queued job's from its scheduler's queue or
    accounting (one call each for all its jobs, ``quick``, by scheduler: its live states None when the queue
    could not be asked), else from the exit code its script wrote, else from the scheduler's status where it
    has no such call (PBS); `status` asks the scheduler properly."""
    try:
        data = json.loads(read_bounded(row["record"]).decode("utf-8"))
    except (OSError, ValueError):
        return "record gone"
    try:
        record = JobRecord.from_data(data, row["job_id"])
    except ValueError:
        return "?"
    edge = scheduler(record.scheduler)
    if not edge.queued:  # no queue to ask: its edge reads the job's files and its supervisor
        return _asked_list_state(record)
    short = row["job_id"].split(".", 1)[0]
    states = quick.get(record.scheduler)
    live = states.live if states is not None else None
    # the queue's word is this job's only where its cluster is the one asked, and a live job of that id was
    # submitted when this one was (a job id is not a job: see app/records.py's whose)
    here = _same_cluster(record, (clusters or {}).get(record.scheduler))
    if here and live is not None and short in live and \
            (states is None or same_job(record.data.get("identity"), states.seen.get(short)) is not False):
        return live[short]
    ended = _exit_file(record)
    if ended is not None:
        return "COMPLETED" if ended[0] == 0 else f"FAILED {ended[0]}"
    if not here:
        return "ENDED"  # the cluster it ran on is not the one this machine's client asks: its files said nothing
    if states is not None and short in states.ended and not (live is not None and short in live):
        return states.ended[short]  # an array (no job-level exit code), or a job stopped before its script's end
    if not edge.lists_in_one_call and not record.remote:
        return _asked_list_state(record)
    # gone from the queue, without an exit code or accounting: ended, how is not known (`status` says why)
    return "ENDED" if live is not None else "?"


def _asked_list_state(record: JobRecord) -> str:
    """A job's state from its scheduler's status (PBS: the real qstat, as `status` reads it: a running
    array's job_state B is RUNNING, a finished one's subjobs say how it ended); "?" when it cannot tell (the
    server gone, the job's history expired). One call per such job that left no exit code: PBS has no squeue
    of all jobs at once that keeps finished ones with their exit status."""
    try:
        info = status(record)
    except (SlurmLaunchError, OSError, ValueError):  # list shows every row, whatever one of them meets
        return "?"
    code = info.get("exit_code")
    return f"{info['state']} {code}" if info["state"] == "FAILED" and code else str(info["state"])


def _list_record(row: Mapping[str, Any]) -> JobRecord | None:
    try:
        data = json.loads(read_bounded(row["record"]).decode("utf-8"))
        return JobRecord.from_data(data, row["job_id"])
    except (OSError, ValueError):
        return None


def _quick_states(rows: list[dict[str, Any]]) -> dict[str, QuickStates | None]:
    """By scheduler (those of ``rows`` of this machine that answer for many jobs at once): its quick states,
    asked once for all; accounting is asked only of the jobs whose script left no exit code (an array's
    elements have theirs; a cancelled job's script never wrote one). None where the queue could not be asked."""
    from ...schedulers.interface import QuickStates

    ids: dict[str, list[str]] = {}
    for row in rows:
        if row.get("remote") or row["scheduler"] not in NAMES:
            continue
        edge = scheduler(row["scheduler"])
        if not edge.queued or not edge.lists_in_one_call:
            continue
        wanted = ids.setdefault(edge.name, [])
        record = _list_record(row)
        if record is not None and _exit_file(record) is None:
            wanted.append(row["job_id"].split(".", 1)[0])
    out: dict[str, QuickStates | None] = {}
    for name, job_ids in ids.items():
        try:
            out[name] = scheduler(name).quick_states(job_ids)
        except SchedulerError:
            out[name] = QuickStates(None)
    return out


def _cluster_here(name: str) -> dict[str, str]:
    """The cluster the client of scheduler ``name`` here talks to ({} where it cannot say)."""
    if name not in NAMES or not scheduler(name).queued:
        return {}
    try:
        return scheduler(name).cluster()
    except SlurmLaunchError:
        return {}


def cmd_list(as_json: bool, filters: Filters | None = None, prune: bool = False) -> int:
    """Every job this user submitted (the index is per user), newest last, with the directory of its files
    and a quick state; only those ``filters`` keep (app/jobs/listing.py). ``prune``: remove those (that have
    ended) from the index instead; their files stay."""
    from . import listing

    filters = filters or listing.Filters()
    rows = [r for r in entries() if listing.matches_time_and_name(r, filters)]
    quick = _quick_states(rows)
    clusters = {name: _cluster_here(name) for name in {r["scheduler"] for r in rows if not r.get("remote")}}
    remote_live: dict[str, dict[str, str] | None] = {}  # per destination: one squeue over ssh for all its jobs
    if any(r.get("remote") for r in rows):
        from ..remote import jobs as remote_jobs

        remote_jobs.prefetch([r for r in rows if r.get("remote")], remote_live)  # all at once, one bound
    shown = []
    for row in rows:
        if row.get("remote"):
            from ..remote import jobs as remote_jobs

            shown.append(remote_jobs.list_row(row, remote_live))
        else:
            shown.append({**row, "state": _list_state(row, quick, clusters),
                          "directory": os.path.dirname(row["record"])})
    shown = [r for r in shown if listing.matches_state(str(r.get("state", "")), filters)]
    if prune:
        return listing.cmd_prune(shown, filters)
    if as_json:
        print(json.dumps(shown))
        return 0
    if not shown:
        print(f"no jobs submitted yet (the index is {index_path()})" if not rows and filters == listing.Filters()
              else "no job matches")
        return 0
    cells = [{key: _cell(r.get(key, "")) for key in ("job_id", "scheduler", "state", "submitted_at", "name",
                                                     "directory")} for r in shown]
    width = max(6, *(len(r["job_id"]) for r in cells))
    states = max(10, *(len(r["state"]) for r in cells))  # "record gone" is wider than STATE
    print(f"{'JOB ID':>{width}}  {'SCHED':<6} {'STATE':<{states}} {'SUBMITTED':<24} {'NAME':<20} DIRECTORY")
    for r in cells:
        print(f"{r['job_id']:>{width}}  {r['scheduler']:<6} {r['state']:<{states}} {r['submitted_at']:<24} "
              f"{r['name']:<20} {r['directory']}")
    for line in listing.legend([r["state"] for r in cells]):
        sys.stderr.write(f"slurmlaunch: {line}\n")
    return 0


def _cell(value: object) -> str:
    """One cell of `list`'s table as printable characters only: a control character in a job's id, name or
    directory (an index line edited by hand, a remote login node's answer) is shown escaped (\\x1b, \\n), never
    sent to the terminal, where an escape sequence could rewrite the screen or a newline or \\r break a row."""
    text = str(value)
    return text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def cmd_status(job_id: str, as_json: bool) -> int:
    from ...schedulers import is_final

    record = find(job_id, gone_ok=True)
    if "record_gone" in record.data:
        sys.stderr.write(f"slurmlaunch: job {job_id}: its record {record.data['record_gone']!r} is gone (its "
                         f"directory was removed); what {record.scheduler} says of it:\n")
    info = status(record)
    if as_json:
        print(json.dumps(info))
    else:
        code = f", exit code {info['exit_code']}" if info["exit_code"] is not None else \
            ", exit code unknown" if is_final(str(info["state"])) else ""
        nodes = f" on {info['nodes']}" if info["nodes"] else ""
        elapsed = f", elapsed {info['elapsed']}" if info.get("elapsed") else ""
        note = f" ({info['note']})" if info.get("note") else ""
        print(f"job {info['job_id']} ({info['scheduler']}): {info['state']}{nodes}{elapsed}{code}{note}")
        if info.get("failure"):  # the line --wait ended with
            print(f"  {info['failure']}")
        for index, state in info.get("elements", {}).items():
            print(f"  {element_id(info['job_id'], index)}: {state}")
    return 0


def cmd_logs(job_id: str, rank: int | None, follow: bool) -> int:
    record = find(job_id)
    path = log_path(record, rank)
    if record.named is not None:  # said on stderr: stdout stays the log's bytes
        sys.stderr.write(f"slurmlaunch: job {record.named} is run {record.run} of job {record.full_id}, resubmitted "
                         f"at the warning: every run's output is in {path}\n")
    if record.remote:
        from ..remote import jobs as remote_jobs

        return remote_jobs.logs(record, path, follow)
    if not follow:
        try:
            with open(path, "rb") as f:
                sys.stdout.buffer.write(f.read())
        except OSError as e:
            raise JobStateError(f"no log {path!r} yet ({e.strerror})") from None
        return 0
    from ..follow import follow as follow_job
    from ..follow import poll_seconds

    edge = _edge(record)
    return follow_job(record.shown_id, lambda: checked_status(record, edge)[0], path, files_id=record.tag,
                      poll=poll_seconds(edge))


def already_ended(edge: Scheduler, record: JobRecord) -> str | None:
    """How a job that has already ended ended ("COMPLETED, exit code 0"); None while it has not, or when its
    scheduler cannot say now (cancel then asks the scheduler anyway, whose refusal is shown)."""
    from ...core.errors import SchedulerError

    indices = array_indices(record) if record.element is None else []
    try:
        verdict, seen = whose(record, edge)
    except SchedulerError as e:  # nothing is sent to a job not known to be ours
        raise SchedulerError(f"{e}: nothing cancelled") from None
    if verdict == UNVERIFIED:
        raise JobStateError(f"{unverified_line(record, edge)}: nothing cancelled (where it is, cancel it with the "
                            f"scheduler's own command)")
    if verdict in (GONE, OTHER):
        return gone_line(record, edge, verdict, seen)
    try:
        st = edge.status(record.full_id, record.log_dir, indices)
    except SchedulerError:
        return None
    if not st.finished:
        return None
    return st.state if st.exit_code is None else f"{st.state}, exit code {st.exit_code}"


def _cancel_here(record: JobRecord) -> tuple[str | None, str]:
    """Cancel a job of this machine: (how it had ended when it already had, then nothing is sent; what was
    cancelled, in words)."""
    from ...schedulers.choice import scheduler
    from ..follow import cancel_where_it_runs

    edge = scheduler(record.scheduler)
    ended = already_ended(edge, record)
    if ended is None:
        return None, cancel_where_it_runs(edge, record.full_id, record.log_dir, record.shown_id)
    return ended, ""


def cmd_cancel(job_id: str) -> int:
    """Cancel a job. One that has already ended is left alone and said so, with exit code 0 as scancel
    gives: what cancel is for, that the job no longer runs, holds."""
    record = find(job_id)
    if record.remote:
        from ..remote import jobs as remote_jobs

        ended, cancelled = remote_jobs.cancel(record, lambda edge: already_ended(edge, record))
    else:
        ended, cancelled = _cancel_here(record)
    if ended is not None:
        if ended.startswith(f"job {record.shown_id} is gone"):
            print(f"{ended}: nothing cancelled")
            return 0
        if record.named is not None:
            print(f"job {record.named} (run {record.run} of job {record.full_id}) had already ended, as had every "
                  f"run after it ({ended}): nothing to cancel")
            return 0
        print(f"job {record.shown_id} had already ended ({ended}): nothing to cancel")
        return 0
    print(f"cancelled {cancelled}")
    return 0
