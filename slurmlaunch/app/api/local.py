"""The Python API's jobs on a scheduler without a queue (the local one): jobs of that scheduler like the CLI's.

A job is the CLI's request (executors.rank_spec: the rank command runs the pickled call through the launcher)
handed to the scheduler's ``submit`` (executors.DetachedExecutor), which for the local scheduler starts it at
once, detached, under the one rank supervisor (schedulers/supervisor.py, with the CLI's signals, grace and time
limit) and writes its record and index line: the job outlives the Python process that submitted it, and
`slurmlaunch list`, `status`, `logs` and `cancel` know it. Its handle (:class:`DetachedJob`) asks its state and
cancels it through the scheduler's interface, as for a queued job; its values are submitit's files, as
everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from submitit.core import core


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
