"""The job description shared by the CLI and the Python API, and its validation.

A JobSpec is made of typed parts (PARTS), each read together by its consumers; every field, and so every job
option, is declared once, in its part: its type, its default, and in its metadata its choices, its flag when it
is not --FIELD-NAME, and whether it is a name rather than data. The CLI's options table (app/options.py) and
the API's keyword names (app/api/job_options.py) are read from these declarations.

Validation happens here, before anything is rendered or submitted; every failure is a SpecError whose
message names the bad value and what would be valid. Pure: values in, values out. What only the submitting
process knows (its interpreter, its working directory) and what needs its files (SCRIPT exists, --python
exists, --output-dir can be a directory) are app/resolve.py's.
"""

from __future__ import annotations

import os
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, Literal, get_args

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
# a JobSpec built from options or the API holds whatever string it was given until then). The field that holds
# one names its tuple in its metadata ("choices"): the CLI's choices are read from there.
Mode = Literal["srun", "torchrun"]  # srun: one Slurm task per rank; torchrun: one task per node running torchrun
GpuFlag = Literal["gpus-per-node", "gres"]  # gres: --gres=gpu:N for sites that refuse --gpus-per-node
MpiFlavour = Literal["openmpi", "mpich", "pals"]  # how a PBS job starts its ranks
# Under Slurm: srun --mpi=TYPE, the PMI an MPI library talks to (Slurm 22.05-24.x's mpi plugins; pmix_vN are the
# versioned names of the pmix one, and which exist depends on the PMIx the site built Slurm with).
SrunMpi = Literal["pmix", "pmix_v2", "pmix_v3", "pmix_v4", "pmix_v5", "pmi2", "cray_shasta", "none"]
PbsFlavour = Literal["pro", "torque"]  # PBS Pro / OpenPBS (-l select=...) or Torque (-l nodes=...:ppn=...)
# select: select=N:ncpus:mpiprocs:ngpus; nodes: select=N only (ALCF); totals: job-wide -l ncpus= (NCI Gadi)
PbsRequest = Literal["select", "nodes", "totals"]
MODES: tuple[Mode, ...] = get_args(Mode)
GPU_FLAGS: tuple[GpuFlag, ...] = get_args(GpuFlag)
MPI_FLAVOURS: tuple[MpiFlavour, ...] = get_args(MpiFlavour)
SRUN_MPI_TYPES: tuple[SrunMpi, ...] = get_args(SrunMpi)
PBS_FLAVOURS: tuple[PbsFlavour, ...] = get_args(PbsFlavour)
PBS_REQUESTS: tuple[PbsRequest, ...] = get_args(PbsRequest)
REQUEUED_BY = ("slurmlaunch", "script")
STAGE_MODES = ("on", "fallback")  # --stage-env (allocation/stage.py's MODES)


def _option(default: Any = None, *, choices: tuple[str, ...] | None = None, flag: str | None = None,
            name: bool = False) -> Any:
    """A field that is a job option: its default, and in its metadata what else is said of it once:
    ``choices`` (the closed values), ``flag`` (the option as the CLI spells it, when it is not --FIELD-NAME;
    "" for a field no option sets), ``name`` (a name, size, path or flag, not data: no control character,
    _validate_text)."""
    metadata: dict[str, Any] = {"name": name}
    if choices is not None:
        metadata["choices"] = choices
    if flag is not None:
        metadata["flag"] = flag
    return field(default=default, metadata=metadata)


# The request in parts, grouped by who reads them together: the launch line (Program, Launch, Environment,
# Containers), every scheduler's directives (Resources, Output), the batch step's plan (Preemption), arrays
# (Arrays) and one scheduler's own knobs (SiteExtras). Each field is declared once, here: its type, its default,
# its choices. app/options.py's table names the fields its options fill and reads the rest from here.

