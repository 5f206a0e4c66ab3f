"""The names of a job's files in its log directory, defined once.

The batch templates, the schedulers and the job commands write and read these names; JobFiles is the value
that spells them (the templates receive the same spelling as their `rank_log` context value). Pure: names
in, paths out; nothing here touches the filesystem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class JobFiles:
    """``job``: the job's tag (its id, or ``ID_ELEMENT`` for an element of an array); ``unit``: what one
    output file holds, "rank" (srun mode) or "node" (torchrun mode: all of a node's ranks, JobSpec.log_unit);
    ``ranks_per_log``: how many ranks one output file holds (1, or a node's ranks in torchrun mode)."""

    log_dir: str
    job: str
    unit: str = "rank"
    ranks_per_log: int = 1

    def log(self, index: int) -> str:
        """Output file ``index`` (a rank in srun mode, a node in torchrun mode)."""
        return os.path.join(self.log_dir, f"job-{self.job}.{self.unit}-{index}.log")

    def rank_log(self, rank: int) -> str:
        """The output file that holds rank ``rank``'s lines."""
        return self.log(rank // self.ranks_per_log)

    @property
    def exit_code(self) -> str:
        """The job's exit code, written by the batch script (or the local scheduler) when it ends."""
        return os.path.join(self.log_dir, f"job-{self.job}.exitcode")

    @property
    def batch_log(self) -> str:
        """The batch step's own output (Slurm)."""
        return os.path.join(self.log_dir, f"job-{self.job}.batch.log")

    @property
    def failure(self) -> str:
        """The first-failure line (which rank failed first, its code, why), written when the job ends."""
        return os.path.join(self.log_dir, f"job-{self.job}.failure")

    @property
    def reasons(self) -> str:
        """The directory where the launcher leaves why it stopped a rank (SLURMLAUNCH_REASONS_DIR)."""
        return os.path.join(self.log_dir, f"job-{self.job}.reasons")

    @property
    def returned(self) -> str:
        """The directory of the ranks' "script returned" marks (SLURMLAUNCH_RETURNED_DIR)."""
        return os.path.join(self.log_dir, f"job-{self.job}.returned")

    def element(self, index: int | str) -> JobFiles:
        """The files of element ``index`` of an array job (tagged ``ID_INDEX``)."""
        return JobFiles(self.log_dir, f"{self.job}_{index}", self.unit, self.ranks_per_log)
