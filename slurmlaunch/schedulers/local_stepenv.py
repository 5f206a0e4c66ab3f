"""The variables a real srun step gives one of its tasks, computed from the request: the local scheduler's
emulation of a Slurm allocation.

Pure: values in, values out (the caller gathers the submitter's facts). The table follows what the newest
release the tests run, Slurm 25.11, sets in a step started by the srun line of our batch script, established
variable by variable against the real dev cluster (tests/schedulers/test_srun_fidelity.py compares a real step
and an emulated one for several shapes, on 25.11 and on Debian's 22.05; it lists what 22.05's step has or
lacks beside 25.11's: SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0 and SLURM_NODE_ALIASES, which 25.11 no longer
sets, and the job's times, group, SLURM_OOM_KILL_STEP, SLURM_TRES_PER_TASK and SLURMD_DEBUG, which 22.05 did
not).

Left out on purpose (see NOT_EMULATED): srun's own channels back to itself and to the controller. A task
never needs them to know its place, and a value pointing at an srun or a slurmctld that does not exist
would only send a nested srun, or an MPI's PMI client, to a dead address.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..core.parse import mem_mb as mem_mb  # SLURM_MEM_PER_NODE's value
from ..core.spec import JobSpec

NOT_EMULATED = (
    "SLURM_SRUN_COMM_HOST",  # where srun listens for its tasks' messages
    "SLURM_SRUN_COMM_PORT",
    "SLURM_STEP_LAUNCHER_PORT",
    "SLURM_LAUNCH_NODE_IPADDR",  # the address of the node srun runs on, for PMI replies to srun
    "SLURM_WORKING_CLUSTER",  # cluster:controller-host:port:rpc-version, for a nested srun/sbatch
    "SLURM_CONF",  # a config file of a cluster; there is none (the caller's is removed with its SLURM_*)
    # Slurm 23.11 and later tell MPI launchers in the allocation to start their daemons with srun
    # --external-launcher; there is no srun here, and a nested mpirun must not be sent to one.
    "HYDRA_BOOTSTRAP", "HYDRA_LAUNCHER_EXTRA_ARGS", "I_MPI_HYDRA_BOOTSTRAP", "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS",
    "OMPI_MCA_plm_slurm_args", "PRTE_MCA_plm_slurm_args",
)

# SLURM_JOB_END_TIME of a job without a time limit: slurmctld's INFINITE limit ends a year after the start.
NO_LIMIT_S = 365 * 24 * 3600
CLUSTER_NAME = "local"  # SLURM_CLUSTER_NAME: ClusterName of slurm.conf on a real cluster
DEFAULT_PARTITION = "local"  # SLURM_JOB_PARTITION without --partition: a cluster's Default=YES partition
# The GPU variables Slurm's gres/gpu plugin sets to the same list (one per GPU API); it unsets them all in
# a step without GPUs on a node that has some.
GPU_LISTS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ZE_AFFINITY_MASK")


@dataclass(frozen=True)
class Submitter:
    """What sbatch records of the process that submitted (who, from where, with which umask and nice value),
    and the size of the nodes it submits to."""

    user: str
    uid: int
    gid: int
    group: str  # the name of the group gid (its number when it has none)
    host: str  # the short host name (sbatch cuts the domain off)
    umask: int
    nice: int
    node_cpus: int  # the CPUs of one node: an --exclusive job gets them all


def per_node(value: int, nodes: int) -> str:
    """Slurm's compressed per-node counts for a count shared by every node: ``4``, or ``4(x2)``."""
    return str(value) if nodes == 1 else f"{value}(x{nodes})"


def array_step(expr: str) -> int:
    """SLURM_ARRAY_TASK_STEP: the first ``:STEP`` written in the --array expression, else 1 (Slurm takes it
    from the text: ``0,4,8`` gives 1, ``0-2,10-20:5`` gives 5, ``0-10:5,20-26:3`` gives 5)."""
    for part in expr.partition("%")[0].split(","):
        _, colon, step = part.partition(":")
        if colon:
            return int(step)
    return 1


def distribution(nodes: int, ntasks: int) -> str:
    """srun's default task distribution: block when there are more tasks than nodes, else cyclic."""
    return "block" if ntasks > nodes else "cyclic"


def _job_vars(spec: JobSpec, job_id: str, nodes: list[str], nodelist: str, submitter: Submitter,
              cpus: int, start: int) -> dict[str, str]:
    """The job, as slurmctld and sbatch describe it."""
    count = len(nodes)
    limit = spec.time_limit_seconds
    return {
        "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_JOB_NAME": spec.name,
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(count), "SLURM_NNODES": str(count),
        "SLURM_JOB_CPUS_PER_NODE": per_node(cpus, count),
        "SLURM_JOB_PARTITION": spec.resources.partition or DEFAULT_PARTITION, "SLURM_CLUSTER_NAME": CLUSTER_NAME,
        "SLURM_JOB_USER": submitter.user, "SLURM_JOB_UID": str(submitter.uid), "SLURM_JOB_GID": str(submitter.gid),
        "SLURM_JOB_GROUP": submitter.group,
        "SLURM_JOB_START_TIME": str(start),
        "SLURM_JOB_END_TIME": str(start + (NO_LIMIT_S if limit is None else limit)),
        "SLURM_SUBMIT_HOST": submitter.host, "SLURM_SUBMIT_DIR": spec.program.workdir,
        "SLURM_UMASK": f"{submitter.umask:04o}", "SLURM_PRIO_PROCESS": str(submitter.nice),
        "SLURM_OPEN_MODE": "a",  # our sbatch and srun lines ask for --open-mode=append
        "ENVIRONMENT": "BATCH",  # the step is started from a batch script
        "HOSTNAME": nodes[0],  # slurmd gives the batch script its node's name; srun passes it on
    }


