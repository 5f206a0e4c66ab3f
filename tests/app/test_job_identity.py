"""A job id is not a job (issue 40): the rules that tell a record's job from another job given the same id, and
what the commands do with a record that names no identity (written before records had one). The real
schedulers' cases (a second cluster, a fresh PBS server) are in tests/real/test_job_identity.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slurmlaunch.core.errors import JobStateError
from slurmlaunch.core.jobfiles import own_dir
from slurmlaunch.schedulers import same_job, taken
from tests.helpers import EXAMPLES, run_cli
from tests.schedulers.test_pbs import calls, fake_pbs

AT = "2026-12-07T00:00:01"


@pytest.mark.parametrize(("recorded", "seen", "same"), [
    ({"submitted": AT, "name": "train", "comment": "ab12", "token": "t"},
     {"submitted": AT, "name": "train", "comment": "ab12"}, True),
    ({"submitted": AT, "name": "train", "comment": "ab12"}, {"submitted": AT, "name": "train"}, True),  # sacct's
    ({"submitted": AT, "name": "train", "comment": "ab12"},
     {"submitted": AT, "name": "train", "comment": ""}, False),  # same second, same name: not our token
    ({"submitted": AT, "name": "train"}, {"submitted": "2026-12-07T00:00:02", "name": "train"}, False),
    # requeued (Slurm's after NODE_FAIL, Lightning's scontrol requeue): a new submit time, the same token
    ({"submitted": AT, "name": "train", "comment": "ab12"},
     {"submitted": "2026-12-07T00:05:00", "name": "train", "comment": "ab12"}, True),
    # sacct after a requeue: every run's submit time (sacct -D), the first one ours
    ({"submitted": AT, "name": "train", "comment": "ab12"},
     {"submitted": "2026-12-07T00:05:00", "name": "train", "submits": f"{AT} 2026-12-07T00:05:00"}, True),
    ({"submitted": AT, "name": "train", "comment": "ab12"},
     {"submitted": "2026-12-07T00:05:00", "name": "train", "submits": "2026-12-07T00:05:00"}, False),
    ({"submitted": AT, "name": "train"}, {"submitted": AT, "name": "sleeper.sh"}, False),
    ({"submitted": AT}, None, None),  # the scheduler knows no such job
    ({"token": "t"}, {"submitted": AT, "name": "x"}, None),  # nothing to compare
    (None, {"submitted": AT}, None),  # an older record
])
def test_same_job(recorded: object, seen: dict[str, str] | None, same: bool | None) -> None:
    assert same_job(recorded, seen) is same


@pytest.mark.parametrize(("names", "taken_by_7"), [
    ([], False),
    (["job-17.json", "job-70.exitcode", "7-notes.txt"], False),
    (["job-7.json"], True),
    (["job-7.batch.log"], True),  # a planted link counts: the new job's files go elsewhere
    (["job-7_3.exitcode"], True),  # an array's element
    (["7.head.OU"], True),  # PBS Pro's own output of job 7
    (["train.o7"], True),  # Torque's
])
def test_which_ids_older_files_carry(tmp_path: Path, names: list[str], taken_by_7: bool) -> None:
    for name in names:
        (tmp_path / name).write_text("")
    assert taken(str(tmp_path), "7") is taken_by_7


def test_a_reused_ids_directory_is_named_by_the_id_and_the_submission() -> None:
    assert own_dir("/logs", "7", "ab12cd34") == "/logs/job-7.ab12cd34"


def test_a_record_without_identity_is_never_cancelled(tmp_path: Path) -> None:
    """A record written before records named their job's identity: status answers (said unverified), cancel
    deletes nothing and says why in one line, exit code 2. EMULATION of qsub/qstat/qdel."""
    env = fake_pbs(tmp_path)
    (tmp_path / "fake-pbs" / "qstat").write_text(
        "#!/bin/sh\necho 'Job Id: 77.pbs-server'\necho '    job_state = R'\n"
        "echo '    ctime = Mon Dec  7 00:00:00 2026'\n")
    r = run_cli("submit", "--scheduler", "pbs", str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "slurmlaunch-logs" / "job-77.json"
    record = json.loads(path.read_text())
    assert record["identity"]["submitted"] == "Mon Dec 7 00:00:00 2026" and record["cluster"] == {}
    del record["identity"]  # as an older slurmlaunch wrote it
    path.write_text(json.dumps(record))
    st = run_cli("status", "77", env=env, cwd=tmp_path)
    assert st.returncode == 0 and "RUNNING" in st.stdout and "not verified" in st.stdout, st.stdout + st.stderr
    c = run_cli("cancel", "77", env=env, cwd=tmp_path)
    assert c.returncode == 2 and c.stderr.count("\n") == 1 and "nothing cancelled" in c.stderr, c.stderr
    assert "Traceback" not in c.stderr
    assert all(Path(argv[0]).name != "qdel" for argv in calls(tmp_path))


def test_an_api_handle_never_cancels_another_job_of_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handle keeps what the scheduler first said of its job; where a later answer is another job's (a
    handle kept past a server started again), cancel raises and sends nothing."""
    from slurmlaunch.app.api.job import Job
    from slurmlaunch.core.spec import JobSpec
    from slurmlaunch.schedulers import pbs

    answers = [{"submitted": "Mon Dec  7 00:00:00 2026", "name": "train"}]
    cancelled: list[str] = []  # what PBS's edge was asked to cancel (it cancels an API job on PBS: qdel)
    monkeypatch.setattr(pbs, "EDGE", dataclasses.replace(pbs.EDGE, identity_of=lambda job_id: answers[-1],
                                                         cancel_job=cancelled.append))

    class Stub:
        job_id = "3.head"
        state = "RUNNING"

    handle = Job(Stub(), JobSpec.of(script="train.py"), "pbs")
    monkeypatch.setattr(Job, "_scheduler_state", lambda self: ("RUNNING", False))
    assert handle.state == "RUNNING"  # the first answer is kept
    handle.cancel()
    assert cancelled == ["3.head"]
    answers.append({"submitted": "Mon Dec  7 01:00:00 2026", "name": "sleeper.sh"})
    with pytest.raises(JobStateError, match=r"job 3.head is gone; another job now has that id on PBS"):
        handle.cancel()
    assert cancelled == ["3.head"]