@dataclass(frozen=True)
class Program:
    """What each rank runs: SCRIPT (a file, a module with -m, an executable with --no-python), its arguments,
    the interpreter and the working directory (plain defaults here: the submitting process's are app.resolve's)."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = _option(False)
    no_python: bool = _option(False)
    legacy_local_rank_arg: bool = _option(False)  # pass --local-rank=N after SCRIPT (torch.distributed.launch style)
    python: str = _option("python3", name=True)
    workdir: str = "."


@dataclass(frozen=True)
class Resources:
    """What the allocation asks for: every scheduler's directives (#SBATCH, #PBS -l, the local emulation)."""

    nodes: int = _option(1)
    min_nodes: int | None = _option(None, flag="--nodes")  # torchrun mode: an elastic job of min_nodes..nodes
    gpus_per_node: int = _option(0)
    tasks_per_node: int | None = _option(None)  # default: one per GPU, or 1 without GPUs
    cpus_per_task: int | None = _option(None)
    cpus_per_gpu: int | None = _option(None)
    mem: str | None = _option(None, name=True)
    time: str | None = _option(None, name=True)
    partition: str | None = _option(None, name=True)
    account: str | None = _option(None, name=True)
    qos: str | None = _option(None, name=True)
    constraint: str | None = _option(None, name=True)
    exclusive: bool = _option(False)
    gpu_flag: GpuFlag = _option("gpus-per-node", choices=GPU_FLAGS, name=True)


@dataclass(frozen=True)
class Launch:
    """How the ranks are started: one task per rank (srun mode) or torchrun per node, and the MPI/PMI."""

    mode: Mode = _option("srun", choices=MODES, name=True)
    nproc_per_node: int | None = _option(None)  # torchrun mode without GPUs: ranks per node
    max_restarts: int = _option(0)  # torchrun mode: torchrun --max-restarts
    # PBS: the MPI whose mpiexec starts the ranks (None: openmpi); Slurm: srun --mpi (None: the cluster's MpiDefault)
    mpi: MpiFlavour | SrunMpi | None = _option(None, choices=(*MPI_FLAVOURS, *SRUN_MPI_TYPES), name=True)


@dataclass(frozen=True)
class Environment:
    """What the ranks' environment gets: the user's variables, the set-up lines run before them, and the
    rendezvous' own (MASTER_PORT, SLURMLAUNCH_RDZV_TIMEOUT)."""

    env: tuple[tuple[str, str], ...] = _option(())
    setup: tuple[str, ...] = _option(())
    master_port: int | None = _option(None)
    rdzv_timeout: float | None = _option(None)
    # Slurm, PBS: the ranks run from a node-local copy of their environment (allocation/stage.py); "fallback": from
    # the shared copy when it cannot be staged
    stage_env: str | None = _option(None, choices=STAGE_MODES, name=True)


@dataclass(frozen=True)
class Output:
    """The job's name and where its files go."""

    job_name: str | None = _option(None)
    output_dir: str = _option("slurmlaunch-logs", name=True)


@dataclass(frozen=True)
class Preemption:
    """The batch step's plan before the time limit: the warning signal and what is done on it."""

    signal: str | None = _option("USR2@90", name=True)  # submit gives Lightning scripts USR1
    requeue: bool = _option(False)
    # Who requeues on the warning: "slurmlaunch" (the batch shell, or the local scheduler), or "script" (its
    # framework does it itself: Lightning's rank 0 runs scontrol requeue; the batch shell must not as well).
    requeued_by: str = _option("slurmlaunch", choices=REQUEUED_BY, flag="", name=True)
    max_requeues: int = _option(3)


@dataclass(frozen=True)
class Containers:
    """The image every task runs in (pyxis/enroot or Apptainer) and its mounts."""

    container_image: str | None = _option(None, name=True)  # pyxis/enroot: srun --container-image
    apptainer: str | None = _option(None, name=True)  # an Apptainer/Singularity image: apptainer exec in front
    # SRC:DST[:FLAGS], besides the working directory and slurmlaunch
    container_mounts: tuple[str, ...] = _option((), flag="--container-mount", name=True)
    container_workdir: str | None = _option(None, name=True)  # default: the working directory, at the same path


@dataclass(frozen=True)
class Arrays:
    """One distributed job per index (Slurm's --array) or per point of a grid (--sweep)."""

    array: str | None = _option(None, name=True)  # Slurm --array indices
    max_parallel: int | None = _option(None)  # at most this many array elements at once (--array=...%N)
    sweep: tuple[tuple[str, tuple[str, ...]], ...] = _option(())  # a grid: one array element per point


