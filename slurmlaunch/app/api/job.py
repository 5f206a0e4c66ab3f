"""The handle of a submitted job: its state, its logs, its ranks' values."""

from __future__ import annotations

import json
import os
import time
import weakref
from pathlib import Path
from typing import Any

from ...core.spec import JobSpec
from .calls import _exit_record
from .collect import _STOPPED_STATES, _collect, _outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...core.timeline import Timeline
    from ...schedulers.interface import Scheduler
    from ..jobs.stacks import Stacks

# How a wait under Slurm asks (docs: From Python, and Benchmarks). The scheduler is asked at
# most once per _SACCT_EVERY_S for all the jobs waited for together (one sacct); the ranks' result files are
# looked at (a stat, no scheduler) every _LOOK_FIRST_S at first, backing off to _FILES_LAST_S as the wait
# grows (_pause), as submitit looks every second. When every rank left its value, squeue is asked once whether
# the job was stopped or requeued meanwhile; if not, the values are the job's and the wait ends there, without
# waiting for the job's end to reach accounting (the 2 s a short job's result used to sit on disk).
_SACCT_EVERY_S = 2
_FILES_FIRST_S = 0.05  # the login node's wait for several jobs (runner.py): every job's files per look
_LOOK_FIRST_S = 0.01
_FILES_LAST_S = 1.0
_FILES_BACKOFF_S = 20.0  # the file poll reaches _FILES_LAST_S after this many seconds of waiting


def _pause(waited: float) -> float:
    """The pause before the next look at one job's files (or, without a queue, its status), ``waited`` seconds
    into the wait: 10 ms at first, growing with the square of the wait to _FILES_LAST_S at _FILES_BACKOFF_S.
    Most looks come early, when a short job's values come (issue 39: the 50 ms pause was half the time between
    a one-call job's value and its result()); a look costs about 0.2 ms of CPU, about 280 of them the first 20 s."""
    return min(_FILES_LAST_S, _LOOK_FIRST_S + _FILES_LAST_S * (waited / _FILES_BACKOFF_S) ** 2)
# squeue's states (`-t all`) of a job that has ended (squeue(1), JOB STATE CODES)
_FINAL_QUEUE_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                       "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT")
# squeue's states in which values on disk may not be this run's last word: it is queued again (requeued,
# preempted), or was stopped from outside (the full wait then says so, as it does without the early end).
_UNCONFIRMED = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                "SUSPENDED", "STOPPED", "SIGNALING", *_STOPPED_STATES)
# The final states (in Slurm's words) of a job the API's own executor runs (PBS: schedulers/pbs.py's), and
# ENDED: gone from the server's history
_EDGE_FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "ENDED")


