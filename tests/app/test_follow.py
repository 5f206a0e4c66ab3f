"""follow(): a submitted job's states, rank 0's log as it grows, the wait's bound, lost contact with the
scheduler and the failure line, all with a fake status function and a fake clock (no scheduler, no sleeps)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmlaunch.allocation.stacks import saved_summary
from slurmlaunch.app import follow as following
from slurmlaunch.app.follow import LOST_CONTACT_S, failure_lines, follow
from slurmlaunch.core.errors import SchedulerError, WaitTimeout
from slurmlaunch.schedulers import JobStatus


class Clock:
    """Stands in for the time module inside follow(): sleeping moves the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(following, "time", c)
    return c


def answers(*states: JobStatus | Exception, then: JobStatus | Exception | None = None) -> Callable[[], JobStatus]:
    """A status function that answers ``states`` in turn, then ``then`` for ever (a test bounds it)."""
    seq: Iterator[JobStatus | Exception] = iter(states)

    def status() -> JobStatus:
        item = next(seq, then)
        if item is None:
            raise AssertionError("follow() asked again after the job ended")
        if isinstance(item, Exception):
            raise item
        return item

    return status


def run(status: Callable[[], JobStatus], rank0_log: str | None = None, **kw: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = follow("7", status, rank0_log, out=out, err=err, **kw)  # type: ignore[arg-type]
    return code, out.getvalue(), err.getvalue()


# --- states and the last line ------------------------------------------------------------------------------

def test_each_state_change_once_with_elapsed_time_then_the_end(clock: Clock) -> None:
    code, out, err = run(answers(JobStatus("PENDING"), JobStatus("PENDING"), JobStatus("RUNNING", nodes="n[1-2]"),
                                 JobStatus("RUNNING", nodes="n[1-2]"), JobStatus("COMPLETED", exit_code=0)))
    assert code == 0 and out == ""
    assert err.splitlines() == [
        "slurmlaunch: [0:00:00] job 7 PENDING",
        "slurmlaunch: [0:00:02] job 7 RUNNING on n[1-2]",
        "slurmlaunch: [0:00:04] job 7 COMPLETED",
        "slurmlaunch: job 7 ended COMPLETED, exit code 0",
    ]
    assert clock.slept == [1.0] * 4  # one poll between answers, none after the end


@pytest.mark.parametrize(("end", "code"), [
    (JobStatus("FAILED", exit_code=3), 3),
    (JobStatus("FAILED"), 1),  # no code known: still a failure, never 0
    (JobStatus("CANCELLED", exit_code=None), 1),
    (JobStatus("TIMEOUT", exit_code=0), 0),
    (JobStatus("NODE_FAIL", exit_code=1), 1),
    (JobStatus("OUT_OF_MEMORY", exit_code=137), 137),
])
def test_the_exit_code_of_an_ended_job(end: JobStatus, code: int, clock: Clock) -> None:
    got, _, err = run(answers(end))
    said = "unknown" if end.exit_code is None else code  # not a made-up 1; --wait still exits 1
    assert got == code and err.splitlines()[-1] == f"slurmlaunch: job 7 ended {end.state}, exit code {said}"


@pytest.mark.parametrize("state", ["PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                                   "RESIZING", "STOPPED", "SIGNALING", "STAGE_OUT", "UNKNOWN"])
def test_states_that_are_not_an_end_keep_it_waiting(state: str, clock: Clock) -> None:
    code, _, err = run(answers(JobStatus(state), JobStatus("COMPLETED", exit_code=0)))
    assert code == 0 and f"job 7 {state}" in err.splitlines()[0]


def test_the_nodes_are_named_only_while_running(clock: Clock) -> None:
    _, _, err = run(answers(JobStatus("PENDING", nodes="n1"), JobStatus("COMPLETED", exit_code=0, nodes="n1")))
    assert " on n1" not in err


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0:00:00"), (59.9, "0:00:59"), (60, "0:01:00"), (3661, "1:01:01"), (90000, "25:00:00"),
])
def test_elapsed_time_format(seconds: float, shown: str, clock: Clock) -> None:
    code, _, err = run(answers(JobStatus("PENDING"), JobStatus("COMPLETED", exit_code=0)), poll=seconds)
    assert code == 0 and err.splitlines()[1] == f"slurmlaunch: [{shown}] job 7 COMPLETED"


# --- rank 0's log, and the failure line ---------------------------------------------------------------------

def test_rank0_log_is_tailed_as_it_grows_and_read_to_the_end(clock: Clock, tmp_path: Path) -> None:
    log = tmp_path / "job-7.rank-0.log"
    chunks = iter(["", "step 1\n", "step 2\npart", "ial\nlast line\n"])

    def status() -> JobStatus:
        chunk = next(chunks)
        with open(log, "a") as f:  # the file appears only after the first answer, as a log does
            f.write(chunk)
        return JobStatus("COMPLETED", exit_code=0) if chunk.startswith("ial") else JobStatus("RUNNING")

    log.unlink(missing_ok=True)
    code, out, err = run(status, str(log))
    assert code == 0 and out == "step 1\nstep 2\npartial\nlast line\n"
    assert err.splitlines()[-1] == f"slurmlaunch: job 7 ended COMPLETED, exit code 0 (logs: {tmp_path})"


def test_a_log_that_never_appears_is_not_an_error(clock: Clock, tmp_path: Path) -> None:
    code, out, _ = run(answers(JobStatus("RUNNING"), JobStatus("COMPLETED", exit_code=0)),
                       str(tmp_path / "never.log"))
    assert code == 0 and out == ""


def test_a_failed_jobs_first_failure_line_comes_before_the_last_line(clock: Clock, tmp_path: Path) -> None:
    (tmp_path / "job-7.failure").write_text("rank 2 failed first with exit code 7 (on n2)\nmore detail\n")
    code, _, err = run(answers(JobStatus("FAILED", exit_code=7)), str(tmp_path / "job-7.rank-0.log"))
    assert code == 7
    assert err.splitlines()[-2:] == ["rank 2 failed first with exit code 7 (on n2)",
                                     f"slurmlaunch: job 7 ended FAILED, exit code 7 (logs: {tmp_path})"]


def _pbs_job(tmp_path: Path, summary: bool = True) -> Path:
    """A PBS job's files as its batch step leaves them after a stop: named by the short id (7 of 7.head); its
    output (the batch log too, -j oe) ends with the failure line and the grouped stacks."""
    stacks = tmp_path / "job-7.stacks"
    stacks.mkdir()
    (stacks / "0.pid").write_text("123 456 n1\n")
    if summary:
        (stacks / "summary").write_text("ranks 0-1: train.py:9 in step: time.sleep(600)\n")
    (tmp_path / "job-7.failure").write_text("slurmlaunch: rank 1 on n1 failed first with exit code 7\n")
    out = tmp_path / "7.head.OU"
    out.write_text("[1,0]<stdout>:hello\nslurmlaunch: rank 1 on n1 failed first with exit code 7\n"
                   "slurmlaunch: where the ranks were when they were stopped (1 group(s); every thread in x):\n"
                   "slurmlaunch:   ranks 0-1: train.py:9 in step: time.sleep(600)\n")
    return out


def test_a_pbs_jobs_stop_summary_is_found_by_its_files_id(clock: Clock, tmp_path: Path) -> None:
    """--wait under PBS follows 7.head, whose files are job-7.*: the summary of where the ranks were is read
    from job-7.stacks (issue 40: it was looked for in job-7.head.stacks, and never shown)."""
    _pbs_job(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    code = follow("7.head", answers(JobStatus("CANCELLED", exit_code=1)), None, out=out, err=err,
                  log_dir=str(tmp_path), files_id="7")
    assert code == 1
    assert err.getvalue().splitlines()[-3:] == [
        f"slurmlaunch: where the ranks were when they were stopped (every thread in {tmp_path}/job-7.stacks):",
        "slurmlaunch:   ranks 0-1: train.py:9 in step: time.sleep(600)",
        f"slurmlaunch: job 7.head ended CANCELLED, exit code 1 (logs: {tmp_path})"]
    assert clock.slept == []  # the summary was there: no wait


def test_what_the_followed_output_said_already_is_not_said_again(clock: Clock, tmp_path: Path) -> None:
    """Under PBS the output --wait shows is the batch log too: the batch step's lines go to stderr, once."""
    output = _pbs_job(tmp_path)
    with open(output, "a") as f:
        f.write("[1,0]<stdout>:no newline at the end")
    out, err = io.StringIO(), io.StringIO()
    follow("7.head", answers(JobStatus("FAILED", exit_code=7)), str(output), out=out, err=err, files_id="7",
           batch_log=True)
    said = out.getvalue() + err.getvalue()
    assert out.getvalue() == "[1,0]<stdout>:hello\n[1,0]<stdout>:no newline at the end"  # the ranks' lines
    assert err.getvalue().splitlines() == [  # the batch step's, where slurmlaunch speaks
        "slurmlaunch: [0:00:00] job 7.head FAILED", "slurmlaunch: rank 1 on n1 failed first with exit code 7",
        "slurmlaunch: where the ranks were when they were stopped (1 group(s); every thread in x):",
        "slurmlaunch:   ranks 0-1: train.py:9 in step: time.sleep(600)",
        f"slurmlaunch: job 7.head ended FAILED, exit code 7 (logs: {tmp_path})"]
    assert said.count("rank 1 on n1 failed first") == 1 and said.count("train.py:9") == 1, said


def test_a_stopped_job_waits_a_bounded_time_for_the_summary(clock: Clock, tmp_path: Path) -> None:
    """PBS says a stopped job ended a moment before its batch step says where the ranks were: --wait waits
    for it, STOP_WORDS_S at most (its ranks ran: their pid files are there), and not at all for a job that
    failed by itself."""
    _pbs_job(tmp_path, summary=False)
    run(answers(JobStatus("FAILED", exit_code=7)), log_dir=str(tmp_path), files_id="7")
    assert clock.slept == []
    start = clock.now
    run(answers(JobStatus("TIMEOUT", exit_code=1)), log_dir=str(tmp_path), files_id="7")
    assert following.STOP_WORDS_S <= clock.now - start < following.STOP_WORDS_S + 1


def test_a_stopped_job_whose_ranks_saved_no_stack_is_not_waited_for(clock: Clock, tmp_path: Path) -> None:
    """The batch step looked at the ranks' stop dumps and found none with a stack (a script whose own TERM
    handler replaced the runner's dump, ranks killed before they wrote): its summary is written empty, and
    --wait ends at once, saying no "where the ranks were" (before, it waited out STOP_WORDS_S for a summary
    that would never come)."""
    _pbs_job(tmp_path, summary=False)
    stacks = tmp_path / "job-7.stacks"
    (stacks / "0.stopped").write_text("")  # a rank's stop dump, left empty
    assert saved_summary(str(stacks)) == [] and (stacks / "summary").read_text() == ""
    start = clock.now
    _, _, err = run(answers(JobStatus("TIMEOUT", exit_code=1)), log_dir=str(tmp_path), files_id="7")
    assert clock.now - start < 1 and "where the ranks were" not in err, err


def test_a_successful_job_shows_no_failure_line(clock: Clock, tmp_path: Path) -> None:
    (tmp_path / "job-7.failure").write_text("left over from an earlier run\n")
    _, _, err = run(answers(JobStatus("COMPLETED", exit_code=0)), log_dir=str(tmp_path))
    assert "left over" not in err


@pytest.mark.parametrize(("files", "expect"), [
    ({}, []),
    ({"job-7.failure": "one\ntwo\n"}, ["one"]),
    ({"job-7.failure": "\n\n  \nafter blanks\n"}, ["after blanks"]),
    ({"job-7_10.failure": "ten\n", "job-7_2.failure": "two\n", "job-7_1.failure": "one\n"}, ["one", "two", "ten"]),
    ({"job-7.failure": "whole\n", "job-7_0.failure": "element\n"}, ["whole", "element"]),
    ({"job-77.failure": "another job\n", "job-7_x.failure": "not an index\n"}, ["not an index"]),
    ({"job-7.failure": "x" * 10000}, ["x" * 4096]),  # read bounded: it holds one line
])
def test_failure_lines(files: dict[str, str], expect: list[str], tmp_path: Path) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert failure_lines(str(tmp_path), "7") == expect


def test_failure_lines_follow_no_link_and_survive_a_missing_directory(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("not a failure line\n")
    (tmp_path / "job-7.failure").symlink_to(tmp_path / "secret")
    assert failure_lines(str(tmp_path), "7") == []
    assert failure_lines(str(tmp_path / "gone"), "7") == []


# --- the wait's bound and lost contact ----------------------------------------------------------------------

def test_the_timeout_says_the_job_keeps_running_and_how_to_follow_it(clock: Clock) -> None:
    with pytest.raises(WaitTimeout) as e:
        run(answers(then=JobStatus("RUNNING")), timeout=5.0)
    assert str(e.value) == ("waited 5s for job 7 (still RUNNING); it keeps running: follow it with slurmlaunch logs "
                            "--follow 7, cancel it with slurmlaunch cancel 7")
    assert isinstance(e.value, SchedulerError) and clock.now - 1000.0 == 6.0  # the first poll past the bound


def test_lost_contact_after_the_bound_names_the_last_error(clock: Clock) -> None:
    with pytest.raises(SchedulerError) as e:
        run(answers(JobStatus("RUNNING"), then=SchedulerError("squeue: Socket timed out")), poll=10.0)
    assert str(e.value) == (f"no answer about job 7 for {LOST_CONTACT_S:.0f}s "
                            f"(last error: squeue: Socket timed out); the job itself is untouched (stopping --wait "
                            f"cancels nothing): follow it later with slurmlaunch status 7 and slurmlaunch logs "
                            f"--follow 7")
    assert not isinstance(e.value, WaitTimeout)
    assert clock.now - 1000.0 == 10.0 + LOST_CONTACT_S + 10.0  # silent for more than the bound, not less


def test_contact_regained_starts_the_count_again(clock: Clock) -> None:
    silent = [SchedulerError("sacct: down")] * int(LOST_CONTACT_S - 10)
    code, _, err = run(answers(*silent, JobStatus("RUNNING"), *silent, JobStatus("COMPLETED", exit_code=0)))
    assert code == 0 and "no answer" not in err and "RUNNING" in err


def test_an_unexpected_error_is_not_swallowed(clock: Clock) -> None:
    with pytest.raises(KeyError):
        run(answers(KeyError("a bug")))  # type: ignore[arg-type]


def test_ctrl_c_while_following_cancels_only_when_asked_to(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule for the local and the remote --wait: --cancel-on-interrupt cancels; otherwise (no terminal to
    ask on) the job keeps running and the line says how to find it again; 130 either way."""
    import io

    from slurmlaunch.app.follow import interrupted

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: nothing is asked
    cancelled: list[str] = []

    def cancel(job: str) -> Callable[[], str]:
        return lambda: cancelled.append(job) or f"job {job}"  # what cancel_where_it_runs says it cancelled

    assert interrupted("7", cancel("7"), True) == 130
    assert cancelled == ["7"] and capsys.readouterr().err == "slurmlaunch: cancelled job 7\n"
    assert interrupted("8", cancel("8"), False, "me@login") == 130
    assert cancelled == ["7"]
    assert capsys.readouterr().err == ("slurmlaunch: job 8 keeps running on me@login (slurmlaunch cancel 8 cancels "
                                       "it; slurmlaunch logs --follow 8 follows it)\n")
