"""The batch step's supervisor (allocation/batch_step.py) without a cluster: its rules as tables, and whole runs
of `slurmlaunch batch-step` in front of a stand-in srun that writes srun's own words (the real Slurm and PBS
runs are in test_preemption_cluster, test_batch_faults, test_stop_reasons, test_teardown, test_stacks*,
test_pbs_real*)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurmlaunch.allocation import step_args, step_rules

USR2 = 128 + signal.SIGUSR2


@pytest.mark.parametrize(("warned", "code", "killed", "want"), [
    (True, 1, False, True),  # got the warning, did not finish: requeue
    (True, 0, False, False),  # finished after the warning: done
    (False, USR2, False, True),  # saved and asked with 128 + the signal
    (True, USR2, True, False),  # some ranks died of the signal: nothing was saved
    (False, 1, False, False),  # an ordinary failure
])
def test_the_requeue_rule(warned: bool, code: int, killed: bool, want: bool) -> None:
    assert step_rules.wants_requeue(warned, code, killed, USR2) is want


def test_the_teardown_abort_rule() -> None:
    assert step_rules.keeps_asked_code(USR2, USR2, True)
    assert not step_rules.keeps_asked_code(USR2, USR2, False)  # another rank failed first
    assert not step_rules.keeps_asked_code(None, USR2, True)  # the script returned, or asked nothing
    assert not step_rules.keeps_asked_code(3, USR2, True)


def test_aborted_ranks_are_srun_task_ranges() -> None:
    lines = ["srun: error: node1: tasks 0-1,3: Aborted (core dumped)", "srun: error: node2: task 5: Aborted",
             "srun: error: node2: task 6: Killed"]
    assert step_rules.srun_aborted(lines) == [0, 1, 3, 5]


# A stand-in srun: writes what $FAKE_WORDS says to stderr (srun's own words), waits for the warning signal
# when $FAKE_WAIT is set (at most 60 s), and exits with $FAKE_CODE (or the signal's 128 + N, as srun reports it).
FAKE_SRUN = """#!/bin/bash
[ -n "$FAKE_WAIT" ] && { trap 'got=1' USR2; echo waiting > "$FAKE_WAIT"; for _ in $(seq 600); do
    [ -n "$got" ] && break; sleep 0.1; done; }