class Job:
    """A submitted distributed job (one submitit job with one task per rank)."""

    def __init__(self, job: Any, spec: JobSpec, scheduler: str) -> None:
        self._job = job
        self.spec = spec
        self.scheduler = scheduler
        self._queue_asked = -float("inf")
        self._queued: str | None = None
        self._returned: set[int] = set()  # ranks whose value (or sys.exit(0)) is on disk
        self._confirm_asked = False
        self._confirmed: str | None = None  # squeue's state, asked once every rank had returned
        # what the scheduler said of the job the first time it was asked (its submit time, name): a handle kept
        # (pickled) past a cluster started again, or sent to another cluster's login node, must not act on
        # another job given the same id (app/records.py)
        self._identity: dict[str, str] | None = None
        if self._watched:
            self._register()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_returned": set(), "_confirm_asked": False, "_confirmed": None, "_identity": None,
                              **state})
        if self._watched:  # a handle sent back and forth (remote=): a job this process waits for
            self._register()

    @property
    def _edge(self) -> Scheduler:
        from ...schedulers.registry import scheduler

        return scheduler(self.scheduler)

    @property
    def _watched(self) -> bool:
        """Whether submitit's own executor runs it on a queue (Slurm): its sacct watcher and squeue answer."""
        edge = self._edge
        return edge.queued and edge.submitit_executor is not None

    def _register(self) -> None:
        """A job this process may wait for: known to the confirmation and to the sacct watcher from the start.
        The watcher asks sacct at once after each new job it learns of: learning of a map_array's jobs one at
        a time, as a loop over their result() reaches each, would make one sacct a job."""
        _WAITING.add(self)
        _watcher().register_job(self.job_id)

    @property
    def job_id(self) -> str:
        return str(self._job.job_id)

    @property
    def state(self) -> str:
        """The scheduler's state: final (COMPLETED, FAILED, CANCELLED by ..., TIMEOUT) exactly when done() is
        true. Under Slurm, sacct's (at most 2 s old), and PENDING for a
        job submitted but not in accounting yet; squeue's while sacct has no record, or once every rank
        returned (its values may come before accounting has caught up with the job's end)."""
        if not self._edge.queued:
            return str(self._job.state)
        if self._identity is None:  # asked once: later answers are compared with it at cancel
            self._same_job()
        return self._scheduler_state()[0]

    def _same_job(self, strict: bool = False) -> bool:
        """Whether the scheduler's job of this id is still this handle's: the first answer is kept, later ones
        compared with it (schedulers.same_job); True where the scheduler knows no such job (its state then says
        how it ended), and where it cannot be asked, unless ``strict`` (cancel): then its SchedulerError."""
        from ...core.errors import SchedulerError
        from ...schedulers import same_job

        if not self._edge.queued:
            return True
        try:
            seen = self._edge.identity(self.job_id)
        except SchedulerError as e:
            if strict:
                raise SchedulerError(f"job {self.job_id}: {self._edge.title} could not be asked whether its job "
                                     f"of that id is still this one ({e}): nothing cancelled") from None
            return True
        if self._identity is None:
            self._identity = seen
            return True
        return same_job(self._identity, seen) is not False

    def done(self) -> bool:
        """Whether the job has ended (under Slurm: sacct, or squeue as for state, says so; rank result files
        alone do not end a job, so state and done() agree: result() may return before done() is true)."""
        if not self._edge.queued:
            return bool(self._job.done())
        return self._scheduler_state()[1]

    def _scheduler_state(self) -> tuple[str, bool]:
        """(state, whether it is final) under Slurm: sacct's; squeue's where sacct has no record (accounting
        off at this site, or not caught up yet: without it a site without accounting would wait forever),
        and where every rank has returned (squeue knows a job's end at once, sacct some time later). squeue
        knows a job until MinJobAge after its end (with its final state), and not at all after ("ENDED")."""
        if not self._watched:
            return self._edge_state()
        watcher = _watcher()
        state = str(watcher.get_state(self.job_id, mode="standard"))
        if state != "UNKNOWN" and watcher.is_done(self.job_id, mode="cache"):
            return state, True
        if state != "UNKNOWN" and self._confirmed is None:
            return state, False
        queued = self._queue_state()
        if queued == "":
            return "ENDED", True
        if queued in _FINAL_QUEUE_STATES:
            return queued, True
        if state == "UNKNOWN":
            return ("PENDING" if queued is None else queued), False
        return (queued or state), False

    def _edge_state(self) -> tuple[str, bool]:
        """(state, whether it is final) of a job the API's own executor runs, from the scheduler's edge (PBS:
        the real qstat -x -f -F json's, read by the CLI's own mapping, schedulers/pbs.py: a qdel'd job is
        CANCELLED), asked at most once per _SACCT_EVERY_S; a job the server no longer knows (its history
        expired) has ended."""
        from ...core.errors import SchedulerError

        now = time.monotonic()
        if self._queued is None or now - self._queue_asked >= _SACCT_EVERY_S:
            self._queue_asked = now
            try:
                self._queued = self._edge.status(self.job_id, None).state
            except SchedulerError as e:
                if "Unknown Job Id" in str(e):
                    self._queued = "ENDED"
        state = self._queued or "PENDING"
        return state, state in _EDGE_FINAL

    def _queue_state(self, force: bool = False) -> str | None:
        """squeue's state of the job (final states too, while slurmctld keeps them), "" when squeue does not
        know it, None when squeue could not be asked; at most one squeue per _SACCT_EVERY_S per job (unless
        ``force``)."""
        now = time.monotonic()
        if not force and now - self._queue_asked < _SACCT_EVERY_S:
            return self._queued
        self._queue_asked = now
        states = self._edge.queue_states([self.job_id])  # {}: gone from the scheduler's memory
        self._queued = None if states is None else states.get(self.job_id, "")
        return self._queued

    def _all_returned(self) -> bool:
        """Whether every rank left its value (or ended by sys.exit(0)); stops at the first rank that has
        not, so a waiting job costs one stat per look, whatever its rank count."""
        for rank in range(self.spec.world_size):
            if rank in self._returned:
                continue
            result = Path(self._job.task(rank).paths.result_pickle)
            if result.exists():
                if _outcome(result) != "success":
                    return False  # a failure: the job's end, from the scheduler, decides what is raised
            else:
                try:
                    record = json.loads(_exit_record(result).read_text())
                except (OSError, ValueError):
                    return False
                if record.get("code") != 0:
                    return False
            self._returned.add(rank)
        return True

    def _early_end(self) -> str | None:
        """squeue's state when every rank returned and squeue (asked once) does not say the job was
        stopped or queued again since; None otherwise (the wait goes on to the job's end)."""
        if not self._watched:  # no early end: the job's end comes from the edge (PBS: qstat; mpiexec ends with
            return None        # the ranks)
        if self._confirmed is None and not self._confirm_asked and self._all_returned():
            _confirm([self, *(j for j in _WAITING if j is not self and j.scheduler == self.scheduler
                              and not j._confirm_asked and j._all_returned())])
        return self._confirmed

    def _wait(self, limit: float | None = None) -> tuple[bool, str | None]:
        """Wait for the job's end (at most ``limit`` seconds): whether it ended, and its state (under Slurm the
        confirmed squeue state when every rank's value came first)."""
        start = time.monotonic()
        deadline = None if limit is None else start + limit
        if not self._edge.queued:  # the scheduler's status (local.DetachedJob): its files and its supervisor
            while not self._job.done():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return False, None
                time.sleep(_pause(now - start))
            return True, str(self._job.state)
        while True:
            early = self._early_end()
            if early is not None:
                return True, early
            if self.done():
                return True, self.state
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False, None
            time.sleep(_pause(now - start))

    def cancel(self) -> None:
        """Cancel the job; JobStateError, and nothing cancelled, where the scheduler's job of this id is another
        one now (a cluster started again numbers from where it began); SchedulerError, nothing cancelled, where
        whether it is cannot be asked."""
        if self._identity is not None and not self._same_job(strict=True):
            from ...core.errors import JobStateError

            raise JobStateError(f"job {self.job_id} is gone; another job now has that id on {self._edge.title}: "
                                f"nothing cancelled")
        if self._edge.queued and not self._watched:  # a job submitit does not run itself: the edge cancels it
            from ...core.errors import SchedulerError

            try:
                self._edge.cancel(self.job_id)
            except SchedulerError:  # ended already (as submitit's cancel(check=False) lets it pass)
                pass
            return
        self._job.cancel(check=False)

    def logs(self, rank: int = 0) -> str:
        """What rank ``rank`` printed (stdout, then stderr)."""
        task = self._job.task(rank)
        return (task.stdout() or "") + (task.stderr() or "")

    def _values(self, state: str | None, rank0: bool) -> list[Any]:
        """The ranks' values once the wait ended with ``state`` (rank 0's alone with ``rank0``)."""
        log_dir = self.spec.log_dir  # the job's failure file is there (the batch step's, the local supervisor's)
        if rank0:
            return [_collect(self._job, self.spec.world_size, state, wanted=(0,), log_dir=log_dir)[0]]
        values = _collect(self._job, self.spec.world_size, state, log_dir=log_dir)
        return [values[rank] for rank in range(self.spec.world_size)]

    def results(self) -> list[Any]:
        """Every rank's return value, by rank; waits for the job. Raises RankFailed for the first rank that
        failed (by time), with its traceback or how its process ended."""
        return self._values(self._wait()[1], rank0=False)

    def result(self) -> Any:
        """Rank 0's return value (waits for the job; raises RankFailed when any rank failed). Only rank 0's
        value is loaded: the others' are checked for failure, not read."""
        return self._values(self._wait()[1], rank0=True)[0]

    def stacks(self, timeout: float = 10.0) -> Stacks:
        """Where every rank is: their Python stacks grouped by the main thread's (``.grouping.groups``: the
        odd ones first, each with its ranks, nodes, frames and summary line; ``.data()`` as JSON-ready data),
        live while the job runs, else those its ranks saved when they were stopped. Each node answers within
        ``timeout`` seconds or its ranks are named as not reached (slurmlaunch stacks JOB; docs/how-to/debugging.md)."""
        from ...core.jobfiles import JobFiles
        from ..jobs.stacks import collect_stacks

        live = not self.done()
        nodes = None
        if live and self._watched:
            nodes = self._edge.status(self.job_id, None).nodes
        return collect_stacks(self.scheduler, self.job_id, JobFiles(self.spec.log_dir, self.job_id),
                              self.spec.world_size, self.spec.program.python, live, nodes, timeout)

    def timeline(self) -> Timeline:
        """Where the job's start-up went, per rank (slurmlaunch timeline JOB; docs/how-to/timeline.md): each
        rank's phases (``.ranks[i].phases``: name, start and length in seconds), ``.slowest_rank``,
        ``.slowest_phase``, ``.data()`` as JSON-ready data. Raises JobStateError when no rank recorded any."""
        from ...core.jobfiles import JobFiles
        from ..jobs.timeline import files_timeline

        return files_timeline(JobFiles(self.spec.log_dir, self.job_id), self.spec.world_size)

    def __repr__(self) -> str:
        return f"slurmlaunch.Job({self.job_id!r}, {self.scheduler}, {self.spec.world_size} ranks)"


