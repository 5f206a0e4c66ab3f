"""A rank of an API job (a queued scheduler's, or the local one's): the program of the JobSpec the API renders
(executors.py), run by the launcher like any CLI job's script (``python -m slurmlaunch launch -m
slurmlaunch.app.api.rank ...``), so the batch script is the template's own. It gives submitit what its own batch
script would have given (which executor's job environment, the warning signal its handler listens to; under PBS
the job's id as submitit names it), puts this rank's stdout and stderr into submitit's files of its task (or
links them to the rank's log where the local scheduler keeps it), and runs submitit's processing of the pickled
call. The launcher runs it in its own interpreter (allocation/launch.py: in_process), not a second one.

    python -m slurmlaunch.app.api.rank ENVIRONMENT SIGNAL FOLDER [stop-on-term]

ENVIRONMENT: submitit's name of the job environment (slurm, pbs: the scheduler's ``submitit_environment``), or
NAME:VARIABLE for a scheduler submitit has none of (a plug-in's: its ``job_id_variable`` holds the job's id), whose
ranks get the launcher's own (:func:`_launched_environment`);
SIGNAL: the warning signal's name, or "-" for none; FOLDER: submitit's folder of the job (with its %j);
stop-on-term: SIGTERM stops the rank (a scheduler without a queue: its ranks run under the rank supervisor,
schedulers/supervisor.py, whose SIGTERM means stop), where submitit's handlers would let it pass.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

MODULE = "slurmlaunch.app.api.rank"


# The last argument of a rank whose SIGTERM means "stop now" (see main)
STOP_ON_TERM = "stop-on-term"


def argv(environment: str, signal_name: str | None, folder: str, stop_on_term: bool = False) -> list[str]:
    """The arguments of this module in a JobSpec's program (executors.py)."""
    return [environment, signal_name or "-", folder, *([STOP_ON_TERM] if stop_on_term else [])]


def _environment(environment: str, signal_name: str) -> None:
    environ = os.environ
    environ["SUBMITIT_EXECUTOR"] = environment.split(":", 1)[0]
    environ["SLURMLAUNCH_API_LAUNCHED"] = "1"  # calls.py: the launcher has checked and exported the rank's variables
    if signal_name != "-":
        environ["SUBMITIT_PREEMPT_SIGNAL"] = signal_name


# submitit's fields of a job environment -> a Slurm step's variables (srun's, and the local scheduler's, which
# emulates a step: schedulers/local_stepenv.py)
_STEP_VARIABLES = {"global_rank": "SLURM_PROCID", "local_rank": "SLURM_LOCALID", "node": "SLURM_NODEID",
                   "num_tasks": "SLURM_NTASKS", "num_nodes": "SLURM_JOB_NUM_NODES"}


def _from_step(env: Any) -> None:
    """The variables submitit's job environment ``env`` reads (its ``_env`` table), where they are not set,
    from the Slurm step's that this rank has: a job environment other than Slurm's (submitit's local one, under
    the local scheduler) then reads the same world. An array element's job id is ARRAYID_INDEX, as submitit
    names the element's files."""
    environ = os.environ
    for field, variable in type(env)._env.items():
        if variable in environ:
            continue
        if field == "job_id" and "SLURM_JOB_ID" in environ:
            array = environ.get("SLURM_ARRAY_JOB_ID")
            environ[variable] = f"{array}_{environ['SLURM_ARRAY_TASK_ID']}" if array else environ["SLURM_JOB_ID"]
        elif _STEP_VARIABLES.get(field, "") in environ:
            environ[variable] = environ[_STEP_VARIABLES[field]]