printf '%b' "$FAKE_WORDS" >&2
exit "$FAKE_CODE"
"""


def _step(tmp_path: Path, plan: list[str], words: str = "", code: int = 0, wait: bool = False,
          extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/requeued\n')
    (bin_dir / "scontrol").chmod(0o755)
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_WORDS=words, FAKE_CODE=str(code),
               FAKE_WAIT=str(tmp_path / "waiting") if wait else "", SLURM_JOB_ID="77", **(extra_env or {}))
    cmd = [sys.executable, "-m", "slurmlaunch", "batch-step", "--srun", "--ranks", "4", *plan,
           "--log-dir", str(logs), "--job", "77", "--", "srun", "true"]
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True), logs


def _warn_when_waiting(proc: subprocess.Popen[str], tmp_path: Path) -> None:
    for _ in range(600):  # the stand-in says when its trap is set (60 s at most)
        if (tmp_path / "waiting").exists():
            break
        assert proc.poll() is None
        subprocess.run(["sleep", "0.1"], check=True)
    proc.send_signal(signal.SIGUSR2)


def test_the_first_failure_is_named_and_its_code_is_the_jobs(tmp_path: Path) -> None:
    proc, logs = _step(tmp_path, [], "srun: error: node2: task 2: Killed\\nsrun: error: node1: tasks 0-1: "
                       "Terminated\\n", 143)
    _, err = proc.communicate(timeout=60)
    line = "slurmlaunch: rank(s) 2 on node2 failed first with exit code 137 (killed by SIGKILL); the other ranks " \
           "were stopped"
    assert proc.returncode == 137 and line in err.splitlines(), err
    assert (logs / "job-77.failure").read_text() == line + "\n"
    assert (logs / "job-77.exitcode").read_text() == "137\n"
    assert sorted(p.name for p in logs.iterdir()) == ["job-77.exitcode", "job-77.failure", "job-77.srun.log",
                                                     "job-77.stacks", "job-77.timeline"]


def test_the_warning_is_passed_on_and_a_saved_run_is_requeued(tmp_path: Path) -> None:
    proc, logs = _step(tmp_path, ["--warning", "USR2", "--requeue", "3"], code=USR2, wait=True,
                       extra_env={"SLURM_RESTART_COUNT": "1"})
    _warn_when_waiting(proc, tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "slurmlaunch: SIGUSR2 received, passing it on to the ranks" in err
    assert "slurmlaunch: requeueing job 77 (restart 2 of at most 3)" in err
    assert (tmp_path / "requeued").read_text() == "requeue 77\n"
    assert not (logs / "job-77.exitcode").exists()  # the requeued run's own, later


def test_ranks_killed_by_the_warning_end_the_step_by_that_signal(tmp_path: Path) -> None:
    proc, logs = _step(tmp_path, ["--warning", "USR2", "--requeue", "3"],
                       "srun: error: node1: tasks 0-3: User defined signal 2\\n", USR2, wait=True)
    _warn_when_waiting(proc, tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGUSR2, err
    assert "slurmlaunch: tasks 0-3 on node1 killed by SIGUSR2, the warning signal: the script does not handle it, " \
           "so nothing was saved and the job is not requeued." in err
    assert not (tmp_path / "requeued").exists()
    assert (logs / "job-77.exitcode").read_text() == "79\n"  # killed by the warning: not 140, "saved, requeue me"


def test_a_planted_link_is_never_written_through(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    for suffix in ("exitcode", "srun.log", "rank-0.log"):
        (logs / f"job-77.{suffix}").symlink_to(victim)
    proc, _ = _step(tmp_path, [], code=3)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert victim.read_text() == "not yours\n"
    assert (logs / "job-77.exitcode").read_text() == "3\n" and not (logs / "job-77.rank-0.log").exists()


def test_without_a_command_it_says_so() -> None:
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "batch-step", "--srun"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr == "slurmlaunch: error: batch-step needs a COMMAND after --\n"


# --- PBS: Open MPI's words, and --requeue carried out by submitting the job's kept script again ---------------
# (the real runs: tests/real/test_pbs_real_requeue.py)

def test_open_mpis_word_on_a_signalled_rank() -> None:
    line = "mpiexec noticed that process rank 1 with PID 0 on node node2 exited on signal 10 (User defined signal 1)."
    assert step_rules.openmpi_signalled(["x", line]) == (1, "node2", 10)
    assert step_rules.openmpi_signalled(["Primary job  terminated normally, but 1 process returned"]) is None


# A stand-in mpiexec: notes the run count the ranks would be given, SIGTERMs the batch step with $FAKE_STOP,
# writes $FAKE_WORDS (Open MPI's words) to stderr, exits $FAKE_CODE. A stand-in qsub notes its arguments and
# prints $FAKE_QSUB_OUT (exit $FAKE_QSUB_RC).
FAKE_MPIEXEC = """#!/bin/bash
echo "${SLURMLAUNCH_RESTART_COUNT-unset}" > "$FAKE_SEEN"
[ -n "$FAKE_STOP" ] && kill -TERM $PPID && sleep 0.5  # PBS's stop reaches the batch step (which outlives it)
printf '%b' "$FAKE_WORDS" >&2
# what the runner leaves for rank $FAKE_MARK: its script returned (and with $FAKE_ASKED, exited so)
if [ -n "$FAKE_MARK" ]; then
    if [ -n "$FAKE_ASKED" ]; then printf %s "$FAKE_ASKED" > "$SLURMLAUNCH_RETURNED_DIR/$FAKE_MARK.exit"
    else : > "$SLURMLAUNCH_RETURNED_DIR/$FAKE_MARK"; fi
