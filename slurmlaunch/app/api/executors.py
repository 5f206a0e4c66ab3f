"""submitit's executors, set up for a job: on a scheduler without a queue (local) DetachedExecutor, which hands
the CLI's request to the scheduler's submit (the job's handle: local.py); on a queued scheduler (Slurm, PBS)
SpecExecutor, whose batch script is the CLI's (``edge.render`` of the job's JobSpec, the rank command
running the pickled call under the launcher), in private folders."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

from submitit.core import core, utils

from ...core.errors import SpecError

# JobSpec's module is for the type checker only: submitit loads its plug-ins (pbs.py, hence this module) in every
# rank of every job, ours and plain submitit's alike, and that module alone was most of the plug-in's cost
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...core.spec import JobSpec


def _minutes(time_text: str | None) -> int:
    """submitit's timeout_min for --time: whole minutes, rounded up; no limit (unset, UNLIMITED, INFINITE, or
    0, which sbatch reads as no limit) as a year."""
    from ...core.spec import time_seconds

    seconds = None if time_text is None else time_seconds(time_text)
    return 60 * 24 * 365 if seconds is None else max(1, -(-seconds // 60))


def _private_folder(spec: JobSpec) -> Path:
    """The folder of submitit's files (the pickled arguments and results): the user's alone, as the CLI's
    job records are. Nothing removes them: submitit never does, and result() can be asked again later."""
    base = Path(spec.log_dir) / "submitit"
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o700)
    return base / "%j"


def _executor(spec: JobSpec, name: str) -> Any:
    """The submitit executor of scheduler ``name``: DetachedExecutor (the scheduler's own detached job, the
    CLI's) for a scheduler without a queue; else SpecExecutor, which renders and submits the CLI's batch script
    through the scheduler's edge (submitit's Job of a scheduler submitit knows, Slurm's; else the API's own, PBS's)."""
    from ...schedulers.registry import scheduler

    edge = scheduler(name)
    own = edge.queued and edge.submitit_executor is None
    if own:  # what the edge cannot carry out is refused as the CLI refuses it, before any file is written
        edge.refuse_unsupported(spec)
    folder = _private_folder(spec)
    if spec.warning_note:  # the CLI's line: the warning moved half-way (a time limit too short for it)
        sys.stderr.write(f"slurmlaunch: {spec.warning_note}\n")
    if not edge.queued:
        for note in edge.start_notes(spec):  # the CLI's lines: a partition, --mem... this machine only shows
            sys.stderr.write(f"slurmlaunch: {note}\n")
        # submitit counts its requeues after a time-out down from max_num_timeout, as on a queue
        local = DetachedExecutor(str(folder), spec, name, max_num_timeout=spec.preemption.max_requeues)
        local.update_parameters(timeout_min=_minutes(spec.resources.time))
        return local
    if spec.warning is None and edge.submitit_executor is not None:
        raise SpecError(f"signal {spec.preemption.signal!r} is not carried out under Slurm by the submitit-based API "
                        f"(submitit always asks for a warning signal): give NAME@SECONDS, or use `slurmlaunch submit`")
    if own:
        if spec.preemption.requeue:
            raise SpecError(REQUEUE_REFUSED)
    # submitit counts its requeues after a time-out down from max_num_timeout (preemptions are not counted)
    ex = SpecExecutor(str(folder), spec, name, max_num_timeout=spec.preemption.max_requeues if not own else 0)
    ex.update_parameters(timeout_min=_minutes(spec.resources.time))
    return ex


class SpecExecutor(core.PicklingExecutor):
    """submitit's executor whose batch script is the CLI's: ``edge.render`` of the job's JobSpec (the same
    template, batch step and directives as `slurmlaunch submit`), its program the launcher running this
    package's rank module (rank.py), which runs submitit's processing of the pickled call; submitted with the
    CLI's command line (sbatch's, qsub's). One job, or one job array with submit_array (map_array, batch)."""

    def __init__(self, folder: str | Path, spec: JobSpec | None = None, scheduler: str = "slurm",
                 max_num_timeout: int = 0) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout)
        self.spec = spec
        self.scheduler = scheduler
        self.job_class = _job_class(scheduler)  # submitit's class attribute: per scheduler here
        self._array_count = 0

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return {"timeout_min"}

    def _spec(self) -> JobSpec:
        if self.spec is None:
            raise ValueError("SpecExecutor needs the job's JobSpec (slurmlaunch.submit(...))")
        return self.spec

    def _num_tasks(self) -> int:
        return self._spec().world_size

    @property
    def _submitit_command_str(self) -> str:
        return "unused"  # the script is rendered from the spec (_make_submission_file_text)

    def rank_spec(self) -> JobSpec:
        """The job's JobSpec with the rank command running the pickled call (and, for map_array, an array)."""
        return rank_spec(self._spec(), self.scheduler, str(self.folder), self._array_count)

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        from ...schedulers.registry import scheduler

        return scheduler(self.scheduler).render(self.rank_spec())

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        from ...schedulers.registry import scheduler

        return scheduler(self.scheduler).submit_command(self.rank_spec(), str(submission_file_path))

    def _get_job_id_from_submission_command(self, string: bytes | str) -> str:  # type: ignore[override]
        from ...schedulers.registry import scheduler

        text = (string.decode() if isinstance(string, bytes) else string).strip()
        job_id = scheduler(self.scheduler).parse_job_id(text.splitlines()[-1] if text else text)
        if job_id is None:
            raise utils.FailedSubmissionError(f"{text!r} is not a job id")
        return job_id

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
        jobs: list[core.Job[Any]] = [self.job_class(folder=self.folder, job_id=f"{first.job_id}_{i}", tasks=tasks)
                                     for i in range(len(pickles))]
        for job, path in zip(jobs, pickles, strict=True):
            job.paths.move_temporary_file(path, "submitted_pickle")
        return jobs


