"""A scheduler that cannot be asked is not a scheduler that forgot the job (issue 40): squeue, sacct or qstat
timing out or failing with anything but "unknown job" makes `status` say so in one line, naming the command and
its error, and `cancel` refuse; never "gone", never "another job has that id". A runner that answers from a
table (an answer, or the error the real runner raises) stands in for the scheduler's commands."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurmlaunch.app.jobs import commands as jobs
from slurmlaunch.app.records import GONE, OURS, JobRecord, checked_status, whose
from slurmlaunch.core.errors import SchedulerError
from slurmlaunch.schedulers import pbs, slurm
from slurmlaunch.schedulers.runner import use_runner

TIMED_OUT = "no answer within 60s from: sacct -n -X -D -P -j 4242 -o Submit,JobName"
DBD_DOWN = ("sacct -n -X -D -P -j 4242 -o Submit,JobName failed (exit 1): sacct: error: Sending PersistInit msg: "
            "Connection refused | sacct: error: Problem talking to the database: Connection refused")
NO_ACCOUNTING = "sacct -n ... failed (exit 1): sacct: error: Slurm accounting storage is disabled"
FORGOTTEN = "squeue -h ... failed (exit 1): slurm_load_jobs error: Invalid job id specified"


class Table:
    """Answers each command (by its name) with a text, or raises the SchedulerError the real runner would;
    keeps every argv. Every client is installed."""

    def __init__(self, answers: dict[str, str | SchedulerError]) -> None:
        self.answers = answers
        self.argvs: list[list[str]] = []

    def run(self, argv: Sequence[str], *, timeout: float, input_text: str | None = None,
            env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
        assert 0 < timeout <= 600, "every scheduler command has a bounded wait"
        self.argvs.append(list(argv))
        answer = self.answers.get(argv[0], "")
        if isinstance(answer, SchedulerError):
            raise answer
        return subprocess.CompletedProcess(list(argv), 0, answer, "")

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20, *, timeout: float = 30.0) -> bytes | None:
        try:
            return Path(path).read_bytes()[offset:offset + limit]
        except OSError:
            return None

    def which(self, name: str) -> bool:
        return True

    def asked(self) -> list[str]:
        return [argv[0] for argv in self.argvs]


def record(tmp_path: Path, scheduler: str = "slurm", job_id: str = "4242") -> JobRecord:
    identity = {"submitted": "2026-12-07T03:00:00", "name": "train", "comment": "0123456789abcdef"}
    if scheduler == "pbs":
        identity = {"submitted": "Mon Dec 7 03:00:00 2026", "name": "train"}
    data = {"job_id": job_id, "scheduler": scheduler, "log_dir": str(tmp_path), "identity": identity}
    return JobRecord.from_data(data, job_id)


@pytest.mark.parametrize("sacct", [TIMED_OUT, DBD_DOWN])
def test_slurm_identity_without_an_answer_is_an_error_not_gone(sacct: str) -> None:
    runner = Table({"squeue": SchedulerError(FORGOTTEN), "sacct": SchedulerError(sacct)})
    with use_runner(runner), pytest.raises(SchedulerError) as e:
        slurm.identity("4242")
    assert str(e.value) == sacct  # the command and its timeout or error, as the runner said them
    assert runner.asked() == ["squeue", "sacct"]


def test_slurm_identity_of_a_silent_controller_names_squeue() -> None:
    silent = "no answer within 60s from: squeue -h -t all -j 4242 -o '%V|%k|%j'"
    runner = Table({"squeue": SchedulerError(silent)})
    with use_runner(runner), pytest.raises(SchedulerError, match="no answer within 60s from: squeue"):
        slurm.identity("4242")
    assert runner.asked() == ["squeue"]  # sacct is no substitute for the controller's word on a live job


@pytest.mark.parametrize("sacct", [SchedulerError(NO_ACCOUNTING), ""])
def test_slurm_identity_of_a_job_nobody_knows_is_none(sacct: str | SchedulerError) -> None:
    """No accounting at all, or accounting that answers and lists no such job: Slurm knows no job of that id."""
    with use_runner(Table({"squeue": SchedulerError(FORGOTTEN), "sacct": sacct})):
        assert slurm.identity("4242") is None


def test_whose_says_in_one_line_that_slurm_could_not_be_asked(tmp_path: Path) -> None:
    rec = record(tmp_path)
    (tmp_path / "job-4242.exitcode").write_text("3\n")
    with use_runner(Table({"squeue": SchedulerError(FORGOTTEN), "sacct": SchedulerError(TIMED_OUT)})):
        with pytest.raises(SchedulerError) as e:
            checked_status(rec, slurm.EDGE)
    said = str(e.value)
    assert "\n" not in said and "gone" not in said and "another job" not in said, said
    assert said.startswith("job 4242: Slurm could not be asked whether its job of that id is still the one "
                           "submitted"), said
    assert TIMED_OUT in said, said
    # the same table with an answer: gone, from its own files
    with use_runner(Table({"squeue": SchedulerError(FORGOTTEN), "sacct": ""})):
        st, verdict = checked_status(rec, slurm.EDGE)
    assert verdict == GONE and (st.state, st.exit_code) == ("FAILED", 3)
    assert st.note is not None and "Slurm no longer knows it" in st.note


def test_cancel_refuses_when_identity_cannot_be_checked(tmp_path: Path) -> None:
    runner = Table({"squeue": SchedulerError(FORGOTTEN), "sacct": SchedulerError(DBD_DOWN)})
    with use_runner(runner), pytest.raises(SchedulerError) as e:
        jobs.already_ended(slurm.EDGE, record(tmp_path))
    assert str(e.value).endswith(": nothing cancelled") and DBD_DOWN in str(e.value), e.value
    assert "scancel" not in runner.asked()


def test_slurm_status_without_accounting_answer_is_not_forgotten(tmp_path: Path) -> None:
    """squeue no longer shows the job and sacct cannot be asked: without an exit-code file, how it ended cannot
    be told now (not "Slurm no longer knows the job"); with one, the file says it."""
    runner = Table({"squeue": SchedulerError(FORGOTTEN), "sacct": SchedulerError(TIMED_OUT),
                    "scontrol": SchedulerError(FORGOTTEN.replace("squeue -h ...", "scontrol show job"))})
    with use_runner(runner), pytest.raises(SchedulerError) as e:
        slurm.status("4242", str(tmp_path))
    assert "sacct could not be asked" in str(e.value) and TIMED_OUT in str(e.value), e.value
    (tmp_path / "job-4242.exitcode").write_text("0\n")
    with use_runner(runner):
        st = slurm.status("4242", str(tmp_path))
    assert (st.state, st.exit_code) == ("COMPLETED", 0)


def test_pbs_identity_without_an_answer_is_an_error_asked_once(tmp_path: Path) -> None:
    silent = "no answer within 30s from: qstat -x -f -F json 7.head"
    runner = Table({"qstat": SchedulerError(silent)})
    with use_runner(runner), pytest.raises(SchedulerError) as e:
        whose(record(tmp_path, "pbs", "7.head"), pbs.EDGE)
    assert silent in str(e.value) and "gone" not in str(e.value)
    assert runner.asked() == ["qstat"]  # not its text form twice more, each as long
    down = "qstat -x -f -F json 7.head failed (exit 2): Connection refused | qstat: cannot connect to server head"
    runner = Table({"qstat": SchedulerError(down)})
    with use_runner(runner), pytest.raises(SchedulerError, match="cannot connect to server head"):
        whose(record(tmp_path, "pbs", "7.head"), pbs.EDGE)


def test_pbs_identity_of_an_unknown_job_is_gone(tmp_path: Path) -> None:
    unknown = SchedulerError("qstat -x -f -F json 7.head failed (exit 153): qstat: Unknown Job Id 7.head")
    with use_runner(Table({"qstat": unknown})):
        assert whose(record(tmp_path, "pbs", "7.head"), pbs.EDGE) == (GONE, None)


def test_slurm_identity_that_answers_is_ours(tmp_path: Path) -> None:
    line = "2026-12-07T03:00:00|slurmlaunch-submit:0123456789abcdef|train\n"
    with use_runner(Table({"squeue": line})):
        assert whose(record(tmp_path), slurm.EDGE)[0] == OURS


def test_an_api_handle_cancels_nothing_when_identity_cannot_be_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API's handle: its first answer kept, a later qstat that times out makes cancel raise (one line,
    naming the error), and nothing is sent to the scheduler."""
    import dataclasses

    from slurmlaunch.app.api.job import Job
    from slurmlaunch.core.spec import JobSpec

    answers: list[dict[str, str] | SchedulerError] = [{"submitted": "Mon Dec  7 00:00:00 2026", "name": "train"}]
    cancelled: list[str] = []

    def identity(job_id: str) -> dict[str, str] | None:
        answer = answers[-1]
        if isinstance(answer, SchedulerError):
            raise answer
        return answer

    monkeypatch.setattr(pbs, "EDGE", dataclasses.replace(pbs.EDGE, identity_of=identity,
                                                         cancel_job=cancelled.append))

    class Stub:
        job_id = "3.head"
        state = "RUNNING"

        def cancel(self, check: bool = False) -> None:
            cancelled.append(self.job_id)

    handle = Job(Stub(), JobSpec.of(script="train.py"), "pbs")
    monkeypatch.setattr(Job, "_scheduler_state", lambda self: ("RUNNING", False))
    assert handle.state == "RUNNING"  # the first answer is kept
    answers.append(SchedulerError("no answer within 30s from: qstat -x -f -F json 3.head"))
    with pytest.raises(SchedulerError) as e:
        handle.cancel()
    assert str(e.value) == ("job 3.head: PBS could not be asked whether its job of that id is still this one (no "
                            "answer within 30s from: qstat -x -f -F json 3.head): nothing cancelled")
    assert cancelled == []
    answers.append(answers[0])
    handle.cancel()
    assert cancelled == ["3.head"]
