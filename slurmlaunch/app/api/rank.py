"""A rank of an API job on a queued scheduler: the program of the JobSpec the API renders (executors.py), run by
the launcher like any CLI job's script (``python -m slurmlaunch launch -m slurmlaunch.app.api.rank ...``), so
the batch script is the template's own. It gives submitit what its own batch script would have given (which
executor's job environment, the warning signal its handler listens to; under PBS the job's id as submitit names
it), puts this rank's stdout and stderr into submitit's files of its task, and runs submitit's processing of the
pickled call.

    python -m slurmlaunch.app.api.rank EXECUTOR NODES SIGNAL FOLDER

EXECUTOR: submitit's name of the job environment (slurm, pbs); NODES: the job's node count; SIGNAL: the warning
signal's name, or "-" for none; FOLDER: submitit's folder of the job (with its %j).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# The variables PbsJobEnvironment (pbs.py) reads: the job's id as submitit names it, and the array's.
PBS_JOB_ID = "SLURMLAUNCH_PBS_JOB_ID"
PBS_ARRAY_ID = "SLURMLAUNCH_PBS_ARRAY_ID"
PBS_NODES = "SLURMLAUNCH_PBS_NODES"
MODULE = "slurmlaunch.app.api.rank"


def argv(executor: str, nodes: int, signal_name: str | None, folder: str) -> list[str]:
    """The arguments of this module in a JobSpec's program (executors.py)."""
    return [executor, str(nodes), signal_name or "-", folder]


def _environment(executor: str, nodes: str, signal_name: str) -> None:
    environ = os.environ
    environ["SUBMITIT_EXECUTOR"] = executor
    environ["SLURMLAUNCH_API_LAUNCHED"] = "1"  # calls.py: the launcher has checked and exported the rank's variables
    if signal_name != "-":
        environ["SUBMITIT_PREEMPT_SIGNAL"] = signal_name
    if executor == "local":
        # the local scheduler's ranks carry a Slurm step's variables (schedulers/local_stepenv.py); submitit's
        # local job environment reads its own names for them (an array element: ARRAYID_INDEX, as submitit
        # names the element's files)
        array = environ.get("SLURM_ARRAY_JOB_ID")
        environ.update(SUBMITIT_LOCAL_JOB_ID=f"{array}_{environ['SLURM_ARRAY_TASK_ID']}" if array
                       else environ["SLURM_JOB_ID"], SUBMITIT_LOCAL_GLOBALID=environ["SLURM_PROCID"],
                       SUBMITIT_LOCAL_LOCALID=environ["SLURM_LOCALID"], SUBMITIT_LOCAL_NODEID=environ["SLURM_NODEID"],
                       SUBMITIT_LOCAL_NTASKS=environ["SLURM_NTASKS"], SUBMITIT_LOCAL_JOB_NUM_NODES=nodes)
    if executor == "pbs":
        # PBS_JOBID: 1234.server, or a subjob's 1234[5].server (mpiexec -x passes it on, as PBS_ARRAY_INDEX)
        job = environ.get("PBS_JOBID", "").split(".", 1)[0]
        environ[PBS_JOB_ID] = job
        environ[PBS_NODES] = nodes
        if "PBS_ARRAY_INDEX" in environ:
            environ[PBS_ARRAY_ID] = job.split("[", 1)[0]


def main(args: Sequence[str]) -> None:
    """A rank: its stdout and stderr into submitit's files of this task, then submitit's own processing."""
    executor, nodes, signal_name, folder = args
    os.umask(0o077)  # what the call writes (its pickled result, its logs) is the user's alone, as before
    _environment(executor, nodes, signal_name)  # before submitit's import: it reads the signal's name then
    import submitit
    from submitit.core.submission import process_job

    os.environ["SUBMITIT_FOLDER"] = folder
    paths = submitit.JobEnvironment().paths
    os.makedirs(paths.folder, mode=0o700, exist_ok=True)
    if executor == "local":
        _local(folder, str(paths.stdout))
        return
    given = _output_file()
    for stream, path in ((1, paths.stdout), (2, paths.stderr)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.dup2(fd, stream)
        os.close(fd)
    if given is not None:
        _point_at(given, str(paths.stdout))
    process_job(folder)


def _local(folder: str, stdout: str) -> None:
    """A rank of the local scheduler: its output (stdout and stderr, one pipe) goes on to the rank's log that
    the local scheduler's supervisor keeps (the CLI's job-ID.rank-N.log, beside submitit's folder), which
    submitit's file of its stdout names; submitit's requeue code (its local environment exits 144 after the
    checkpoint) becomes the one the local scheduler requeues on, 128 + the warning signal."""
    import time

    import submitit
    from submitit.core.submission import process_job
    from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE

    from ...core.jobfiles import JobFiles

    log_dir = os.path.dirname(os.path.dirname(folder))  # executors._private_folder: LOG_DIR/submitit/%j
    tag = os.environ["SUBMITIT_LOCAL_JOB_ID"]
    log = JobFiles(log_dir, tag).rank_log(int(os.environ["SUBMITIT_LOCAL_GLOBALID"]))
    try:
        os.symlink(os.path.relpath(log, os.path.dirname(stdout)), stdout)
    except FileExistsError:  # a requeued run's: the link is there
        pass
    # the submitter moves the pickled call into the job's folder once the scheduler gave the id, which it did
    # at once here: submitit's own wait for it looks once a second
    pickled = submitit.JobEnvironment().paths.submitted_pickle
    for _ in range(6000):  # 60 s, as submitit's wait, which then says what it waited for
        if pickled.exists():
            break
        time.sleep(0.01)
    try:
        process_job(folder)
    except SystemExit as e:
        if e.code != LOCAL_REQUEUE_RETURN_CODE:
            raise
        from ...core.parse import signal_number

        sys.stdout.flush()
        os._exit(128 + signal_number(os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")))


def _output_file() -> str | None:
    """The file the scheduler gave this rank as its stdout (srun's --output: the CLI's job-ID.rank-N.log), or
    None (a pipe: mpiexec's under PBS, which keeps one output file for the job)."""
    try:
        path = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return path if path.startswith("/") and os.path.isfile(path) else None


def _point_at(output: str, stdout: str) -> None:
    """The CLI's rank log ``output`` made a link to submitit's file of this rank's stdout, where the rank now
    writes, so that `slurmlaunch logs JOB --rank N` shows what it printed (as the API's jobs always showed it).
    The batch step removes such links before srun runs again (a requeue): srun never appends through one."""
    try:
        os.unlink(output)
        os.symlink(os.path.relpath(stdout, os.path.dirname(output)), output)
    except OSError:  # not ours to replace: the rank's output is in submitit's file all the same
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
