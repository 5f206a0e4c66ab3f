"""The torch distributed environment of one rank, as a frozen value, and what it exports.

Pure: no os.environ, no I/O. The exported names are torchrun's, so scripts written for torchrun run
unchanged (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, GROUP_WORLD_SIZE,
ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT), plus OMP_NUM_THREADS when the CPUs per
task are known and the user has not set it, and SLURMLAUNCH_LOCAL_DEVICE (the index, among the GPUs this
rank can see, of the one it should use).
"""

from __future__ import annotations

from collections.abc import Mapping

_SECRET_WORDS = ("TOKEN", "KEY", "PASSWORD", "PASSWD", "SECRET", "CREDENTIAL")


def mask(name: str, value: str) -> str:
    """The value to show in a diagnostic: '****' when the variable's name looks secret."""
    upper = name.upper()
    return "****" if any(w in upper for w in _SECRET_WORDS) else value


_FIELDS = ("source", "rank", "local_rank", "world_size", "local_world_size", "node_rank", "num_nodes",
           "master_addr", "master_port", "rank0_host", "this_host", "omp_num_threads", "local_device",
           "owned_by_torchrun", "origins", "notes")


class DistEnv:
    """One rank's place in the world, immutable. ``origins`` says, per exported name, where the value came
    from. (A hand-written value class, not a dataclass: importing dataclasses costs the launcher, which
    runs once per rank, more than everything else it does.)"""

    __slots__ = _FIELDS
    source: str  # "slurm", "run", "mpi:openmpi", "torchrun", "single"
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int  # 0: pick a free port at launch (a world of 1 only)
    rank0_host: str | None  # the scheduler's name of the host that runs rank 0, when known
    this_host: str | None  # the scheduler's name of this host, when known
    omp_num_threads: int | None
    local_device: int | None  # None: no GPU visible, run on CPU
    owned_by_torchrun: bool
    origins: Mapping[str, str]
    notes: tuple[str, ...]

    def __init__(self, *, source: str, rank: int, local_rank: int, world_size: int, local_world_size: int,
                 node_rank: int, num_nodes: int, master_addr: str, master_port: int, rank0_host: str | None = None,
                 this_host: str | None = None, omp_num_threads: int | None = None, local_device: int | None = None,
                 owned_by_torchrun: bool = False, origins: Mapping[str, str] | None = None,
                 notes: tuple[str, ...] = ()) -> None:
        values = locals()
        for name in _FIELDS:
            object.__setattr__(self, name, values[name])
        object.__setattr__(self, "origins", dict(origins or {}))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"DistEnv is immutable (tried to set {name})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DistEnv) and all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, f) for f in _FIELDS if f != "origins"))

    def __repr__(self) -> str:
        return "DistEnv(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in _FIELDS) + ")"

    def replace(self, **changes: object) -> DistEnv:
        values = {f: getattr(self, f) for f in _FIELDS}
        values.update(changes)
        return DistEnv(**values)

    def exports(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables to set before exec. Empty when torchrun owns the process (its values stand)."""
        if self.owned_by_torchrun:
            return {}
        out = {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.num_nodes),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "default",
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.omp_num_threads is not None and "OMP_NUM_THREADS" not in environ:
            out["OMP_NUM_THREADS"] = str(self.omp_num_threads)
        if self.local_device is not None:
            out["SLURMLAUNCH_LOCAL_DEVICE"] = str(self.local_device)
        return out

    def summary(self) -> str:
        """One line for --print-env: what this rank will see."""
        dev = "cpu" if self.local_device is None else f"gpu:{self.local_device}"
        return (
            f"slurmlaunch[{self.source}] rank {self.rank}/{self.world_size} local {self.local_rank}/"
            f"{self.local_world_size} node {self.node_rank}/{self.num_nodes} host {self.this_host or '?'} "
            f"master {self.master_addr}:{self.master_port} device {dev}"
        )
