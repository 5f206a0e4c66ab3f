"""The job description shared by the CLI and the Python API, and its validation.

Validation happens here, before anything is rendered or submitted; every failure is a SpecError whose
message names the bad value and what would be valid. Pure: values in, values out. What only the submitting
process knows (its interpreter, its working directory) and what needs its files (SCRIPT exists, --python
exists, --output-dir can be a directory) are app/resolve.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, get_args

from .errors import SpecError
from .limits import (
    MAX_ARRAY_ELEMENTS,
    MAX_LOCAL_RANKS,
    MAX_NODES,
    MAX_PER_NODE,
    MAX_RESTARTS,
    MAX_SECONDS,
    MAX_TIME_MINUTES,
    MAX_WORLD,
    check_count,
    shown,
)

# The option values' parsers live in parse.py; they are named here too, where the CLI, the API and the
# tests have always taken them from.
from .parse import DEFAULT_WARNING_SECONDS as DEFAULT_WARNING_SECONDS
from .parse import ENV_KEY as ENV_KEY
from .parse import UNLIMITED as UNLIMITED
from .parse import WARNING_SIGNALS as WARNING_SIGNALS
from .parse import array_ranges as array_ranges
from .parse import not_a_time, parse_mem, parse_signal
from .parse import parse_array as parse_array
from .parse import parse_env as parse_env
from .parse import parse_nodes as parse_nodes
from .parse import parse_sweep as parse_sweep
from .parse import time_minutes as time_minutes
from .parse import time_seconds as time_seconds

# The closed choices, as types (mypy checks the code's own values) and as tuples (validate checks the user's:
# a JobSpec built from options or the API holds whatever string it was given until then).
Mode = Literal["srun", "torchrun"]  # srun: one Slurm task per rank; torchrun: one task per node running torchrun
GpuFlag = Literal["gpus-per-node", "gres"]  # gres: --gres=gpu:N for sites that refuse --gpus-per-node
MpiFlavour = Literal["openmpi", "mpich", "pals"]  # how a PBS job starts its ranks
# Under Slurm: srun --mpi=TYPE, the PMI an MPI library talks to (Slurm 22.05-24.x's mpi plugins; pmix_vN are the
# versioned names of the pmix one, and which exist depends on the PMIx the site built Slurm with).
SrunMpi = Literal["pmix", "pmix_v2", "pmix_v3", "pmix_v4", "pmix_v5", "pmi2", "cray_shasta", "none"]
PbsFlavour = Literal["pro", "torque"]  # PBS Pro / OpenPBS (-l select=...) or Torque (-l nodes=...:ppn=...)
MODES: tuple[Mode, ...] = get_args(Mode)
GPU_FLAGS: tuple[GpuFlag, ...] = get_args(GpuFlag)
MPI_FLAVOURS: tuple[MpiFlavour, ...] = get_args(MpiFlavour)
SRUN_MPI_TYPES: tuple[SrunMpi, ...] = get_args(SrunMpi)
PBS_FLAVOURS: tuple[PbsFlavour, ...] = get_args(PbsFlavour)
REQUEUED_BY = ("slurmlaunch", "script")


@dataclass(frozen=True)
class JobSpec:
    """One distributed job: where, how big, and what each rank runs."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    legacy_local_rank_arg: bool = False  # pass --local-rank=N after SCRIPT (torch.distributed.launch style)
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int | None = None  # default: one per GPU, or 1 without GPUs
    cpus_per_task: int | None = None
    cpus_per_gpu: int | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    job_name: str | None = None
    output_dir: str = "slurmlaunch-logs"
    env: tuple[tuple[str, str], ...] = ()
    setup: tuple[str, ...] = ()
    sbatch_args: tuple[str, ...] = ()
    master_port: int | None = None
    # Plain defaults: the submitting process's interpreter and directory are filled in by app.resolve.
    python: str = "python3"
    workdir: str = "."
    gpu_flag: GpuFlag = "gpus-per-node"
    signal: str | None = "USR2@90"  # the warning before the time limit (submit gives Lightning scripts USR1)
    requeue: bool = False
    # Who requeues on the warning: "slurmlaunch" (the batch shell, or the local scheduler), or "script" (its
    # framework does it itself: Lightning's rank 0 runs scontrol requeue; the batch shell must not as well).
    requeued_by: str = "slurmlaunch"
    max_requeues: int = 3
    rdzv_timeout: float | None = None  # SLURMLAUNCH_RDZV_TIMEOUT for the ranks
    pbs_flavour: PbsFlavour = "pro"
    # PBS: the MPI whose mpiexec starts the ranks (None: openmpi); Slurm: srun --mpi (None: the cluster's MpiDefault)
    mpi: MpiFlavour | SrunMpi | None = None
    # PBS site resources (checked in schedulers/pbs.py): job-wide -l KEY[=VALUE], per-chunk KEY=VALUE in
    # select, the project (-P), how resources are requested, and the queue chosen by node count.
    pbs_resources: tuple[str, ...] = ()
    pbs_chunk: tuple[str, ...] = ()
    project: str | None = None
    pbs_request: str = "select"  # select: select=N:ncpus:mpiprocs:ngpus; nodes: select=N only; totals: -l ncpus=
    pbs_queues: str | None = None  # QUEUE:MIN-MAX,... (first match wins) when --partition is not given
    mpiexec_args: tuple[str, ...] = ()  # extra flags for the mpiexec that starts the ranks under PBS
    array: str | None = None  # Slurm --array indices: one distributed job per index
    max_parallel: int | None = None  # at most this many array elements at once (--array=...%N)
    sweep: tuple[tuple[str, tuple[str, ...]], ...] = ()  # a grid: one array element per point
    mode: Mode = "srun"
    nproc_per_node: int | None = None  # torchrun mode without GPUs: ranks per node
    max_restarts: int = 0  # torchrun mode: torchrun --max-restarts
    min_nodes: int | None = None  # torchrun mode: an elastic job of min_nodes..nodes nodes
    container_image: str | None = None  # pyxis/enroot: srun --container-image
    apptainer: str | None = None  # an Apptainer/Singularity image: apptainer exec in front of the launcher
    container_mounts: tuple[str, ...] = ()  # SRC:DST[:FLAGS], besides the working directory and slurmlaunch
    container_workdir: str | None = None  # default: the working directory, mounted at the same path

    @property
    def container(self) -> str | None:
        """"pyxis", "apptainer" or None."""
        return "pyxis" if self.container_image else "apptainer" if self.apptainer else None

    @property
    def slurm_tasks_per_node(self) -> int:
        """Slurm tasks per node: one per rank, or one torchrun per node in torchrun mode."""
        return 1 if self.mode == "torchrun" else self.ntasks_per_node

    @property
    def log_unit(self) -> str:
        """What one output file holds: a rank's output, or in torchrun mode a node's (all its ranks)."""
        return "node" if self.mode == "torchrun" else "rank"

    @property
    def ranks_per_log(self) -> int:
        """Ranks whose output one log file holds: 1, or a node's in torchrun mode."""
        return self.ntasks_per_node if self.mode == "torchrun" else 1

    def node_range(self, sep: str = ":") -> str:
        """--nodes as written: N, or an elastic MIN:MAX (torchrun's --nnodes); sbatch's MIN-MAX with sep="-"."""
        return f"{self.min_nodes}{sep}{self.nodes}" if self.min_nodes is not None else str(self.nodes)

    @property
    def nodes_text(self) -> str:
        return self.node_range()

    @property
    def is_array(self) -> bool:
        return self.array is not None or bool(self.sweep)

    @property
    def array_indices(self) -> list[int]:
        """The indices of the array's elements; [] when the job is not an array."""
        if self.sweep:
            return list(range(len(self.sweep_points)))
        return parse_array(self.array) if self.array is not None else []

    @property
    def array_directive(self) -> str | None:
        """Slurm's --array value, or None."""
        if not self.is_array:
            return None
        indices = f"0-{len(self.sweep_points) - 1}" if self.sweep else str(self.array)
        return indices + (f"%{self.max_parallel}" if self.max_parallel else "")

    @property
    def sweep_points(self) -> list[list[str]]:
        """The grid's points as the arguments each adds to SCRIPT's (--KEY=VALUE), first key slowest."""
        points: list[list[str]] = [[]]
        for key, values in self.sweep:
            points = [[*p, f"--{key}={v}"] for p in points for v in values]
        return points if self.sweep else []

    @property
    def asked_warning(self) -> tuple[str, int] | None:
        """The warning as --signal asks for it: (signal name without SIG, seconds before the time limit), or
        None for no warning signal. What the job gets is ``warning``."""
        return parse_signal(self.signal)

    @property
    def warning(self) -> tuple[str, int] | None:
        """The warning every scheduler gives (Slurm's --signal, PBS and the local scheduler, the API): as asked,
        except where it would come too early. Slurm sends a warning longer than the time limit at once, which
        stops every rank before its script could install a handler (the default action of USR2 is to end the
        process). So a warning not shorter than --time, or the default 90 s with a limit under 180 s, comes
        half-way through the run instead; None when that leaves no whole second (--time of 1 s). A warning
        time chosen below the limit is kept: tests of preemption ask for an early one on purpose."""
        asked = self.asked_warning
        limit = self.time_limit_seconds
        if asked is None or limit is None:
            return asked
        name, seconds = asked
        half = limit // 2
        if seconds >= limit or (seconds == DEFAULT_WARNING_SECONDS and seconds > half):
            return (name, half) if half > 0 else None
        return asked

    @property
    def warning_note(self) -> str | None:
        """One line saying how the warning was moved (``warning``), or None when it is as asked."""
        asked, given = self.asked_warning, self.warning
        if asked is None or given == asked:
            return None
        now = f"it comes {given[1]}s before instead, half-way" if given else "no warning signal is sent"
        return (f"--time {self.time} is too short for the warning SIG{asked[0]} {asked[1]}s before the limit "
                f"(Slurm would send it at or near the start, before the script could handle it): {now} "
                f"(--signal NAME@SECONDS chooses, --signal none for none)")

    @property
    def time_limit_seconds(self) -> int | None:
        """--time in seconds, None when unlimited or not given."""
        return None if self.time is None else time_seconds(self.time)

    @property
    def ntasks_per_node(self) -> int:
        """Ranks per node."""
        if self.mode == "torchrun" and self.nproc_per_node is not None:
            return self.nproc_per_node
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ntasks_per_node

    @property
    def name(self) -> str:
        if self.job_name is not None:
            return self.job_name
        base = os.path.basename(self.script) if not self.module else self.script
        return base or "slurmlaunch"

    @property
    def per_task_cpus(self) -> int | None:
        if self.cpus_per_task is not None:
            return self.cpus_per_task
        return self.cpus_per_gpu  # one task per GPU: CPUs per GPU are CPUs per task

    @property
    def slurm_cpus_per_task(self) -> int | None:
        """CPUs per Slurm task: per rank, or in torchrun mode for all the ranks of a node."""
        cpus = self.per_task_cpus
        return cpus * self.ntasks_per_node if cpus is not None and self.mode == "torchrun" else cpus

    @property
    def log_dir(self) -> str:
        return os.path.join(self.workdir, self.output_dir)


