"""Ranks started by an MPI launcher (Open MPI, MPICH/Hydra, Cray PALS, MVAPICH, PMIx), typically from a
PBS job script, and the PBS job script itself. Pure, like detect.py: a mapping in, a DistEnv out.

The node list comes from PBS_NODEFILE (one line per slot, or per node on some systems; nodes in order of
first appearance, never sorted); this host is the nodefile entry whose short name is this host's
(SLURMLAUNCH_HOSTNAME overrides the host name); NODE_RANK is its position. Without a nodefile the ranks
must fill nodes evenly in blocks (NODE_RANK = RANK // LOCAL_SIZE) and MASTER_ADDR must be given when
they span several nodes. MASTER_ADDR is the nodefile's first host: mpiexec places rank 0 on the first
slot (rank 0 checks it at start-up). MASTER_PORT derives from the numeric part of PBS_JOBID
(``1234.server``; array jobs ``1234[5].server`` use the index as the step), else from the MPI launcher's
job name. OMPI_COMM_WORLD_NODE_RANK is never read: it is a rank among the node's ranks, not a node index.

Cray PALS started with PMIx (``mpiexec --pmi=pmix``, as on Aurora) exports no world size at all (see
:func:`pals_world_size`): it is derived as the distinct hosts of PBS_NODEFILE x PALS_LOCAL_SIZE, and refused
when that cannot be trusted.
"""

from __future__ import annotations

from .distenv import DistEnv
from .envvars import Context, Env, derive_port, first_set, int_var, local_device, master_from
from .errors import EnvironmentMappingError
from .limits import bounded_int, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

# PBS Pro's job sequence numbers can be configured far past Slurm's 32 bits; 64 bits hold them all.
MAX_PBS_ID = 2**63 - 1



class Flavour:
    """The variables one MPI launcher sets for each rank it starts. A slotted class rather than a NamedTuple
    or a dataclass: this table is on the launcher's path, where importing `typing` or `dataclasses` would
    cost every rank milliseconds. The fields are Final: mypy refuses an assignment after __init__."""

    __slots__ = ("name", "rank_var", "size_vars", "local_var", "local_size_vars", "node_var")
    name: Final[str]
    rank_var: Final[str]
    size_vars: Final[tuple[str, ...]]  # the world size: the first one set
    local_var: Final[str]  # the rank among this node's ranks
    local_size_vars: Final[tuple[str, ...]]  # the ranks on this node: the first one set
    node_var: Final[str | None]  # this node's index, where the launcher says it

    def __init__(self, name: str, rank_var: str, size_vars: tuple[str, ...], local_var: str,
                 local_size_vars: tuple[str, ...], node_var: str | None = None) -> None:
        self.name, self.rank_var, self.size_vars = name, rank_var, size_vars
        self.local_var, self.local_size_vars, self.node_var = local_var, local_size_vars, node_var

    def __repr__(self) -> str:
        return f"Flavour({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


