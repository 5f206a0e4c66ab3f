"""A rank that aborts after its script returned (torch's gloo teardown at interpreter exit, issue 14): the job
still fails, and the console or batch log names the rank and says where it died. The abort here is a real
SIGABRT from a real process: os.abort in an atexit hook, which runs after the script returned, exactly where
torch's teardown runs; the control aborts inside the script and must not be called a teardown abort."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurmlaunch.allocation.script_runner import RUNNER, python_argv, recorded_exit
from slurmlaunch.allocation.torchrun_mode import RELAY, aborted_workers, parse, teardown_aborts, torchrun_command
from slurmlaunch.core.jobfiles import JobFiles
from tests.helpers import no_slurm_env, run_cli, step_env, teardown_abort_only

TEARDOWN = "rank 1 aborted in torch's teardown after the script returned"

# rank 1 aborts at interpreter exit (after the script returned) or, with "early", inside the script
ABORTS = """
import atexit, os, sys
rank = os.environ["RANK"]
print(f"rank {rank} finished its work", flush=True)
if rank == "1":
    if sys.argv[1:] == ["early"]:
        os.abort()
    atexit.register(os.abort)
"""

# Every rank asks for the requeue (140: saved, requeue me) and is then killed by SIGABRT during interpreter
# teardown, where torch's abort comes (an atexit hook that aborts); the requeued run (SLURM_RESTART_COUNT=1)
# finishes. With "inside", the abort comes inside the script instead, before any exit is asked for.
REQUEUE_THEN_ABORT = """
import atexit, os, sys
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
print(f"rank {os.environ['RANK']} run {restart}", flush=True)
if restart == "0":
    if sys.argv[1:] == ["inside"]:
        os.abort()
    atexit.register(os.abort)
    sys.exit(140)
"""
ASKED = "aborted in torch's teardown after the script exited 140"

SHOW = """'''the docstring'''
import os, sys
print(repr((sys.argv, sys.path[0], __file__, __name__, __doc__, sorted(k for k in globals() if "slurmlaunch" in k))))
if sys.argv[1:2] == ["raise"]:
    raise ValueError("boom")
if sys.argv[1:2] == ["exit"]:
    sys.exit(int(sys.argv[2]))
