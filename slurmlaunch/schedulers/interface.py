"""The one interface app code sees a scheduler through; slurm.py, pbs.py and local.py each implement it, and
registry.py lists them. Everything app/ needs to know of a scheduler is here as an attribute or a method: what
it can do (a capability), never which one it is (app/ compares no scheduler names: tests/schedulers/
test_registry.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..core.errors import SchedulerError
from ..core.spec import GpuFlag, JobSpec
from . import JobStatus, Submission
from .support import Refusals, refuse

SchedulerName = str  # a name of registry.PLUGINS


@dataclass(frozen=True)
class QuickStates:
    """`list`'s states of many jobs from one or two scheduler calls: ``live``, the queue's (job id -> state;
    None when the queue could not be asked) and ``ended``, the accounting's for jobs the queue no longer shows."""

    live: dict[str, str] | None
    ended: dict[str, str] = field(default_factory=dict)
    # a live job's identity as the queue shows it (its submit time, its submission's token): schedulers.same_job
    seen: dict[str, dict[str, str]] = field(default_factory=dict)


class Scheduler(Protocol):
    @property
    def name(self) -> SchedulerName:
        """The name records, the index and --scheduler use (its registry line's)."""
        ...

    @property
    def title(self) -> str:
        """How messages name it: "Slurm", "PBS", "the local scheduler"."""
        ...

    @property
    def client(self) -> str | None:
        """The command whose presence on PATH says the scheduler is there (sbatch, qsub); None: always there."""
        ...

    @property
    def queued(self) -> bool:
        """Whether jobs go to a queue (submit renders and submits a script); False: they start at once on this
        machine under a supervisor of slurmlaunch's (the local scheduler), whose :meth:`status` reads the job's
        files and that supervisor, and whose :meth:`cancel` signals it."""
        ...

    @property
    def readers(self) -> tuple[str, ...]:
        """The in-allocation readers (core.detect / core.detect_mpi functions) that read its ranks' places."""
        ...

    @property
    def refusals(self) -> Refusals:
        """The options it cannot carry out, and the values only it takes (schedulers/support.py)."""
        ...

    @property
    def script_suffix(self) -> str:
        """The suffix of its saved batch script (job-ID.sbatch); "" where there is none."""
        ...

    @property
    def warning_signal(self) -> bool:
        """Whether its jobs get --signal's warning before the time limit (else --signal is refused)."""
        ...

    @property
    def rank_requeue(self) -> str | None:
        """The command a rank of its jobs may run to requeue its own job, as a client runs it from inside the job
        (Slurm: "scontrol requeue"); None where it offers none. A client of the script that requeues with this
        very command (app/clients.py: Lightning's SLURMEnvironment) then requeues the job itself, and the batch
        script leaves requeueing to it; any other requeues as the batch step's rule says."""
        ...

    @property
    def gpu_request_styles(self) -> tuple[GpuFlag, ...]:
        """The ways its scripts may ask for GPUs that a site may refuse one of (--gpu-flag's values; Slurm:
        gpus-per-node, gres), first the default: `slurmlaunch doctor` learns which one the site takes (kept under
        the cluster's name, :meth:`cluster`'s "name") and submit uses it unless --gpu-flag is given. () where it
        has one way of its own (PBS's ngpus) or none."""
        ...

    @property
    def shared_output(self) -> str | None:
        """Why `logs --rank` has no file of its own to show: every rank writes the job's one output; None
        where each rank has its file."""
        ...

    @property
    def lists_in_one_call(self) -> bool:
        """Whether :meth:`quick_states` answers for many jobs at once (else `list` asks status per job)."""
        ...

    @property
    def submitit_executor(self) -> str | None:
        """The Python API's way: the submitit executor of submitit's own that runs its jobs (its watcher and
        the scheduler's queue answer for them), or None where the API's own executor does, through this edge."""
        ...

    @property
    def job_id_variable(self) -> str | None:
        """The variable the scheduler sets in its jobs to the job's id (Slurm: SLURM_JOB_ID), where submitit has
        no job environment of this scheduler's: the Python API's ranks read their job's id from it
        (app/api/rank.py). None: submitit's own environment, or the API's for PBS (app/api/pbs.py), reads it."""
        ...

    @property
    def exports_environment(self) -> bool:
        """Whether its jobs start with the submitting shell's environment (sbatch's --export=ALL); False: with
        only what the script sets (PBS's qsub without -V), so a variable the job needs goes in the script."""
        ...

    @property
    def doctor_checks(self) -> str | None:
        """The module that checks its site from the login node for `slurmlaunch doctor` (a name of app/doctor/, or
        a plug-in's module by its full dotted name): its ``login_checks(partition, edge)`` gives (checks,
        partition rows, facts) and ``cluster(facts)`` the cluster's name; None where doctor has nothing to check
        (the local scheduler)."""
        ...

    def available(self) -> bool:
        """Whether this machine has the scheduler's client (no command is run)."""
        ...

    def auto_check(self) -> tuple[bool, str]:
        """With its client on PATH: whether --scheduler auto takes it, and why in a few words ("slurmctld
        answers"; "" when the client says enough). SchedulerError where auto must not fall back either."""
        ...

    def render(self, spec: JobSpec, template_dir: str | None = None) -> str:
        """What --dry-run prints: the batch script (or the local scheduler's plan); nothing is submitted."""
        ...

    def refuse_unsupported(self, spec: JobSpec, origins: Mapping[str, str] | None = None) -> None:
        """SpecError for the first option of ``spec`` it cannot carry out (``origins``: where values came from),
        or that it would refuse (PBS: render/pbs_script.py's check); before anything is written or submitted."""
        ...

    def submit_command(self, spec: JobSpec, script_path: str) -> list[str]:
        """The command that submits the script saved at ``script_path``."""
        ...

    def submit(self, spec: JobSpec, script_text: str) -> Submission:
        """Submit the job (``script_text``: :meth:`render`'s script). Where not :attr:`queued`, start it at once,
        detached under its own supervisor (there is no script); its ``note`` then says how it runs."""
        ...

    def refuse_here(self, spec: JobSpec, template_dir: str | None) -> None:
        """Where not :attr:`queued`: SpecError for what this machine cannot start as asked (``template_dir``
        for a scheduler that renders no script, a container runtime not on PATH, more ranks than it runs),
        before --dry-run's plan as before a start. A queued scheduler checks nothing here."""
        ...

    def start_notes(self, spec: JobSpec) -> list[str]:
        """Lines said (by the CLI and the Python API) before a job of ``spec`` starts: what it will not do of
        the request (the local scheduler: options it only shows its tasks); [] for none."""
        ...

    def run_here(self, spec: JobSpec) -> int:
        """Where not :attr:`queued`: run the job in this process, as a terminal runs a training script (Ctrl-C
        or a hang-up stops it), and return its exit code. SchedulerError for a queued scheduler."""
        ...

    def job_main(self, argv: Sequence[str]) -> int:
        """The hidden command ``slurmlaunch NAME-job ARGV`` (cli.py) that its jobs' own processes run (the local
        scheduler's detached supervisor); its exit code. A scheduler with none says so and returns 2."""
        ...

    def parse_job_id(self, out: str) -> str | None:
        """The short job id (the one that names the job's files) in what the submit command printed, or None."""
        ...

    def command_id(self, out: str) -> str:
        """The id its commands (status, cancel) take, from what the submit command printed."""
        ...

    def status(self, job_id: str, log_dir: str | None, indices: Sequence[int] = ()) -> JobStatus:
        """The job's state; with ``indices``, a job array's (all its elements at once). ``log_dir``: where the
        job's files are (its exit-code file is the script's own word), None to ask the scheduler alone."""
        ...

    def quick_states(self, job_ids: Sequence[str] | None) -> QuickStates:
        """`list`'s states of ``job_ids`` (None: every job of the user it still knows) in one or two calls;
        SchedulerError when the queue cannot be asked. Only where :attr:`lists_in_one_call`."""
        ...

    def queue_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        """The queue's word on ``job_ids`` in one call, final states included while the scheduler keeps them:
        job id -> state (a job it no longer knows is left out); None where it could not be asked, or has no
        such call (the Python API then waits for the job's end from :meth:`status`)."""
        ...

    def cancel(self, job_id: str, log_dir: str | None = None) -> str:
        """Cancel the job; ``log_dir``: where its files are, so that a job submitted again at the warning (PBS)
        is cancelled where it runs now. The id the cancel was sent to (``job_id``, or its latest resubmission)."""
        ...

    def resubmissions(self, job_id: str, log_dir: str) -> list[str]:
        """The ids job ``job_id`` was submitted again as at the warning, in order, as its files in ``log_dir``
        list them (PBS: job-ID.requeued); [] where a requeue keeps the job's id (Slurm) or there is none."""
        ...

    def rank_log(self, spec: JobSpec, job_id: str, rank: int) -> str | None:
        """The file rank ``rank`` writes its output to, or None where the ranks share the job's output
        (PBS: mpiexec tags every line) or a job array has many such ranks."""
        ...

    def batch_log(self, spec: JobSpec, job_id: str) -> str | None:
        """The batch script's own output file where slurmlaunch names it, else None."""
        ...

    def output_log(self, log_dir: str, job: str, printed_id: str) -> str | None:
        """The file `slurmlaunch logs JOB` shows without --rank (``job``: the id its files carry,
        ``printed_id``: as the submit command printed it); None: rank 0's log."""
        ...

    def identity(self, job_id: str) -> dict[str, str] | None:
        """What the scheduler says of job ``job_id`` that a later job given the same id cannot share (its submit
        time, its name, ...: compared with a record's by schedulers.same_job); None when it knows no such job.
        SchedulerError when it cannot be asked."""
        ...

    def cluster(self) -> dict[str, str]:
        """Which cluster (or server) the client here talks to, in the scheduler's words; {} where it cannot say."""
        ...

    def node_commands(self, job_id: str, nodes: str, argv: Sequence[str]) -> dict[str, list[str]]:
        """For a running job on ``nodes`` (its status' words), node -> the command that runs ``argv`` on that
        node, next to the job's ranks (`slurmlaunch stacks`); {} where there is no such way."""
        ...


