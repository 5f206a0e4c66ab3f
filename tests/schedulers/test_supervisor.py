"""The supervisor (schedulers/supervisor.py) that runs the local scheduler's ranks: its pure parts as tables
(exit codes, which signal stopped a run, the console that may go away, one rank's output pump over a pipe),
then supervise() itself with tiny real child processes (no training, no CLI)."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import threading
from pathlib import Path

import pytest

from slurmlaunch.schedulers.supervisor import Console, RankProcess, _code, _pump, _stopping, supervise

# --- pure parts ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("returncode", "code"), [
    (0, 0), (1, 1), (3, 3), (255, 255), (-signal.SIGKILL, 137), (-signal.SIGTERM, 143), (-signal.SIGSEGV, 139),
])
def test_a_rank_killed_by_signal_n_counts_as_128_plus_n(returncode: int, code: int) -> None:
    assert _code(returncode) == code


@pytest.mark.parametrize(("received", "stopping"), [
    ([], None),
    ([signal.SIGUSR1, signal.SIGUSR2], None),  # forwarded, not a stop
    ([signal.SIGUSR1, signal.SIGTERM, signal.SIGINT], signal.SIGTERM),  # the first stop signal names it
    ([signal.SIGHUP], signal.SIGHUP),
    ([signal.SIGINT, signal.SIGINT], signal.SIGINT),
])
def test_which_signal_stopped_the_run(received: list[int], stopping: int | None) -> None:
    assert _stopping(received) == stopping


class GoneReader(io.RawIOBase):
    """A console whose reader went away: every write is EPIPE."""

    def __init__(self) -> None:
        self.writes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        self.writes += 1
        raise BrokenPipeError(32, "Broken pipe")


def test_console_writes_through() -> None:
    out = io.BytesIO()
    console = Console(out)
    console.write(b"[rank 0] a\n")
    console.write(b"[rank 1] b\n")
    assert out.getvalue() == b"[rank 0] a\n[rank 1] b\n" and not console.gone


def test_a_console_that_went_away_is_said_once_then_left_alone(capsys: pytest.CaptureFixture[str]) -> None:
    out = GoneReader()
    console = Console(out)  # type: ignore[arg-type]
    for _ in range(3):
        console.write(b"[rank 0] lost\n")
    assert console.gone and out.writes == 1
    assert capsys.readouterr().err == ("slurmlaunch: the console stopped taking output (Broken pipe); the job goes "
                                       "on, its output goes to the rank logs only\n")


def pumped(data: bytes, log: Path, *, close_writer: bool = True, log_fd: int | None = None) -> tuple[bytes, bool]:
    """Feeds ``data`` through _pump over a real pipe (the log: ``log``, or ``log_fd``); returns (console bytes,
    whether the pump returned)."""
    r, w = os.pipe()
    out = io.BytesIO()
    stop = threading.Event()
    fd = log_fd if log_fd is not None else os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    t = threading.Thread(target=_pump, args=(r, b"[rank 3] ", fd, Console(out), stop), daemon=True)
    t.start()
    with os.fdopen(os.dup(w), "wb") as writer:  # may be more than a pipe holds: the pump is already reading
        writer.write(data)
    if close_writer:
        os.close(w)
    else:
        stop.set()  # something still holds the pipe open: the supervisor stops reading once nothing is ready
    t.join(timeout=30)
    if not close_writer:
        os.close(w)
    if log_fd is None:
        os.close(fd)
    return out.getvalue(), not t.is_alive()


@pytest.mark.parametrize(("data", "console"), [
    (b"", b""),
    (b"one\n", b"[rank 3] one\n"),
    (b"one\ntwo\n", b"[rank 3] one\n[rank 3] two\n"),
    (b"no newline at the end", b"[rank 3] no newline at the end\n"),
    (b"a\n\nb", b"[rank 3] a\n[rank 3] \n[rank 3] b\n"),
    (b"\xff\xfe bytes\n", b"[rank 3] \xff\xfe bytes\n"),  # bytes in, bytes out: no decoding
    (b"x" * 200000 + b"\n", b"[rank 3] " + b"x" * 200000 + b"\n"),  # longer than one read
])
def test_pump_prefixes_lines_and_logs_every_byte(data: bytes, console: bytes, tmp_path: Path) -> None:
    out, returned = pumped(data, tmp_path / "log")
    assert returned and out == console and (tmp_path / "log").read_bytes() == data


def test_pump_stops_when_told_while_the_pipe_is_still_open(tmp_path: Path) -> None:
    out, returned = pumped(b"partial", tmp_path / "log", close_writer=False)
    assert returned and out == b"[rank 3] partial\n"


def test_a_log_that_cannot_be_written_is_said_once_and_the_console_goes_on(tmp_path: Path) -> None:
    read_only = os.open(tmp_path / "log", os.O_RDONLY | os.O_CREAT, 0o600)  # writes fail: EBADF
    try:
        out, returned = pumped(b"one\n" + b"two\n", tmp_path / "unused", log_fd=read_only)
    finally:
        os.close(read_only)
    assert returned
    assert out == b"[rank 3] slurmlaunch: cannot write this rank's log any more: Bad file descriptor\n" \
                  b"[rank 3] one\n[rank 3] two\n"


# --- supervise() with tiny real ranks ---------------------------------------------------------------------------

def rank(n: int, code: str, tmp_path: Path, **kw: object) -> RankProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    return RankProcess(n, [sys.executable, "-c", code, str(tmp_path)], env, **kw)  # type: ignore[arg-type]


# A rank that waits (bounded) until every rank has written its start file: a test that one rank's end stops the
# others must know the others were running, without guessing a time.
WAITS_FOR_ALL = """
import os, sys, time
d, me, world = sys.argv[1], int(os.environ["R"]), int(os.environ["W"])
open(os.path.join(d, f"started-{me}"), "w").close()
deadline = time.monotonic() + 60
while sum(n.startswith("started-") for n in os.listdir(d)) < world and time.monotonic() < deadline:
    time.sleep(0.02)
