"""The API on PBS: submitit's plugin interface (the ``submitit`` entry-point group, pyproject.toml) filled with a
PBS executor, its job and its job environment. The batch script asks for the CLI's resources (the #PBS lines of
render/pbs_script.py) and starts one submitit task per rank the way the CLI's script does: Open MPI's mpiexec
over $PBS_NODEFILE, its daemons started through pbs_tmrsh (no `tm` in Debian's Open MPI), under the CLI's batch
step (allocation/batch_step.py: the warning signal before the walltime, the first failure named). Each rank writes its
own submitit log files (run as ``python -m slurmlaunch.app.api.pbs FOLDER``), so the caller's collection is the
same as under Slurm (collect.py); mpiexec stops the other ranks when one fails, so the job ends at once and
qstat says so (job.py asks it at most every 2 s)."""

from __future__ import annotations

import os
import shlex
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import submitit
from submitit.core import core, utils

from ...core.errors import SpecError
from ...core.spec import JobSpec
from .collect import _MPIEXEC_REPORT

# The variables the script gives every rank (forwarded by mpiexec -x): the job's id as submitit names it.
_JOB_ID = "SLURMLAUNCH_PBS_JOB_ID"
_ARRAY_ID = "SLURMLAUNCH_PBS_ARRAY_ID"


class PbsJobEnvironment(submitit.JobEnvironment):
    """A rank of a PBS job started by the script below: Open MPI's rank variables, the script's job id."""

    _env = {"job_id": _JOB_ID, "array_job_id": _ARRAY_ID, "array_task_id": "PBS_ARRAY_INDEX",
            "num_tasks": "OMPI_COMM_WORLD_SIZE", "num_nodes": "SLURMLAUNCH_PBS_NODES",
            "global_rank": "OMPI_COMM_WORLD_RANK", "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK"}

    @property
    def node(self) -> int:
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")) or 1
        return self.global_rank // local  # --map-by ppr:N:node fills each node in turn

    @property
    def hostnames(self) -> list[str]:
        """The job's hosts in PBS's order (the distinct lines of $PBS_NODEFILE, which mpiexec -x passes on):
        submitit's TorchDistributedEnvironment takes the first as MASTER_ADDR, as the launcher does."""
        try:
            with open(os.environ["PBS_NODEFILE"], encoding="utf-8") as f:
                hosts = list(dict.fromkeys(line.strip() for line in f if line.strip()))
        except (KeyError, OSError, ValueError):  # ValueError: not UTF-8
            hosts = []
        # unreadable: the master the launcher chose, the same for every rank (its own host would not be)
        return hosts or [os.environ.get("MASTER_ADDR") or self.hostname]


class _PbsWatcher(core.InfoWatcher):
    """submitit's Job registers with a watcher: job.py asks qstat itself (schedulers/pbs.py)."""

    def _make_command(self) -> list[str] | None:
        return None


class PbsJob(core.Job[Any]):
    watcher = _PbsWatcher()

    def cancel(self, check: bool = True) -> None:
        from ...core.errors import SchedulerError
        from ...schedulers import pbs

        try:
            pbs.cancel(self.job_id)
        except SchedulerError:
            if check:
                raise


class PbsExecutor(core.PicklingExecutor):
    """One job (or one job array, with submit_array) of ``spec.world_size`` ranks on PBS Pro / OpenPBS."""

    job_class = PbsJob

    def __init__(self, folder: str | Path, spec: JobSpec | None = None, max_num_timeout: int = 0) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout)
        self.spec = spec
        self._array_count = 0

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return {"timeout_min"}

    def _spec(self) -> JobSpec:
        if self.spec is None:
            raise ValueError("PbsExecutor needs the job's JobSpec (slurmlaunch.submit(..., scheduler='pbs'))")
        return self.spec

    def _num_tasks(self) -> int:
        return self._spec().world_size

    @property
    def _submitit_command_str(self) -> str:
        return "unused"  # the script is built from the spec (_make_submission_file_text)

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        from ...schedulers.pbs import qsub_command

        return qsub_command(self._spec(), str(submission_file_path))

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        from ...schedulers.pbs import parse_job_id

        text = (string.decode() if isinstance(string, bytes) else string).strip()
        job_id = parse_job_id(text)
        if job_id is None:
            raise utils.FailedSubmissionError(f"qsub printed {text!r}, which is not a job id (expected ID.server)")
        return job_id

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return batch_script(self._spec(), str(self.folder), self._array_count)

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[core.Job[Any]]:
        if len(delayed_submissions) == 1:
            return super()._internal_process_submissions(delayed_submissions)
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        pickles = []
        for delayed in delayed_submissions:
            path = folder / f"{uuid.uuid4().hex}.pkl"
            delayed.set_timeout(self.parameters.get("timeout_min", 5), self.max_num_timeout)
            delayed.dump(path)
            pickles.append(path)
        self._array_count = len(delayed_submissions)
        try:
            first = self._submit_command(self._submitit_command_str)
        finally:
            self._array_count = 0
        tasks = list(range(first.num_tasks))
        jobs: list[core.Job[Any]] = [PbsJob(folder=self.folder, job_id=f"{first.job_id}_{i}", tasks=tasks)
                                     for i in range(len(pickles))]
        for job, path in zip(jobs, pickles, strict=True):
            job.paths.move_temporary_file(path, "submitted_pickle")
        return jobs


