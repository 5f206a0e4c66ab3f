"""What every reader of the environment shares (detect.py, detect_mpi.py): the variable mapping, the
:class:`Context`, typed access to variables, the derived MASTER_PORT, the rank's GPU, the user's MASTER_*.

Pure: values in, values out; errors are EnvironmentMappingError (or PreflightError for the GPU rule).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .errors import EnvironmentMappingError, PreflightError
from .limits import MAX_JOB_ID, bounded_int, parse_count

Env = Mapping[str, str]

# MASTER_PORT = PORT_BASE + (job id + 1009 * step id) mod PORT_SPAN: below Linux's ephemeral range
# (32768-60999, where the kernel hands out client ports that could take ours) and above the well-known ones.
PORT_BASE = 15000
PORT_SPAN = 17000
# Ports PBS's daemons hold at every PBS site, inside that range: pbs_server 15001, pbs_mom 15002-15003 (on
# every compute node, where rank 0 listens), pbs_sched 15004, 15005-15006, the datastore 15007, pbs_comm
# 17001. Seen on a real OpenPBS: job 2's derived 15002 was pbs_mom's, and rank 0 could not listen.
DAEMON_PORTS = (*range(15001, 15008), 17001)


class Context:
    """What a reader may know beyond the variables; filled in by launch.py, faked freely in tests."""

    __slots__ = ("hostname", "read_file", "gpu_device_count")

    def __init__(self, hostname: str = "localhost", read_file: Callable[[str], str] = lambda path: "",
                 gpu_device_count: Callable[[], int] = lambda: 0) -> None:
        self.hostname = hostname
        self.read_file = read_file
        self.gpu_device_count = gpu_device_count


def first_set(env: Env, *names: str) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name)
        if value is not None and value != "":
            return name, value
    return None


def require(env: Env, *names: str) -> tuple[str, str]:
    found = first_set(env, *names)
    if found is None:
        raise EnvironmentMappingError(f"{' or '.join(names)} is not set (needed to place this task)")
    return found


def int_var(name: str, value: str, minimum: int = 0, maximum: int = MAX_JOB_ID) -> int:
    """A variable's integer. Slurm's ids and counts are 32-bit unsigned, so that is the default bound; a
    longer value is refused before int() sees it (past 4300 digits int() raises)."""
    return parse_count(name, value, minimum, maximum, sep="=", error=EnvironmentMappingError)


def optional_int(name: str, env: Env, maximum: int = MAX_JOB_ID) -> int | None:
    """A variable that may be unset or empty (None), else an integer like :func:`int_var`."""
    value = env.get(name, "")
    return None if value == "" else int_var(name, value, 0, maximum)


def cpus_per_task(env: Env) -> int | None:
    """SLURM_CPUS_PER_TASK: None when unset or empty (Slurm sets it only with --cpus-per-task); a value that
    is not a count 0..65535 is an error, not silently no OMP_NUM_THREADS (which would leave every rank's
    thread pool at all of the node's cores). One reading for the launcher and torchrun mode alike."""
    return optional_int("SLURM_CPUS_PER_TASK", env, 65535)


def derive_port(job_id: int, step_id: int = 0) -> int:
    """The MASTER_PORT every task of a step computes alike, without talking to the others: one of the span's
    ports that is not in DAEMON_PORTS (a bijection from the key mod the free count onto them, in order)."""
    port = PORT_BASE + (job_id + 1009 * step_id) % (PORT_SPAN - len(DAEMON_PORTS))
    for taken in DAEMON_PORTS:  # ascending: each one at or below the port moves it one further
        if port >= taken:
            port += 1
    return port


def local_device(env: Env, local_rank: int, local_world_size: int, ctx: Context, host: str) -> int | None:
    """Index of this rank's GPU among those it can see, or None to run on the CPU.

    Reads SLURMLAUNCH_DEVICE ("cpu" forces the CPU), CUDA_VISIBLE_DEVICES (kept as Slurm set it: it is
    never rewritten), SLURM_GPUS_ON_NODE, and, when CUDA_VISIBLE_DEVICES is unset, the count of
    /dev/nvidiaN devices, else of Intel's Level Zero devices (ZE_AFFINITY_MASK, gpus.intel_gpu_ids).
    The rule: when a rank sees at least as many GPUs as there are ranks on its node, it uses GPU
    LOCAL_RANK (Slurm's --gpus-per-node / --gres layout, which slurmlaunch generates; with
    SLURMLAUNCH_GPU_ORDER=reversed, GPU visible-1-LOCAL_RANK, ALCF's Polaris order); when Slurm (or an
    Intel per-rank ZE_AFFINITY_MASK) bound a subset to each task (--gpus-per-task, --gpu-bind), it uses
    its first, index 0.
    """
    if env.get("SLURMLAUNCH_DEVICE", "").lower() == "cpu":
        return None
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        visible = ctx.gpu_device_count()
        described = f"{visible} GPU device(s) in /dev"
    else:
        ids = [] if cvd.strip() in ("", "NoDevFiles") else cvd.split(",")
        visible = len(ids)
        described = f"CUDA_VISIBLE_DEVICES={cvd!r}"
    if visible == 0:
        return None
    if visible >= local_world_size:
        order = env.get("SLURMLAUNCH_GPU_ORDER", "")
        if order not in ("", "in-order", "reversed"):
            raise PreflightError(f"SLURMLAUNCH_GPU_ORDER={order!r} is not valid (expected in-order or reversed)")
        # reversed: rank 0 on the last GPU, as ALCF binds Polaris ranks (its first cores sit nearest GPU 3)
        return visible - 1 - local_rank if order == "reversed" else local_rank
    node_gpus = bounded_int(env.get("SLURM_GPUS_ON_NODE", ""), MAX_JOB_ID)
    if cvd is not None and node_gpus is not None and node_gpus >= local_world_size:
        return 0
    if cvd is None and env.get("ZE_AFFINITY_MASK", "").strip():
        return 0  # Intel: a per-rank mask (ALCF's gpu_tile_compact.sh, mpiexec --gpu-bind) bound it to its own
    raise PreflightError(
        f"{local_world_size} ranks on {host} but only {visible} GPU(s) visible ({described}): "
        f"request at least {local_world_size} GPUs per node, start fewer ranks per node, "
        f"or set SLURMLAUNCH_DEVICE=cpu to run on the CPU"
    )


def master_from(env: Env, default_addr: str, addr_origin: str, default_port: int, port_origin: str
            ) -> tuple[str, int, dict[str, str]]:
    """A user-set MASTER_ADDR / MASTER_PORT wins over the derived ones."""
    origins = {}
    addr = env.get("MASTER_ADDR") or default_addr
    origins["MASTER_ADDR"] = "MASTER_ADDR (set by the user)" if env.get("MASTER_ADDR") else addr_origin
    if env.get("MASTER_PORT"):
        port = int_var("MASTER_PORT", env["MASTER_PORT"], 1)
        if port > 65535:
            raise EnvironmentMappingError(f"MASTER_PORT={port} is not valid (expected 1-65535)")
        origins["MASTER_PORT"] = "MASTER_PORT (set by the user)"
    else:
        port, origins["MASTER_PORT"] = default_port, port_origin
    return addr, port, origins