# Tried in this order: the first flavour whose rank (and local rank) variables are set is the one.
FLAVOURS: tuple[Flavour, ...] = (
    Flavour("openmpi", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",), "OMPI_COMM_WORLD_LOCAL_RANK",
            ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    Flavour("mvapich", "MV2_COMM_WORLD_RANK", ("MV2_COMM_WORLD_SIZE",), "MV2_COMM_WORLD_LOCAL_RANK",
            ("MV2_COMM_WORLD_LOCAL_SIZE",)),
    Flavour("pals", "PALS_RANKID", ("PMI_SIZE", "PALS_SIZE"), "PALS_LOCAL_RANKID",
            ("PMI_LOCAL_SIZE", "PALS_LOCAL_SIZE"), node_var="PALS_NODEID"),
    # Hydra sets MPI_LOCALRANKID; srun --mpi=pmi2 sets PMI_RANK without it and stays a Slurm step.
    Flavour("mpich", "PMI_RANK", ("PMI_SIZE",), "MPI_LOCALRANKID", ("MPI_LOCALNRANKS",)),
    Flavour("pmix", "PMIX_RANK", ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"), "OMPI_COMM_WORLD_LOCAL_RANK",
            ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
)
_JOB_NAMES = ("PBS_JOBID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PALS_APID", "PMI_KVSNAME")


def _short(host: str) -> str:
    return host.split(".", 1)[0]


def parse_nodefile(text: str, path: str) -> list[tuple[str, int]]:
    """(host, slots) in order of first appearance; one line per slot (or per node) as PBS writes it."""
    order: list[str] = []
    slots: dict[str, int] = {}
    for line in text.splitlines():
        host = line.strip()
        if not host or host.startswith("#"):
            continue
        host = host.split()[0]
        if host not in slots:
            order.append(host)
            slots[host] = 0
        slots[host] += 1
    if not order:
        raise EnvironmentMappingError(f"PBS_NODEFILE={path!r} is empty (expected one host per line)")
    return [(h, slots[h]) for h in order]


def _port_from_job(env: Env) -> tuple[int, str] | None:
    found = first_set(env, *_JOB_NAMES)
    if found is None:
        return None
    name, value = found
    if name == "PBS_JOBID":
        number = value.split(".", 1)[0]
        job_text, _, index_text = number.partition("[")
        index_text = index_text.rstrip("]")
        job, index = bounded_int(job_text, MAX_PBS_ID), bounded_int(index_text or "0", MAX_PBS_ID)
        if job is None or index is None:
            raise EnvironmentMappingError(
                f"PBS_JOBID={shown(value)} is not valid (expected NUMBER.server or NUMBER[INDEX].server)"
            )
        return derive_port(job, index), f"derived from PBS_JOBID={value}"
    digest = 0
    for ch in value:  # a stable hash: every rank of one launch computes the same
        digest = (digest * 131 + ord(ch)) % 1_000_003
    return derive_port(digest), f"derived from {name}={value}"


def read_mpi(env: Env, ctx: Context) -> DistEnv | None:
    """A rank started by mpiexec/mpirun; see the module's docstring for the rules."""
    for flavour in FLAVOURS:
        # PALS under PMIx may leave PALS_LOCAL_RANKID out (pals_world_size and the node file cover it)
        if flavour.rank_var in env and (flavour.local_var in env or flavour.name == "pals"):
            return _mpi_env(env, ctx, flavour)
    return None


def pals_world_size(env: Env, rank: int, hosts: list[tuple[str, int]] | None, nodefile: str | None
                    ) -> tuple[int, str]:
    """The world size of ranks that Cray PALS started with PMIx, and where it came from.

    PALS under PMIx exports PMIX_RANK, PALS_RANKID, PALS_LOCAL_RANKID, PALS_NODEID and PALS_LOCAL_SIZE but
    neither PMI_SIZE nor PALS_SIZE (HPE's list of PALS variables, as quoted in flux-framework/flux-core#3825,
    has no world size; meta-pytorch/torchcomms' query_pals_ranksize notes PALS_SIZE is not exported yet and
    multiplies node-file lines by PALS_LOCAL_SIZE). The world is then the distinct hosts of PBS_NODEFILE
    (the PBS Professional reference guide: each chunk's host is written once per mpiprocs of that chunk, so
    hosts repeat and lines are no node count; one line per node where mpiprocs is left at 1, as on Aurora)
    times the ranks per node, PMI_LOCAL_SIZE else PALS_LOCAL_SIZE (the pair LOCAL_WORLD_SIZE is read from):
    true only when every host of the node file runs the same number of ranks, which is what
    `mpiexec -n H*P --ppn P` over the whole allocation does. Refused (EnvironmentMappingError) when that
    cannot hold: no node file, no ranks-per-node count, hosts with different slot counts in the node file,
    or a rank that is not PALS_NODEID x PALS_LOCAL_SIZE + PALS_LOCAL_RANKID (the block placement of --ppn;
    a short last node shows here). Not detectable from one rank: an mpiexec on a subset of the hosts
    (--hosts, -n < H*P). PALS_SIZE set by hand (`PALS_SIZE=N mpiexec -n N ...`) is read before any of this.
    """
    missing = "PALS_RANKID is set but not PMI_SIZE or PALS_SIZE (PALS with PMIx exports no world size)"
    fix = "export PALS_SIZE=N (the -n given to mpiexec) to state it"
    local = first_set(env, "PMI_LOCAL_SIZE", "PALS_LOCAL_SIZE")
    if local is None:
        raise EnvironmentMappingError(
            f"{missing}, and neither PALS_LOCAL_SIZE nor PMI_LOCAL_SIZE is set to derive it from: {fix}")
    per_node = int_var(local[0], local[1], 1)
    if hosts is None or not nodefile:
        raise EnvironmentMappingError(
            f"{missing}, and PBS_NODEFILE is not set to derive it from (distinct hosts x {local[0]}): {fix}")
    if len({n for _, n in hosts}) > 1:
        shown = ", ".join(f"{h} x{n}" for h, n in hosts[:4]) + (", ..." if len(hosts) > 4 else "")
        raise EnvironmentMappingError(
            f"{missing}, and PBS_NODEFILE={nodefile!r} gives its hosts different slot counts ({shown}): the ranks "
            f"per node may differ, so hosts x {local[0]} is no world size; {fix}")
    node_text, local_text = env.get("PALS_NODEID", ""), env.get("PALS_LOCAL_RANKID", "")
    if node_text and local_text:
        node, local_rank = int_var("PALS_NODEID", node_text), int_var("PALS_LOCAL_RANKID", local_text)
        # Out-of-range values are left to the checks that name them; here only the block layout is asked.
        if node < len(hosts) and local_rank < per_node and rank != node * per_node + local_rank:
            raise EnvironmentMappingError(
                f"{missing}, and PALS_RANKID={rank} is not PALS_NODEID={node} x {local[0]}={per_node} + "
                f"PALS_LOCAL_RANKID={local_rank}: the nodes do not all run {per_node} ranks in blocks (a short last "
                f"node?), so hosts x {local[0]} is no world size; {fix}")
    world = len(hosts) * per_node
    return world, (f"{len(hosts)} distinct host(s) in PBS_NODEFILE={nodefile} x {local[0]}={per_node} "
                   f"(PALS with PMIx exports no world size)")


def _world_size(env: Env, flavour: Flavour, rank: int, size: tuple[str, str] | None,
                hosts: list[tuple[str, int]] | None, nodefile: str | None) -> tuple[int, str]:
    """(the world size, where it came from): the flavour's size variable, else (PALS under PMIx) derived."""
    if size is None:
        world, origin = pals_world_size(env, rank, hosts, nodefile)
        world_name = "WORLD_SIZE"
    else:
        world_name = size[0]
        world = int_var(world_name, size[1], 1)
        origin = f"{world_name}={world}"
    if rank >= world:
        raise EnvironmentMappingError(
            f"{flavour.rank_var}={rank} is not valid with {world_name}={world} (expected 0..{world - 1})"
            + ("" if size else f"; {origin}"))
    return world, origin


def _node_in_nodefile(env: Env, flavour: Flavour, hosts: list[tuple[str, int]], nodefile: str | None,
                      me: str) -> int:
    """This host's index among the nodefile's hosts: the flavour's node variable, else this host's name."""
    node_var = flavour.node_var
    if node_var and node_var in env:
        node_rank = int_var(node_var, env[node_var])
        if node_rank >= len(hosts):
            raise EnvironmentMappingError(
                f"{node_var}={node_rank} is not valid for the {len(hosts)} hosts of PBS_NODEFILE={nodefile!r}"
            )
        return node_rank
    names = [_short(h) for h, _ in hosts]
    if _short(me) in names:
        return names.index(_short(me))
    raise EnvironmentMappingError(
        f"this host {me!r} is not in PBS_NODEFILE={nodefile!r} (hosts: "
        f"{', '.join(h for h, _ in hosts[:8])}{', ...' if len(hosts) > 8 else ''})"
    )


def _nodefile_slots(flavour: Flavour, rank: int, world: int, hosts: list[tuple[str, int]], node_rank: int,
                    nodefile: str | None, local: tuple[int, int | None], origins: dict[str, str]) -> tuple[int, int]:
    """(local rank, ranks on this node) with a nodefile: its slots, when it has one line per slot."""
    local_rank, local_world = local
    this_host = hosts[node_rank][0]
    if sum(n for _, n in hosts) == world:
        # One line per slot: mpiexec --hostfile $PBS_NODEFILE places ranks on the slots in order, so this
        # host's ranks are a block. When the MPI's own local numbering disagrees (ranks of several nodefile
        # hosts sharing one machine), the nodefile wins: NODE_RANK came from it, and the pair must agree.
        slots = hosts[node_rank][1]
        first = sum(n for _, n in hosts[:node_rank])
        if local_world != slots:
            if not first <= rank < first + slots:
                raise EnvironmentMappingError(
                    f"{flavour.rank_var}={rank} is not on a slot of {this_host} in PBS_NODEFILE={nodefile!r} "
                    f"(slots {first}..{first + slots - 1}): was mpiexec given another hostfile or mapping?"
                )
            local_rank, local_world = rank - first, slots
            origins["LOCAL_RANK"] = f"{flavour.rank_var} - first slot of {this_host} in PBS_NODEFILE"
            origins["LOCAL_WORLD_SIZE"] = f"slots of {this_host} in PBS_NODEFILE"
    elif local_world is None:
        raise EnvironmentMappingError(
            f"{' or '.join(flavour.local_size_vars)} is not set and PBS_NODEFILE has one line per node: "
            f"the ranks per node are unknown"
        )
    return local_rank, local_world


def _block_nodes(env: Env, flavour: Flavour, rank: int, world: int, local_world: int,
                 origins: dict[str, str]) -> tuple[int, int]:
    """(node rank, node count) without a nodefile: the ranks must fill nodes evenly, in blocks."""
    if world % local_world:
        raise EnvironmentMappingError(
            f"{world} ranks do not fill nodes of {local_world} evenly and there is no PBS_NODEFILE to say "
            f"which node is which"
        )
    num_nodes = world // local_world
    node_var = flavour.node_var
    node_rank = int_var(node_var, env[node_var]) if node_var and node_var in env else rank // local_world
    origins["NODE_RANK"] = f"{flavour.rank_var} // {local_world} (ranks fill nodes in blocks)"
    if num_nodes > 1 and not env.get("MASTER_ADDR"):
        raise EnvironmentMappingError(
            f"{flavour.name} ranks span {num_nodes} nodes but neither PBS_NODEFILE nor MASTER_ADDR says where "
            f"rank 0 runs: export MASTER_ADDR (e.g. mpirun -x MASTER_ADDR=host)"
        )
    return node_rank, num_nodes


def _mpi_env(env: Env, ctx: Context, flavour: Flavour) -> DistEnv:
    rank_var, local_var = flavour.rank_var, flavour.local_var
    rank = int_var(rank_var, env[rank_var])
    size = first_set(env, *flavour.size_vars)
    if size is None and flavour.name != "pals":
        raise EnvironmentMappingError(f"{rank_var} is set but not {' or '.join(flavour.size_vars)} (the world size)")
    me = env.get("SLURMLAUNCH_HOSTNAME") or ctx.hostname
    nodefile = env.get("PBS_NODEFILE")
    hosts = parse_nodefile(ctx.read_file(nodefile), nodefile) if nodefile else None
    world, world_origin = _world_size(env, flavour, rank, size, hosts, nodefile)
    local_rank = int_var(local_var, env.get(local_var, "0"))
    local_size = first_set(env, *flavour.local_size_vars)
    origins = {"RANK": f"{rank_var}={rank}", "WORLD_SIZE": world_origin, "LOCAL_RANK": f"{local_var}={local_rank}"}
    if local_size:
        origins["LOCAL_WORLD_SIZE"] = f"{local_size[0]}={local_size[1]}"
    local_world = int_var(local_size[0], local_size[1], 1) if local_size else None
    this_host, rank0_host = me, None
    if hosts is not None:
        node_rank = _node_in_nodefile(env, flavour, hosts, nodefile, me)
        this_host, num_nodes, rank0_host = hosts[node_rank][0], len(hosts), hosts[0][0]
        origins["NODE_RANK"] = f"position of {this_host} in PBS_NODEFILE={nodefile}"
        local_rank, local_world = _nodefile_slots(flavour, rank, world, hosts, node_rank, nodefile,
                                                  (local_rank, local_world), origins)
    elif local_world is None:
        local_world = world
        origins["LOCAL_WORLD_SIZE"] = "WORLD_SIZE (no ranks-per-node count and no PBS_NODEFILE: one node)"
    if local_rank >= local_world:
        raise EnvironmentMappingError(
            f"{local_var}={local_rank} is not valid with {local_world} ranks on this node "
            f"(expected 0..{local_world - 1})"
        )
    if hosts is None:
        node_rank, num_nodes = _block_nodes(env, flavour, rank, world, local_world, origins)
        rank0_host = me if num_nodes == 1 else None
    port = _port_from_job(env)
    addr, master_port, master_origins = master_from(
        env, rank0_host or "127.0.0.1", "first host of PBS_NODEFILE" if hosts else "this host (one node)",
        port[0] if port else 29500, port[1] if port else "torch's default (no job id to derive one from)",
    )
    origins.update(master_origins)
    origins["GROUP_WORLD_SIZE"] = f"{num_nodes} node(s)"
    return DistEnv(
        source=f"mpi:{flavour.name}", rank=rank, local_rank=local_rank, world_size=world,
        local_world_size=local_world, node_rank=node_rank, num_nodes=num_nodes, master_addr=addr,
        master_port=master_port, rank0_host=rank0_host, this_host=this_host,
        local_device=local_device(env, local_rank, local_world, ctx, this_host), origins=origins,
    )


def read_pbs_script(env: Env, ctx: Context) -> DistEnv | None:
    """The PBS job script itself (PBS_JOBID set, no MPI rank variables): it must not pretend to be rank 0."""
    if "PBS_JOBID" not in env or "PBS_NODEFILE" not in env:
        return None
    nodefile = env["PBS_NODEFILE"]
    slots = sum(n for _, n in parse_nodefile(ctx.read_file(nodefile), nodefile))
    if slots > 1:
        raise EnvironmentMappingError(
            f"this is the PBS job script of job {env['PBS_JOBID']} ({slots} slots in PBS_NODEFILE, no MPI rank "
            f"variables): start the ranks with mpiexec (mpiexec ... slurmlaunch launch SCRIPT)"
        )
    return None
