"""Which launcher started this task, and the torch distributed environment that follows from it.

Pure: every reader takes a plain mapping of variables plus a :class:`Context` (host name, file reader,
GPU device count) and returns a :class:`DistEnv`, or None when the environment is not its own.
Detection order (first match wins), see :data:`READERS`:

1. torchrun owns the process (TORCHELASTIC_RUN_ID set, SLURMLAUNCH_RUN not): its variables are left alone;
2. `slurmlaunch run` started it (SLURMLAUNCH_RUN=1, with torchrun's TORCHELASTIC_* variables, which `run`
   exports as torchrun does), even inside a Slurm allocation;
3. an MPI launcher started it (Open MPI, MVAPICH, Cray PALS, MPICH/Hydra, PMIx: detect_mpi.py);
4. a Slurm step (SLURM_JOB_ID and SLURM_STEP_ID set); the batch step of a multi-task job is refused;
5. a PBS job script with several slots (refused: start ranks with mpiexec);
6. RANK and WORLD_SIZE set by hand: respected;
7. a plain single process: a world of 1.
"""

from __future__ import annotations

from collections.abc import Callable

from . import hostlist
from .detect_mpi import read_mpi, read_pbs_script
from .distenv import DistEnv
from .envvars import PORT_BASE as PORT_BASE
from .envvars import PORT_SPAN as PORT_SPAN
from .envvars import Context as Context
from .envvars import Env as Env
from .envvars import cpus_per_task, first_set, int_var, master_from, require
from .envvars import derive_port as derive_port
from .envvars import local_device as local_device
from .errors import EnvironmentMappingError, HostlistError
from .limits import MAX_JOB_ID, bounded_int, shown

#: Where a task of a step finds its node list, first set wins (see _slurm_nodes).
NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def read_torchrun(env: Env, ctx: Context) -> DistEnv | None:
    """torchrun (torch.distributed.elastic) already set everything: report it, change nothing. Not a rank
    of `slurmlaunch run` (SLURMLAUNCH_RUN=1), which exports torchrun's TORCHELASTIC_* variables too."""
    if "TORCHELASTIC_RUN_ID" not in env or env.get("SLURMLAUNCH_RUN") == "1":
        return None
    vals = {}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"):
        vals[name] = int_var(name, require(env, name)[1])
    return DistEnv(
        source="torchrun",
        rank=vals["RANK"],
        local_rank=vals["LOCAL_RANK"],
        world_size=vals["WORLD_SIZE"],
        local_world_size=vals["LOCAL_WORLD_SIZE"],
        node_rank=vals["GROUP_RANK"],
        num_nodes=vals["GROUP_WORLD_SIZE"],
        master_addr=env.get("MASTER_ADDR", ""),
        master_port=int_var("MASTER_PORT", env.get("MASTER_PORT", "0")),
        this_host=ctx.hostname,
        owned_by_torchrun=True,
        origins={name: f"{name} (set by torchrun, TORCHELASTIC_RUN_ID={env['TORCHELASTIC_RUN_ID']})"
                 for name in vals},
    )