def _positive(name: str, value: int | None, minimum: int = 1, maximum: int = MAX_PER_NODE) -> None:
    check_count(name, value, minimum, maximum)


def _validate_mode(spec: JobSpec) -> None:
    if spec.mode not in MODES:
        raise SpecError(f"--mode {spec.mode!r} is not valid (expected srun or torchrun)")
    _positive("--max-restarts", spec.max_restarts, 0, MAX_RESTARTS)
    if spec.mode != "torchrun":
        for text, given in ((f"--max-restarts {spec.max_restarts}", spec.max_restarts != 0),
                            (f"--nodes {spec.nodes_text}", spec.min_nodes is not None),
                            (f"--nproc-per-node {spec.nproc_per_node}", spec.nproc_per_node is not None)):
            if given:
                raise SpecError(f"{text} needs --mode torchrun (torchrun's restarts, elastic ranges and "
                                f"ranks per node); in srun mode use --requeue and --tasks-per-node")
        return
    if spec.tasks_per_node not in (None, 1):
        raise SpecError(f"--tasks-per-node {spec.tasks_per_node} is not valid with --mode torchrun (one task per "
                        f"node runs torchrun; its ranks per node are --gpus-per-node, or --nproc-per-node)")
    if spec.gpus_per_node and spec.nproc_per_node not in (None, spec.gpus_per_node):
        raise SpecError(f"--nproc-per-node {spec.nproc_per_node} is not valid with --gpus-per-node "
                        f"{spec.gpus_per_node} (one rank per GPU)")
    if spec.min_nodes is not None and not 1 <= spec.min_nodes <= spec.nodes:
        raise SpecError(f"--nodes {spec.nodes_text} is not valid (expected MIN:MAX with 1 <= MIN <= MAX)")


