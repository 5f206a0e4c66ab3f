"""A job's record, as a value: what `submit` wrote beside the job's logs (or, for a remote job, on this
machine), and which job of it a command names (the whole job, or one element of an array).

The file is JSON written by the schedulers' write_record and remote_submit.write_local_record; it is kept whole
in ``data`` (those writers, not this class, decide its fields), and the fields the job commands read are
properties. Which job a command names is not in the file: ``full_id`` (as the scheduler printed the id,
PBS: 1234.server), ``element`` and ``named`` (a later run's id of a PBS job submitted again at the warning) come
from the index, the command line and the first job's list of its resubmissions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..schedulers import IDENTITY_FIELDS, JobStatus, same_job
from ..schedulers.registry import NAMES

if TYPE_CHECKING:
    from ..schedulers.interface import Scheduler


@dataclass(frozen=True)
class JobRecord:
    data: Mapping[str, Any]
    full_id: str
    element: str | None = None  # an array element's index: the command named ARRAYID_INDEX
    # A later run of a job submitted again at the warning (PBS): the id the command named (that run's own, as
    # qstat shows it) and which run it is (2 for the first resubmission); the record is the first job's, whose
    # files and full_id are the whole chain's.
    named: str | None = None
    run: int = 1

    @classmethod
    def from_data(cls, data: object, full_id: str) -> JobRecord:
        """The record of a parsed file; ValueError when it is not one of ours (a JSON object with a log
        directory and a known scheduler)."""
        if not isinstance(data, dict) or not isinstance(data.get("log_dir"), str) or \
                data.get("scheduler") not in NAMES:
            raise ValueError("not a slurmlaunch job record")
        return cls(data, full_id)

    @classmethod
    def from_json(cls, text: str, full_id: str) -> JobRecord:
        """The record in ``text``; ValueError when it is not JSON, or not one of ours."""
        return cls.from_data(json.loads(text), full_id)

    def to_json(self) -> str:
        """The file's text (what from_json reads back; full_id and element are not part of it)."""
        return json.dumps(dict(self.data), indent=2) + "\n"

    @property
    def job_id(self) -> str:
        return str(self.data["job_id"])

    @property
    def scheduler(self) -> str:
        return str(self.data["scheduler"])

    @property
    def log_dir(self) -> str:
        return str(self.data["log_dir"])

    @property
    def remote(self) -> str | None:
        """The ssh destination the job runs on (its files are there), or None for a job of this machine."""
        remote = self.data.get("remote")
        return str(remote) if remote else None

    @property
    def tag(self) -> str:
        """What the job's file names carry: its id, or ARRAYID_INDEX for an array element."""
        return f"{self.job_id}_{self.element}" if self.element is not None else self.job_id

    @property
    def shown_id(self) -> str:
        """The id as the user sees it from submit and the scheduler's own tools: the one the scheduler printed
        (PBS: 1234.server, as qstat shows it; Slurm: 1234), an array element's as :func:`element_id` spells it."""
        if self.element is None:
            return self.full_id
        return element_id(self.full_id.rsplit("_", 1)[0], self.element)

    def of_element(self, index: str) -> JobRecord:
        """The record naming element ``index`` of this array job."""
        return replace(self, element=index, full_id=f"{self.full_id}_{index}")

    def whole(self) -> JobRecord:
        """The record naming the whole job (an element's array)."""
        return replace(self, element=None, full_id=self.full_id.rsplit("_", 1)[0]) if self.element is not None \
            else self


def element_id(printed: str, index: int | str) -> str:
    """Element ``index`` of the array the scheduler printed as ``printed``, as its own tools show it: PBS's
    1234[].server has 1234[3].server (qstat's spelling), Slurm's 1234 has 1234_3."""
    base, sep, rest = printed.partition("[]")
    return f"{base}[{index}]{rest}" if sep else f"{printed}_{index}"


# Whose is the job a scheduler shows under a record's id (see :func:`whose`)
OURS = "ours"  # the recorded job: its identity matches
GONE = "gone"  # the scheduler knows no job of that id any more: the job's own files say how it ended
OTHER = "other"  # another job has that id now (a restarted server, another cluster): never acted on
UNVERIFIED = "unverified"  # the record names no identity (written before records had one): cannot be told