# `qstat -f`'s text as Slurm's Torque wrapper prints it (every attribute after a tab, no ctime until the job
# ends: it is then the end time) and as PBS does (attributes indented by spaces, a long value folded onto lines
# that begin with a tab).
WRAPPER_QUEUED = "Job Id:\t9000\n\tJob_Name = myjob\n\tjob_state = Q\n\tqtime = Mon Dec  7 03:11:47 2026\n"
WRAPPER_ENDED = WRAPPER_QUEUED + "\tctime = Mon Dec  7 03:11:57 2026\n"
PBS_TEXT = ("Job Id: 4.head\n    Job_Name = a_long_name_that_qstat_folds_onto\n\t_the_next_line\n"
            "    ctime = Mon Dec  7 00:12:01 2026\n")


@pytest.mark.parametrize(("text", "seen"), [
    (WRAPPER_QUEUED, {"submitted": "", "name": "myjob"}),
    (WRAPPER_ENDED, {"submitted": "Mon Dec 7 03:11:57 2026", "name": "myjob"}),
    (PBS_TEXT, {"submitted": "Mon Dec 7 00:12:01 2026", "name": "a_long_name_that_qstat_folds_onto_the_next_line"}),
])
def test_identity_from_qstat_text(text: str, seen: dict[str, str]) -> None:
    from slurmlaunch.schedulers.pbs import identity_from_text

    assert identity_from_text(text) == seen


def test_a_torque_wrapper_job_is_known_by_its_name_alone() -> None:
    """Recorded while queued (no ctime then), compared once it ended (ctime: its end time): the name decides."""
    from slurmlaunch.schedulers.pbs import identity_from_text

    recorded = {**identity_from_text(WRAPPER_QUEUED), "token": "t"}
    assert same_job(recorded, identity_from_text(WRAPPER_ENDED)) is True
    assert same_job(recorded, identity_from_text(WRAPPER_ENDED.replace("myjob", "sleeper.sh"))) is False
