"""The API on PBS: submitit's plugin interface (the ``submitit`` entry-point group, pyproject.toml) filled with a
PBS executor, its job and its job environment. The batch script is the CLI's qsub script (executors.SpecExecutor:
the template's #PBS lines, Open MPI's mpiexec over $PBS_NODEFILE under the CLI's batch step, which sends the warning
signal before the walltime and writes the first failure to the job's failure file), each rank the launcher running
rank.py, which writes the rank's own submitit log files, so the caller's collection is the same as under Slurm
(collect.py); mpiexec stops the other ranks when one fails, so the job ends at once and qstat says so (job.py asks
it at most every 2 s)."""

from __future__ import annotations

import os
from pathlib import Path

import submitit

from .executors import REQUEUE_REFUSED as REQUEUE_REFUSED
from .executors import SpecExecutor

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: submitit loads this plug-in in every rank of every job (executors.py)
    from ...core.spec import JobSpec


class PbsJobEnvironment(submitit.JobEnvironment):
    """A rank of a PBS job started by the CLI's qsub script: Open MPI's rank variables, and PBS's own job id
    ($PBS_JOBID: 1234.server, or a subjob's 1234[5].server, which mpiexec -x passes on with $PBS_ARRAY_INDEX)
    as submitit names a job (the server's name left out)."""

    _env = {"job_id": "PBS_JOBID", "array_task_id": "PBS_ARRAY_INDEX", "num_tasks": "OMPI_COMM_WORLD_SIZE",
            "global_rank": "OMPI_COMM_WORLD_RANK", "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK"}

    @property
    def raw_job_id(self) -> str:
        return os.environ["PBS_JOBID"].split(".", 1)[0]

    @property
    def array_job_id(self) -> str | None:
        return self.raw_job_id.split("[", 1)[0] if "PBS_ARRAY_INDEX" in os.environ else None

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_tasks // self._per_node)

    @property
    def node(self) -> int:
        return self.global_rank // self._per_node  # --map-by ppr:N:node fills each node in turn

    @property
    def _per_node(self) -> int:
        return int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")) or 1

    @property
    def hostnames(self) -> list[str]:
        """The job's hosts in PBS's order (the distinct lines of $PBS_NODEFILE, which mpiexec -x passes on):
        submitit's TorchDistributedEnvironment takes the first as MASTER_ADDR, as the launcher does."""
        try:
            with open(os.environ["PBS_NODEFILE"], encoding="utf-8") as f:
                hosts = list(dict.fromkeys(line.strip() for line in f if line.strip()))
        except (KeyError, OSError, ValueError):  # ValueError: not UTF-8
            hosts = []
        # unreadable: the master the launcher chose, the same for every rank (its own host would not be)
        return hosts or [os.environ.get("MASTER_ADDR") or self.hostname]


class PbsExecutor(SpecExecutor):
    """One job (or one job array, with submit_array) of ``spec.world_size`` ranks on PBS Pro / OpenPBS: the CLI's
    qsub script (executors.SpecExecutor), under submitit's plugin interface."""

    def __init__(self, folder: str | Path, spec: JobSpec | None = None, max_num_timeout: int = 0) -> None:
        super().__init__(folder, spec, "pbs", max_num_timeout=max_num_timeout)