def _step_and_task_vars(spec: JobSpec, rank: int, nodes: list[str], nodelist: str, cpus: int) -> dict[str, str]:
    """The step, as srun requested it, and the task, as slurmstepd starts it (SLURM_TASK_PID is the task's
    own pid: see cli.main)."""
    count = len(nodes)
    tpn = spec.slurm_tasks_per_node
    ntasks = count * tpn
    node, local = divmod(rank, tpn)
    tasks = per_node(tpn, count)
    return {
        "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_NTASKS_PER_NODE": str(tpn),  # srun sets it for --ntasks-per-node; Lightning requires it
        "SLURM_STEP_NUM_NODES": str(count), "SLURM_STEP_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": tasks, "SLURM_STEP_TASKS_PER_NODE": tasks,
        "SLURM_DISTRIBUTION": distribution(count, ntasks),
        "SRUN_DEBUG": "3",  # srun's verbosity: info, without -v or -Q
        "SLURMD_DEBUG": "2",  # srun's --slurmd-debug: error, its default
        "SLURM_OOM_KILL_STEP": "0",  # --oom-kill-step: an OOM kill ends the task, not the whole step (the default)
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": nodes[node], "SLURM_TOPOLOGY_ADDR": nodes[node], "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
        "SLURM_GTIDS": ",".join(str(node * tpn + i) for i in range(tpn)),
        "SLURM_CPUS_ON_NODE": str(cpus),
    }


def _request_vars(spec: JobSpec) -> dict[str, str]:
    """What only some requests set: CPUs per task, memory, account, QOS, the array's step."""
    env = {}
    if spec.slurm_cpus_per_task is not None:
        env["SLURM_CPUS_PER_TASK"] = str(spec.slurm_cpus_per_task)
        env["SLURM_TRES_PER_TASK"] = f"cpu={spec.slurm_cpus_per_task}"  # srun's --cpus-per-task, as a TRES
    if spec.resources.mem is not None:
        env["SLURM_MEM_PER_NODE"] = str(mem_mb(spec.resources.mem))
    # Accounting's defaults (the user's default account, the default QOS) have no local counterpart.
    if spec.resources.account is not None:
        env["SLURM_JOB_ACCOUNT"] = spec.resources.account
    if spec.resources.qos is not None:
        env["SLURM_JOB_QOS"] = spec.resources.qos
    if spec.array_directive is not None:
        env["SLURM_ARRAY_TASK_STEP"] = str(array_step(spec.array_directive))
    return env


def _gpu_vars(spec: JobSpec, node: int, gpus: list[str]) -> dict[str, str]:
    """The GPUs of node ``node``, in every GPU API's variable, and the request's own GPU variables."""
    mine = ",".join(gpus[node * spec.resources.gpus_per_node:(node + 1) * spec.resources.gpus_per_node])
    env = {name: mine for name in GPU_LISTS}
    env.update(SLURM_JOB_GPUS=mine, SLURM_STEP_GPUS=mine, SLURM_GPUS_ON_NODE=str(spec.resources.gpus_per_node))
    if spec.resources.gpu_flag == "gpus-per-node":  # --gres=gpu:N sets no SLURM_GPUS_* request variable
        env["SLURM_GPUS_PER_NODE"] = str(spec.resources.gpus_per_node)
    return env


def step_env(spec: JobSpec, job_id: str, rank: int, nodes: list[str], nodelist: str, submitter: Submitter,
             gpus: list[str] | None, start: int | None = None) -> dict[str, str]:
    """The Slurm variables of task ``rank`` of the step that runs ``spec`` on ``nodes`` (the node names in
    order; ``nodelist`` is their compressed form), with ``gpus`` the GPUs handed out in node order (None: a
    step without GPUs), for a job that started at ``start`` (epoch seconds; None: now, the clock's one read).
    The array variables are the caller's, except the step, which only the request knows."""
    start = int(time.time()) if start is None else start
    tpn = spec.slurm_tasks_per_node
    # one CPU per task without --cpus-per-task (a node without SMT, or CR_CPU); --exclusive: the whole node
    cpus = submitter.node_cpus if spec.resources.exclusive else tpn * (spec.slurm_cpus_per_task or 1)
    env = _job_vars(spec, job_id, nodes, nodelist, submitter, cpus, start)
    env.update(_step_and_task_vars(spec, rank, nodes, nodelist, cpus))
    env.update(_request_vars(spec))
    if gpus is not None:
        env.update(_gpu_vars(spec, rank // tpn, gpus))
    return env