def main(args: Sequence[str]) -> None:
    """A rank: its output into submitit's files of this task (or, where the scheduler keeps it in the CLI's rank
    log, submitit's file naming that log), then submitit's own processing."""
    environment, signal_name, folder, *flags = args
    os.umask(0o077)  # what the call writes (its pickled result, its logs) is the user's alone, as before
    _environment(environment, signal_name)  # before submitit's import: it reads the signal's name then
    import submitit

    if ":" in environment:
        _launched_environment(*environment.split(":", 1))
    os.environ["SUBMITIT_FOLDER"] = folder
    env = submitit.JobEnvironment()
    _from_step(env)
    paths = env.paths
    os.makedirs(paths.folder, mode=0o700, exist_ok=True)
    given = _output_file()
    kept = None if given is not None else _kept_log(folder, env)
    if kept is not None:  # the local scheduler's supervisor logs this rank's pipe (stdout and stderr) there
        try:
            os.symlink(os.path.relpath(kept, os.path.dirname(paths.stdout)), paths.stdout)
        except FileExistsError:  # a requeued run's: the link is there
            pass
    else:
        for stream, path in ((1, paths.stdout), (2, paths.stderr)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            os.dup2(fd, stream)
            os.close(fd)
        if given is not None:
            _point_at(given, str(paths.stdout))
    _process(folder, paths.submitted_pickle, STOP_ON_TERM in flags)


def _kept_log(folder: str, env: Any) -> str | None:
    """The CLI's log of this rank (job-ID.rank-N.log beside submitit's folder, LOG_DIR/submitit/%j:
    executors._private_folder) where it is there before the rank wrote a byte: a scheduler that copies the
    rank's output pipe there (the local one's supervisor); None otherwise (mpiexec's pipe under PBS)."""
    from ...core.jobfiles import JobFiles

    log = JobFiles(os.path.dirname(os.path.dirname(folder)), str(env.job_id)).rank_log(env.global_rank)
    return log if os.path.isfile(log) and not os.path.islink(log) else None


def _process(folder: str, pickled: Any, stop_on_term: bool) -> None:
    """submitit's processing of the pickled call (:func:`_run_call`). Its local job environment's requeue (exit
    144, after the checkpoint) becomes the code every scheduler here requeues on, 128 + the warning signal, as a
    CLI job's script asks for it."""
    import time

    from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE

    # the submitter moves the pickled call into the job's folder once the scheduler gave the id, which a
    # scheduler without a queue starts at once: submitit's own wait for it looks only once a second
    for _ in range(6000):  # 60 s, as submitit's wait, which then says what it waited for
        if pickled.exists():
            break
        time.sleep(0.01)
    try:
        _run_call(folder, stop_on_term)
    except SystemExit as e:
        if e.code != LOCAL_REQUEUE_RETURN_CODE:
            raise
        from ...core.parse import signal_number

        sys.stdout.flush()
        os._exit(128 + signal_number(os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")))


def _run_call(folder: str, stop_on_term: bool) -> None:
    """The pickled call run as submitit's own job processing runs it, the same files for submitit's Job to read:
    its job environment's signal handlers (the checkpoint and requeue at the warning signal), then
    ("success", value) or ("error", the traceback's text) pickled beside the call (written aside, then renamed,
    so no reader sees half a file), the exception raised again. Not through submitit.core.submission: that module
    imports numpy before the call, whether the call needs it or not (about 100 ms of CPU, half of a rank's start
    on a short job: issue 39); a call that uses numpy loads it when it is unpickled or run, as any module.

    ``stop_on_term``: SIGTERM stops the rank (the stop's stack dump, armed later, chains to it) instead of
    being let pass as submitit's handlers let it pass (Slurm sends it to every process of a job it requeues;
    the checkpoint comes with the warning signal): for ranks under the rank supervisor here, whose SIGTERM
    means stop (another rank failed, a cancel, the time limit), which otherwise waited its grace (10 s) for
    SIGKILL before the job's failure reached results()."""
    import traceback

    from submitit.core import job_environment, utils
    from submitit.core.logger import get_logger

    logger = get_logger()
    env = job_environment.JobEnvironment()
    paths = env.paths
    logger.info(f"Starting with {env}")
    if not paths.submitted_pickle.exists():
        raise RuntimeError(f"waited 60 s for the pickled call {paths.submitted_pickle}, which never came")
    try:
        delayed = utils.DelayedSubmission.load(paths.submitted_pickle)
        env._handle_signals(paths, delayed)
        if stop_on_term:
            import signal

            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        result = delayed.result()
        logger.info("Job completed successfully")
        del delayed
        with utils.temporary_save_path(paths.result_pickle) as saved:
            utils.cloudpickle_dump(("success", result), saved)
        del result
    except Exception as error:
        try:
            with utils.temporary_save_path(paths.result_pickle) as saved:
                utils.cloudpickle_dump(("error", traceback.format_exc()), saved)
        except Exception as unsaved:  # noqa: BLE001  # the call's own error is the one raised
            logger.error(f"could not save the call's error ({error!r}): {unsaved!r}")
        logger.error("Submitted job triggered an exception")
        raise


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