def _validate_container(spec: JobSpec) -> None:
    if spec.container_image is not None and spec.apptainer is not None:
        raise SpecError("--container-image (pyxis) and --apptainer cannot be used together (give one of them)")
    for name, value in (("--container-image", spec.container_image), ("--apptainer", spec.apptainer)):
        if value is not None and (not value or any(c.isspace() or c == "," for c in value)):
            raise SpecError(f"{name} {value!r} is not valid (expected an image name or path, without spaces "
                            f"or commas)")
    if spec.container is None and (spec.container_mounts or spec.container_workdir):
        raise SpecError("--container-mount and --container-workdir need --container-image or --apptainer")
    for mount in spec.container_mounts:
        parts = mount.split(":")
        if not 2 <= len(parts) <= 3 or not all(p.startswith("/") for p in parts[:2]) or "," in mount \
                or any(c.isspace() for c in mount):
            raise SpecError(f"--container-mount {mount!r} is not valid (expected /host/path:/container/path"
                            f"[:FLAGS], e.g. /scratch:/scratch:ro; no commas or spaces)")
    if spec.container_workdir is not None and (not spec.container_workdir.startswith("/") or
                                               any(c.isspace() or not c.isprintable() for c in spec.container_workdir)):
        raise SpecError(f"--container-workdir {shown(spec.container_workdir)} is not valid (expected an absolute "
                        f"path inside the container, without spaces or control characters)")