fi
exit "$FAKE_CODE"
"""
FAKE_QSUB = """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_QSUB_ARGS"
[ -n "$FAKE_QSUB_STOP" ] && kill -TERM $PPID && sleep 0.5  # a qdel of the job while qsub runs
echo "$FAKE_QSUB_OUT"
exit "${FAKE_QSUB_RC:-0}"
"""
FAKE_QDEL = """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_QSUB_ARGS.qdel"
"""
PBS_PLAN = ["--outlive-stop", "--mpi", "openmpi", "--ranks", "2", "--nodes", "2", "--warning", "USR1",
            "--requeue", "1", "--resubmit", "train"]


def _pbs_step(tmp_path: Path, job: str, code: int, words: str = "", plan: tuple[str, ...] = (),
              **env: str) -> tuple[int, str, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("mpiexec", FAKE_MPIEXEC), ("qsub", FAKE_QSUB), ("qdel", FAKE_QDEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    full = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PBS_JOBID=f"{job}.head", FAKE_CODE=str(code),
                FAKE_WORDS=words, FAKE_SEEN=str(tmp_path / "seen"), FAKE_QSUB_ARGS=str(tmp_path / "qsub-args"),
                **{"FAKE_QSUB_OUT": "6.head", **env})
    for name in ("SLURMLAUNCH_RESTART_COUNT", "SLURMLAUNCH_REQUEUE_OF"):
        if name not in env:
            full.pop(name, None)
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "batch-step", *PBS_PLAN, *plan, "--log-dir", str(logs),
                        "--job", job, "--", "mpiexec"], env=full, stderr=subprocess.PIPE, text=True, timeout=60)
    return r.returncode, r.stderr, logs


def test_pbs_a_saved_run_is_submitted_again_and_the_next_run_is_bounded(tmp_path: Path) -> None:
    code, err, logs = _pbs_step(tmp_path, "5", 128 + signal.SIGUSR1)  # the ranks saved and asked (138)
    assert code == 0, err
    assert (tmp_path / "seen").read_text() == "0\n"  # the first run, as the ranks are told
    assert (tmp_path / "qsub-args").read_text().splitlines() == [
        "-N", "train", "-o", f"{logs}/5.head.OU", "-W", "depend=afterany:5.head", "-v",
        "SLURMLAUNCH_RESTART_COUNT=1,SLURMLAUNCH_REQUEUE_OF=5.head", f"{logs}/job-5.qsub"]
    assert "slurmlaunch: requeued: job 5.head resubmitted as job 6.head (restart 1 of at most 1), to start once job " \
           "5.head has ended" in err
    assert (logs / "job-5.requeued").read_text() == "6.head\n" and not (logs / "job-5.exitcode").exists()
    # the resubmission (job 6) asks again: --requeue 1 is spent; its files are job 5's
    (tmp_path / "qsub-args").unlink()
    code, err, logs = _pbs_step(tmp_path, "6", 128 + signal.SIGUSR1, SLURMLAUNCH_RESTART_COUNT="1",
                                SLURMLAUNCH_REQUEUE_OF="5.head")
    assert code == 138 and "slurmlaunch: not requeued: job 5.head was already requeued 1 time(s) (--max-requeues " \
        "1)" in err, err
    assert (tmp_path / "seen").read_text() == "1\n" and not (tmp_path / "qsub-args").exists()
    assert (logs / "job-5.exitcode").read_text() == "138\n" and not list(logs.glob("job-6.*"))


def test_pbs_a_resubmission_qsub_refuses_is_said_and_the_code_stands(tmp_path: Path) -> None:
    code, err, logs = _pbs_step(tmp_path, "5", 138, FAKE_QSUB_OUT="qsub: Unauthorized Request", FAKE_QSUB_RC="159")
    assert code == 138 and "slurmlaunch: not requeued: qsub -N train" in err and \
        "failed: qsub: Unauthorized Request" in err, err
    assert (logs / "job-5.exitcode").read_text() == "138\n" and not (logs / "job-5.requeued").exists()


def test_pbs_ranks_killed_by_the_warning_or_another_signal_are_named(tmp_path: Path) -> None:
    said = "mpiexec noticed that process rank 1 with PID 0 on node node2 exited on signal {} ({}).\\n"
    code, err, logs = _pbs_step(tmp_path, "5", 138, said.format(10, "User defined signal 1"))
    line = "rank 1 on node2 killed by SIGUSR1, the warning signal: the script does not handle it, so nothing was " \
           "saved and the job is not requeued. Fix: handle SIGUSR1"
    assert code == -signal.SIGUSR1 and f"slurmlaunch: {line}" in err, err
    assert (logs / "job-5.failure").read_text().startswith(f"slurmlaunch: {line}")
    assert not (tmp_path / "qsub-args").exists() and (logs / "job-5.exitcode").read_text() == "79\n"
    code, err, logs = _pbs_step(tmp_path, "5", 139, said.format(11, "Segmentation fault"))
    line = "rank 1 on node2 failed first with exit code 139 (killed by SIGSEGV); the other ranks were stopped"
    assert code == 139 and f"slurmlaunch: {line}" in err, err
    assert (logs / "job-5.failure").read_text() == f"slurmlaunch: {line}\n"
    assert not (tmp_path / "qsub-args").exists()


def test_pbs_a_rank_aborted_after_its_script_returned_is_named(tmp_path: Path) -> None:
    """torch's teardown abort under PBS (CI run of f5766bd-1: a DDP rank, after its training): Open MPI's word
    on the SIGABRT plus the runner's mark name it, as under srun; without the mark it is an abort like any."""
    said = "mpiexec noticed that process rank 1 with PID 0 on node node2 exited on signal 6 (Aborted).\\n"
    teardown = "slurmlaunch: rank 1 aborted in torch's teardown after the script returned"
    code, err, logs = _pbs_step(tmp_path, "5", 134, said, FAKE_MARK="1")
    assert code == 134 and "rank 1 on node2 failed first with exit code 134 (killed by SIGABRT)" in err, err
    assert teardown in err and not (logs / "job-5.returned").exists(), err
    code, err, _ = _pbs_step(tmp_path, "5", 134, said)  # an abort inside the script leaves no mark
    assert code == 134 and "killed by SIGABRT" in err and "teardown" not in err, err
    # a rank that had asked for the requeue (138: saved after SIGUSR1) keeps its request through the abort
    code, err, logs = _pbs_step(tmp_path, "5", 134, said, FAKE_MARK="1", FAKE_ASKED="138")
    assert "slurmlaunch: rank 1 aborted in torch's teardown after the script exited 138" in err, err
    assert code == 0 and (logs / "job-5.requeued").read_text() == "6.head\n", err