def slurm_step_ids(env: Env) -> tuple[int, int] | None:
    """(job id, step id) of a task of a step; None outside Slurm and in the batch step of a one-task job.
    Reads SLURM_JOB_ID > SLURM_JOBID, SLURM_STEP_ID > SLURM_STEPID, SLURM_NTASKS (the batch step's refusal)."""
    job = first_set(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if job is None:
        return None
    job_id = int_var(job[0], job[1])
    step = first_set(env, "SLURM_STEP_ID", "SLURM_STEPID")
    if step is None:
        # The batch script (or an salloc shell) carries SLURM_PROCID=0 and the job's SLURM_NTASKS, but
        # it is no task of a step: treating it as rank 0 of N makes it wait for N-1 ranks forever.
        ntasks = env.get("SLURM_NTASKS", "1")
        if (bounded_int(ntasks, MAX_JOB_ID) or 0) > 1:
            raise EnvironmentMappingError(
                f"this is the batch step of Slurm job {job_id} (SLURM_STEP_ID is not set, "
                f"SLURM_NTASKS={ntasks}): start the ranks with srun "
                f"(srun slurmlaunch launch SCRIPT), not directly in the batch script"
            )
        return None
    return job_id, int_var(step[0], step[1])


def _slurm_nodes(env: Env) -> tuple[str, str, int]:
    """(the node list's variable, the node list, the step's node count), which must agree.

    The step's own list first; without it the job's, by its name (sbatch(1), salloc(1): SLURM_NODELIST is
    SLURM_JOB_NODELIST's name "included for backwards compatibility"; within a step Slurm 22.05 sets both
    to the job's list, and SLURM_STEP_NODELIST to the step's)."""
    nodelist_name, nodelist = require(env, *NODELIST_VARIABLES)
    try:
        hosts_in_list = hostlist.count(nodelist)
    except HostlistError as e:
        raise EnvironmentMappingError(f"{nodelist_name}: {e}") from None
    nnodes_found = first_set(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    nnodes = int_var(nnodes_found[0], nnodes_found[1], 1) if nnodes_found else hosts_in_list
    if nnodes != hosts_in_list:
        raise EnvironmentMappingError(
            f"{nodelist_name}={nodelist!r} names {hosts_in_list} hosts but the step has {nnodes} nodes "
            f"({nnodes_found[0] if nnodes_found else 'count'}={nnodes})"
        )
    return nodelist_name, nodelist, nnodes


def _slurm_tasks_per_node(env: Env, nnodes: int, world: int) -> tuple[str, str, list[tuple[int, int]]]:
    """(the variable, its text, its parsed counts): one count per node, adding up to the world size."""
    tpn_name, tpn_text = require(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    longest = max((len(run) for run in tpn_text.replace("(x", ",").replace(")", ",").split(",")), default=0)
    if longest > len(str(MAX_JOB_ID)):  # before the count list's parser converts 5000 digits
        raise EnvironmentMappingError(f"{tpn_name}={shown(tpn_text)} is not valid (a count of {longest} "
                                      f"characters; expected counts such as 2(x3),1)")
    try:
        tpn = hostlist.parse_counts(tpn_text)
    except HostlistError as e:
        raise EnvironmentMappingError(f"{tpn_name}: {e}") from None
    if hostlist.counts_length(tpn) != nnodes or hostlist.counts_total(tpn) != world:
        raise EnvironmentMappingError(
            f"{tpn_name}={tpn_text!r} is not valid for {nnodes} nodes and {world} tasks "
            f"(expected {nnodes} counts adding up to {world})"
        )
    return tpn_name, tpn_text, tpn


def _slurm_place(env: Env, nodes: tuple[str, str, int], tasks: tuple[str, str, list[tuple[int, int]]]
                 ) -> tuple[int, int, int, str]:
    """(node rank, local rank, tasks on this node, this host) of this task, checked against the step's
    ``nodes`` (_slurm_nodes's) and ``tasks`` per node (_slurm_tasks_per_node's)."""
    nodelist_name, nodelist, nnodes = nodes
    tpn_name, tpn_text, tpn = tasks
    node_rank = int_var("SLURM_NODEID", require(env, "SLURM_NODEID")[1])
    if node_rank >= nnodes:
        raise EnvironmentMappingError(
            f"SLURM_NODEID={node_rank} is not valid for a step on {nnodes} nodes (expected 0..{nnodes - 1})"
        )
    local_world = hostlist.count_at(tpn, node_rank) or 0
    local_rank = int_var("SLURM_LOCALID", require(env, "SLURM_LOCALID")[1])
    if local_rank >= local_world:
        raise EnvironmentMappingError(
            f"SLURM_LOCALID={local_rank} is not valid with {local_world} tasks on node {node_rank} "
            f"({tpn_name}={tpn_text!r}; expected 0..{local_world - 1})"
        )
    my_host = hostlist.nth_host(nodelist, node_rank)
    node_name = env.get("SLURMD_NODENAME")
    if node_name and node_name != my_host:
        raise EnvironmentMappingError(
            f"SLURMD_NODENAME={node_name!r} is not node {node_rank} of {nodelist_name}={nodelist!r} "
            f"(that is {my_host!r})"
        )
    return node_rank, local_rank, local_world, node_name or my_host


def _slurm_rank0_host(env: Env, ctx: Context, nodelist_name: str, nodelist: str) -> tuple[str, str]:
    """(rank 0's host, where that came from): the node list's first host, or with an arbitrary distribution
    the first host of SLURM_HOSTFILE."""
    hostfile = env.get("SLURM_HOSTFILE")
    if not (env.get("SLURM_DISTRIBUTION", "").startswith("arbitrary") and hostfile):
        return hostlist.first_host(nodelist), f"first host of {nodelist_name}={nodelist}"
    first_line = next((ln.strip() for ln in ctx.read_file(hostfile).splitlines() if ln.strip()), "")
    if not first_line:
        raise EnvironmentMappingError(f"SLURM_HOSTFILE={hostfile!r} names no host")
    try:
        host = hostlist.first_host(first_line)
    except HostlistError as e:
        raise EnvironmentMappingError(f"SLURM_HOSTFILE={hostfile!r}: {e}") from None
    return host, f"first host of SLURM_HOSTFILE={hostfile} (arbitrary distribution)"


def read_slurm(env: Env, ctx: Context) -> DistEnv | None:
    """A task of a Slurm job step (started by srun).

    Reads, step-scoped first: SLURM_PROCID; SLURM_STEP_NUM_TASKS > SLURM_NTASKS; SLURM_STEP_NODELIST >
    SLURM_JOB_NODELIST > SLURM_NODELIST; SLURM_STEP_NUM_NODES > SLURM_NNODES; SLURM_STEP_TASKS_PER_NODE >
    SLURM_TASKS_PER_NODE; SLURM_NODEID; SLURM_LOCALID; SLURMD_NODENAME; SLURM_JOB_ID; SLURM_STEP_ID;
    SLURM_CPUS_PER_TASK; SLURM_DISTRIBUTION and SLURM_HOSTFILE (arbitrary distribution: rank 0 runs
    on the hostfile's first host, not on the first host of the sorted node list).
    """
    ids = slurm_step_ids(env)
    if ids is None:
        return None
    procid_name, procid_text = require(env, "SLURM_PROCID")
    rank = int_var(procid_name, procid_text)
    ntasks_name, ntasks_text = require(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    world = int_var(ntasks_name, ntasks_text, 1)
    if rank >= world:
        raise EnvironmentMappingError(
            f"SLURM_PROCID={rank} is not valid with {ntasks_name}={world} (expected 0..{world - 1})"
        )
    nodelist_name, nodelist, nnodes = _slurm_nodes(env)
    tpn_name, tpn_text, tpn = _slurm_tasks_per_node(env, nnodes, world)
    node_rank, local_rank, local_world, host = _slurm_place(env, (nodelist_name, nodelist, nnodes),
                                                            (tpn_name, tpn_text, tpn))
    rank0_host, rank0_origin = _slurm_rank0_host(env, ctx, nodelist_name, nodelist)
    addr, port, origins = master_from(
        env, rank0_host, rank0_origin, derive_port(*ids), f"derived from SLURM_JOB_ID={ids[0]}, SLURM_STEP_ID={ids[1]}",
    )
    cpus = cpus_per_task(env)
    origins.update({
        "RANK": f"{procid_name}={procid_text}", "WORLD_SIZE": f"{ntasks_name}={ntasks_text}",
        "LOCAL_RANK": f"SLURM_LOCALID={local_rank}", "LOCAL_WORLD_SIZE": f"{tpn_name}={tpn_text} at node {node_rank}",
        "NODE_RANK": f"SLURM_NODEID={node_rank}", "GROUP_WORLD_SIZE": f"{nodelist_name}={nodelist}",
    })
    if cpus is not None:
        origins["OMP_NUM_THREADS"] = f"SLURM_CPUS_PER_TASK={cpus}"
    return DistEnv(
        source="slurm", rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
        node_rank=node_rank, num_nodes=nnodes, master_addr=addr, master_port=port, rank0_host=rank0_host,
        this_host=host, omp_num_threads=cpus or None,
        local_device=local_device(env, local_rank, local_world, ctx, host), origins=origins,
    )


def read_run(env: Env, ctx: Context) -> DistEnv | None:
    """A rank started by `slurmlaunch run` (torchrun's flags on a machine without a scheduler).

    Reads SLURMLAUNCH_NNODES, SLURMLAUNCH_NODE_RANK, SLURMLAUNCH_NPROC_PER_NODE, SLURMLAUNCH_LOCAL_RANK,
    MASTER_ADDR and MASTER_PORT, all set by `run` for each rank it starts.
    """
    if env.get("SLURMLAUNCH_RUN") != "1":
        return None
    nnodes = int_var("SLURMLAUNCH_NNODES", require(env, "SLURMLAUNCH_NNODES")[1], 1)
    node_rank = int_var("SLURMLAUNCH_NODE_RANK", require(env, "SLURMLAUNCH_NODE_RANK")[1])
    nproc = int_var("SLURMLAUNCH_NPROC_PER_NODE", require(env, "SLURMLAUNCH_NPROC_PER_NODE")[1], 1)
    local_rank = int_var("SLURMLAUNCH_LOCAL_RANK", require(env, "SLURMLAUNCH_LOCAL_RANK")[1])
    if node_rank >= nnodes or local_rank >= nproc:
        raise EnvironmentMappingError(
            f"SLURMLAUNCH_NODE_RANK={node_rank}/SLURMLAUNCH_LOCAL_RANK={local_rank} are not valid for "
            f"{nnodes} node(s) x {nproc} process(es) (expected node rank < nnodes, local rank < nproc)"
        )
    addr = require(env, "MASTER_ADDR")[1]
    port = int_var("MASTER_PORT", require(env, "MASTER_PORT")[1], 1)
    return DistEnv(
        source="run",
        rank=node_rank * nproc + local_rank,
        local_rank=local_rank,
        world_size=nnodes * nproc,
        local_world_size=nproc,
        node_rank=node_rank,
        num_nodes=nnodes,
        master_addr=addr,
        master_port=port,
        this_host=ctx.hostname,
        local_device=local_device(env, local_rank, nproc, ctx, ctx.hostname),
        origins={"RANK": "--node-rank x --nproc-per-node + local rank", "WORLD_SIZE": "--nnodes x --nproc-per-node",
                 "LOCAL_RANK": "the process's index on this node", "LOCAL_WORLD_SIZE": "--nproc-per-node",
                 "NODE_RANK": "--node-rank", "GROUP_WORLD_SIZE": "--nnodes", "MASTER_ADDR": "--master-addr",
                 "MASTER_PORT": "--master-port"},
    )


def read_preset(env: Env, ctx: Context) -> DistEnv | None:
    """RANK and WORLD_SIZE set by hand (no launcher around): respected, with LOCAL_RANK (default 0),
    LOCAL_WORLD_SIZE (default 1), NODE_RANK or GROUP_RANK (default RANK // LOCAL_WORLD_SIZE), MASTER_ADDR
    (needed when WORLD_SIZE > 1) and MASTER_PORT (default 29500, torch's)."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world = int_var("WORLD_SIZE", env["WORLD_SIZE"], 1)
    rank = int_var("RANK", env["RANK"])
    local_world = int_var("LOCAL_WORLD_SIZE", env.get("LOCAL_WORLD_SIZE", "1"), 1)
    local_rank = int_var("LOCAL_RANK", env.get("LOCAL_RANK", "0"))
    if rank >= world or local_rank >= local_world:
        raise EnvironmentMappingError(
            f"RANK={rank}/LOCAL_RANK={local_rank} are not valid with WORLD_SIZE={world}/LOCAL_WORLD_SIZE="
            f"{local_world} (expected RANK < WORLD_SIZE, LOCAL_RANK < LOCAL_WORLD_SIZE)"
        )
    if world > 1 and not env.get("MASTER_ADDR"):
        raise EnvironmentMappingError(f"RANK and WORLD_SIZE={world} are set by hand but MASTER_ADDR is not")
    node_text = env.get("NODE_RANK") or env.get("GROUP_RANK") or str(rank // local_world)
    addr, port, origins = master_from(env, "127.0.0.1", "default", 29500, "torch's default")
    return DistEnv(
        source="preset", rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
        node_rank=int_var("NODE_RANK", node_text), num_nodes=max(1, -(-world // local_world)), master_addr=addr,
        master_port=port, this_host=ctx.hostname,
        local_device=local_device(env, local_rank, local_world, ctx, ctx.hostname),
        origins={**origins, "RANK": "RANK (set by hand)", "WORLD_SIZE": "WORLD_SIZE (set by hand)"},
    )


def read_single(env: Env, ctx: Context) -> DistEnv:
    """No launcher around us: a world of 1 on this host (a free port is picked at launch)."""
    addr, port, origins = master_from(env, "127.0.0.1", "default for a world of 1", 0, "a free port, picked at launch")
    return DistEnv(
        source="single",
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=addr,
        master_port=port,
        rank0_host=ctx.hostname,
        this_host=ctx.hostname,
        local_device=local_device(env, 0, 1, ctx, ctx.hostname),
        origins=origins,
        notes=("no scheduler or launcher variables found: running as a world of 1",),
    )


Reader = Callable[[Env, Context], "DistEnv | None"]


#: The detection order, first match wins. MPI comes before Slurm: ranks that mpirun started inside a
#: Slurm allocation inherit SLURM_PROCID/SLURM_NTASKS of mpirun's daemons, which are not their own.
READERS: tuple[Reader, ...] = (read_torchrun, read_run, read_mpi, read_slurm, read_pbs_script, read_preset)


def detect(env: Env, ctx: Context | None = None) -> DistEnv:
    """The first reader in :data:`READERS` that recognises ``env``; a world of 1 when none does."""
    ctx = ctx or Context()
    for reader in READERS:
        found = reader(env, ctx)
        if found is not None:
            return found
    return read_single(env, ctx)