"""


def run_python(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=60,
                          env={k: v for k, v in dict(os.environ, **env).items() if k != "PYTHONSTARTUP"})


@pytest.mark.parametrize(("log", "tolerated"), [
    ("slurmlaunch: torchrun on node2 (node task 1) failed first with exit code 1; the other nodes were stopped\n"
     "slurmlaunch: rank 3 aborted in torch's teardown after the script returned (SIGABRT ...)\n", True),
    ("slurmlaunch: torchrun on node2 (node task 1) failed first with exit code 1; the other nodes were stopped\n",
     False),
    ("slurmlaunch: torchrun on node2 (node task 1) failed first with exit code 7; the other nodes were stopped\n"
     "slurmlaunch: rank 3 aborted in torch's teardown after the script returned (SIGABRT ...)\n", False),
    ("slurmlaunch: local job 9: rank 2 failed first with exit code 134; the other ranks were stopped\n"
     "slurmlaunch: local job 9: rank 2 aborted in torch's teardown after the script returned (SIGABRT ...)\n", True),
    ("srun: error: node2: task 1: Aborted (core dumped)\n"
     "slurmlaunch: rank 1 aborted in torch's teardown after the script returned (SIGABRT ...)\n", True),
    ("slurmlaunch: local job 9: rank 2 failed first with exit code 134; the other ranks were stopped\n", False),
    # `submit --wait` repeats the batch log's line on the console, and the tests read both (CI, f5766bd)
    ("slurmlaunch: rank(s) 1 on node2 failed first with exit code 134 (killed by SIGABRT); the other ranks were "
     "stopped\n" * 2 + "slurmlaunch: rank 1 aborted in torch's teardown after the script returned (SIGABRT ...)\n",
     True),
    # two array elements' lines with the same code are two failures, one of them not a teardown abort
    ("slurmlaunch: job 5_0: rank 1 failed first with exit code 134; the other ranks were stopped\n"
     "slurmlaunch: job 5_1: rank 0 failed first with exit code 134; the other ranks were stopped\n"
     "slurmlaunch: rank 1 aborted in torch's teardown after the script returned (SIGABRT ...)\n", False),
    ("slurmlaunch: rank(s) 1 on node2 failed first with exit code 134 (killed by SIGABRT)\n"
     "slurmlaunch: rank(s) 3 on node2 failed first with exit code 7\n"
     "slurmlaunch: rank 1 aborted in torch's teardown after the script returned (SIGABRT ...)\n", False),
    ("", False),
])
def test_only_a_diagnosed_teardown_abort_is_tolerated(log: str, tolerated: bool) -> None:
    assert teardown_abort_only(log) == tolerated


@pytest.mark.parametrize("args", [[], ["raise"], ["exit", "0"], ["exit", "4"]])
def test_runner_runs_the_script_as_python_would_and_marks_only_a_return(args: list[str], tmp_path: Path) -> None:
    script = tmp_path / "sub" / "show.py"
    script.parent.mkdir()
    script.write_text(SHOW)
    marks = tmp_path / "marks"
    marks.mkdir()
    plain = run_python([sys.executable, "-u", str(script), *args], tmp_path)
    wrapped = run_python([*python_argv(sys.executable, False, str(script), {"SLURMLAUNCH_RETURNED_DIR": "x"}), *args],
                         tmp_path, SLURMLAUNCH_RETURNED_DIR=str(marks), RANK="3")
    # same argv, sys.path[0], __file__, __name__, docstring, no names of ours; same exit code and traceback
    assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    # a return or exit 0: the returned mark; another exit status: that status in the exit mark
    files = JobFiles(str(tmp_path), "x")
    assert os.listdir(marks) == {"[]": ["3"], "['exit', '0']": ["3"], "['exit', '4']": ["3.exit"]}.get(str(args), [])
    assert os.path.basename(files.exit_mark(3)) == "3.exit"
    assert recorded_exit(str(marks / "3.exit")) == (4 if args == ["exit", "4"] else None)
    if args == ["exit", "4"]:
        assert stat.S_IMODE(os.stat(marks / "3.exit").st_mode) == 0o600  # private, as the other marks


@pytest.mark.parametrize(("code", "recorded"), [("140", 140), ("-1", 255), ("True", 1), ("'a message'", 1)])
def test_runner_records_the_status_python_exits_with(code: str, recorded: int, tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text(f"import sys\nsys.exit({code})\n")
    r = run_python(python_argv(sys.executable, False, str(tmp_path / "s.py"), {"SLURMLAUNCH_RETURNED_DIR": "x"}),
                   tmp_path, SLURMLAUNCH_RETURNED_DIR=str(tmp_path), RANK="0")
    assert r.returncode == recorded and recorded_exit(str(tmp_path / "0.exit")) == recorded


def test_runner_runs_a_module_as_python_m_would(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("import sys; print('init', sys.argv)\n")
    (tmp_path / "pkg" / "__main__.py").write_text("import sys; print('main', sys.argv, sys.path[0], __name__)\n")
    plain = run_python([sys.executable, "-u", "-m", "pkg", "a", "b"], tmp_path)
    wrapped = run_python([*python_argv(sys.executable, True, "pkg", {"SLURMLAUNCH_RETURNED_DIR": "x"}), "a", "b"],
                         tmp_path, SLURMLAUNCH_RETURNED_DIR=str(tmp_path), RANK="0")
    assert (wrapped.returncode, wrapped.stdout) == (plain.returncode, plain.stdout) == (0, plain.stdout)
    assert (tmp_path / "0").exists()


def test_without_the_variable_the_launcher_execs_python_directly() -> None:
    assert python_argv("/py", False, "t.py", {}) == ["/py", "-u", "t.py"]
    assert python_argv("/py", True, "pkg", {"SLURMLAUNCH_RETURNED_DIR": "/d"}) == ["/py", "-u", "-c", RUNNER, "-m",
                                                                                   "pkg"]


def test_torchrun_workers_go_through_the_runner() -> None:
    env = step_env("n[1-2]", [1, 1], 0, job=7, SLURMLAUNCH_RETURNED_DIR="/logs/job-7.returned")
    relay = ["--no-python", "/py", "-c", RELAY]  # two workers: each behind the line relay, the RUNNER inside it
    for argv, tail in ((["t.py", "--a"], [*relay, "-u", "-c", RUNNER, "t.py", "--a"]),
                       (["-m", "pkg"], [*relay, "-u", "-c", RUNNER, "-m", "pkg"]),
                       (["--no-python", "./t.sh"], [*relay, "./t.sh"])):
        values, flags, script = parse(["--nproc-per-node=2", *argv])
        cmd, _ = torchrun_command(env, values, flags, script, "/py")
        assert cmd[-len(tail):] == tail and cmd.count("--no-python") == 1


def test_torchrun_failure_summary_is_read_for_sigabrt_only(tmp_path: Path) -> None:
    summary = ("[0]:\n  time      : 2026-12-01_04:00:00\n  host      : node2\n  rank      : 3 (local_rank: 1)\n"
               "  exitcode  : -6 (pid: 812)  (SIGABRT)\n  error_file: <N/A>\n"
               "  traceback : Signal 6 (SIGABRT) received by PID 812\n"
               "[1]:\n  time      : 2026-12-01_04:00:00\n  host      : node2\n  rank      : 2 (local_rank: 0)\n"
               "  exitcode  : -15 (pid: 811)\n")
    assert aborted_workers(summary) == [3]
    (tmp_path / "3").touch()
    assert teardown_aborts([3], str(tmp_path)) == [3] and teardown_aborts([2], str(tmp_path)) == []


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
@pytest.mark.parametrize("early", [False, True])
def test_local_scheduler_names_the_rank_that_aborted_after_returning(mode: str, early: bool, tmp_path: Path,
                                                                    torch_available: None) -> None:
    (tmp_path / "aborts.py").write_text(ABORTS)
    shape = ["--mode", "torchrun", "--nodes", "2", "--nproc-per-node", "1"] if mode == "torchrun" else \
        ["--nodes", "1", "--tasks-per-node", "2"]
    r = run_cli("submit", "--scheduler", "local", *shape, "aborts.py", *(["early"] if early else []),
                env=no_slurm_env(tmp_path), cwd=tmp_path, timeout=180)
    # the job fails either way (honest), with the torchrun node's 1 or the rank's 128 + SIGABRT
    assert r.returncode == (1 if mode == "torchrun" else 134), r.stdout + r.stderr
    assert "rank 1 finished its work" in r.stdout
    assert (TEARDOWN in r.stderr) != early, r.stderr
    assert not list((tmp_path / "slurmlaunch-logs").glob("*.returned"))  # the marks are cleaned up


# A stand-in for torch's gloo worker that is still running when the script returns: a thread named as gloo's
# are ("pt_gloo_runloop", set with prctl), busy for BUSY seconds; "torch" is in sys.modules (a stand-in too).
# `from os import *` rebinds open in the script's globals, which the runner's code shares.
BUSY_GLOO_WORKER = """
import atexit, ctypes, sys, threading, time, types
from os import *
sys.modules["torch"] = types.ModuleType("torch")
def worker():
    ctypes.CDLL(None).prctl(15, b"pt_gloo_runloop", 0, 0, 0)  # PR_SET_NAME
    end = time.monotonic() + BUSY
    while time.monotonic() < end:
        pass
    print("worker done", time.monotonic(), flush=True)
