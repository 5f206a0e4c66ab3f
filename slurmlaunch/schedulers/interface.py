"""The one interface app code sees a scheduler through; slurm.py, pbs.py and local.py each implement it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from ..core.spec import JobSpec
from . import JobStatus, Submission

SchedulerName = Literal["slurm", "pbs", "local"]


class Scheduler(Protocol):
    @property
    def name(self) -> SchedulerName:
        """The name records, the index and --scheduler use."""
        ...

    @property
    def queued(self) -> bool:
        """Whether jobs go to a queue (submit, then status/cancel by id); False: they run in the foreground."""
        ...

    def available(self) -> bool:
        """Whether this machine has the scheduler's client (no command is run)."""
        ...

    def render(self, spec: JobSpec, template_dir: str | None = None) -> str:
        """What --dry-run prints: the batch script (or the local scheduler's plan); nothing is submitted."""
        ...

    def submit_command(self, spec: JobSpec, script_path: str) -> list[str]:
        """The command that submits the script saved at ``script_path``."""
        ...

    def submit(self, spec: JobSpec, script_text: str) -> Submission:
        ...

    def status(self, job_id: str, log_dir: str, indices: Sequence[int] = ()) -> JobStatus:
        """The job's state; with ``indices``, a job array's (all its elements at once)."""
        ...

    def cancel(self, job_id: str) -> None:
        ...

    def rank_log(self, spec: JobSpec, job_id: str, rank: int) -> str | None:
        """The file rank ``rank`` writes its output to, or None where the ranks share the job's output
        (PBS: mpiexec tags every line) or a job array has many such ranks."""
        ...

    def batch_log(self, spec: JobSpec, job_id: str) -> str | None:
        """The batch script's own output file where slurmlaunch names it, else None."""
        ...
