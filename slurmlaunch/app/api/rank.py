"""A rank of an API job on a queued scheduler: the program of the JobSpec the API renders (executors.py), run by
the launcher like any CLI job's script (``python -m slurmlaunch launch -m slurmlaunch.app.api.rank ...``), so
the batch script is the template's own; the launcher runs it in its own interpreter (allocation/launch.py:
in_process), not a second one. It gives submitit what its own batch script would have given (the job
environment's name, the warning signal its handler listens to), puts this rank's stdout and stderr into
submitit's files of its task, and runs submitit's processing of the pickled call. Nothing here depends on the
scheduler: what a scheduler's job environment reads is that environment's own (app/api/pbs.py's for PBS).

    python -m slurmlaunch.app.api.rank ENVIRONMENT SIGNAL FOLDER

ENVIRONMENT: submitit's name of the job environment (slurm, pbs: the scheduler's ``submitit_environment``), or
NAME:VARIABLE for a scheduler submitit has none of (a plug-in's: its ``job_id_variable`` holds the job's id), whose
ranks get the launcher's own (:func:`_launched_environment`);
SIGNAL: the warning signal's name, or "-" for none; FOLDER: submitit's folder of the job (with its %j).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

MODULE = "slurmlaunch.app.api.rank"


def argv(environment: str, signal_name: str | None, folder: str) -> list[str]:
    """The arguments of this module in a JobSpec's program (executors.py)."""
    return [environment, signal_name or "-", folder]


def _environment(environment: str, signal_name: str) -> None:
    environ = os.environ
    environ["SUBMITIT_EXECUTOR"] = environment.split(":", 1)[0]
    environ["SLURMLAUNCH_API_LAUNCHED"] = "1"  # calls.py: the launcher has checked and exported the rank's variables
    if signal_name != "-":
        environ["SUBMITIT_PREEMPT_SIGNAL"] = signal_name


def main(args: Sequence[str]) -> None:
    """A rank: its stdout and stderr into submitit's files of this task, then submitit's own processing."""
    environment, signal_name, folder = args
    os.umask(0o077)  # what the call writes (its pickled result, its logs) is the user's alone, as before
    _environment(environment, signal_name)  # before submitit's import: it reads the signal's name then
    import submitit
    from submitit.core.submission import process_job

    if ":" in environment:
        _launched_environment(*environment.split(":", 1))
    os.environ["SUBMITIT_FOLDER"] = folder
    paths = submitit.JobEnvironment().paths
    os.makedirs(paths.folder, mode=0o700, exist_ok=True)
    given = _output_file()
    for stream, path in ((1, paths.stdout), (2, paths.stderr)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.dup2(fd, stream)
        os.close(fd)
    if given is not None:
        _point_at(given, str(paths.stdout))
    process_job(folder)


def _launched_environment(name: str, job_id_variable: str) -> None:
    """A job environment named ``name`` for submitit in this rank, where submitit knows none of that name (a
    scheduler plug-in's): the job's id from ``job_id_variable``, the rank's place from the variables the launcher
    exported to it (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, GROUP_WORLD_SIZE: core/distenv.py), so a function
    reads them through submitit.JobEnvironment() as under Slurm. Added to submitit's table of environments (its
    plug-ins, which it reads once per process) for this process only."""
    import submitit
    from submitit.core import plugins

    variables = {"job_id": job_id_variable, "num_tasks": "WORLD_SIZE", "num_nodes": "GROUP_WORLD_SIZE",
                 "node": "GROUP_RANK", "global_rank": "RANK", "local_rank": "LOCAL_RANK"}
    launched: type[submitit.JobEnvironment] = type(f"{name.capitalize()}JobEnvironment", (submitit.JobEnvironment,),
                                                   {"_env": variables})
    if launched.name() == name:  # a name submitit would derive otherwise ("a-b") stays unknown: submitit says so
        table = plugins.get_job_environments()
        assert isinstance(table, dict)  # submitit's: a dict it keeps for the process (functools.lru_cache)
        table.setdefault(name, launched())


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