# What the CLI does at the warning under PBS (submit its script again: PBS lets no job's own user qrerun it) the
# API cannot: its jobs are submitit's, with no script of ours kept to submit again. Refused before any qsub.
REQUEUE_REFUSED = ("requeue=True: the Python API's PBS jobs are not submitted again at the warning (PBS lets no job's "
                   "own user qrerun it, and the API keeps no batch script to resubmit; `slurmlaunch submit --scheduler "
                   "pbs --requeue` does); leave requeue out (the job stays rerunnable after a node failure, PBS's "
                   "default) and resume from your checkpoint in a new submit()")


def batch_script(spec: JobSpec, folder: str, array_count: int = 0) -> str:
    """The qsub script: the CLI's #PBS lines (a job array of ``array_count`` when above 1), the --env exports and
    --setup lines, then one rank per slot through mpiexec, run by the batch step with the CLI's plan, each rank
    running this module."""
    from ...render.launch import batch_step_command, script_env
    from ...render.pbs_script import batch_step_plan, check, directives, mpiexec_args

    check(spec)
    if spec.preemption.requeue:
        raise SpecError(REQUEUE_REFUSED)
    env = script_env(spec)
    lines = ["#!/bin/bash -l", "# Generated by slurmlaunch's Python API (submitit, PBS executor)"]
    lines += [f"#PBS {d}" for d in directives(spec)]
    if array_count > 1:
        lines.append(f"#PBS -J 0-{array_count - 1}")
    lines += ["umask 077  # what this job writes (results, logs) is the user's alone"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env]
    lines += list(spec.environment.setup)
    # the signal submitit's handler in the ranks listens to: the batch step's warning (as under Slurm)
    preempt = [f"export SUBMITIT_PREEMPT_SIGNAL={spec.warning[0]}"] if spec.warning else []
    lines += [f"cd {shlex.quote(spec.program.workdir)} || exit 2", *preempt,
              "export SUBMITIT_EXECUTOR=pbs",
              f"export SLURMLAUNCH_PBS_NODES={spec.resources.nodes}",
              f'export {_JOB_ID}="${{PBS_JOBID%%.*}}"']
    job = '"$' + _JOB_ID + '"'
    if array_count > 1:
        lines.append(f'export {_ARRAY_ID}="${{PBS_JOBID%%[*}}"')
        job = f'"${{{_ARRAY_ID}}}_${{PBS_ARRAY_INDEX}}"'
    # submitit's folder of this job (its %j: the job id as the ranks' JobEnvironment names it), where mpiexec's
    # stderr is kept too: Open MPI names there the first rank that ended badly (collect._mpiexec_ends)
    lines += [f"job_folder={job.join(shlex.quote(part) for part in folder.split('%j'))}",
              'mkdir -p -m 700 "$job_folder" || exit 2',
              f'mpiexec_report="$job_folder/"{job}{shlex.quote(_MPIEXEC_REPORT.format(job_id=""))}']
    args, hostfile_flag = mpiexec_args(spec, env)
    names = ["SUBMITIT_EXECUTOR", "SLURMLAUNCH_PBS_NODES", _JOB_ID, *([_ARRAY_ID, "PBS_ARRAY_INDEX"]
                                                                    if array_count > 1 else []),
             *(["SUBMITIT_PREEMPT_SIGNAL"] if preempt else [])]
    forwards = [a for n in names for a in ("-x", n)]
    hostfile = f' {hostfile_flag} "$PBS_NODEFILE"' if hostfile_flag else ""
    command = [spec.program.python, "-u", "-m", "slurmlaunch.app.api.pbs", folder]
    # mpiexec runs under the batch step (allocation/batch_step.py) with the CLI's plan (render/pbs_script.py): the
    # warning signal --signal's seconds before the walltime (PBS sends none), the first failure named and its
    # code, a qdel or the walltime outlived until mpiexec ended. Its files (job-ID.*) go in the job's folder.
    # Not exec'd, since its stderr (with mpiexec's) is also kept for collect.py: so the batch shell waits out a
    # SIGTERM (a trap defers it until the pipeline ended), and tee ignores it, to keep what mpiexec says last.
    step = [*batch_step_command(spec), *batch_step_plan(spec)]
    lines += ["trap 'true' TERM",
              "exec 3>&1",
              f'{shlex.join(step)} --log-dir "$job_folder" --job {job} -- \\',
              f"    mpiexec {shlex.join([*args, *forwards])}{hostfile} {shlex.join(command)} \\",
              """    2>&1 1>&3 3>&- | (trap '' TERM; exec tee -a "$mpiexec_report" >&2)""",
              "rc=${PIPESTATUS[0]}",
              "exec 3>&-"]
    lines += ['exit "$rc"', ""]
    return "\n".join(lines)


def _rank_main(argv: Sequence[str]) -> None:
    """A rank: its stdout and stderr into submitit's files of this task, then submitit's own processing."""
    from submitit.core.submission import process_job

    os.environ["SUBMITIT_FOLDER"] = argv[0]
    paths = PbsJobEnvironment().paths
    for stream, path in ((1, paths.stdout), (2, paths.stderr)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.dup2(fd, stream)
        os.close(fd)
    process_job(argv[0])


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