@dataclass(frozen=True)
class QueuedEdge:
    """A batch scheduler's edge (slurm.py's, pbs.py's) as a :class:`Scheduler`, made of its module's
    functions and facts: the delegation is written once, each module says only what differs."""

    name: SchedulerName
    title: str
    client: str
    readers: tuple[str, ...]
    refusals: Refusals
    script_suffix: str
    is_available: Callable[[], bool]
    check_auto: Callable[[], tuple[bool, str]]
    render_script: Callable[[JobSpec, str | None], str]
    submit_script_command: Callable[[JobSpec, str], list[str]]
    submit_script: Callable[[JobSpec, str], Submission]
    parse_id: Callable[[str], str | None]
    job_status: Callable[[str, str | None], JobStatus]
    array_status: Callable[[str, str, list[int]], JobStatus]
    cancel_job: Callable[[str], None]
    rank_log_of: Callable[[JobSpec, str, int], str | None]
    batch_log_of: Callable[[JobSpec, str], str | None]
    output_log_of: Callable[[str, str, str], str | None]
    node_commands_of: Callable[[str, str, Sequence[str]], dict[str, list[str]]] | None = None
    quick_states_of: Callable[[Sequence[str] | None], QuickStates] | None = None
    command_id_of: Callable[[str], str] | None = None  # None: the id as printed
    resubmissions_of: Callable[[str, str], list[str]] | None = None  # None: the job always runs under its own id
    # (id, first job) -> whether the scheduler says the id is a resubmission of the first job; cancel deletes none
    # its files list without it (None: every listed id is taken as it is)
    resubmission_check: Callable[[str, str], bool] | None = None
    check_request: Callable[[JobSpec], None] | None = None  # more refusals, of the request's meaning there
    identity_of: Callable[[str], dict[str, str] | None] | None = None  # None: the scheduler says nothing of it
    queue_states_of: Callable[[Sequence[str]], dict[str, str] | None] | None = None  # None: no such call
    cluster_of: Callable[[], dict[str, str]] | None = None
    warning_signal: bool = True
    rank_requeue: str | None = None  # no requeue command of its own for a rank to run
    gpu_request_styles: tuple[GpuFlag, ...] = ()  # no GPU request style a site would choose among
    shared_output: str | None = None
    submitit_executor: str | None = None
    job_id_variable: str | None = None
    exports_environment: bool = True
    doctor_checks: str | None = None
    queued: bool = True

    @property
    def lists_in_one_call(self) -> bool:
        return self.quick_states_of is not None

    def available(self) -> bool:
        return self.is_available()

    def auto_check(self) -> tuple[bool, str]:
        return self.check_auto()

    def render(self, spec: JobSpec, template_dir: str | None = None) -> str:
        return self.render_script(spec, template_dir)

    def refuse_unsupported(self, spec: JobSpec, origins: Mapping[str, str] | None = None) -> None:
        refuse(spec, self.name, self.refusals, origins)
        if self.check_request is not None:
            self.check_request(spec)

    def submit_command(self, spec: JobSpec, script_path: str) -> list[str]:
        return self.submit_script_command(spec, script_path)

    def submit(self, spec: JobSpec, script_text: str) -> Submission:
        return self.submit_script(spec, script_text)

    def refuse_here(self, spec: JobSpec, template_dir: str | None) -> None:
        return None  # its jobs start on the scheduler's nodes: its refusals are refuse_unsupported's

    def start_notes(self, spec: JobSpec) -> list[str]:
        return []

    def run_here(self, spec: JobSpec) -> int:
        raise SchedulerError(f"{self.title} runs no job in this process: it queues them (submit)")

    def job_main(self, argv: Sequence[str]) -> int:
        sys.stderr.write(f"slurmlaunch: {self.name}-job: {self.title} runs no command of its own in its jobs\n")
        return 2

    def parse_job_id(self, out: str) -> str | None:
        return self.parse_id(out)

    def command_id(self, out: str) -> str:
        return self.command_id_of(out) if self.command_id_of is not None else out

    def status(self, job_id: str, log_dir: str | None, indices: Sequence[int] = ()) -> JobStatus:
        if indices and log_dir is not None:
            return self.array_status(job_id, log_dir, list(indices))
        return self.job_status(job_id, log_dir)

    def quick_states(self, job_ids: Sequence[str] | None) -> QuickStates:
        if self.quick_states_of is None:
            raise NotImplementedError(f"{self.title} has no call that answers for many jobs at once")
        return self.quick_states_of(job_ids)

    def queue_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        return None if self.queue_states_of is None else self.queue_states_of(job_ids)

    def cancel(self, job_id: str, log_dir: str | None = None) -> str:
        chain = self.resubmissions(job_id, log_dir) if log_dir is not None else []
        live = chain[-1] if chain else job_id
        if live != job_id:
            self._refuse_foreign(live, job_id)
        self.cancel_job(live)
        later = self.resubmissions(job_id, log_dir) if log_dir is not None else []
        if later and later[-1] not in (live, job_id):  # submitted again while the cancel was on its way: it too
            live = later[-1]
            self._refuse_foreign(live, job_id)
            self.cancel_job(live)
        return live

    def _refuse_foreign(self, listed: str, job_id: str) -> None:
        """SchedulerError unless the scheduler confirms that ``listed``, which job ``job_id``'s files name as its
        resubmission, is one: a planted or garbled list must not make cancel delete another job."""
        if self.resubmission_check is not None and not self.resubmission_check(listed, job_id):
            raise SchedulerError(
                f"job {job_id}: its log directory's list of resubmissions at the warning names job {listed}, which "
                f"{self.title} does not show as one: nothing deleted (fix or remove that list, then cancel again)")

    def resubmissions(self, job_id: str, log_dir: str) -> list[str]:
        return self.resubmissions_of(job_id, log_dir) if self.resubmissions_of is not None else []

    def rank_log(self, spec: JobSpec, job_id: str, rank: int) -> str | None:
        return self.rank_log_of(spec, job_id, rank)

    def batch_log(self, spec: JobSpec, job_id: str) -> str | None:
        return self.batch_log_of(spec, job_id)

    def output_log(self, log_dir: str, job: str, printed_id: str) -> str | None:
        return self.output_log_of(log_dir, job, printed_id)

    def identity(self, job_id: str) -> dict[str, str] | None:
        return self.identity_of(job_id) if self.identity_of is not None else None

    def cluster(self) -> dict[str, str]:
        return self.cluster_of() if self.cluster_of is not None else {}

    def node_commands(self, job_id: str, nodes: str, argv: Sequence[str]) -> dict[str, list[str]]:
        return self.node_commands_of(job_id, nodes, argv) if self.node_commands_of is not None else {}


def slurm_step_variables(edge: Scheduler) -> bool:
    """Whether the ranks of ``edge`` see a Slurm step's variables (SLURM_PROCID, SLURM_STEP_ID, ...: a real
    step's, or the local scheduler's emulation, local_stepenv.py), which clients that know only Slurm's launcher
    read (app/clients.py): its in-allocation readers include the one that reads them."""
    from ..core.detect import read_slurm

    return read_slurm.__name__ in edge.readers