def whose(record: JobRecord, edge: Scheduler) -> tuple[str, dict[str, str] | None]:
    """(OURS, GONE, OTHER or UNVERIFIED; what the scheduler says of the job now under the record's id). A job
    id is not a job: a PBS server started again numbers from 0, and two clusters (or two --remote login hosts)
    hand out the same ids; the record's "identity" (the scheduler's submit time and name of the job, its
    submission's token) tells them apart. SchedulerError, in one line naming the command and its error or
    timeout, when the scheduler cannot be asked: no answer is never taken for "gone" nor for "another job"."""
    from ..core.errors import SchedulerError

    if not edge.queued:  # no id handed out by a server: the local edge checks its supervisor's pid, start and boot
        return OURS, None
    recorded = record.data.get("identity")
    if not isinstance(recorded, dict) or not any(recorded.get(key) for key in IDENTITY_FIELDS):
        return UNVERIFIED, None
    try:
        seen = edge.identity(record.whole().full_id)
    except SchedulerError as e:
        raise SchedulerError(f"job {record.shown_id}: {edge.title} could not be asked whether its job of that id "
                             f"is still the one submitted ({e}); nothing is known of it now: retry when "
                             f"{edge.title} answers") from None
    if seen is None:
        if not record.remote and edge.resubmissions(record.whole().full_id, record.log_dir):
            # submitted again at the warning (PBS): the first job may be forgotten while its last run is live;
            # the edge follows the chain only to runs the server shows as this job's (resubmission_check)
            return OURS, None
        return GONE, None
    same = same_job(recorded, seen)
    return (UNVERIFIED if same is None else OURS if same else OTHER), seen


def gone_line(record: JobRecord, edge: Scheduler, verdict: str, seen: dict[str, str] | None) -> str:
    """The one line that says a record's job is no longer the scheduler's job of that id."""
    if verdict == OTHER:
        said = ", ".join(f"{key} {value!r}" for key, value in (seen or {}).items() if key in ("submitted", "name"))
        return f"job {record.shown_id} is gone; another job now has that id on {edge.title} ({said})"
    return f"job {record.shown_id} is gone: {edge.title} no longer knows it"


def unverified_line(record: JobRecord, edge: Scheduler) -> str:
    return (f"job {record.shown_id}: its record names no job identity (written by an older slurmlaunch), so "
            f"whether {edge.title}'s job {record.shown_id} is still the one submitted cannot be told")


def from_files(record: JobRecord, indices: Sequence[int] = ()) -> JobStatus:
    """A job's state from its own files alone (its exit code, as its batch script wrote it; an array's, each
    element's): for a job its scheduler no longer shows. Read where the job ran (the runner)."""
    from ..core.jobfiles import JobFiles
    from ..schedulers import array_outcome
    from ..schedulers.runner import read_file

    if indices and record.element is None:
        return array_outcome(record.job_id, record.log_dir, indices, {}, {}, "gone from the scheduler")
    text = read_file(JobFiles(record.log_dir, record.tag).exit_code, limit=64)
    try:
        code = int(text.split()[0]) if text is not None else None
    except (ValueError, IndexError):
        code = None
    if code is None:
        return JobStatus("ENDED", None, note="no exit-code file of its batch script: how it ended is unknown")
    return JobStatus("COMPLETED" if code == 0 else "FAILED", code)


def checked_status(record: JobRecord, edge: Scheduler, indices: Sequence[int] = ()) -> tuple[JobStatus, str]:
    """The job's state, and whose the scheduler's job of that id is (:func:`whose`): the scheduler's while it
    is the recorded job (or the record cannot tell); else from the job's own files, the note saying why."""
    verdict, seen = whose(record, edge)
    if verdict in (OURS, UNVERIFIED):
        return edge.status(record.full_id, record.log_dir, indices), verdict
    st = from_files(record, indices)
    line = gone_line(record, edge, verdict, seen) + "; this is from its own files"
    return replace(st, note=f"{line}; {st.note}" if st.note else line), verdict
