"""The warning harms no script that did not ask for it (issue 40 item 3), as real processes: the launcher starts the
script with $SLURMLAUNCH_WARNING's signals ignored (but TERM, INT, HUP); a script that sets a handler gets the
signal; the runner arms no stack dump on an ignored warning; the batch step names the warning to the ranks,
and `slurmlaunch run` its USR1 and USR2. The real clusters: tests/real/test_warning_unhandled.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmlaunch.allocation import batch_step
from slurmlaunch.core.signals import STOP_SIGNALS, WARNING_SIGNALS, WARNING_VAR, ignored_until_handled
from slurmlaunch.render import pbs_script
from tests.helpers import clean_env, launch, step_env


@pytest.mark.parametrize("text, expect", [
    ("USR2", [signal.SIGUSR2]), ("USR1,USR2", [signal.SIGUSR1, signal.SIGUSR2]), ("ALRM", [signal.SIGALRM]),
    ("XCPU", [signal.SIGXCPU]), ("TERM", []), ("INT", []), ("HUP", []), ("USR1,TERM", [signal.SIGUSR1]),
    ("", []), (None, []), ("usr2", []), ("SIGUSR2", []), ("KILL", []), ("USR2 ", []), ("12", []),
])
def test_which_warnings_a_rank_starts_with_ignored(text: str | None, expect: list[int]) -> None:
    """parse_signal's names only (the batch step and the local scheduler write those), never a stop signal; a
    garbled value ignores nothing rather than stopping the rank."""
    assert ignored_until_handled(text) == [int(s) for s in expect]


def test_every_warning_signal_but_the_stop_signals_is_ignored() -> None:
    assert set(STOP_SIGNALS) < set(WARNING_SIGNALS)
    for name in WARNING_SIGNALS:
        assert ignored_until_handled(name) == ([] if name in STOP_SIGNALS else [int(signal.Signals["SIG" + name])])


# Says how it started, optionally sets a handler, then tells the test it is ready and waits for a signal.
SCRIPT = """
import os, signal, sys, time
names = ("USR1", "USR2", "TERM", "INT", "HUP")
start = {n: signal.getsignal(getattr(signal, "SIG" + n)) == signal.SIG_IGN for n in names}
print("IGNORED " + ",".join(n for n in names if start[n]), flush=True)
if sys.argv[1:] == ["handle"]:
    signal.signal(signal.SIGUSR2, lambda n, _: (print("GOT USR2", flush=True), sys.exit(140)))
print("READY", flush=True)
for _ in range(100):
    time.sleep(0.1)
print("ALIVE", flush=True)
"""


def _started(tmp_path: Path, warning: str | None, *args: str, **extra: str) -> subprocess.Popen[str]:
    script = tmp_path / "warned.py"
    script.write_text(SCRIPT)
    env = clean_env(**step_env("localhost", [1], 0, MASTER_ADDR="127.0.0.1"), **extra)
    env.pop(WARNING_VAR, None)
    if warning is not None:
        env[WARNING_VAR] = warning
    p = launch(str(script), *args, env=env)
    assert p.stdout is not None
    lines = [p.stdout.readline(), p.stdout.readline()]
    assert lines[1] == "READY\n", (lines, p.stderr.read() if p.stderr else "")
    p.ignored = lines[0].split()[1:]  # type: ignore[attr-defined]
    return p


@pytest.mark.parametrize("runner", [False, True], ids=["plain", "through-the-runner"])
def test_a_script_without_a_handler_outlives_the_warning(runner: bool, tmp_path: Path) -> None:
    """USR2 ignored from the start (the runner, which arms stack dumps at USR1/USR2, leaves it so: nothing
    dumped at a warning that stops nothing); TERM, INT and HUP keep their default. Before: killed by USR2."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    extra = {"SLURMLAUNCH_STACKS_DIR": str(stacks), "SLURMLAUNCH_RETURNED_DIR": str(tmp_path)} if runner else {}
    p = _started(tmp_path, "USR2", **extra)
    assert p.ignored == ["USR2"]  # type: ignore[attr-defined]
    p.send_signal(signal.SIGUSR2)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (0, "ALIVE\n"), err
    if runner:  # the runner ran (its pid file) and dumped nothing at the ignored USR2
        assert (stacks / "0.pid").exists() and (stacks / "0.stopped").read_text() == ""


def test_a_script_with_a_handler_gets_the_warning(tmp_path: Path) -> None:
    p = _started(tmp_path, "USR2", "handle", SLURMLAUNCH_STACKS_DIR=str(tmp_path))
    start = time.monotonic()
    p.send_signal(signal.SIGUSR2)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (140, "GOT USR2\n"), err
    assert time.monotonic() - start < 5  # at once, not at the end of the script's 10 s


@pytest.mark.parametrize("warning", [None, "TERM", "garbled"])
def test_no_warning_or_a_stop_signal_changes_nothing(warning: str | None, tmp_path: Path) -> None:
    """Without $SLURMLAUNCH_WARNING (a script run by hand), or with TERM as the warning: the defaults, so a
    USR2 still ends the script as it always did, and the TERM warning too."""
    p = _started(tmp_path, warning)
    assert p.ignored == []  # type: ignore[attr-defined]
    p.send_signal(signal.SIGTERM if warning == "TERM" else signal.SIGUSR2)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == -(signal.SIGTERM if warning == "TERM" else signal.SIGUSR2) and out == ""


def test_the_batch_step_names_the_warning_to_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WARNING_VAR, "")  # restored (removed) after the test: the Step writes os.environ
    monkeypatch.delenv(WARNING_VAR)
    batch_step.Step(batch_step.parser().parse_args(["--", "true"]))
    assert WARNING_VAR not in os.environ
    batch_step.Step(batch_step.parser().parse_args(["--warning", "USR1", "--", "true"]))
    assert os.environ[WARNING_VAR] == "USR1"


def test_pbs_passes_the_warning_to_the_ranks_only_when_there_is_one() -> None:
    from slurmlaunch.core.spec import JobSpec

    def forwarded(signal_text: str) -> list[str]:
        spec = JobSpec.of(script="t.py", signal=signal_text, time="1:00:00", nodes=2)
        args, _ = pbs_script.mpiexec_args(spec, [])
        return [args[i + 1] for i, a in enumerate(args) if a == "-x"]

    assert WARNING_VAR in forwarded("USR2@90")
    assert WARNING_VAR not in forwarded("none")  # Open MPI warns about an unset variable it is told to pass


def test_run_passes_usr2_on_to_ranks_that_ignore_it_unless_they_handle_it(tmp_path: Path) -> None:
    """`slurmlaunch run` passes the USR1/USR2 it gets on to every rank (a batch script's warning): rank 0 has
    no handler and runs on, rank 1 handles it."""
    script = tmp_path / "two.py"
    script.write_text(
        "import os, signal, sys, time\nrank = os.environ['RANK']\n"
        "if rank == '1':\n    signal.signal(signal.SIGUSR2, lambda *_: (print('GOT', flush=True), sys.exit(0)))\n"
        "open(os.path.join(sys.argv[1], rank), 'w').close()\n"
        "end = time.monotonic() + 6\nwhile time.monotonic() < end:\n    time.sleep(0.1)\nprint('ALIVE', flush=True)\n")
    env = clean_env()
    p = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "run", "--nproc-per-node", "2", str(script),
                          str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ((tmp_path / "0").exists() and (tmp_path / "1").exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGUSR2)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "[rank 1] GOT" in out and "[rank 0] ALIVE" in out, out

