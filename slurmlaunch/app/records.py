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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..schedulers.registry import NAMES


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