# What Debian's Open MPI 4.1.4 printed on stderr here for `mpiexec -n 1 true` run as root without the two
# OMPI_ALLOW_RUN_AS_ROOT variables (exit code 1), word for word.
OPENMPI_AS_ROOT = """--------------------------------------------------------------------------
mpiexec has detected an attempt to run as root.

Running as root is *strongly* discouraged as any mistake (e.g., in
defining TMPDIR) or bug can result in catastrophic damage to the OS
file system, leaving your system in an unusable state.

We strongly suggest that you run mpiexec as a non-root user.

You can override this protection by adding the --allow-run-as-root option
to the cmd line or by setting two environment variables in the following way:
the variable OMPI_ALLOW_RUN_AS_ROOT=1 to indicate the desire to override this
protection, and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 to confirm the choice and
add one more layer of certainty that you want to do so.
We reiterate our advice against doing so - please proceed at your own risk.
--------------------------------------------------------------------------
"""


def test_pbs_open_mpis_refusal_to_run_as_root_is_the_first_failure_with_its_fix(tmp_path: Path) -> None:
    """mpiexec refuses root before any rank starts (exit 1, no rank named): the step names that, with the fix,
    in its stderr and the failure file that status and --wait read; Open MPI's own text is passed on."""
    code, err, logs = _pbs_step(tmp_path, "5", 1, OPENMPI_AS_ROOT.replace("\n", "\\n"))
    line = "mpiexec refused to start the ranks as root (Open MPI's run-as-root protection; no rank ran). Fix: add " \
           "--env OMPI_ALLOW_RUN_AS_ROOT=1 --env OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 to slurmlaunch submit, or submit " \
           "as a user other than root"
    assert code == 1 and f"slurmlaunch: {line}" in err and OPENMPI_AS_ROOT in err, err
    assert (logs / "job-5.failure").read_text() == f"slurmlaunch: {line}\n"
    assert (logs / "job-5.exitcode").read_text() == "1\n" and not (tmp_path / "qsub-args").exists()
    code, err, logs = _pbs_step(tmp_path, "5", 1, OPENMPI_AS_ROOT.split("\n", 2)[2].replace("\n", "\\n"))
    assert code == 1 and "refused" not in err and not (logs / "job-5.failure").exists(), err  # not without its line