"""


def ranks_of(tmp_path: Path, *tails: str, **kw: object) -> list[RankProcess]:
    out = []
    for n, tail in enumerate(tails):
        r = rank(n, WAITS_FOR_ALL + tail, tmp_path, **kw)
        out.append(RankProcess(r.rank, r.argv, {**r.env, "R": str(n), "W": str(len(tails))}, r.log_path, r.cwd))
    return out


def test_every_rank_succeeds(tmp_path: Path) -> None:
    out = io.BytesIO()
    logs = [str(tmp_path / f"rank-{n}.log") for n in range(2)]
    ranks = [RankProcess(r.rank, r.argv, r.env, logs[r.rank]) for r in
             ranks_of(tmp_path, "print('hello from', me)", "print('hello from', me)")]
    outcome = supervise(ranks, out=out, grace=5)
    assert (outcome.exit_code, outcome.first_failed_rank, dict(outcome.codes)) == (0, None, {0: 0, 1: 0})
    assert sorted(out.getvalue().splitlines()) == [b"[rank 0] hello from 0", b"[rank 1] hello from 1"]
    assert [Path(p).read_text() for p in logs] == ["hello from 0\n", "hello from 1\n"]  # no prefix in a log
    assert not outcome.interrupted_by and not outcome.timed_out and not outcome.signaled


def test_the_first_failure_is_the_result_and_stops_the_others(tmp_path: Path) -> None:
    ranks = ranks_of(tmp_path, "time.sleep(300)", "sys.exit(7)", "time.sleep(300)")
    outcome = supervise(ranks, out=io.BytesIO(), grace=5)
    assert (outcome.exit_code, outcome.first_failed_rank) == (7, 1)
    assert dict(outcome.codes) == {0: 143, 1: 7, 2: 143} and dict(outcome.signaled) == {0: 15, 2: 15}


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    ranks = ranks_of(tmp_path, "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                               "open(os.path.join(d, 'ignoring'), 'w').close()\ntime.sleep(300)",
                     "while not os.path.exists(os.path.join(d, 'ignoring')): time.sleep(0.02)\nsys.exit(3)")
    outcome = supervise(ranks, out=io.BytesIO(), grace=0.5)
    assert (outcome.exit_code, outcome.first_failed_rank, dict(outcome.codes)) == (3, 1, {0: 137, 1: 3})


def test_a_rank_killed_by_a_signal_is_named_by_it(tmp_path: Path) -> None:
    ranks = ranks_of(tmp_path, "os.kill(os.getpid(), 9)")
    outcome = supervise(ranks, out=io.BytesIO(), grace=5)
    assert (outcome.exit_code, dict(outcome.codes), dict(outcome.signaled)) == (137, {0: 137}, {0: 9})


def test_the_time_limit_warns_then_stops_and_no_rank_is_blamed(tmp_path: Path,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    """The warning (USR2, 2 s into a 4 s limit) goes to rank 0, which handles it, not to rank 1, which does not
    and runs on to the limit (killed by USR2 it would read 140, not 143); one line says so."""
    ranks = ranks_of(tmp_path, "import signal\nsignal.signal(signal.SIGUSR2, lambda *_: print('GOT', flush=True))\n"
                               "time.sleep(300)", "time.sleep(300)")
    out = io.BytesIO()
    outcome = supervise(ranks, out=out, grace=5, time_limit=4.0, warning=(signal.SIGUSR2, 2.0))
    assert outcome.warned and outcome.timed_out and outcome.first_failed_rank is None
    assert outcome.exit_code == 143 and dict(outcome.codes) == {0: 143, 1: 143}
    assert b"[rank 0] GOT" in out.getvalue()
    assert "SIGUSR2, the time limit's warning: sent to rank 0 (a handler for it); left alone: rank 1" \
        in capfd.readouterr().err


def test_a_rank_whose_handler_comes_after_the_warning_gets_it_then(tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    """The local scheduler's warning (USR2, 2 s into a 60 s limit) reaches rank 0 at once; rank 1 installs its
    handler only once rank 0 got it (its file): the supervisor, watching the rank it left alone, sends it then,
    and says so in a second line. Both ranks end once rank 1 got it: the job ends long before its limit. Before
    the fix rank 1 was never warned and both ran to the limit (timed_out, 143)."""
    def handler(me: int) -> str:
        return (f"signal.signal(signal.SIGUSR2, lambda *_: (open(os.path.join(d, 'warned-{me}'), 'w').close(), "
                f"print('GOT', flush=True)))\n")
    until = "end = time.monotonic() + 60\nwhile not os.path.exists(os.path.join(d, 'warned-{}')) and " \
            "time.monotonic() < end: time.sleep(0.02)\n"
    ranks = ranks_of(tmp_path, "import signal\n" + handler(0) + until.format(1),
                     "import signal\n" + until.format(0) + handler(1) + until.format(1))
    out = io.BytesIO()
    outcome = supervise(ranks, out=out, grace=5, time_limit=60.0, warning=(signal.SIGUSR2, 58.0))
    assert outcome.warned and not outcome.timed_out and dict(outcome.codes) == {0: 0, 1: 0}
    assert sorted(out.getvalue().splitlines()) == [b"[rank 0] GOT", b"[rank 1] GOT"]
    err = capfd.readouterr().err
    # rank 0 is sent it at once, or, on a machine so slow that its handler came after the 2 s, late as well
    assert re.search(r"sent to (rank 0 \(a handler for it\); left alone: rank 1|no rank; left alone: ranks 0-1) ",
                     err), err
    assert re.search(r"SIGUSR2, the time limit's warning: sent to rank 1 \d+s after it came \(its script installed "
                     r"a handler for it then\)", err), err


def test_a_log_that_exists_is_never_written_into(tmp_path: Path) -> None:
    (tmp_path / "taken.log").write_text("someone else's\n")
    with pytest.raises(FileExistsError):
        supervise([rank(0, "print('x')", tmp_path, log_path=str(tmp_path / "taken.log"))], out=io.BytesIO())
    assert (tmp_path / "taken.log").read_text() == "someone else's\n"


def test_a_requeued_run_appends_to_its_log(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("first run\n")
    supervise([rank(0, "print('second run')", tmp_path, log_path=str(log), log_append=True)], out=io.BytesIO())
    assert log.read_text() == "first run\nsecond run\n"


def test_the_unit_names_the_prefix_and_prefix_can_be_off(tmp_path: Path) -> None:
    out = io.BytesIO()
    supervise([rank(2, "print('up')", tmp_path, unit="node")], out=out)
    assert out.getvalue() == b"[node 2] up\n"
    out = io.BytesIO()
    supervise([rank(2, "print('up')", tmp_path)], out=out, prefix=False)
    assert out.getvalue() == b"up\n"


def test_signal_handlers_are_given_back(tmp_path: Path) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    supervise([rank(0, "pass", tmp_path)], out=io.BytesIO())
    assert {s: signal.getsignal(s) for s in before} == before
