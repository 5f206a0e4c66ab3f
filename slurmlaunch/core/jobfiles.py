"""The names of a job's files in its log directory, defined once.

The batch templates, the schedulers, the launcher's RUNNER and the job commands write and read these names;
JobFiles is the value that spells them (the templates receive them in their context, spelled with the
shell's own variables: ``JobFiles("$log_dir", "$job_tag")``). Pure: names in, paths out; nothing here
touches the filesystem.
"""

from __future__ import annotations

import os

from . import EXIT_MARK_SUFFIX, STACKS_DUMP_SUFFIX, STACKS_PID_SUFFIX, STACKS_STOP_SUFFIX, STACKS_SUMMARY_NAME

# The batch script's own exit code when the output directory takes no write before any rank starts (a full
# file system, one gone read-only): sysexits' EX_IOERR, below 128 and apart from every code docs: Exit codes
# lists. Slurm never starts the script when it cannot open the batch log itself (exit code 181, see
# app/faults.py); this is the case where it could, but nothing more fits.
WRITE_FAILED = 74

# What a rendered batch script holds where its submission's own token goes (submit replaces it; --dry-run
# shows it): a job whose id an older job's files already carry in the output directory (a restarted PBS
# numbers from 0, two clusters hand out the same ids) has its files in a directory of its own,
# own_dir(...), which the script finds by that token.
SUBMISSION_MARK = "SUBMISSION"


def carries_id(name: str, short: str) -> bool:
    """Whether a file named ``name`` in an output directory is one of job ``short``'s: its record, logs and
    exit code (``job-ID.*``, an array's ``job-ID_*``), PBS's output named after the id (``ID.*``, ``ID[``,
    ``*.oID``)."""
    own = (f"job-{short}.", f"job-{short}_", f"{short}.", f"{short}[")
    return name.startswith(own) or name.endswith(f".o{short}")


def own_dir(log_dir: str, job: str, token: str) -> str:
    """The directory of the files of job ``job`` (its id; an array's id) whose id older files in ``log_dir``
    carry: named by the id and the submission's ``token``, so no other job's files are ever appended to."""
    return os.path.join(log_dir, f"job-{job}.{token}")