def link_logs(spec: JobSpec, job: Any) -> None:
    """The job commands' file names (JobFiles) for submitit's job ``job``'s, so that `slurmlaunch logs JOB
    [--rank N]` finds a rank's output (its stdout; the batch log: rank 0's): on a login node for the laptop,
    and for the local scheduler's jobs."""
    from ...core.jobfiles import JobFiles

    files = JobFiles(spec.log_dir, str(job.job_id), spec.log_unit, spec.ranks_per_log)
    for rank in range(spec.world_size):
        target = os.path.relpath(str(job.task(rank).paths.stdout), spec.log_dir)
        for name in {files.rank_log(rank), *([files.batch_log] if rank == 0 else [])}:
            try:
                os.symlink(target, name)
            except OSError:  # there already (a resubmitted id on a new cluster): keep it
                pass


# The Slurm jobs of this process (weakly: a handle dropped is forgotten): one squeue confirms every one of
# them whose ranks have all returned, so a loop over a map_array's handles asks once, not once a job.
_WAITING: weakref.WeakSet[Job] = weakref.WeakSet()


def _confirm(jobs: list[Job]) -> None:
    """One squeue for ``jobs`` (every rank of each returned): each gets its state (a job squeue no longer
    knows has ended: "ENDED") unless it was stopped or queued again; squeue failing confirms none."""
    for job in jobs:
        job._confirm_asked = True
    states = jobs[0]._edge.queue_states([j.job_id for j in jobs])
    if states is None:
        return
    for job in jobs:
        state = states.get(job.job_id, "").strip()
        if state.split(" ")[0] not in _UNCONFIRMED:
            job._confirmed = state or "ENDED"


_WATCHERS: list[Any] = []


def _watcher() -> Any:
    """One sacct watcher for every API job of this process (submitit's batches the ids it is asked about
    into one sacct call); ours refreshes at most every _SACCT_EVERY_S, where submitit's shared one backs off
    to minutes for long jobs, which would delay the news of a job's end as long."""
    if not _WATCHERS:
        from submitit.slurm.slurm import SlurmInfoWatcher

        _WATCHERS.append(SlurmInfoWatcher(delay_s=_SACCT_EVERY_S))
    return _WATCHERS[0]
