"""The Python front end, built on submitit: run a function (or a script) as a distributed job.

    import slurmlaunch
    job = slurmlaunch.submit(train, cfg, nodes=2, gpus_per_node=4, time="4:00:00", partition="gpu")
    print(job.result())          # rank 0's return value
    print(job.results())         # every rank's, indexed by rank

The options are JobSpec's fields, validated by the same code as the CLI's. Under Slurm, submitit's
SlurmExecutor runs one task per GPU (srun --kill-on-bad-exit); ``scheduler="local"`` makes the job a
local scheduler's job like the CLI's (local.py: started detached under the one rank supervisor, it outlives
the submitting interpreter; `slurmlaunch list`, `status` and `cancel` know it), submitit's pickling and files
kept. Inside every task the torch distributed environment is computed and exported by the launcher's own code
(detect, checks, exports) before ``fn`` runs.

How a job's outcome is collected (Job.results, the same on both schedulers): wait for the job to end
(under Slurm: until sacct says so, one batched sacct every 2 s for all the jobs being waited for; or until
every rank's value is on disk and one squeue confirms the job was not stopped or requeued: job.py), then
look at every rank's files at once, without waiting for any that is missing; the return value travels
pickled by the rank itself (_Packed), so a value that cannot be pickled is reported as such, with the part
that could not be; a rank that raised SystemExit left an exit record (its code, and when); a rank with
neither ended without a Python exception, and how (exit code or signal) comes from the job's failure file
(job-ID.failure: the batch step's under Slurm and PBS, the local scheduler's supervisor's locally; read by
allocation/step_rules.read_failure, the CLI's words). The first failure
by time is raised as RankFailed; a job that Slurm cancelled or stopped at its time limit says so instead.
Only the values asked for are loaded: result() reads rank 0's alone.

The warning signal under Slurm follows the CLI's plan: ``--signal=B:SIG@secs`` goes to the batch shell,
which has become the batch step (allocation/batch_step.py, as in the CLI's script) and passes it on through
srun to the ranks, where submitit's handler (told the signal's name by the rank module, rank.py) checkpoints
and requeues. The batch script is the CLI's: ``edge.render`` of the job's JobSpec (executors.SpecExecutor),
the rank command the launcher running rank.py, which runs submitit's processing of the pickled call.
"""

from __future__ import annotations

from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...core.errors import SlurmLaunchError, SpecError
    from .executors import _choose
    from .failures import RankFailed
    from .functions import Batch, batch, map_array, submit, submit_script
    from .job import Job
    from .job_options import CLI_ONLY, OPTION_NAMES, profile_options

__all__ = ["CLI_ONLY", "OPTION_NAMES", "Batch", "Job", "RankFailed", "SlurmLaunchError", "SpecError", "_choose",
           "batch", "map_array", "profile_options", "submit", "submit_script"]

# Every rank imports this package to unpickle its call (calls.py): the caller's side (submission, submitit's
# executors, the wait) is loaded on first use, not in every rank (issue 32: a rank's start is part of the
# time to result).
_WHERE = {"SlurmLaunchError": "...core.errors", "SpecError": "...core.errors", "_choose": ".executors",
          "RankFailed": ".failures", "Batch": ".functions", "batch": ".functions", "map_array": ".functions",
          "submit": ".functions", "submit_script": ".functions", "Job": ".job", "CLI_ONLY": ".job_options",
          "OPTION_NAMES": ".job_options", "profile_options": ".job_options"}


# The functions that submit: reached through the package (slurmlaunch.submit, ...), they come with what every
# submission to a queued scheduler renders with (its batch script is the CLI's template; Jinja2's import is about
# 40 ms of CPU, the scheduler registry's and the renderer's about 10), as submitit's executors come with `import
# submitit`, rather than inside the first call, whose time the caller waits (issue 39). Not functions.py's own
# imports: the login node's half of remote= (runner.py) loads it for every question about a job, and a missing
# Jinja2 stays the submission's error, said where it renders.
_SUBMITTING = ("submit", "submit_script", "map_array", "batch", "Batch")


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    if name in _SUBMITTING:
        for module in ("jinja2", "slurmlaunch.render.jinja", "slurmlaunch.schedulers.choice"):
            try:
                importlib.import_module(module)
            except ImportError:
                pass
    return getattr(importlib.import_module(_WHERE[name], __name__), name)
