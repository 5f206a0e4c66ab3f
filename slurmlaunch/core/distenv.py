"""The torch distributed environment of one rank, as a frozen value, and what it exports.

Pure: no os.environ, no I/O. The exported names are torchrun's, so scripts written for torchrun run
unchanged (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, GROUP_WORLD_SIZE,
ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT), plus OMP_NUM_THREADS unless the user set
it (the CPUs per task, else 1 with several ranks per node: DistEnv.omp_threads), and
SLURMLAUNCH_LOCAL_DEVICE (the index, among the GPUs this rank can see, of the one it should use).
"""

from __future__ import annotations

import _socket
from collections.abc import Mapping

from .errors import EnvironmentMappingError

# A variable is shown as **** when its name contains one of these, in any case. Substrings on purpose:
# secrets hide in names like APIKEY, GITHUBTOKEN, SLURM_AUTH_CRED, MUNGE_CRED, PGPASSFILE, SESSION_COOKIE; the
# price is an occasional harmless name masked too (a certificate path), which costs a debugging line, not a
# credential. "PWD" is not among them: it is the shell's working directory.
SECRET_WORDS = ("TOKEN", "KEY", "PASS", "SECRET", "CRED", "AUTH", "COOKIE", "CERT", "PRIVATE", "SIGNATURE")
MASKED = "****"
# No `re` here: this module is on the launcher's path, which runs once per rank (see launch.py).
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_AUTHORITY_ENDS = "/?#"


def secret_name(name: str) -> bool:
    """Whether the variable's name looks like it holds a credential (see SECRET_WORDS)."""
    upper = name.upper()
    return any(w in upper for w in SECRET_WORDS)


def _url_spans(value: str) -> list[tuple[int, int, int]]:
    """(scheme start, authority start, authority end) of every scheme://authority in ``value``."""
    spans = []
    at = value.find("://")
    while at > 0:
        start = at
        while start > 0 and value[start - 1] in _SCHEME_CHARS:
            start -= 1
        end = at + 3
        while end < len(value) and value[end] not in _AUTHORITY_ENDS and not value[end].isspace():
            end += 1
        if start < at and value[start].isalpha():
            spans.append((start, at + 3, end))
        at = value.find("://", end)
    return spans


def mask(name: str, value: str) -> str:
    """The value to show in a diagnostic: '****' when the name looks secret; otherwise the value with the
    userinfo of every URL in it masked (``https://user:pw@host`` -> ``https://****@host``; a bare token
    in the user's place is masked too)."""
    if secret_name(name):
        return MASKED
    out, done = [], 0
    for _, authority, end in _url_spans(value):
        # up to the authority's last "@": a raw "@" in a password is common although RFC 3986 wants %40
        userinfo_end = value.rfind("@", authority, end)
        if userinfo_end >= 0:
            out += [value[done:authority], MASKED]
            done = userinfo_end
    return "".join(out) + value[done:] if out else value


def _is_host_name(value: str) -> bool:
    # Dot-separated labels of letters, digits, '-' and '_' (Slurm node names and /etc/hosts accept '_',
    # RFC 1123 does not), none empty or starting with '-'; 253 characters at most, a final dot allowed.
    labels = (value[:-1] if value.endswith(".") else value).split(".")
    return 0 < len(value) <= 253 and all(
        0 < len(label) <= 63 and label[0] != "-" and all(c in _HOST_CHARS for c in label) for label in labels)


def _is_ipv6(value: str) -> bool:
    address, _, zone = value.partition("%")
    if "%" in value and not (zone and all(c in _HOST_CHARS or c == "." for c in zone)):
        return False
    try:  # the C library's parser (the C module launch.py imports anyway, not `socket` or `ipaddress`)
        _socket.inet_pton(_socket.AF_INET6, address)
    except (OSError, ValueError):
        return False
    return True