class DetachedExecutor(SpecExecutor):
    """submitit's pickling executor whose every job (a map_array's too: one job each, run side by side) is the
    CLI's request handed to the scheduler's ``submit``, which starts it detached."""

    _checkpointable = False

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[core.Job[Any]]:
        jobs = []
        for delayed in delayed_submissions:
            self._checkpointable = hasattr(delayed.function, "checkpoint")
            jobs += core.PicklingExecutor._internal_process_submissions(self, [delayed])
        return jobs

    def rank_spec(self) -> JobSpec:
        """The CLI's request (SpecExecutor's), requeued by the scheduler when a checkpointable call asks for it:
        its rank 0 saves at the warning and exits 128 + the warning signal (rank.py), as a CLI job's script
        does."""
        spec = super().rank_spec()
        if self._checkpointable and spec.warning is not None and not spec.preemption.requeue:
            spec = spec.changed(requeue=True)
        return spec

    def _submit_command(self, command: str) -> core.Job[Any]:
        from ...schedulers.registry import scheduler
        from .local import DetachedJob

        spec = self.rank_spec()
        submission = scheduler(self.scheduler).submit(spec, "")
        return DetachedJob(self.folder, submission.job_id, tuple(range(spec.world_size)), self.scheduler,
                           spec.log_dir)


def _job_class(scheduler: str) -> type[core.Job[Any]]:
    """submitit's own Job where submitit runs the scheduler's jobs itself (its one queued executor, Slurm's: its
    sacct watcher, its scancel), else EdgeJob, whose state and cancel job.py asks the scheduler's edge for."""
    from ...schedulers.registry import scheduler as edge_of

    if edge_of(scheduler).submitit_executor is not None:
        from submitit.slurm.slurm import SlurmJob  # submitit's only queued executor

        return SlurmJob
    return EdgeJob