def test_pbs_ranks_a_stop_ended_are_not_a_failure(tmp_path: Path) -> None:
    """qdel or the walltime (SIGTERM to the batch step, which outlives it): Open MPI's word on a rank the stop
    ended names no failure, and the step writes no exit code (PBS's word stands)."""
    said = "mpiexec noticed that process rank 0 with PID 0 on node node1 exited on signal 15 (Terminated).\\n"
    code, err, logs = _pbs_step(tmp_path, "5", 143, said, ("--stacks",), FAKE_STOP="1")
    assert "slurmlaunch: the job was stopped" in err and "failed first" not in err, err
    assert not (logs / "job-5.failure").exists() and not (logs / "job-5.exitcode").exists()


def test_pbs_a_stop_before_the_walltime_is_never_undone_by_a_requeue(tmp_path: Path) -> None:
    """A qdel (SIGTERM before the walltime) of ranks that asked for a requeue: not resubmitted."""
    code, err, logs = _pbs_step(tmp_path, "5", 138, "", ("--stacks", "--walltime", "3600"), FAKE_STOP="1")
    assert "slurmlaunch: not requeued: the job was stopped " in err and "before its walltime (qdel or qrerun)" in err
    assert not (tmp_path / "qsub-args").exists() and not (logs / "job-5.requeued").exists()


def test_pbs_a_qdel_while_the_job_is_submitted_again_deletes_the_resubmission(tmp_path: Path) -> None:
    """The cancel may have read no chain yet (job-ID.requeued is written after qsub answers): the batch step,
    stopped by hand while its qsub ran, deletes the job it just submitted; the chain lists it (a cancel that
    reads it after its qdel deletes it too, schedulers/interface.py)."""
    code, err, logs = _pbs_step(tmp_path, "5", 138, "", ("--stacks", "--walltime", "3600"), FAKE_QSUB_STOP="1")
    assert "slurmlaunch: not requeued: the job was stopped (qdel or qrerun) while it was submitted again as job " \
           "6.head, which was deleted" in err, err
    assert (tmp_path / "qsub-args.qdel").read_text() == "6.head\n" and code == 138, err
    assert (logs / "job-5.requeued").read_text() == "6.head\n"


# --- the API's path: no job files, COMMAND started without subprocess (issue 32) -------------------------------