def validate_local(spec: JobSpec) -> None:
    """The local scheduler's own bound (docs: Limits): every rank of every element runs on this machine."""
    elements = len(spec.array_indices) if spec.is_array else 1
    if spec.world_size * elements > MAX_LOCAL_RANKS:
        what = f"{spec.world_size} ranks" + (f" x {elements} array elements" if spec.is_array else "")
        raise SpecError(f"{what} is more than the local scheduler runs on one machine (at most "
                        f"{MAX_LOCAL_RANKS} ranks in all; submit to Slurm, or ask for fewer)")


def _validate_counts(spec: JobSpec) -> None:
    """The counts first, before anything that is sized by them (docs: Limits)."""
    _positive("--nodes", spec.nodes, 1, MAX_NODES)
    _positive("--gpus-per-node", spec.gpus_per_node, 0)
    _positive("--tasks-per-node", spec.tasks_per_node)
    _positive("--cpus-per-task", spec.cpus_per_task)
    _positive("--cpus-per-gpu", spec.cpus_per_gpu)
    _positive("--nproc-per-node", spec.nproc_per_node)
    if spec.min_nodes is not None:
        _positive("--nodes MIN", spec.min_nodes, 1, MAX_NODES)
    if spec.world_size > MAX_WORLD:
        raise SpecError(f"{spec.nodes} nodes x {spec.ntasks_per_node} ranks per node is {spec.world_size} ranks "
                        f"(expected at most {MAX_WORLD}: torch.distributed ranks are 32-bit integers)")
    if spec.cpus_per_task is not None and spec.cpus_per_task * spec.ntasks_per_node > MAX_PER_NODE:
        raise SpecError(f"--cpus-per-task {spec.cpus_per_task} x {spec.ntasks_per_node} ranks per node is more "
                        f"than the {MAX_PER_NODE} CPUs a node may have (docs: Limits)")
    if spec.cpus_per_task is not None and spec.cpus_per_gpu is not None:
        raise SpecError("--cpus-per-task and --cpus-per-gpu cannot be used together (give one of them)")
    if spec.cpus_per_gpu is not None and spec.gpus_per_node == 0:
        raise SpecError("--cpus-per-gpu needs --gpus-per-node > 0 (or use --cpus-per-task)")
    if spec.gpus_per_node > 0 and spec.tasks_per_node not in (None, spec.gpus_per_node):
        raise SpecError(
            f"--tasks-per-node {spec.tasks_per_node} is not valid with --gpus-per-node {spec.gpus_per_node} "
            f"(one rank per GPU: tasks per node must equal GPUs per node)"
        )


