"""The toy queue's clients, one file for the four commands (which one: the name it is run by), their state in
$TOYQ_HOME, a few files per job: toyq-submit [--hold] SCRIPT copies SCRIPT (as sbatch and qsub read it at
submission) and starts it detached, or holds it, and prints its job id; toyq-release ID starts a held job;
toyq-stat ID prints its state (HELD, RUNNING, DONE CODE, CANCELLED) and then `submitted TIME` (exit 1: no such
job); toyq-del ID stops the job's process group."""

import os
import signal
import subprocess
import sys
import time

home = os.environ["TOYQ_HOME"]
command = os.path.basename(sys.argv[0])
RUNNER = ("import subprocess, sys\n"
          "code = subprocess.call(['bash', sys.argv[1]])\n"
          "if open(sys.argv[2]).read().split()[0] == 'RUNNING':\n"
          "    open(sys.argv[2], 'w').write(f'DONE {code}\\n')\n")


def path(job: str, kind: str) -> str:
    return os.path.join(home, f"{job}.{kind}")


def known(job: str) -> str:
    if not job.isdigit() or not os.path.exists(path(job, "state")):
        sys.exit(f"{command}: no job {job}")
    return job


def start(job: str) -> None:
    with open(path(job, "state"), "w") as f:
        f.write("RUNNING\n")
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, path(job, "sh"), path(job, "state")],
                            env={**os.environ, "TOYQ_JOB_ID": job}, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(path(job, "pid"), "w") as f:
        f.write(str(proc.pid))


if command == "toyq-submit":
    hold = sys.argv[1] == "--hold"
    os.makedirs(home, exist_ok=True)
    job = str(101 + sum(name.endswith(".state") for name in os.listdir(home)))
    with open(sys.argv[-1]) as f, open(path(job, "sh"), "w") as copy:
        copy.write(f.read())
    with open(path(job, "submitted"), "w") as f:
        f.write(f"{time.time():.6f}\n")
    with open(path(job, "state"), "w") as f:
        f.write("HELD\n")
    if not hold:
        start(job)
    print(job)
elif command == "toyq-release":
    with open(path(known(sys.argv[1]), "state")) as f:
        if f.read().split()[0] != "HELD":
            sys.exit(f"toyq-release: job {sys.argv[1]} is not held")
    start(sys.argv[1])
elif command == "toyq-stat":
    job = known(sys.argv[1])
    with open(path(job, "state")) as f, open(path(job, "submitted")) as g:
        print(f.read().strip())
        print("submitted", g.read().strip())
elif command == "toyq-del":
    job = known(sys.argv[1])
    with open(path(job, "state")) as f:
        was = f.read().split()[0]
    with open(path(job, "state"), "w") as f:
        f.write("CANCELLED\n")
    if was == "RUNNING":
        with open(path(job, "pid")) as f:
            pid = int(f.read())
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
else:
    sys.exit(f"standin.py: run as toyq-submit, toyq-release, toyq-stat or toyq-del, not {command}")