def _api_step(tmp_path: Path, command: list[str], **env: str) -> subprocess.Popen[str]:
    """The batch step as the API's Slurm jobs run it (app/api/executors.py: no --log-dir)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_WORDS": "", "FAKE_CODE": "0",
            "FAKE_WAIT": "", **env}
    return subprocess.Popen([sys.executable, "-m", "slurmlaunch", "batch-step", "--warning", "USR2", "--", *command],
                            env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_apis_step_passes_the_warning_on_and_ends_with_the_commands_code(tmp_path: Path) -> None:
    proc = _api_step(tmp_path, ["srun", "true"], FAKE_CODE="7", FAKE_WAIT=str(tmp_path / "waiting"))
    _warn_when_waiting(proc, tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    assert err == "slurmlaunch: SIGUSR2 received, passing it on to the ranks\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "waiting"]  # no job files: the API keeps its own


def test_the_apis_step_reports_a_command_killed_by_a_signal_as_the_shell_would(tmp_path: Path) -> None:
    proc = _api_step(tmp_path, ["sh", "-c", "kill -KILL $$"])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL and err == "", err


def test_the_apis_step_gives_the_command_the_default_sigpipe(tmp_path: Path) -> None:
    """Python ignores SIGPIPE; what it starts gets the default back, as subprocess gives it (a `head` in the
    job's pipeline then ends its writer the usual way)."""
    proc = _api_step(tmp_path, ["sh", "-c", "grep ^SigIgn: /proc/self/status"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    ignored = int(out.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1)), out


def test_a_command_that_is_not_there_is_said_in_one_line(tmp_path: Path) -> None:
    proc = _api_step(tmp_path, [str(tmp_path / "no-such-srun"), "x"])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 127
    assert err == f"slurmlaunch: cannot run {str(tmp_path / 'no-such-srun')!r}: No such file or directory\n"


def test_the_apis_step_starts_on_the_standard_library_it_needs() -> None:
    """What `python -m slurmlaunch batch-step` imports after `site` on the API's path: none of argparse,
    subprocess, the job files' dataclasses and pathlib, the stacks' json, tempfile, shutil (issue 32: the step
    starts once per job, before srun; its CPU is measured in benchmarks/api.py's notes, this guards the
    structure, not the time). The CLI's path loads them where it uses them."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "slurmlaunch", "batch-step", "--warning", "USR2",
                        "--", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    after_site = _imported_after_site(r.stderr)
    heavy = {"argparse", "subprocess", "selectors", "threading", "tempfile", "shutil", "glob", "json", "pathlib",
             "dataclasses", "inspect", "typing", "slurmlaunch.core.jobfiles", "slurmlaunch.allocation.stacks",
             "slurmlaunch.allocation.torchrun_mode", "torch", "submitit", "jinja2"}
    assert sorted(heavy & after_site) == [], sorted(after_site)


def _imported_after_site(importtime: str) -> set[str]:
    names = [line.rsplit("|", 1)[1].strip() for line in importtime.splitlines() if line.startswith("import time:")]
    assert "site" in names and "slurmlaunch.allocation.batch_step" in names, importtime[-2000:]
    return set(names[names.index("site") + 1:])


def test_a_jobs_step_with_its_files_starts_and_ends_on_the_standard_library_it_needs(tmp_path: Path) -> None:
    """The plan the API's (and the CLI's) Slurm script gives, the job's files included (rank logs, stacks, the
    start-up's moments, the exit code): from its start to its end none of the heavier modules either
    (issue 39: the job files' dataclass loaded inspect, their fresh directories and the exit code file shutil
    and tempfile with the compression modules; about 10 ms of CPU of every job)."""
    env = {**os.environ, "SLURM_JOB_ID": "5"}
    argv = ["--srun", "--unit", "rank", "--ranks", "2", "--nodes", "2", "--warning", "USR2", "--stacks", "--log-dir",
            str(tmp_path), "--job", "5", "--", "true"]
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "slurmlaunch", "batch-step", *argv], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "job-5.exitcode").read_text() == "0\n" and (tmp_path / "job-5.stacks").is_dir()
    assert not (tmp_path / "job-5.returned").exists() and not (tmp_path / "job-5.reasons").exists()
    heavy = {"argparse", "subprocess", "selectors", "threading", "tempfile", "shutil", "json", "pathlib",
             "dataclasses", "inspect", "typing", "slurmlaunch.allocation.stacks",
             "slurmlaunch.allocation.torchrun_mode", "torch", "submitit", "jinja2"}
    assert sorted(heavy & _imported_after_site(r.stderr)) == [], r.stderr[-3000:]


PLANS = [
    [], ["--", "srun", "true"], ["srun", "--x", "-y"], ["--warning", "USR2", "--", "srun", "--kill-on-bad-exit=1"],
    ["--srun", "--unit", "node", "--ranks", "8", "--nodes", "2", "--torchrun", "--warning", "USR1", "--requeue",
     "3", "--requeued-by-script", "--stacks", "--log-dir", "/l o g", "--job", "7_2", "--", "srun", "-n", "2"],
    ["--outlive-stop", "--mpi", "openmpi", "--ranks", "4", "--nodes", "2", "--tasks-per-node", "2", "--warning",
     "TERM", "--walltime", "7200", "--warn-before", "90.5", "--requeue", "2", "--resubmit", "train", "--stacks",
     "--log-dir", "d", "--job", "9", "--", "mpiexec", "-n", "4"],
    ["--ranks", "3", "--ranks", "5", "--", "x"],  # the last one counts, as argparse has it
]


@pytest.mark.parametrize("argv", PLANS, ids=[" ".join(p) or "(none)" for p in PLANS])
def test_the_fast_reading_of_a_plan_is_argparses(argv: list[str]) -> None:
    fast = step_args.parse(argv)
    assert type(fast).__name__ == "SimpleNamespace"  # read without argparse
    assert vars(fast) == vars(step_args.parser().parse_args(argv))


def test_the_renderers_plans_are_read_without_argparse(tmp_path: Path) -> None:
    from slurmlaunch.core.spec import JobSpec
    from slurmlaunch.render import pbs_script, slurm_script

    for fields in ({}, {"signal": "USR1@60", "requeue": True, "nodes": 2, "time": "2:00:00"},
                   {"mode": "torchrun", "nodes": 2, "tasks_per_node": 2, "time": "1:00:00"}):
        spec = JobSpec.of(script="t.py", workdir=str(tmp_path), **fields)
        for plan in (slurm_script.batch_step_plan(spec), pbs_script.batch_step_plan(spec)):
            argv = [*plan, "--log-dir", str(tmp_path), "--job", "12", "--", "srun", "true"]
            fast = step_args.parse(argv)
            assert type(fast).__name__ == "SimpleNamespace", argv
            assert vars(fast) == vars(step_args.parser().parse_args(argv))


@pytest.mark.parametrize("argv", [["--ranks", "many", "--", "x"], ["--unit", "job", "--", "x"], ["--log-dir"],
                                  ["--job", "--", "x"], ["--bogus", "x"]])
def test_a_plan_the_fast_reading_does_not_know_goes_to_argparse(argv: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "batch-step", *argv], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("usage: slurmlaunch batch-step"), r.stderr
    assert "Traceback" not in r.stderr


def test_the_fast_reading_leaves_spellings_it_does_not_write_to_argparse() -> None:
    for argv in (["--log-dir=d", "--job=3", "--", "x"], ["--log", "d", "--job", "3", "--", "x"]):
        assert type(step_args.parse(argv)).__name__ == "Namespace"
        assert vars(step_args.parse(argv)) == vars(step_args.parser().parse_args(argv))


def test_the_batch_steps_scheduler_commands_are_bounded_and_say_why_they_did_not_run(tmp_path: Path) -> None:
    """scontrol requeue, qsub and qdel run through scheduler_commands.run_command: its result, or in words why
    there is none (a command that is not there, one that ran past its bound, killed then)."""
    from slurmlaunch.allocation.scheduler_commands import run_command

    done = run_command(["sh", "-c", "echo 7.head; echo said >&2; exit 3"])
    assert not isinstance(done, str) and (done.returncode, done.stdout, done.stderr) == (3, "7.head\n", "said\n")
    missing = str(tmp_path / "no-such-qsub")
    assert "No such file or directory" in str(run_command([missing])) and missing in str(run_command([missing]))
    late = run_command(["sleep", "30"], timeout=0.5)
    assert isinstance(late, str) and "timed out after 0.5 seconds" in late, late


def test_a_warning_before_commands_pid_is_known_is_passed_on_once_it_is(tmp_path: Path) -> None:
    """The warning can come between COMMAND's spawn and its pid's assignment (CI under two busy loops: the
    stand-in srun waited out its 60 s); it is kept and sent as soon as the pid is known."""
    from slurmlaunch.allocation.batch_step import Step

    got = tmp_path / "got"
    child = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGUSR2, lambda *_: (open({str(got)!r}, 'w').close(), sys.exit(0)))\n"
        f"open({str(tmp_path / 'ready')!r}, 'w').close()\n"
        "time.sleep(60)\n")])
    try:
        while not (tmp_path / "ready").exists():
            assert child.poll() is None
            subprocess.run(["sleep", "0.05"], check=True)
        step = Step(step_args.parse(["--srun", "--ranks", "1", "--warning", "USR2", "--", "true"]))
        step._forward(signal.SIGUSR2, None)  # no pid yet: kept
        assert step.pending == signal.SIGUSR2 and child.poll() is None
        step._started(child.pid)
        assert child.wait(timeout=30) == 0 and got.exists() and step.pending is None
    finally:
        child.kill()
        child.wait()