@dataclass(frozen=True)
class SiteExtras:
    """A site's own knobs: extra batch directives, and PBS's site resources (checked in render/pbs_script.py):
    job-wide -l KEY[=VALUE], per-chunk KEY=VALUE in select, the project (-P), how resources are requested, the
    queue chosen by node count, and extra mpiexec flags."""

    sbatch_args: tuple[str, ...] = _option((), flag="--sbatch-arg", name=True)
    pbs_flavour: PbsFlavour = _option("pro", choices=PBS_FLAVOURS, name=True)
    pbs_resources: tuple[str, ...] = _option((), flag="--pbs-resource", name=True)
    pbs_chunk: tuple[str, ...] = _option((), name=True)
    project: str | None = _option(None, name=True)
    pbs_request: PbsRequest = _option("select", choices=PBS_REQUESTS, name=True)
    pbs_queues: str | None = _option(None, name=True)  # QUEUE:MIN-MAX,... (first match wins) without --partition
    mpiexec_args: tuple[str, ...] = _option((), flag="--mpiexec-arg", name=True)  # under PBS


# JobSpec's parts, by its attribute name, in its order.
PARTS: dict[str, type] = {"program": Program, "resources": Resources, "launch": Launch,
                          "environment": Environment, "output": Output, "preemption": Preemption,
                          "containers": Containers, "arrays": Arrays, "site": SiteExtras}
# Each field's part: the fields' names are one namespace (the API's keyword arguments, the CLI's dests).
PART_OF: dict[str, str] = {f.name: part for part, cls in PARTS.items() for f in fields(cls)}
# Every field's declaration, by name.
FIELDS: dict[str, Field[Any]] = {f.name: f for cls in PARTS.values() for f in fields(cls)}


def flag_of(name: str) -> str:
    """The option that sets field ``name`` as the CLI spells it (--FIELD-NAME, or the field's own flag), or the
    field's name for a field no option sets."""
    flag = FIELDS[name].metadata.get("flag")
    return name if flag == "" else flag if flag is not None else "--" + name.replace("_", "-")


def field_of(flag: str) -> str | None:
    """The field that option ``flag`` fills (the inverse of flag_of, --nodes filling nodes), or None."""
    if flag == "--nodes":
        return "nodes"
    return next((name for name in FIELDS if flag_of(name) == flag), None)


