"""The job record as a value (app/records.py): what the file holds round-trips, which job a command names
is kept beside it (never written into it), and what is not one of ours is refused."""

from __future__ import annotations

import json

import pytest

from slurmlaunch.app.records import JobRecord, element_id

DATA = {"job_id": "41", "scheduler": "pbs", "log_dir": "/logs", "pbs_job_id": "41[].server",
        "spec": {"nodes": 2, "array": "0-3"}}


def test_round_trip_keeps_the_file_as_written() -> None:
    record = JobRecord.from_json(json.dumps(DATA), "41[].server")
    assert json.loads(record.to_json()) == DATA  # nothing of the command's choice leaks into the file
    assert (record.job_id, record.scheduler, record.log_dir, record.remote) == ("41", "pbs", "/logs", None)
    assert JobRecord.from_json(record.to_json(), record.full_id) == record


def test_elements() -> None:
    record = JobRecord.from_json(json.dumps(DATA), "41")
    element = record.of_element("3")
    assert (element.tag, element.full_id, element.element) == ("41_3", "41_3", "3")
    assert (record.tag, record.element) == ("41", None)
    assert element.whole() == record and record.whole() is record
    assert element.data is record.data


def test_the_id_shown_is_the_one_the_schedulers_tools_show() -> None:
    """PBS: qsub and qstat say 41.server, 41[].server and 41[3].server; Slurm: 41 and 41_3."""
    pbs = JobRecord.from_json(json.dumps(DATA), "41[].server")
    assert (pbs.shown_id, pbs.of_element("3").shown_id, pbs.of_element("3").tag) == ("41[].server", "41[3].server",
                                                                                      "41_3")
    assert JobRecord.from_json(json.dumps(DATA), "41.head").shown_id == "41.head"
    slurm = JobRecord({**DATA, "scheduler": "slurm"}, "41")
    assert (slurm.shown_id, slurm.of_element("3").shown_id) == ("41", "41_3")
    assert (element_id("41[].server", "INDEX"), element_id("41[]", 0), element_id("41", 0)) == (
        "41[INDEX].server", "41[0]", "41_0")


def test_remote() -> None:
    record = JobRecord({**DATA, "scheduler": "slurm", "remote": "me@login"}, "41")
    assert record.remote == "me@login"


@pytest.mark.parametrize("text", ['[]', '"x"', '{}', '{"log_dir": "/l", "scheduler": "lsf"}',
                                  '{"log_dir": 3, "scheduler": "local"}', '{"scheduler": "slurm"}', 'not json'])
def test_not_ours_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        JobRecord.from_json(text, "1")
