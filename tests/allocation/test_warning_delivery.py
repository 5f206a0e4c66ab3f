"""The warning goes only to ranks that handle it (issue 40 item 3), as real processes: ranks started by the real
launcher through the runner (their RANK.pid), `slurmlaunch warn-node` reading their SigCgt, `slurmlaunch run`
passing a batch script's USR2 on, and the one warning timer. The real clusters: tests/real/test_warning_unhandled.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmlaunch.allocation.warning import (
    LateWatch,
    WarningTimer,
    deliver,
    handles,
    late_said,
    ranks_text,
    reports,
    said,
)
from tests.helpers import clean_env, launch, launch_job_id, step_env

# Says whether it started with USR2 at its default (what Lightning's _has_already_handler reads), sets a handler
# when asked, marks itself ready, then lives ~8 s unless a handler ends it. "late": sets its handler only once
# the file named by $INSTALL_WHEN exists (the test makes it after the warning came: a Lightning that installs
# its handler at trainer.fit, after a slow import), then lives up to 60 s more unless the handler ends it.
SCRIPT = """
import os, signal, sys, time
print("DEFAULT", signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL, flush=True)
def got(n, _):
    print("GOT USR2", flush=True)
    sys.exit(140)
if sys.argv[1] == "handle":
    signal.signal(signal.SIGUSR2, got)
print("READY", flush=True)
if sys.argv[1] == "late":
    end = time.monotonic() + 60
    while not os.path.exists(os.environ["INSTALL_WHEN"]) and time.monotonic() < end:
        time.sleep(0.05)
    signal.signal(signal.SIGUSR2, got)
    print("INSTALLED", flush=True)
    while time.monotonic() < end:
        time.sleep(0.1)
    print("NEVER WARNED", flush=True)
    sys.exit(0)
for _ in range(80):
    time.sleep(0.1)
print("ALIVE", flush=True)
"""


def _rank(tmp_path: Path, rank: int, how: str, stacks: Path) -> subprocess.Popen[str]:
    script = tmp_path / "warned.py"
    script.write_text(SCRIPT)
    env = clean_env(**step_env("localhost", [2], rank, job=launch_job_id(40), MASTER_ADDR="127.0.0.1"),
                    SLURMLAUNCH_STACKS_DIR=str(stacks), SLURMLAUNCH_RETURNED_DIR=str(tmp_path),
                    INSTALL_WHEN=str(tmp_path / "install"))
    p = launch(str(script), how, env=env)
    assert p.stdout is not None
    lines = [p.stdout.readline(), p.stdout.readline()]
    assert lines == ["DEFAULT True\n", "READY\n"], (lines, p.stderr.read() if p.stderr else "")
    return p


def test_warn_node_sends_only_to_the_rank_with_a_handler(tmp_path: Path) -> None:
    """Rank 0 has no handler and runs on to its end (exit 0, ALIVE); rank 1 handles USR2 and gets it at once
    (its handler exits 140). Both started with USR2 at SIG_DFL: Lightning would arm its requeue handler. Before
    the fix (SIG_IGN at start) "DEFAULT False"; before that (srun forwarding to all) rank 0 died of USR2."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    plain, handler = _rank(tmp_path, 0, "plain", stacks), _rank(tmp_path, 1, "handle", stacks)
    host = (stacks / "0.pid").read_text().split()[2]
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "warn-node", str(stacks), "USR2"],
                       env=clean_env(SLURMD_NODENAME=host), capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    assert [(e["warned"], e["left"], e["host"]) for e in reports(str(stacks))] == [([1], [0], host)]
    assert json.loads((stacks / f"{host}.warned").read_text())["warned"] == [1]
    out, err = handler.communicate(timeout=60)
    assert (handler.returncode, out) == (140, "GOT USR2\n"), err
    out, err = plain.communicate(timeout=60)
    assert (plain.returncode, out) == (0, "ALIVE\n"), err


def test_warn_node_sends_it_to_a_rank_whose_handler_comes_late(tmp_path: Path) -> None:
    """Rank 0 installs its handler only after warn-node has delivered and reported (the file the test makes once
    the report is there): warn-node, still watching the ranks it left alone, sends it the warning then, and
    reports it in a second line; it ends once no rank is left to watch. Before the fix warn-node delivered once
    and ended: the rank lived its 60 s and said NEVER WARNED."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    late = _rank(tmp_path, 0, "late", stacks)
    host = (stacks / "0.pid").read_text().split()[2]
    node = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "warn-node", str(stacks), "USR2"],
                            env=clean_env(SLURMD_NODENAME=host), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not reports(str(stacks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(e["warned"], e["left"]) for e in reports(str(stacks))] == [([], [0])]
    (tmp_path / "install").touch()
    out, err = late.communicate(timeout=90)
    assert (late.returncode, out) == (140, "INSTALLED\nGOT USR2\n"), err
    out, err = node.communicate(timeout=60)  # its one rank is gone: nothing left to watch
    assert (node.returncode, out, err) == (0, "", "")
    entries = reports(str(stacks))
    assert [e.get("late") for e in entries] == [None, [0]] and entries[1]["host"] == host
    assert isinstance(entries[1]["after"], float) and entries[1]["after"] > 0


def test_warn_node_watches_no_longer_than_the_job_s_end(tmp_path: Path) -> None:
    """UNTIL (the job's end) bounds the watch: an UNTIL already past, and warn-node ends after its first report
    although rank 0, with no handler, lives on (its 8 s); it is not sent the warning."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    plain = _rank(tmp_path, 0, "plain", stacks)
    host = (stacks / "0.pid").read_text().split()[2]
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "warn-node", str(stacks), "USR2", f"{time.time():.0f}"],
                       env=clean_env(SLURMD_NODENAME=host), capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert [(e["warned"], e["left"]) for e in reports(str(stacks))] == [([], [0])]
    assert plain.poll() is None, "the rank ended before warn-node: the bound was not what ended it"
    out, err = plain.communicate(timeout=60)
    assert (plain.returncode, out) == (0, "ALIVE\n"), err


