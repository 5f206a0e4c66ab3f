"""Thin edges to the schedulers: the only modules that run scheduler commands."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import SchedulerError, SpecError
from ..core.jobfiles import SUBMISSION_MARK, JobFiles, carries_id, own_dir
from ..core.spec import JobSpec
from .runner import run_command as run_command  # the one way edges (and doctor) run a command


@dataclass(frozen=True)
class JobStatus:
    state: str  # Slurm's words: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: int | None = None  # known once the job has ended
    nodes: str | None = None
    elements: dict[str, str] | None = None  # a job array's elements: index -> "STATE" or "STATE CODE"
    elapsed: str | None = None  # as Slurm shows it: [D-][HH:]MM:SS
    note: str | None = None  # the scheduler's word on a live job: why it waits, a node of it lost, a requeue

    @property
    def finished(self) -> bool:
        return is_final(self.state)


# Slurm's job states (squeue(1), JOB STATE CODES) in which a job may still run or run again; every other
# state, and PBS's and the local scheduler's words mapped onto Slurm's, is final. The one definition of
# "finished": the edges' "is this job still live?" and JobStatus.finished both read it.
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING",
                           "SIGNALING", "STAGE_OUT", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                           "SPECIAL_EXIT", "UNKNOWN"})


def is_final(state: str) -> bool:
    """Whether a job in ``state`` (Slurm's word) has ended for good."""
    return state not in ACTIVE_STATES


def array_outcome(job_id: str, log_dir: str, indices: Sequence[int], live: dict[int, tuple[str, str]],
                  reported: dict[int, int | None], unknown_end: str) -> JobStatus:
    """A job array as one job, from the scheduler's live elements (index -> (state, nodes)): running while
    any element is, then FAILED with the first failing element's exit code (in index order), or COMPLETED.
    An ended element's code is its exit-code file (written by our script), else what the scheduler
    ``reported``; ``unknown_end`` says what an element without either probably met."""
    codes: dict[int, int | None] = {}
    for i in indices:
        if i not in live:
            try:
                with open(JobFiles(log_dir, job_id).element(i).exit_code) as f:
                    codes[i] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                codes[i] = reported.get(i)
    elements = {str(i): live[i][0] if i in live else
                ("COMPLETED 0" if codes[i] == 0 else f"FAILED {codes[i]}" if codes[i] is not None
                 else f"ENDED without exit code ({unknown_end})")
                for i in indices}
    if live:
        states = [state for state, _ in live.values()]
        nodes = ",".join(sorted({n for _, n in live.values() if n}))
        return JobStatus("RUNNING" if "RUNNING" in states else states[0], None, nodes or None, elements)
    failed = [(i, c) for i, c in codes.items() if c != 0]
    if not failed:
        return JobStatus("COMPLETED", 0, None, elements)
    code = failed[0][1]
    return JobStatus("FAILED", code if code is not None and code > 0 else 1, None, elements)


def current_umask() -> int:
    """This process's umask, read without changing it where Linux shows it (/proc/self/status, 4.7+)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_private(path: str, text: str, mode: int = 0o640, *, exclusive: bool = False) -> None:
    """Write a file that is not world-writable (nor world-readable): scripts and records hold env values.

    Never through a link planted at ``path``: an exclusive file is created new (O_EXCL|O_NOFOLLOW:
    FileExistsError when anything is there); otherwise the text goes to a new temporary file that then
    replaces whatever ``path`` was (a link is replaced, its target untouched)."""
    if exclusive:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
        return
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory or ".")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_log_dir(path: str) -> None:
    """Create the output directory, or check an existing one is safe to write job files into: ours, and not
    world-writable unless sticky (as /tmp is): else another user could plant links or files there."""
    try:
        os.makedirs(path, mode=0o750, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        raise SpecError(f"--output-dir {path!r}: cannot create or use it ({e.strerror or e}); "
                        f"give a directory you can write to") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SpecError(f"--output-dir {path!r} is not a directory; give a directory")
    if st.st_uid != os.geteuid():
        raise SpecError(f"--output-dir {path!r} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): "
                        f"its owner could replace the job's files; give a directory of your own")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise SpecError(f"--output-dir {path!r} is writable by others ({stat.filemode(st.st_mode)}) and not "
                        f"sticky: anyone could plant links to your files there; chmod go-w it or give another")
    if not os.access(path, os.W_OK | os.X_OK):
        raise SpecError(f"--output-dir {path!r}: not writable by you; give a directory you can write to")


def write_record(spec: JobSpec, job_id: str, scheduler: str, command: Sequence[str],
                 extra: dict[str, Any] | None = None, *, exclusive: bool = False, log_dir: str | None = None) -> str:
    """The record of a submission beside its logs: what was asked, how it was submitted, where logs go
    (``log_dir``: the job's own directory where not the output directory, see :func:`submit_with`).
    ``exclusive``: the record must be new (FileExistsError otherwise): the id is ours to choose."""
    log_dir = log_dir or spec.log_dir
    files = JobFiles(log_dir, job_id, spec.log_unit)
    path = files.record
    record = {
        "job_id": job_id,
        "scheduler": scheduler,
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(command),
        "log_dir": log_dir,
        "rank_log": files.log(f"{{{spec.log_unit}}}"),
        "spec": spec.values(),
        **(extra or {}),
    }
    write_private(path, json.dumps(record, indent=2) + "\n", exclusive=exclusive)
    return path


def rank_log(spec: JobSpec, job_id: str, rank: int) -> str:
    """Rank ``rank``'s output file (in torchrun mode: node ``rank``'s, which holds all its ranks)."""
    return JobFiles(spec.log_dir, job_id, spec.log_unit).log(rank)


@dataclass(frozen=True)
class Submission:
    job_id: str  # as the scheduler prints it (PBS: 1234.server)
    script_path: str
    record_path: str
    command: list[str]
    note: str | None = None  # what the submitter should hear besides the id (the job was found after a failure)
    files_id: str = ""  # the short id that names the job's files (PBS: 1234 of 1234.server)
    log_dir: str = ""  # where its files are: the output directory, or (an id older files carry) own_dir(...)


@dataclass(frozen=True)
class Held:
    """How an edge submits a job on hold, so that its files and record are in place before it can start:
    ``hold`` turns the submit command into one that holds the job; ``cluster`` and ``identity`` say which
    cluster took it and what the scheduler says of the job (see :func:`same_job`); ``prepare(spec, command id,
    short id, log dir)`` creates what the scheduler itself would open (Slurm's batch log, exclusively) and,
    where the job's files go to a directory of their own, points the scheduler's output there; ``release``
    lets the job go; ``cancel`` removes it where its record could not be written."""

    hold: Callable[[JobSpec, list[str]], list[str]]
    cluster: Callable[[], dict[str, str]]
    identity: Callable[[str], dict[str, str] | None]
    prepare: Callable[[JobSpec, str, str, str], None]
    release: Callable[[JobSpec, str], None]
    cancel: Callable[[str], None]


def same_job(recorded: object, seen: dict[str, str] | None) -> bool | None:
    """Whether the scheduler's job (its identity ``seen``: None when it knows no such job) is the one a record
    holds (``recorded``: the record's "identity"): the submission's token decides where the scheduler shows it
    (Slurm's comment); else every field both name (and the record has a value of) must agree (its submit time,
    its name), a submit time being any of ``seen``'s "submits" where the scheduler lists each run's (sacct -D);
    None when that cannot be told: the scheduler knows no such job, or the record has no identity (written
    before records had one)."""
    if seen is None or not isinstance(recorded, dict):
        return None
    # A requeue (Slurm's after NODE_FAIL, Lightning's `scontrol requeue`) gives the same job a new submit time;
    # the token slurmlaunch put in the job is the job's own for as long as it lives.
    if recorded.get("comment") and "comment" in seen:
        return str(recorded["comment"]) == seen["comment"]
    shared = [key for key in recorded if key in seen and recorded[key]]  # recorded empty: nothing said then
    if not shared:
        return None
    runs = seen.get("submits", "").split()
    return all(str(recorded[key]) == seen[key] or (key == "submitted" and str(recorded[key]) in runs)
               for key in shared)


# The fields of a record's identity that a scheduler's answer is compared with (the token is the files' own)
IDENTITY_FIELDS = ("submitted", "name", "comment")


def taken(log_dir: str, short: str) -> bool:
    """Whether files of an older job with id ``short`` are in ``log_dir`` (its record, logs, exit code; PBS's
    output named after the id): then a new job of that id gets a directory of its own."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return False
    return any(carries_id(name, short) for name in names)


def submit_with(spec: JobSpec, script_text: str, scheduler: str, suffix: str,
                command: Callable[[JobSpec, str], list[str]], parse_id: Callable[[str], str | None],
                accepted: Callable[[SchedulerError], tuple[str, str] | None] | None = None,
                held: Held | None = None, command_id: Callable[[str], str] = lambda out: out) -> Submission:
    """Save the script beside the logs, submit it, keep a record; SchedulerError (with the command and the
    scheduler's words) when the scheduler refuses or prints no job id. ``parse_id`` maps the command's
    output to the short job id that names the files, or None. ``accepted``: after the command failed, the
    job the scheduler accepted all the same, as (what the command would have printed, a note), or None when
    it accepted none; it raises SchedulerError when that cannot be known. ``held``: the job is submitted on
    hold and released once its record (which names the cluster and the job's identity) and files are in
    place; a job whose id older files in the output directory carry gets a directory of its own there
    (jobfiles.own_dir), which its script finds by the submission's token."""
    make_log_dir(spec.log_dir)
    token = secrets.token_hex(4)
    pending = JobFiles(spec.log_dir, f"pending-{os.getpid()}-{token}").script(suffix)
    write_private(pending, script_text.replace(SUBMISSION_MARK, token), 0o750)
    cmd = command(spec, pending)
    if held is not None:
        cmd = held.hold(spec, cmd)
    note = None
    try:
        # never writable by others: the batch log and rank logs Slurm creates take the submitter's umask
        out = run_command(cmd, umask=current_umask() | 0o022).stdout.strip()
    except SchedulerError as e:
        try:
            found = accepted(e) if accepted else None
        except SchedulerError:
            os.unlink(pending)
            raise
        if found is None:
            os.unlink(pending)
            raise
        out, note = found
    short = parse_id(out)
    if short is None:
        os.unlink(pending)
        raise SchedulerError(f"{shlex.join(cmd)} printed {out!r}, not a job id")
    log_dir = spec.log_dir
    extra: dict[str, Any] = {}
    if held is not None:
        try:
            if taken(log_dir, short):
                log_dir = own_dir(spec.log_dir, short, token)
                os.mkdir(log_dir, 0o750)
                note = (f"{note}; " if note else "") + (
                    f"files of an older job {short} are in {spec.log_dir}: this job's are in {log_dir}")
            held.prepare(spec, command_id(out), short, log_dir)
            try:
                seen = held.identity(command_id(out)) or {}
            except SchedulerError as e:  # the job is taken all the same; its record cannot vouch for it later
                seen = {}
                note = (f"{note}; " if note else "") + (
                    f"what the scheduler says of job {out} could not be read ({e}): its record names no job "
                    f"identity, so `slurmlaunch cancel` will leave it to the scheduler's own command")
            extra = {"cluster": held.cluster(), "identity": {**seen, "token": token}}
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(pending)
            with contextlib.suppress(SchedulerError):  # a held job of ours no record names: never left behind
                held.cancel(command_id(out))
            raise
    script_path = JobFiles(log_dir, short).script(suffix)
    os.replace(pending, script_path)
    cmd[cmd.index(pending)] = script_path
    extra = {**extra, "script": script_path} if out == short else \
        {**extra, "script": script_path, f"{scheduler}_job_id": out}
    record = write_record(spec, short, scheduler, cmd, extra, log_dir=log_dir)
    if held is not None:
        try:
            held.release(spec, command_id(out))
        except SchedulerError as e:  # recorded, and ours: said, never cancelled
            note = (f"{note}; " if note else "") + f"job {out} is held still: {e}"
    return Submission(out, script_path, record, cmd, note=note, files_id=short, log_dir=log_dir)