def check_master_addr(value: str, label: str = "MASTER_ADDR") -> None:
    """MASTER_ADDR must be what torch hands to getaddrinfo: a host name or an IP address. Anything else
    (a URL, host:port, a bracketed IPv6 address, spaces) is refused here with one line that never shows a
    URL's credentials, instead of failing later in the rendezvous with the value in a traceback.
    ``label`` names where the value came from: a variable (NAME=value) or an option (--flag value)."""
    if _is_host_name(value) or _is_ipv6(value):
        return
    shown = mask("MASTER_ADDR", value)
    spans = _url_spans(value)
    if spans and spans[0][0] == 0:
        _, authority, end = spans[0]
        host = value[authority:end][value[authority:end].rfind("@") + 1:]
        if host.startswith("["):
            host = host[1:host.find("]")] if "]" in host else host[1:]
        else:
            host = host.partition(":")[0]
        hint = f"it is a URL; expected a host name or an IP address only ({host!r}), the port in MASTER_PORT"
    elif value.startswith("[") or (":" in value and value.rpartition(":")[2].isdigit()):
        hint = "expected a host name or an IP address only: no brackets, the port goes in MASTER_PORT"
    else:
        hint = "expected a host name (letters, digits, '-', '_', dots) or an IPv4/IPv6 address"
    given = f"{label} {shown!r}" if label.startswith("-") else f"{label}={shown!r}"
    raise EnvironmentMappingError(f"{given} is not valid: {hint}")


def omp_threads(environ: Mapping[str, str], cpus: int | None, ranks_on_node: int, cpus_shared_by: int = 1
                ) -> int | None:
    """OMP_NUM_THREADS to export (docs: the launcher, OMP_NUM_THREADS), for the launcher and torchrun mode alike: None
    when the user set it (never overridden); else the CPUs per task (SLURM_CPUS_PER_TASK) shared among
    ``cpus_shared_by`` ranks (torchrun mode: one task per node holds all of its workers' CPUs), at least 1;
    else 1 when several ranks share the node, as torchrun does (each rank's thread pool would otherwise take
    every core of the node); else None, the runtime's own default."""
    if "OMP_NUM_THREADS" in environ:
        return None
    if cpus:
        return max(1, cpus // cpus_shared_by)
    return 1 if ranks_on_node > 1 else None


def omp_note(environ: Mapping[str, str], cpus: int | None, ranks_on_node: int, by_run: bool = False) -> str | None:
    """The line said once per job (by rank 0, or torchrun mode's first node) when OMP_NUM_THREADS=1 came from
    the several-ranks-per-node rule of :func:`omp_threads`; None otherwise. ``by_run``: the ranks of
    `slurmlaunch run` (no --cpus-per-task to give there: the variable is the way)."""
    if cpus or omp_threads(environ, cpus, ranks_on_node) != 1:
        return None
    more = "OMP_NUM_THREADS=N slurmlaunch run ..." if by_run else "submit --cpus-per-task N"
    return f"OMP_NUM_THREADS=1 per rank ({ranks_on_node} ranks per node, as torchrun does); for more: {more}"


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
        threads = self.omp_threads(environ)
        if threads is not None:
            out["OMP_NUM_THREADS"] = str(threads)
        if self.local_device is not None:
            out["SLURMLAUNCH_LOCAL_DEVICE"] = str(self.local_device)
        return out

    def omp_threads(self, environ: Mapping[str, str]) -> int | None:
        """OMP_NUM_THREADS to export: :func:`omp_threads` for this rank's CPUs and node."""
        return omp_threads(environ, self.omp_num_threads, self.local_world_size)

    def omp_note(self, environ: Mapping[str, str]) -> str | None:
        """:func:`omp_note` on rank 0 (said once per job, not per rank), None on the others."""
        if self.owned_by_torchrun or self.rank != 0:
            return None
        return omp_note(environ, self.omp_num_threads, self.local_world_size, by_run=self.source == "run")

    def summary(self) -> str:
        """One line for --print-env: what this rank will see."""
        dev = "cpu" if self.local_device is None else f"gpu:{self.local_device}"
        return (
            f"slurmlaunch[{self.source}] rank {self.rank}/{self.world_size} local {self.local_rank}/"
            f"{self.local_world_size} node {self.node_rank}/{self.num_nodes} host {self.this_host or '?'} "
            f"master {self.master_addr}:{self.master_port} device {dev}"
        )
