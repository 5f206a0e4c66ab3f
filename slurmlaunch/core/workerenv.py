"""What a worker of --mode torchrun sees of Slurm: the task variables of the srun step that would have started
it, written from torchrun's own (pure: values in, values out).

Why: in --mode torchrun, srun starts one task per node (torchrun's agent) and the agent starts the node's
workers, which inherit the node task's SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS. Clients that read both
sets then see two worlds: ignite refuses RANK != SLURM_PROCID on a multi-node job, idr-torch takes its rank
from SLURM_PROCID and gives every worker of a node the same one. So each worker's task variables are made
what `srun --ntasks-per-node=LOCAL_WORLD_SIZE` would have set, in the order torchrun's rendezvous chose (its
GROUP_RANK is the node's place, which need not be the node list's): both sets then describe one world.
SLURM_STEP_ID (and SLURM_STEPID) are dropped: they say "srun started this process as a task of a step", which
is the agent's claim, not the worker's; torchrun's TORCHELASTIC_RUN_ID says who started it. A client that
picks its launcher by them (idr-torch prefers Slurm's when SLURM_STEP_ID is set, and then moves MASTER_ADDR and
MASTER_PORT away from torchrun's store to its own) takes torchrun's. The job's variables (SLURM_JOB_ID, the
node list, SLURMD_NODENAME, ...) are true of the worker and stay.
"""

from __future__ import annotations

from collections.abc import Mapping

from .limits import MAX_JOB_ID, bounded_int

# torchrun's variable -> the task variables that mean the same
_SAME = {
    "RANK": ("SLURM_PROCID",),
    "LOCAL_RANK": ("SLURM_LOCALID",),
    "GROUP_RANK": ("SLURM_NODEID",),
    "WORLD_SIZE": ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"),
    "LOCAL_WORLD_SIZE": ("SLURM_NTASKS_PER_NODE",),
    "GROUP_WORLD_SIZE": ("SLURM_STEP_NUM_NODES",),
}
DROPPED = ("SLURM_STEP_ID", "SLURM_STEPID")


def torchrun_worker_slurm(env: Mapping[str, str]) -> dict[str, str | None]:
    """The changes to a torchrun worker's environment (None: unset). Reads TORCHELASTIC_RUN_ID, SLURM_JOB_ID
    (or SLURM_JOBID) and torchrun's RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    GROUP_WORLD_SIZE. Nothing changes outside a Slurm job or torchrun, or when one of torchrun's values is not
    a count (torchrun always sets them: such an environment is not torchrun's, and is left as it is)."""
    if "TORCHELASTIC_RUN_ID" not in env or not (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")):
        return {}
    read = {name: bounded_int(env.get(name, ""), MAX_JOB_ID) for name in _SAME}
    values = {name: value for name, value in read.items() if value is not None}
    if len(values) != len(read) or values["LOCAL_RANK"] > values["RANK"]:
        return {}
    out: dict[str, str | None] = {slurm: str(values[name]) for name, names in _SAME.items() for slurm in names}
    per_node, nodes = max(1, values["LOCAL_WORLD_SIZE"]), max(1, values["GROUP_WORLD_SIZE"])
    tasks_per_node = f"{per_node}(x{nodes})" if nodes > 1 else str(per_node)  # Slurm's compressed form
    out["SLURM_TASKS_PER_NODE"] = out["SLURM_STEP_TASKS_PER_NODE"] = tasks_per_node
    first = values["RANK"] - values["LOCAL_RANK"]  # torchrun numbers a node's workers in a row
    out["SLURM_GTIDS"] = ",".join(str(first + i) for i in range(per_node))
    out.update(dict.fromkeys(DROPPED))
    return out