def _by_part(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    parts: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if name not in PART_OF:
            raise TypeError(f"JobSpec has no field {name!r}")
        parts.setdefault(PART_OF[name], {})[name] = value
    return parts


@dataclass(frozen=True)
class JobSpec:
    """One distributed job: where, how big, and what each rank runs, in parts (see PARTS). ``JobSpec.of``
    builds one from the fields by name (the API's keyword arguments), ``changed`` changes fields by name."""

    program: Program
    resources: Resources = Resources()
    launch: Launch = Launch()
    environment: Environment = Environment()
    output: Output = Output()
    preemption: Preemption = Preemption()
    containers: Containers = Containers()
    arrays: Arrays = Arrays()
    site: SiteExtras = SiteExtras()

    @classmethod
    def of(cls, **values: Any) -> JobSpec:
        """The request with these fields (by name, any part's; ``script`` is needed) and the defaults."""
        parts = _by_part(values)
        return cls(**{part: PARTS[part](**parts.get(part, {})) for part in PARTS})

    def changed(self, **values: Any) -> JobSpec:
        """This request with these fields (by name, any part's) changed."""
        return replace(self, **{part: replace(getattr(self, part), **given)
                                for part, given in _by_part(values).items()})

    def value(self, name: str) -> Any:
        """Field ``name``'s value, whichever part holds it."""
        return getattr(getattr(self, PART_OF[name]), name)

    def values(self) -> dict[str, Any]:
        """Every field by name (the flat view: the API's keyword arguments)."""
        return {name: self.value(name) for name in PART_OF}

    @property
    def container(self) -> str | None:
        """"pyxis", "apptainer" or None."""
        return "pyxis" if self.containers.container_image else "apptainer" if self.containers.apptainer else None

    @property
    def slurm_tasks_per_node(self) -> int:
        """Slurm tasks per node: one per rank, or one torchrun per node in torchrun mode."""
        return 1 if self.launch.mode == "torchrun" else self.ntasks_per_node

    @property
    def log_unit(self) -> str:
        """What one output file holds: a rank's output, or in torchrun mode a node's (all its ranks)."""
        return "node" if self.launch.mode == "torchrun" else "rank"

    @property
    def ranks_per_log(self) -> int:
        """Ranks whose output one log file holds: 1, or a node's in torchrun mode."""
        return self.ntasks_per_node if self.launch.mode == "torchrun" else 1

    def node_range(self, sep: str = ":") -> str:
        """--nodes as written: N, or an elastic MIN:MAX (torchrun's --nnodes); sbatch's MIN-MAX with sep="-"."""
        res = self.resources
        return f"{res.min_nodes}{sep}{res.nodes}" if res.min_nodes is not None else str(res.nodes)

    @property
    def nodes_text(self) -> str:
        return self.node_range()

    @property
    def is_array(self) -> bool:
        return self.arrays.array is not None or bool(self.arrays.sweep)

    @property
    def array_indices(self) -> list[int]:
        """The indices of the array's elements; [] when the job is not an array."""
        if self.arrays.sweep:
            return list(range(len(self.sweep_points)))
        return parse_array(self.arrays.array) if self.arrays.array is not None else []

    @property
    def array_directive(self) -> str | None:
        """Slurm's --array value, or None."""
        if not self.is_array:
            return None
        indices = f"0-{len(self.sweep_points) - 1}" if self.arrays.sweep else str(self.arrays.array)
        return indices + (f"%{self.arrays.max_parallel}" if self.arrays.max_parallel else "")

    @property
    def sweep_points(self) -> list[list[str]]:
        """The grid's points as the arguments each adds to SCRIPT's (--KEY=VALUE), first key slowest."""
        points: list[list[str]] = [[]]
        for key, values in self.arrays.sweep:
            points = [[*p, f"--{key}={v}"] for p in points for v in values]
        return points if self.arrays.sweep else []

    @property
    def asked_warning(self) -> tuple[str, int] | None:
        """The warning as --signal asks for it: (signal name without SIG, seconds before the time limit), or
        None for no warning signal. What the job gets is ``warning``."""
        return parse_signal(self.preemption.signal)

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
        return (f"--time {self.resources.time} is too short for the warning SIG{asked[0]} {asked[1]}s before the "
                f"limit (Slurm would send it at or near the start, before the script could handle it): {now} "
                f"(--signal NAME@SECONDS chooses, --signal none for none)")

    @property
    def time_limit_seconds(self) -> int | None:
        """--time in seconds, None when unlimited or not given."""
        return None if self.resources.time is None else time_seconds(self.resources.time)

    @property
    def ntasks_per_node(self) -> int:
        """Ranks per node."""
        if self.launch.mode == "torchrun" and self.launch.nproc_per_node is not None:
            return self.launch.nproc_per_node
        if self.resources.tasks_per_node is not None:
            return self.resources.tasks_per_node
        return self.resources.gpus_per_node if self.resources.gpus_per_node > 0 else 1

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.ntasks_per_node

    @property
    def name(self) -> str:
        if self.output.job_name is not None:
            return self.output.job_name
        base = os.path.basename(self.program.script) if not self.program.module else self.program.script
        return base or "slurmlaunch"

    @property
    def per_task_cpus(self) -> int | None:
        if self.resources.cpus_per_task is not None:
            return self.resources.cpus_per_task
        return self.resources.cpus_per_gpu  # one task per GPU: CPUs per GPU are CPUs per task

    @property
    def slurm_cpus_per_task(self) -> int | None:
        """CPUs per Slurm task: per rank, or in torchrun mode for all the ranks of a node."""
        cpus = self.per_task_cpus
        return cpus * self.ntasks_per_node if cpus is not None and self.launch.mode == "torchrun" else cpus

    @property
    def log_dir(self) -> str:
        return os.path.join(self.program.workdir, self.output.output_dir)


def _positive(name: str, value: int | None, minimum: int = 1, maximum: int = MAX_PER_NODE) -> None:
    check_count(name, value, minimum, maximum)


def _validate_mode(spec: JobSpec) -> None:
    launch, res = spec.launch, spec.resources
    if launch.mode not in MODES:
        raise SpecError(f"--mode {launch.mode!r} is not valid (expected srun or torchrun)")
    _positive("--max-restarts", launch.max_restarts, 0, MAX_RESTARTS)
    if launch.mode != "torchrun":
        for text, given in ((f"--max-restarts {launch.max_restarts}", launch.max_restarts != 0),
                            (f"--nodes {spec.nodes_text}", res.min_nodes is not None),
                            (f"--nproc-per-node {launch.nproc_per_node}", launch.nproc_per_node is not None)):
            if given:
                raise SpecError(f"{text} needs --mode torchrun (torchrun's restarts, elastic ranges and "
                                f"ranks per node); in srun mode use --requeue and --tasks-per-node")
        return
    if res.tasks_per_node not in (None, 1):
        raise SpecError(f"--tasks-per-node {res.tasks_per_node} is not valid with --mode torchrun (one task per "
                        f"node runs torchrun; its ranks per node are --gpus-per-node, or --nproc-per-node)")
    if res.gpus_per_node and launch.nproc_per_node not in (None, res.gpus_per_node):
        raise SpecError(f"--nproc-per-node {launch.nproc_per_node} is not valid with --gpus-per-node "
                        f"{res.gpus_per_node} (one rank per GPU)")
    if res.min_nodes is not None and not 1 <= res.min_nodes <= res.nodes:
        raise SpecError(f"--nodes {spec.nodes_text} is not valid (expected MIN:MAX with 1 <= MIN <= MAX)")


def _validate_container(spec: JobSpec) -> None:
    box = spec.containers
    if box.container_image is not None and box.apptainer is not None:
        raise SpecError("--container-image (pyxis) and --apptainer cannot be used together (give one of them)")
    for name, value in (("--container-image", box.container_image), ("--apptainer", box.apptainer)):
        if value is not None and (not value or any(c.isspace() or c == "," for c in value)):
            raise SpecError(f"{name} {value!r} is not valid (expected an image name or path, without spaces "
                            f"or commas)")
    if spec.container is None and (box.container_mounts or box.container_workdir):
        raise SpecError("--container-mount and --container-workdir need --container-image or --apptainer")
    for mount in box.container_mounts:
        parts = mount.split(":")
        if not 2 <= len(parts) <= 3 or not all(p.startswith("/") for p in parts[:2]) or "," in mount \
                or any(c.isspace() for c in mount):
            raise SpecError(f"--container-mount {mount!r} is not valid (expected /host/path:/container/path"
                            f"[:FLAGS], e.g. /scratch:/scratch:ro; no commas or spaces)")
    workdir = box.container_workdir
    if workdir is not None and (not workdir.startswith("/")
                                or any(c.isspace() or not c.isprintable() for c in workdir)):
        raise SpecError(f"--container-workdir {shown(workdir)} is not valid (expected an absolute "
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
    res = spec.resources
    _positive("--nodes", res.nodes, 1, MAX_NODES)
    _positive("--gpus-per-node", res.gpus_per_node, 0)
    _positive("--tasks-per-node", res.tasks_per_node)
    _positive("--cpus-per-task", res.cpus_per_task)
    _positive("--cpus-per-gpu", res.cpus_per_gpu)
    _positive("--nproc-per-node", spec.launch.nproc_per_node)
    if res.min_nodes is not None:
        _positive("--nodes MIN", res.min_nodes, 1, MAX_NODES)
    if spec.world_size > MAX_WORLD:
        raise SpecError(f"{res.nodes} nodes x {spec.ntasks_per_node} ranks per node is {spec.world_size} ranks "
                        f"(expected at most {MAX_WORLD}: torch.distributed ranks are 32-bit integers)")
    if res.cpus_per_task is not None and res.cpus_per_task * spec.ntasks_per_node > MAX_PER_NODE:
        raise SpecError(f"--cpus-per-task {res.cpus_per_task} x {spec.ntasks_per_node} ranks per node is more "
                        f"than the {MAX_PER_NODE} CPUs a node may have (docs: Limits)")
    if res.cpus_per_task is not None and res.cpus_per_gpu is not None:
        raise SpecError("--cpus-per-task and --cpus-per-gpu cannot be used together (give one of them)")
    if res.cpus_per_gpu is not None and res.gpus_per_node == 0:
        raise SpecError("--cpus-per-gpu needs --gpus-per-node > 0 (or use --cpus-per-task)")
    if res.gpus_per_node > 0 and res.tasks_per_node not in (None, res.gpus_per_node):
        raise SpecError(
            f"--tasks-per-node {res.tasks_per_node} is not valid with --gpus-per-node {res.gpus_per_node} "
            f"(one rank per GPU: tasks per node must equal GPUs per node)"
        )


def _validate_time_and_mem(spec: JobSpec) -> None:
    res = spec.resources
    if res.time is not None and res.time.upper() not in UNLIMITED:
        minutes = time_minutes(res.time)
        if minutes is None:
            raise not_a_time(res.time)
        if minutes > MAX_TIME_MINUTES:
            raise SpecError(f"--time {shown(res.time)} is longer than Slurm can keep (at most {MAX_TIME_MINUTES} "
                            f"minutes; UNLIMITED for no limit)")
    if res.mem is not None:
        parse_mem(res.mem)


def _validate_warning(spec: JobSpec) -> None:
    """The warning signal and what is done on it (requeue)."""
    plan = spec.preemption
    parse_signal(plan.signal)
    _positive("--max-requeues", plan.max_requeues, 0, MAX_RESTARTS)
    if plan.requeued_by not in REQUEUED_BY:
        raise SpecError(f"requeued_by {shown(plan.requeued_by)} is not valid (expected one of "
                        f"{', '.join(REQUEUED_BY)})")
    if plan.requeue and spec.warning is None:
        raise SpecError("--requeue needs a warning signal (--signal NAME@SECONDS), not --signal none")


def _validate_rendezvous_and_array(spec: JobSpec) -> None:
    env, arrays = spec.environment, spec.arrays
    if env.rdzv_timeout is not None and not 0 <= env.rdzv_timeout <= MAX_SECONDS:
        raise SpecError(f"--rdzv-timeout {env.rdzv_timeout} is not valid (expected seconds 0..{MAX_SECONDS}; "
                        f"0: no bound)")
    if env.master_port is not None and not 1 <= env.master_port <= 65535:
        raise SpecError(f"--master-port {env.master_port} is not valid (expected 1-65535)")
    if arrays.array is not None:
        if arrays.sweep:
            raise SpecError("--array and --sweep cannot be used together (a sweep makes its own array: one "
                            "element per point)")
        array_ranges(arrays.array)
    _positive("--max-parallel", arrays.max_parallel, 1, MAX_ARRAY_ELEMENTS)
    if arrays.max_parallel is not None and not spec.is_array:
        raise SpecError("--max-parallel needs --array or --sweep")
    if spec.is_array and env.master_port is not None:
        raise SpecError(f"--master-port {env.master_port} cannot be used with --array/--sweep (array elements "
                        f"may share nodes; each derives its own port from its job id)")


def _validate_choices(spec: JobSpec) -> None:
    """The closed choices (their Literal types; a request built from options holds any string until here)."""
    if spec.launch.mpi is not None and spec.launch.mpi not in (*MPI_FLAVOURS, *SRUN_MPI_TYPES):
        raise SpecError(f"--mpi {spec.launch.mpi!r} is not valid (expected one of {', '.join(MPI_FLAVOURS)} under PBS, "
                        f"{', '.join(SRUN_MPI_TYPES)} under Slurm)")
    if spec.site.pbs_flavour not in PBS_FLAVOURS:
        raise SpecError(f"--pbs-flavour {spec.site.pbs_flavour!r} is not valid (expected pro or torque)")
    if spec.resources.gpu_flag not in GPU_FLAGS:
        raise SpecError(f"--gpu-flag {spec.resources.gpu_flag!r} is not valid (expected gpus-per-node or gres)")
    if spec.environment.stage_env is not None and spec.environment.stage_env not in STAGE_MODES:
        raise SpecError(f"--stage-env {spec.environment.stage_env!r} is not valid (expected "
                        f"{' or '.join(STAGE_MODES)})")
    if spec.environment.stage_env is not None and spec.container:
        raise SpecError("--stage-env cannot be used with --container-image or --apptainer (the image is the "
                        "environment; leave --stage-env out)")


def _validate_names(spec: JobSpec) -> None:
    """The strings that reach the script: the logs' directory, sbatch's options, the site's names, SCRIPT.
    (The job name is data, byte for byte, on sbatch's command line: docs "Strings are data".)"""
    res = spec.resources
    if not spec.output.output_dir:  # control characters: _validate_text
        raise SpecError(f"--output-dir {shown(spec.output.output_dir)} is not valid (expected a directory name)")
    for bad in ("%", "\\"):
        if bad in spec.output.output_dir:
            raise SpecError(
                f"--output-dir {spec.output.output_dir!r} contains {bad!r}, which Slurm reads as a file-name "
                f"pattern (choose a directory without '%' and '\\\\')"
            )
    for arg in spec.site.sbatch_args:
        if "\n" in arg or "\r" in arg or not arg.startswith("-"):
            raise SpecError(
                f"--sbatch-arg {arg!r} is not valid (expected one sbatch option on one line, e.g. --mail-type=END)"
            )
    for name, value in (("--partition", res.partition), ("--account", res.account), ("--qos", res.qos),
                        ("--constraint", res.constraint)):
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise SpecError(f"{name} {value!r} is not valid (expected a non-empty name without spaces)")
    if not spec.program.script:  # an empty path would name the working directory itself
        raise SpecError("no SCRIPT given")


# The values that are names, sizes, paths or flags, not data (docs: Strings are data): the fields declared
# name=True, by the option that sets them. A control character in one (C0, DEL, the ESC of a terminal sequence)
# would end up in an #SBATCH/#PBS line, the srun line or a terminal, so it is refused whatever the option.
_NAME_OPTIONS = {name: flag_of(name) for name, f in FIELDS.items() if f.metadata.get("name")}


def control_character(value: str) -> str | None:
    """The first control character in ``value`` (C0, DEL, C1, and what else str.isprintable() refuses), or
    None."""
    return next((c for c in value if not c.isprintable()), None)


def _validate_text(spec: JobSpec) -> None:
    """No control character in a value that is not data (_NAME_OPTIONS, the sweep's keys)."""
    for name, flag in _NAME_OPTIONS.items():
        value = spec.value(name)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, str) and control_character(item) is not None:
                raise SpecError(f"{flag} {shown(item)} contains the control character "
                                f"{control_character(item)!r} (expected a value without control characters)")
    for key, _ in spec.arrays.sweep:
        if isinstance(key, str) and control_character(key) is not None:
            raise SpecError(f"--sweep key {shown(key)} contains the control character {control_character(key)!r} "
                            f"(expected a name without control characters)")


def _strings(value: object) -> list[str]:
    """Every string in a field's value (a string, or tuples of them at any depth: --env's pairs, a sweep)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, tuple):
        return [text for item in value for text in _strings(item)]
    return []


def _validate_encoding(spec: JobSpec) -> None:
    """Every value is text the batch script (UTF-8) can carry: a command-line argument that was not UTF-8
    reaches Python with its bytes as lone surrogates (PEP 383), which no script can be written with."""
    for name, value in spec.values().items():
        texts = [f"{key}={text}" for key, text in value] if name == "env" and isinstance(value, tuple) else \
            _strings(value)  # an --env pair as the user typed it: its KEY names the one at fault
        for i, text in enumerate(texts):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raw = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                bad = ord(text[e.start])
                byte = f"the byte {bad - 0xDC00:#04x}" if 0xDC80 <= bad <= 0xDCFF else f"{chr(bad)!r}"
                who = f"SCRIPT argument {i + 1}" if name == "args" else "SCRIPT" if name == "script" else flag_of(name)
                shown_raw = raw if len(raw) <= 60 else f"{raw[:60]}... ({len(raw)} characters)"
                raise SpecError(f"{who} '{shown_raw}' is not valid UTF-8 ({byte}; expected UTF-8 text, which the "
                                f"batch script is written in)") from None


def validate(spec: JobSpec) -> JobSpec:
    """Raise SpecError for the first thing wrong with ``spec``; return it unchanged otherwise. Pure: what
    needs the submitting machine's files (SCRIPT, --python, --output-dir exist) is app.resolve's."""
    _validate_encoding(spec)
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