def rank_spec(spec: JobSpec, scheduler: str, folder: str, array_count: int = 0) -> JobSpec:
    """``spec`` with its program the API's rank (rank.py: submitit's processing of the pickled call in
    ``folder``), run by the launcher as any CLI job's script is; a job array of ``array_count`` elements (0-N)
    when above 1; without the rendezvous watchdog unless ``rdzv_timeout`` was given. Everything else, and so every
    line of the batch script but the rank command, is the user's request as `slurmlaunch submit --dry-run`
    renders it (with --rdzv-timeout 0 where the API's request left it out)."""
    from ...schedulers.registry import scheduler as edge_of
    from .rank import MODULE, argv

    edge = edge_of(scheduler)
    # submitit's job environment of that name; a plug-in's that submitit does not know: the launcher's (rank.py)
    environment = edge.submitit_executor or scheduler
    if edge.job_id_variable is not None:
        environment = f"{environment}:{edge.job_id_variable}"
    signal_name = spec.warning[0] if spec.warning else None
    # a scheduler without a queue runs the ranks here under the rank supervisor, whose SIGTERM means stop (a
    # failed rank, a cancel, the time limit): not let pass as submitit's handlers let Slurm's pass (rank.py)
    changed: dict[str, Any] = {"script": MODULE, "module": True, "no_python": False, "legacy_local_rank_arg": False,
                               "args": tuple(argv(environment, signal_name, folder, stop_on_term=not edge.queued))}
    if spec.environment.rdzv_timeout is None:
        # no rendezvous watchdog (the launcher's, beside every rank but 0) unless asked for: a function need
        # not rendezvous at all, and one that makes no connection for 900 s would be stopped (the API's ranks
        # never had one); rdzv_timeout=SECONDS brings it back, as --rdzv-timeout does for the CLI
        changed["rdzv_timeout"] = 0.0
    if array_count > 1:
        changed["array"] = f"0-{array_count - 1}"
    return spec.changed(**changed)


def _choose(requested: str) -> str:
    """--scheduler's one definition (schedulers/choice.py), within what the API runs on, quietly: auto keeps to
    the schedulers submitit runs itself (Slurm, local); one the API's own executor runs (PBS, app/api/pbs.py)
    only when named, and then its client must be there."""
    from ...schedulers.choice import choose
    from ...schedulers.registry import NAMES, canonical, scheduler

    named = canonical(requested)
    own = named is not None and scheduler(named).submitit_executor is None
    # a named one is allowed as it is: the others' modules (the local one brings the launcher's) are not loaded
    allowed = (named,) if named is not None else tuple(n for n in NAMES if scheduler(n).submitit_executor is not None)
    return choose(requested, allowed=allowed, check_client=own, announce=False)


class _EdgeWatcher(core.InfoWatcher):
    """submitit's Job registers with a watcher: job.py asks the scheduler's edge itself."""

    def _make_command(self) -> list[str] | None:
        return None


class EdgeJob(core.Job[Any]):
    """submitit's Job of a scheduler submitit does not run itself (PBS): a handle on submitit's files of the
    job; its state and its cancel are the scheduler edge's, which job.py (slurmlaunch.Job) asks."""

    watcher = _EdgeWatcher()

    def cancel(self, check: bool = True) -> None:
        raise NotImplementedError("cancel through slurmlaunch.Job.cancel(): it asks the job's scheduler")


# What the CLI does at the warning under PBS (submit its script again: PBS lets no job's own user qrerun it) the
# API cannot: its jobs are submitit's, with no script of ours kept to submit again. Refused before any qsub.
REQUEUE_REFUSED = ("requeue=True: the Python API's PBS jobs are not submitted again at the warning (PBS lets no job's "
                   "own user qrerun it, and the API keeps no batch script to resubmit; `slurmlaunch submit --scheduler "
                   "pbs --requeue` does); leave requeue out (the job stays rerunnable after a node failure, PBS's "
                   "default) and resume from your checkpoint in a new submit()")