def _validate_time_and_mem(spec: JobSpec) -> None:
    if spec.time is not None and spec.time.upper() not in UNLIMITED:
        minutes = time_minutes(spec.time)
        if minutes is None:
            raise not_a_time(spec.time)
        if minutes > MAX_TIME_MINUTES:
            raise SpecError(f"--time {shown(spec.time)} is longer than Slurm can keep (at most {MAX_TIME_MINUTES} "
                            f"minutes; UNLIMITED for no limit)")
    if spec.mem is not None:
        parse_mem(spec.mem)


def _validate_warning(spec: JobSpec) -> None:
    """The warning signal and what is done on it (requeue)."""
    parse_signal(spec.signal)
    _positive("--max-requeues", spec.max_requeues, 0, MAX_RESTARTS)
    if spec.requeued_by not in REQUEUED_BY:
        raise SpecError(f"requeued_by {shown(spec.requeued_by)} is not valid (expected one of "
                        f"{', '.join(REQUEUED_BY)})")
    if spec.requeue and spec.warning is None:
        raise SpecError("--requeue needs a warning signal (--signal NAME@SECONDS), not --signal none")


def _validate_rendezvous_and_array(spec: JobSpec) -> None:
    if spec.rdzv_timeout is not None and not 0 <= spec.rdzv_timeout <= MAX_SECONDS:
        raise SpecError(f"--rdzv-timeout {spec.rdzv_timeout} is not valid (expected seconds 0..{MAX_SECONDS}; "
                        f"0: no bound)")
    if spec.master_port is not None and not 1 <= spec.master_port <= 65535:
        raise SpecError(f"--master-port {spec.master_port} is not valid (expected 1-65535)")
    if spec.array is not None:
        if spec.sweep:
            raise SpecError("--array and --sweep cannot be used together (a sweep makes its own array: one "
                            "element per point)")
        array_ranges(spec.array)
    _positive("--max-parallel", spec.max_parallel, 1, MAX_ARRAY_ELEMENTS)
    if spec.max_parallel is not None and not spec.is_array:
        raise SpecError("--max-parallel needs --array or --sweep")
    if spec.is_array and spec.master_port is not None:
        raise SpecError(f"--master-port {spec.master_port} cannot be used with --array/--sweep (array elements "
                        f"may share nodes; each derives its own port from its job id)")


def _validate_choices(spec: JobSpec) -> None:
    """The closed choices (their Literal types; a request built from options holds any string until here)."""
    if spec.mpi is not None and spec.mpi not in (*MPI_FLAVOURS, *SRUN_MPI_TYPES):
        raise SpecError(f"--mpi {spec.mpi!r} is not valid (expected one of {', '.join(MPI_FLAVOURS)} under PBS, "
                        f"{', '.join(SRUN_MPI_TYPES)} under Slurm)")
    if spec.pbs_flavour not in PBS_FLAVOURS:
        raise SpecError(f"--pbs-flavour {spec.pbs_flavour!r} is not valid (expected pro or torque)")
    if spec.gpu_flag not in GPU_FLAGS:
        raise SpecError(f"--gpu-flag {spec.gpu_flag!r} is not valid (expected gpus-per-node or gres)")


