"""The one interface app code sees a scheduler through; slurm.py, pbs.py and local.py each implement it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

    def node_commands(self, job_id: str, nodes: str, argv: Sequence[str]) -> dict[str, list[str]]:
        """For a running job on ``nodes`` (its status' words), node -> the command that runs ``argv`` on that
        node, next to the job's ranks (`slurmlaunch stacks`); {} where there is no such way."""
        ...


@dataclass(frozen=True)
class QueuedEdge:
    """A batch scheduler's edge (slurm.py's, pbs.py's) as a :class:`Scheduler`, made of its module's
    functions: the delegation is written once, each module says only what differs."""

    name: SchedulerName
    is_available: Callable[[], bool]
    render_script: Callable[[JobSpec, str | None], str]
    submit_script_command: Callable[[JobSpec, str], list[str]]
    submit_script: Callable[[JobSpec, str], Submission]
    job_status: Callable[[str, str], JobStatus]
    array_status: Callable[[str, str, list[int]], JobStatus]
    cancel_job: Callable[[str], None]
    rank_log_of: Callable[[JobSpec, str, int], str | None]
    batch_log_of: Callable[[JobSpec, str], str | None]
    node_commands_of: Callable[[str, str, Sequence[str]], dict[str, list[str]]] | None = None
    queued: bool = True

    def available(self) -> bool:
        return self.is_available()

    def render(self, spec: JobSpec, template_dir: str | None = None) -> str:
        return self.render_script(spec, template_dir)

    def submit_command(self, spec: JobSpec, script_path: str) -> list[str]:
        return self.submit_script_command(spec, script_path)

    def submit(self, spec: JobSpec, script_text: str) -> Submission:
        return self.submit_script(spec, script_text)

    def status(self, job_id: str, log_dir: str, indices: Sequence[int] = ()) -> JobStatus:
        return self.array_status(job_id, log_dir, list(indices)) if indices else self.job_status(job_id, log_dir)

    def cancel(self, job_id: str) -> None:
        self.cancel_job(job_id)

    def rank_log(self, spec: JobSpec, job_id: str, rank: int) -> str | None:
        return self.rank_log_of(spec, job_id, rank)

    def batch_log(self, spec: JobSpec, job_id: str) -> str | None:
        return self.batch_log_of(spec, job_id)

    def node_commands(self, job_id: str, nodes: str, argv: Sequence[str]) -> dict[str, list[str]]:
        return self.node_commands_of(job_id, nodes, argv) if self.node_commands_of is not None else {}
