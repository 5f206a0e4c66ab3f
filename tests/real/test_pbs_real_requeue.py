"""The checkpoint/requeue plan at the warning under PBS, against the real OpenPBS 23.06 of the session
(tests/conftest.py pbs_cluster): the batch step sends the warning before the walltime (test_pbs_real_more.py);
here, what happens after it.

- Ranks the warning killed (a TERM warning, a stop signal, which goes to every rank; the script has no handler,
  nothing saved) are named with Open MPI's words, rank and host, the job ends with 79 and is not requeued, as
  under Slurm. (A script without a handler for USR1/USR2 is not sent them: tests/real/test_warning_unhandled.py.)
- `--requeue`: qrerun needs operator or manager rights (OpenPBS src/server/req_rerun.c), so the batch step
  submits the job's kept script again (`-W depend=afterany:` this job), appending to the same output file and
  writing the same job files; `SLURMLAUNCH_RESTART_COUNT` tells the ranks which run it is; `--max-requeues`
  bounds it; `status`, `--wait` and `logs` of the first id follow the chain.

Each test's job gets the warning 15 s into its run (`--time 0:01:00 --signal USR1@45`); the ranks need to have
started by then (they take 2-5 s here). Cost, measured in five runs at load 4-20 on this 2-core machine: the
killed test 21-24 s, the requeue test 29-41 s (two jobs), besides the cluster's start.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.real.test_pbs_real import AS_ROOT, _raw, submitted

pytestmark = pytest.mark.pbs

WARNED_AT_15S = ["--nodes", "2", "--tasks-per-node", "1", "--time", "0:01:00", "--signal", "USR1@45"]
TERM_AT_15S = ["--nodes", "2", "--tasks-per-node", "1", "--time", "0:01:00", "--signal", "TERM@45"]

# No handler for the TERM warning: each rank says it is up, then sleeps past the walltime.
NO_HANDLER = """
import os, time
os.write(1, ("UP rank " + os.environ["RANK"] + "\\n").encode())
time.sleep(300)
"""


def test_ranks_killed_by_the_warning_are_named_and_the_job_is_not_requeued(pbs_env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(NO_HANDLER)
    r = run_cli("submit", "--scheduler", "pbs", *TERM_AT_15S, "--requeue", *AS_ROOT, "--wait",
                "--wait-timeout", "280", str(script), env=pbs_env, cwd=tmp_path, timeout=400)
    job = submitted(r.stderr)
    short = job.split(".", 1)[0]
    logs = tmp_path / "slurmlaunch-logs"
    output = (logs / f"{job}.OU").read_text(errors="replace")
    line = re.compile(r"slurmlaunch: rank [01] on node[1-3] killed by SIGTERM, the warning signal: the script does "
                      r"not handle it, so nothing was saved and the job is not requeued\. Fix: handle SIGTERM in the "
                      r"script \(save a checkpoint, exit 143")
    for text in (output, r.stderr):  # the job's output, and --wait (from the job's failure file)
        assert line.search(text), text
    assert r.returncode == 79 and f"job {job} ended FAILED, exit code 79" in r.stderr, r.stderr
    assert (logs / f"job-{short}.exitcode").read_text() == "79\n"
    assert not (logs / f"job-{short}.requeued").exists() and "resubmitted" not in output, output
    # the batch shell ended killed by SIGTERM, as the ranks did; OpenPBS 23.06 reads that as 143 (not 256 + 15)
    assert _raw(pbs_env, job)["Exit_status"] == 143


# Run 0: each rank waits for the warning; rank 0 then saves a checkpoint, and both exit 138 (128 + SIGUSR1:
# "saved, requeue me"). Run 1 (the resubmission) resumes from it, says so, and asks for a requeue again at once,
# which --max-requeues 1 refuses.
SAVES = """
import os, signal, sys, time
d, rank = sys.argv[1], os.environ["RANK"]
run = os.environ.get("SLURMLAUNCH_RESTART_COUNT", "unset")
ckpt = os.path.join(d, "ckpt")
if run != "0":
    os.write(1, ("RESUMED run " + run + " rank " + rank + " from " + open(ckpt).read() + "\\n").encode())
    os.write(1, ("GOT rank " + rank + " " + repr([os.environ.get("HOSTILE"), sys.argv[2:]]) + "\\n").encode())
    sys.exit(138)
got = []
signal.signal(signal.SIGUSR1, lambda n, _: got.append(n))
os.write(1, ("RUN 0 rank " + rank + " waits\\n").encode())
deadline = time.monotonic() + 240
while not got and time.monotonic() < deadline:
    time.sleep(0.1)
if rank == "0":
    with open(ckpt + ".tmp", "w") as f:
        f.write("step 5")
    os.rename(ckpt + ".tmp", ckpt)
while not os.path.exists(ckpt) and time.monotonic() < deadline:  # a rank's exit ends the others: wait for it
    time.sleep(0.1)