def _validate_names(spec: JobSpec) -> None:
    """The strings that reach the script: the logs' directory, sbatch's options, the site's names, SCRIPT.
    (The job name is data, byte for byte, on sbatch's command line: docs "Strings are data".)"""
    if not spec.output_dir:  # control characters: _validate_text
        raise SpecError(f"--output-dir {shown(spec.output_dir)} is not valid (expected a directory name)")
    for bad in ("%", "\\"):
        if bad in spec.output_dir:
            raise SpecError(
                f"--output-dir {spec.output_dir!r} contains {bad!r}, which Slurm reads as a file-name "
                f"pattern (choose a directory without '%' and '\\\\')"
            )
    for arg in spec.sbatch_args:
        if "\n" in arg or "\r" in arg or not arg.startswith("-"):
            raise SpecError(
                f"--sbatch-arg {arg!r} is not valid (expected one sbatch option on one line, e.g. --mail-type=END)"
            )
    for name, value in (("--partition", spec.partition), ("--account", spec.account), ("--qos", spec.qos),
                        ("--constraint", spec.constraint)):
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise SpecError(f"{name} {value!r} is not valid (expected a non-empty name without spaces)")
    if not spec.script:  # an empty path would name the working directory itself
        raise SpecError("no SCRIPT given")


# The values that are names, sizes, paths or flags, not data (docs: Strings are data): their options, as
# the CLI spells them. A control character in one (C0, DEL, the ESC of a terminal sequence) would end up in an
# #SBATCH/#PBS line, the srun line or a terminal, so it is refused whatever the option.
_NAME_OPTIONS = {
    "mem": "--mem", "time": "--time", "partition": "--partition", "account": "--account", "qos": "--qos",
    "constraint": "--constraint", "output_dir": "--output-dir", "python": "--python", "signal": "--signal",
    "requeued_by": "requeued_by", "gpu_flag": "--gpu-flag", "mode": "--mode", "mpi": "--mpi",
    "pbs_flavour": "--pbs-flavour", "pbs_request": "--pbs-request", "pbs_queues": "--pbs-queues",
    "project": "--project", "array": "--array", "container_image": "--container-image",
    "apptainer": "--apptainer", "container_workdir": "--container-workdir", "sbatch_args": "--sbatch-arg",
    "pbs_resources": "--pbs-resource", "pbs_chunk": "--pbs-chunk", "mpiexec_args": "--mpiexec-arg",
    "container_mounts": "--container-mount",
}


def control_character(value: str) -> str | None:
    """The first control character in ``value`` (C0, DEL, C1, and what else str.isprintable() refuses), or
    None."""
    return next((c for c in value if not c.isprintable()), None)


def _validate_text(spec: JobSpec) -> None:
    """No control character in a value that is not data (_NAME_OPTIONS, the sweep's keys)."""
    for field, flag in _NAME_OPTIONS.items():
        value = getattr(spec, field)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, str) and control_character(item) is not None:
                raise SpecError(f"{flag} {shown(item)} contains the control character "
                                f"{control_character(item)!r} (expected a value without control characters)")
    for key, _ in spec.sweep:
        if isinstance(key, str) and control_character(key) is not None:
            raise SpecError(f"--sweep key {shown(key)} contains the control character {control_character(key)!r} "
                            f"(expected a name without control characters)")


def validate(spec: JobSpec) -> JobSpec:
    """Raise SpecError for the first thing wrong with ``spec``; return it unchanged otherwise. Pure: what
    needs the submitting machine's files (SCRIPT, --python, --output-dir exist) is app.resolve's."""
    _validate_text(spec)
    _validate_counts(spec)
    _validate_time_and_mem(spec)
    _validate_warning(spec)
    _validate_rendezvous_and_array(spec)
    _validate_mode(spec)
    _validate_container(spec)
    _validate_choices(spec)
    _validate_names(spec)
    return spec