@pytest.mark.parametrize("until", ["soon", "-5", "nan", ""])
def test_warn_node_refuses_a_bad_until_in_one_line(tmp_path: Path, until: str) -> None:
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "warn-node", str(tmp_path), "USR2", until],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and f"UNTIL {until!r} is not a time" in r.stderr, r.stderr


def test_the_late_watch_forgets_ranks_that_ended_and_stops_at_its_limit() -> None:
    """LateWatch with this test's own process as a rank: USR2 at its default (no handler) is never sent; a rank
    no longer running is forgotten; past ``until`` it sends nothing and is over."""
    watch = LateWatch(signal.SIGUSR2, [0, 1], until=100.0)
    previous = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        assert watch.poll([(0, os.getpid())], 50.0) == [] and watch.left == {0}  # rank 1 ended
        assert not watch.over(50.0) and watch.over(100.0)
        got: list[int] = []
        signal.signal(signal.SIGUSR2, lambda n, _: got.append(n))
        assert watch.poll([(0, os.getpid())], 100.0) == [] and got == []  # the limit came: not sent
        assert watch.poll([(0, os.getpid())], 99.0) == [0]
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [signal.SIGUSR2] and watch.left == set() and watch.over(0.0)
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_stop_signal_as_the_warning_goes_to_every_rank(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    plain = _rank(tmp_path, 0, "plain", stacks)
    pid = int((stacks / "0.pid").read_text().split()[0])
    assert handles(pid, signal.SIGUSR2) is False
    assert deliver([(0, pid)], signal.SIGTERM, to_all=True) == ([0], [])
    plain.communicate(timeout=60)
    assert plain.returncode == -signal.SIGTERM
    assert handles(pid, signal.SIGUSR2) is None  # gone: neither warned nor left
    assert deliver([(0, pid)], signal.SIGUSR2) == ([], [])


def test_warn_node_refuses_a_bad_signal_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "warn-node", str(tmp_path), "KILL"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "'KILL' is not a signal name" in r.stderr, r.stderr


def test_the_line_names_who_got_it_and_who_was_left() -> None:
    assert ranks_text([3, 0, 1, 2, 7, 9, 10]) == "ranks 0-3,7,9-10" and ranks_text([4]) == "rank 4"
    assert said("SIGUSR2", [1], [0, 2, 3]) == (
        "SIGUSR2, the time limit's warning: sent to rank 1 (a handler for it); left alone: ranks 0,2-3 (no handler "
        "yet: each is sent it once its script installs one, else runs on to the time limit)")
    assert said("SIGUSR1", [], [0, 1], ["node2 did not answer within 60s"]).endswith(
        "sent to no rank; left alone: ranks 0-1 (no handler yet: each is sent it once its script installs one, else "
        "runs on to the time limit); not reached: node2 did not answer within 60s")
    assert late_said("SIGUSR2", [2], 7.4, "node2") == (
        "SIGUSR2, the time limit's warning: sent to rank 2 on node2 7s after it came (its script installed a handler "
        "for it then)")


@pytest.mark.parametrize("started, limit, before, asked, due", [
    (100.0, 60.0, 10.0, 149.9, False), (100.0, 60.0, 10.0, 150.0, True), (100.0, 60.0, 90.0, 100.0, True),
    (100.0, None, 10.0, 1e9, False), (100.0, 60.0, None, 1e9, False),
])
def test_the_warning_timer(started: float, limit: float | None, before: float | None, asked: float,
                           due: bool) -> None:
    """One timer (the batch step's, PBS, and the local supervisor's): `before` seconds before the limit, never
    before the start, once."""
    timer = WarningTimer(started, limit, before)
    assert timer.due(asked) is due
    assert timer.due(asked) is False


def test_the_timer_fires_its_thread_once() -> None:
    fired: list[float] = []
    WarningTimer(time.monotonic(), 0.2, 0.1).start(time.monotonic(), lambda: fired.append(time.monotonic()))
    deadline = time.monotonic() + 30
    while not fired and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(fired) == 1


def test_run_passes_usr2_only_to_the_rank_that_handles_it(tmp_path: Path) -> None:
    """`slurmlaunch run` passes a USR2 it gets (a batch script's warning) to the ranks with a handler and says
    so: rank 0 has none and runs on, rank 1 handles it."""
    script = tmp_path / "two.py"
    script.write_text(
        "import os, signal, sys, time\nrank = os.environ['RANK']\n"
        "if rank == '1':\n    signal.signal(signal.SIGUSR2, lambda *_: (print('GOT', flush=True), sys.exit(0)))\n"
        "open(os.path.join(sys.argv[1], rank), 'w').close()\n"
        "end = time.monotonic() + 6\nwhile time.monotonic() < end:\n    time.sleep(0.1)\nprint('ALIVE', flush=True)\n")
    p = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "run", "--nproc-per-node", "2", str(script),
                          str(tmp_path)], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ((tmp_path / "0").exists() and (tmp_path / "1").exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGUSR2)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "[rank 1] GOT" in out and "[rank 0] ALIVE" in out, out
    assert "sent to rank 1 (a handler for it); left alone: rank 0 (no handler" in err, err