sys.exit(138 if got else 3)
"""


# Through the resubmission (the kept script, qsub -N/-v) to run 1 unchanged and never run by a shell: the script's
# path, an --env value and arguments with quotes, $(...), backquotes, a tab, a newline and commas (qsub -v splits
# on them). Bytes that are not UTF-8 reach no run: submit refuses them in a PBS (or Slurm) script, exit 2.
HOSTILE = "a b 'q' \"d\" $(touch PWNED) `touch PWNED2` ; | & * \\ \ttab\nnewline ${HOME} %s,X=1,"
ARGS = [HOSTILE, "c,d", ""]


def test_requeue_resubmits_at_the_warning_and_the_chain_is_followed(pbs_env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    """Also: `logs --follow` of the first id, started with the job, follows it across the resubmission to the
    chain's end (it runs alongside the submit's --wait: no time of its own); status and cancel of the second
    run's own id (which qstat shows) name the chain. Cost over P3's test: a few seconds of CPU, no wall time."""
    script = tmp_path / "saves ,'$(touch PWNED3)'.py"
    script.write_text(SAVES)
    submit = subprocess.Popen(
        [sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "pbs", *WARNED_AT_15S, "--requeue",
         "--max-requeues", "1", *AS_ROOT, "--env", f"HOSTILE={HOSTILE}", "--wait", "--wait-timeout", "280",
         str(script), str(tmp_path), *ARGS], env=pbs_env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    assert submit.stderr is not None
    head = ""
    for line in submit.stderr:  # up to the id, which submit says before it follows the job
        head += line
        if "submitted job" in line:
            break
    job = submitted(head)
    follow = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "logs", "--follow", job], env=pbs_env,
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = submit.communicate(timeout=400)
        followed, follow_err = follow.communicate(timeout=120)  # it ends with the chain, as --wait did
    finally:
        for p in (submit, follow):
            if p.poll() is None:
                p.kill()
                p.wait()
    r = subprocess.CompletedProcess(submit.args, submit.returncode, out, head + err)
    short = job.split(".", 1)[0]
    logs = tmp_path / "slurmlaunch-logs"
    chain = (logs / f"job-{short}.requeued").read_text().split()
    assert len(chain) == 1 and chain[0] != job, chain
    second = chain[0]
    # --wait followed the chain: the resubmission's state under the first id, then its exit code
    assert re.search(rf"job {re.escape(job)} (PENDING|RUNNING)[^\n]*\(run 2: resubmitted at the warning as job "
                     rf"{re.escape(second)}[;)]", r.stderr), r.stderr
    assert r.returncode == 138 and f"job {job} ended FAILED, exit code 138" in r.stderr, r.stderr
    # one output file for the chain, as one Slurm job's: run 0, its resubmission, run 1, the bound
    output = (logs / f"{job}.OU").read_text(errors="replace")
    said = [
        "slurmlaunch: SIGUSR1 received: sending it to the ranks whose script handles it",
        "slurmlaunch: SIGUSR1, the time limit's warning: sent to ranks 0-1 (a handler for it)",
        f"slurmlaunch: requeued: job {job} resubmitted as job {second} (restart 1 of at most 1), to start once "
        f"job {job} has ended",
        "RESUMED run 1 rank 0 from step 5", "RESUMED run 1 rank 1 from step 5",
        f"slurmlaunch: not requeued: job {job} was already requeued 1 time(s) (--max-requeues 1)",
    ]
    at = [output.find(text) for text in said]
    assert -1 not in at and at[:4] == sorted(at[:4]) and at[5] > at[3], (at, output)
    assert "killed by SIGUSR1" not in output, output
    # the resubmission: its own id, held for the first job (afterany), the same name and output file
    raw = _raw(pbs_env, second)
    assert raw["Job_Name"] == _raw(pbs_env, job)["Job_Name"] == "saves_____touch_PWNED3__.py", raw
    assert str(raw["Output_Path"]).endswith(f"/slurmlaunch-logs/{job}.OU"), raw["Output_Path"]
    assert raw["Variable_List"]["SLURMLAUNCH_RESTART_COUNT"] == 1, raw["Variable_List"]  # type: ignore[index]
    assert (logs / f"job-{short}.exitcode").read_text() == "138\n"  # the chain's files are the first job's
    assert not list(logs.glob(f"job-{second.split('.', 1)[0]}.*"))
    # status and logs of the first id follow the chain too
    st = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)
    assert (st["state"], st["exit_code"]) == ("FAILED", 138), st
    assert st["note"] == f"run 2: resubmitted at the warning as job {second}", st
    shown = run_cli("logs", job, env=pbs_env, cwd=tmp_path).stdout
    assert "RUN 0 rank 0 waits" in shown and "RESUMED run 1 rank 1 from step 5" in shown, shown
    # run 1 got the hostile strings as given, and no shell ran them
    for rank in (0, 1):
        assert f"GOT rank {rank} {[HOSTILE, ARGS]!r}\n" in output, output
    assert not list(tmp_path.rglob("PWNED*"))
    # logs --follow of the first id went on across the resubmission to the chain's end
    assert follow.returncode == 138, follow_err
    assert "RUN 0 rank 1 waits" in followed and "RESUMED run 1 rank 0 from step 5" in followed, followed
    assert f"job {job} ended FAILED, exit code 138" in follow_err, follow_err  # named as qsub printed it
    # the second run's own id (as qstat shows it) names the chain, and says which run it is
    st = json.loads(run_cli("status", second, "--json", env=pbs_env, cwd=tmp_path).stdout)
    assert (st["state"], st["exit_code"], st["named"], st["run"]) == ("FAILED", 138, second, 2), st
    c = run_cli("cancel", second, env=pbs_env, cwd=tmp_path)
    assert c.returncode == 0 and c.stdout == (f"job {second} (run 2 of job {job}) had already ended, as had every "
                                              f"run after it (FAILED, exit code 138): nothing to cancel\n"), c
