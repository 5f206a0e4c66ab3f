"""The Python API's jobs on a scheduler without a queue (the local one): jobs of that scheduler like the CLI's.

A job is the CLI's request (executors.rank_spec: the rank command runs the pickled call through the launcher)
handed to the scheduler's ``submit``, which for the local scheduler starts it at once, detached, under the one
rank supervisor (schedulers/supervisor.py, with the CLI's signals, grace and time limit) and writes its record
and index line: the job outlives the Python process that submitted it, and `slurmlaunch list`, `status`, `logs`
and `cancel` know it. Its handle (:class:`DetachedJob`) asks its state and cancels it through the scheduler's
interface, as for a queued job; its values are submitit's files, as everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from submitit.core import core, utils

from ...core.spec import JobSpec
from .executors import SpecExecutor


class _NoWatcher(core.InfoWatcher):
    """submitit's Job registers with a watcher: the state is the scheduler's (DetachedJob.state)."""

    def _make_command(self) -> list[str] | None:
        return None


class DetachedJob(core.Job[Any]):
    """submitit's Job (its files, its tasks) of a job the scheduler runs detached: state, done and cancel
    through the scheduler's interface (its ``status`` and ``cancel``, which read the job's files and its
    supervisor)."""

    watcher = _NoWatcher()

    def __init__(self, folder: str | Path, job_id: str, tasks: Any = (0,), scheduler: str = "local",
                 log_dir: str = "") -> None:
        self._scheduler, self._log_dir = scheduler, log_dir
        super().__init__(folder, job_id, tasks)
        for sub in self._sub_jobs:
            assert isinstance(sub, DetachedJob)
            sub._scheduler, sub._log_dir = scheduler, log_dir

    @property
    def _edge(self) -> Any:
        from ...schedulers.registry import scheduler

        return scheduler(self._scheduler)

    def _status(self) -> Any:
        return self._edge.status(self.job_id, self._log_dir)

    @property
    def state(self) -> str:
        """The scheduler's state (Slurm's words: RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT)."""
        return str(self._status().state)

    def done(self, force_check: bool = False) -> bool:
        return bool(self._status().finished)

    def cancel(self, check: bool = True) -> None:
        from ...core.errors import SlurmLaunchError

        try:
            self._edge.cancel(self.job_id, self._log_dir)
        except SlurmLaunchError:  # it has ended already
            if check:
                raise


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

        spec = self.rank_spec()
        submission = scheduler(self.scheduler).submit(spec, "")
        return DetachedJob(self.folder, submission.job_id, tuple(range(spec.world_size)), self.scheduler,
                           spec.log_dir)
