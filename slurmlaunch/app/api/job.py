"""The handle of a submitted job: its state, its logs, its ranks' values."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from ...core.spec import JobSpec
from .collect import _collect

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..stacks import Stacks

_SACCT_EVERY_S = 2  # at most one sacct per this many seconds, for all the jobs being waited for together
# squeue's states (`-t all`) of a job that has ended (squeue(1), JOB STATE CODES)
_FINAL_QUEUE_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                       "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT")
# The first line the batch shell writes to the batch log at each start: srun's reports before the last


class Job:
    """A submitted distributed job (one submitit job with one task per rank)."""

    def __init__(self, job: Any, spec: JobSpec, scheduler: str) -> None:
        self._job = job
        self.spec = spec
        self.scheduler = scheduler
        self._queue_asked = -float("inf")
        self._queued: str | None = None

    @property
    def job_id(self) -> str:
        return str(self._job.job_id)

    @property
    def state(self) -> str:
        """The scheduler's state: final (COMPLETED, FAILED, CANCELLED by ..., TIMEOUT; locally FINISHED or
        INTERRUPTED) exactly when done() is true. Under Slurm, sacct's (at most 2 s old), and PENDING for a
        job submitted but not in accounting yet."""
        if self.scheduler == "local":
            return str(self._job.state)
        state = str(_watcher().get_state(self.job_id, mode="standard"))
        if state == "UNKNOWN":  # not in accounting (yet, or at all): the queue's word
            queued = self._queue_state()
            # "" is a job gone from the queue with no accounting record: it ended, how is not known
            return queued if queued not in (None, "") else ("PENDING" if queued is None else "ENDED")
        return state

    def done(self) -> bool:
        """Whether the job has ended (under Slurm: sacct says so; rank result files alone do not end a job,
        so state and done() agree)."""
        if self.scheduler == "local":
            return bool(self._job.done())
        watcher = _watcher()
        if watcher.is_done(self.job_id, mode="standard"):
            return True
        if str(watcher.get_state(self.job_id, mode="cache")) != "UNKNOWN":
            return False
        # sacct has no record: accounting is off at this site (sacct fails), or not caught up yet. Without
        # this, a site without accounting would wait forever. squeue knows the job until MinJobAge after its
        # end (with its final state), and not at all after: either means it ended.
        queued = self._queue_state()
        return queued == "" or queued in _FINAL_QUEUE_STATES

    def _queue_state(self) -> str | None:
        """squeue's state of the job (final states too, while slurmctld keeps them), "" when squeue does not
        know it, None when squeue could not be asked; at most one squeue per _SACCT_EVERY_S per job."""
        now = time.monotonic()
        if now - self._queue_asked < _SACCT_EVERY_S:
            return self._queued
        self._queue_asked = now
        try:
            r = subprocess.run(["squeue", "-h", "-t", "all", "-j", self.job_id, "-o", "%T"], capture_output=True,
                               text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self._queued = None
            return None
        if r.returncode != 0:  # "Invalid job id specified": gone from slurmctld's memory
            self._queued = "" if "Invalid job id" in r.stderr else None
        else:
            self._queued = r.stdout.strip().split("\n")[0].strip()
        return self._queued

    def _wait(self) -> str | None:
        """Wait for the job's end; its final state under Slurm (None locally)."""
        if self.scheduler == "local":
            while not self._job.done():  # the controller has ended: every rank has, and it wrote its status
                time.sleep(0.1)
            return None
        while not self.done():
            time.sleep(0.5)
        return self.state

    def stacks(self, timeout: float = 10.0) -> Stacks:
        """Where every rank is: their Python stacks grouped by the main thread's (``.grouping.groups``: the
        odd ones first, each with its ranks, nodes, frames and summary line; ``.data()`` as JSON-ready data),
        live while the job runs, else those its ranks saved when they were stopped. Each node answers within
        ``timeout`` seconds or its ranks are named as not reached (slurmlaunch stacks JOB, README)."""
        from ...core.jobfiles import JobFiles
        from ..stacks import collect_stacks

        live = not self.done()
        nodes = None
        if live and self.scheduler != "local":
            r = subprocess.run(["squeue", "-h", "-j", self.job_id, "-o", "%N"], capture_output=True, text=True,
                               timeout=60)
            nodes = r.stdout.strip() or None
        return collect_stacks(self.scheduler, self.job_id, JobFiles(self.spec.log_dir, self.job_id),
                              self.spec.world_size, self.spec.python, live, nodes, timeout)

    def cancel(self) -> None:
        self._job.cancel(check=False)

    def logs(self, rank: int = 0) -> str:
        """What rank ``rank`` printed (stdout, then stderr)."""
        task = self._job.task(rank)
        return (task.stdout() or "") + (task.stderr() or "")

    def results(self) -> list[Any]:
        """Every rank's return value, by rank; waits for the job. Raises RankFailed for the first rank that
        failed (by time), with its traceback or how its process ended."""
        values = _collect(self._job, self.spec.world_size, self._wait())
        return [values[rank] for rank in range(self.spec.world_size)]

    def result(self) -> Any:
        """Rank 0's return value (waits for the job; raises RankFailed when any rank failed). Only rank 0's
        value is loaded: the others' are checked for failure, not read."""
        return _collect(self._job, self.spec.world_size, self._wait(), wanted=(0,))[0]

    def __repr__(self) -> str:
        return f"slurmlaunch.Job({self.job_id!r}, {self.scheduler}, {self.spec.world_size} ranks)"


_WATCHERS: list[Any] = []


def _watcher() -> Any:
    """One sacct watcher for every API job of this process (submitit's batches the ids it is asked about
    into one sacct call); ours refreshes at most every _SACCT_EVERY_S, where submitit's shared one backs off
    to minutes for long jobs, which would delay the news of a job's end as long."""
    if not _WATCHERS:
        from submitit.slurm.slurm import SlurmInfoWatcher

        _WATCHERS.append(SlurmInfoWatcher(delay_s=_SACCT_EVERY_S))
    return _WATCHERS[0]