class JobFiles:
    """``job``: the job's tag (its id, or ``ID_ELEMENT`` for an element of an array); ``unit``: what one
    output file holds, "rank" (srun mode) or "node" (torchrun mode: all of a node's ranks, JobSpec.log_unit);
    ``ranks_per_log``: how many ranks one output file holds (1, or a node's ranks in torchrun mode).

    A frozen value, written out rather than a dataclass: the batch step of every job uses it, and `dataclasses`
    loads `inspect` (and with it `ast`, `dis`, `tokenize`): about 5 ms of CPU per job (issue 39)."""

    __slots__ = ("job", "log_dir", "ranks_per_log", "unit")
    log_dir: str
    job: str
    unit: str
    ranks_per_log: int

    def __init__(self, log_dir: str, job: str, unit: str = "rank", ranks_per_log: int = 1) -> None:
        for name, value in (("log_dir", log_dir), ("job", job), ("unit", unit), ("ranks_per_log", ranks_per_log)):
            object.__setattr__(self, name, value)

    def _key(self) -> tuple[str, str, str, int]:
        return self.log_dir, self.job, self.unit, self.ranks_per_log

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"JobFiles is frozen: cannot assign to {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"JobFiles is frozen: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        return other._key() == self._key() if isinstance(other, JobFiles) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"JobFiles(log_dir={self.log_dir!r}, job={self.job!r}, unit={self.unit!r}, "
                f"ranks_per_log={self.ranks_per_log!r})")

    def __reduce__(self) -> tuple[type[JobFiles], tuple[str, str, str, int]]:
        return JobFiles, self._key()

    @property
    def stem(self) -> str:
        """What every file name of the job starts with (then "." for its own files, "_" for its elements')."""
        return f"job-{self.job}"

    def _named(self, suffix: str) -> str:
        return os.path.join(self.log_dir, f"{self.stem}.{suffix}")

    def log(self, index: int | str) -> str:
        """Output file ``index`` (a rank in srun mode, a node in torchrun mode; or a pattern in its place,
        such as srun's ``%t`` or the shell's ``*``)."""
        return self._named(f"{self.unit}-{index}.log")

    def rank_log(self, rank: int) -> str:
        """The output file that holds rank ``rank``'s lines."""
        return self.log(rank // self.ranks_per_log)

    def script(self, suffix: str) -> str:
        """The rendered batch script as submitted (``suffix``: "sbatch", "qsub")."""
        return self._named(suffix)

    @property
    def record(self) -> str:
        """The job's record: what was asked, how it was submitted, where the logs are."""
        return self._named("json")

    @property
    def exit_code(self) -> str:
        """The job's exit code, written by the batch script (or the local scheduler) when it ends."""
        return self._named("exitcode")

    @property
    def requeued(self) -> str:
        """PBS: the jobs this one was resubmitted as at the warning, one id a line, in order (the batch step
        writes it; Slurm's requeue keeps the job id and needs none)."""
        return self._named("requeued")

    @property
    def batch_log(self) -> str:
        """The batch step's own output (Slurm)."""
        return self._named("batch.log")

    @property
    def srun_log(self) -> str:
        """srun's own messages (task exits, cancellations), which the batch script's failure summary reads."""
        return self._named("srun.log")

    @property
    def failure(self) -> str:
        """The first-failure line (which rank failed first, its code, why), written when the job ends."""
        return self._named("failure")

    @property
    def reasons(self) -> str:
        """The directory where the launcher leaves why it stopped a rank (SLURMLAUNCH_REASONS_DIR)."""
        return self._named("reasons")

    @property
    def returned(self) -> str:
        """The directory of the ranks' "script returned" marks (SLURMLAUNCH_RETURNED_DIR)."""
        return self._named("returned")

    def returned_mark(self, rank: int | str) -> str:
        """Rank ``rank``'s "script returned (or exited 0)" mark, an empty file."""
        return os.path.join(self.returned, str(rank))

    def exit_mark(self, rank: int | str) -> str:
        """Where the RUNNER records the code rank ``rank``'s script asked for with sys.exit(N), N != 0."""
        return os.path.join(self.returned, f"{rank}{EXIT_MARK_SUFFIX}")

    @property
    def timeline(self) -> str:
        """The directory of the start-up's moments (SLURMLAUNCH_TIMELINE_DIR): one file per rank, one for the
        batch step (core/timeline.py); kept after the job, a requeued run starts it anew."""
        return self._named("timeline")

    @property
    def timeline_svg(self) -> str:
        """The picture `slurmlaunch timeline` draws of the job's start-up."""
        return self._named("timeline.svg")

    @property
    def stacks(self) -> str:
        """The directory of the ranks' stack dumps (SLURMLAUNCH_STACKS_DIR): kept after the job, private."""
        return self._named("stacks")

    def stack_pid(self, rank: int | str) -> str:
        """Where the RUNNER of rank ``rank`` says which process it is ("PID START HOST")."""
        return os.path.join(self.stacks, f"{rank}{STACKS_PID_SUFFIX}")

    def stack_dump(self, rank: int | str) -> str:
        """Rank ``rank``'s dumps on demand (`slurmlaunch stacks`), appended one after another."""
        return os.path.join(self.stacks, f"{rank}{STACKS_DUMP_SUFFIX}")

    def stack_stop(self, rank: int | str) -> str:
        """Rank ``rank``'s dump at the stop signal that ended it (SIGTERM, the warning signal)."""
        return os.path.join(self.stacks, f"{rank}{STACKS_STOP_SUFFIX}")

    @property
    def stacks_summary(self) -> str:
        """The grouped summary of the stacks saved when the job was stopped (one line per group)."""
        return os.path.join(self.stacks, STACKS_SUMMARY_NAME)

    def element(self, index: int | str) -> JobFiles:
        """The files of element ``index`` of an array job (tagged ``ID_INDEX``)."""
        return JobFiles(self.log_dir, f"{self.job}_{index}", self.unit, self.ranks_per_log)