threading.Thread(target=worker, daemon=True).start()
time.sleep(0.05)
atexit.register(lambda: print("finalizing", time.monotonic(), flush=True))
"""


def test_the_runner_lets_torchs_gloo_workers_finish_before_the_interpreter_finalizes(tmp_path: Path) -> None:
    """The settle after the script (docs: Teardown aborts): the interpreter's exit waits for a running gloo
    worker (at most 0.5 s); without torch imported it does not wait at all."""
    (tmp_path / "busy.py").write_text(BUSY_GLOO_WORKER.replace("BUSY", "0.3"))
    r = run_python([sys.executable, "-u", "-c", RUNNER, str(tmp_path / "busy.py")], tmp_path)
    assert r.returncode == 0 and "worker done" in r.stdout, r.stdout + r.stderr
    times = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert float(times["worker done"]) < float(times["finalizing"]), r.stdout
    # no torch: no wait (a daemon thread busy for 5 s is cut off at exit)
    (tmp_path / "busy.py").write_text(BUSY_GLOO_WORKER.replace("BUSY", "5").replace('sys.modules["torch"] = ', "_ = "))
    r = run_python([sys.executable, "-u", "-c", RUNNER, str(tmp_path / "busy.py")], tmp_path)
    assert r.returncode == 0 and "worker done" not in r.stdout and "finalizing" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("early", [False, True])
def test_run_names_the_rank_that_aborted_after_returning(early: bool, tmp_path: Path) -> None:
    """`slurmlaunch run` (torch.distributed.launch's place, one node): the same word as the schedulers."""
    (tmp_path / "aborts.py").write_text(ABORTS)
    r = run_cli("run", "--standalone", "--nproc-per-node", "2", "aborts.py", *(["early"] if early else []),
                env=no_slurm_env(tmp_path), cwd=tmp_path, timeout=120)
    assert r.returncode == 134 and "rank 1 finished its work" in r.stdout, r.stdout + r.stderr
    assert "slurmlaunch: rank 1 failed first with exit code 134" in r.stderr, r.stderr
    assert (f"slurmlaunch: {TEARDOWN}" in r.stderr) != early and teardown_abort_only(r.stderr) != early, r.stderr


@pytest.mark.parametrize("early", [False, True])
def test_the_apis_script_jobs_name_the_rank_that_aborted_after_returning(early: bool, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """submit_script: RankFailed says it, from the runner's mark (in the task's own private directory)."""
    import slurmlaunch

    (tmp_path / "aborts.py").write_text(ABORTS)
    for k, v in no_slurm_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    job = slurmlaunch.submit_script("aborts.py", ["early"] if early else [], scheduler="local", nodes=1,
                                    tasks_per_node=2, output_dir=str(tmp_path / "logs"))
    with pytest.raises(slurmlaunch.RankFailed) as failed:
        job.results()
    assert failed.value.rank == 1 and "killed by SIGABRT" in str(failed.value), str(failed.value)
    assert (TEARDOWN in str(failed.value)) != early and teardown_abort_only(str(failed.value)) != early


@pytest.mark.slurm
@pytest.mark.parametrize("mode", ["srun", "torchrun"])
@pytest.mark.parametrize("early", [False, True])
def test_batch_log_names_the_rank_that_aborted_after_returning(mode: str, early: bool, cluster_env: dict[str, str],
                                                               tmp_path: Path, torch_available: None) -> None:
    (tmp_path / "aborts.py").write_text(ABORTS)
    shape = ["--mode", "torchrun", "--nodes", "2", "--nproc-per-node", "1"] if mode == "torchrun" else \
        ["--nodes", "2", "--tasks-per-node", "1"]
    r = run_cli("submit", *shape, "--wait", "--wait-timeout", "150", "aborts.py", *(["early"] if early else []),
                env=cluster_env, cwd=tmp_path, timeout=200)
    assert r.returncode != 0, r.stdout + r.stderr  # the job is FAILED, not hidden
    job = r.stdout.split()[0]
    logs = tmp_path / "slurmlaunch-logs"
    batch = (logs / f"job-{job}.batch.log").read_text()
    assert (TEARDOWN in batch) != early, batch
    assert not (logs / f"job-{job}.returned").exists()


@pytest.mark.parametrize("inside", [False, True])
def test_local_scheduler_keeps_the_requeue_asked_for_before_a_teardown_abort(inside: bool, tmp_path: Path) -> None:
    (tmp_path / "rq.py").write_text(REQUEUE_THEN_ABORT)
    r = run_cli("submit", "--scheduler", "local", "--nodes", "1", "--tasks-per-node", "2", "--requeue",
                "--max-requeues", "1", "--time", "10", "rq.py", *(["inside"] if inside else []),
                env=no_slurm_env(tmp_path), cwd=tmp_path, timeout=180)
    if inside:  # no exit was asked for: an abort in the training, not requeued
        assert r.returncode == 134 and ASKED not in r.stderr and "requeued" not in r.stderr, r.stdout + r.stderr
        return
    assert r.returncode == 0, r.stdout + r.stderr
    assert ASKED in r.stderr and "requeued (restart 1 of at most 1)" in r.stderr, r.stderr
    assert "rank 0 run 1" in r.stdout and "rank 1 run 1" in r.stdout
    assert not list((tmp_path / "slurmlaunch-logs").glob("*.returned"))  # the marks are cleaned up


@pytest.mark.slurm
@pytest.mark.parametrize("inside", [False, True])
def test_batch_script_keeps_the_requeue_asked_for_before_a_teardown_abort(inside: bool, cluster_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """On the real cluster: srun reports the ranks 'Aborted'; the batch script still requeues (140 asked for)."""
    (tmp_path / "rq.py").write_text(REQUEUE_THEN_ABORT)
    r = run_cli("submit", "--nodes", "2", "--tasks-per-node", "1", "--requeue", "--max-requeues", "1", "--wait",
                "--wait-timeout", "150", "rq.py", *(["inside"] if inside else []), env=cluster_env, cwd=tmp_path,
                timeout=200)
    job = r.stdout.split()[0]
    logs = tmp_path / "slurmlaunch-logs"
    batch = (logs / f"job-{job}.batch.log").read_text()
    assert re.search(r"^srun: error: \S+: task \d: Aborted", batch, re.M), batch  # srun saw a rank abort
    if inside:
        assert r.returncode != 0 and ASKED not in batch and "requeueing" not in batch, r.stdout + r.stderr + batch
        return
    assert r.returncode == 0, r.stdout + r.stderr + batch
    assert ASKED in batch and f"requeueing job {job} (restart 1 of at most 1)" in batch, batch
    assert "rank 0 run 1" in (logs / f"job-{job}.rank-0.log").read_text()
    assert not (logs / f"job-{job}.returned").exists()
