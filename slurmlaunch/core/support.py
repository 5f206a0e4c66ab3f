"""Which job options each scheduler carries out. Pure: values in, values out.

Every option of a job means the same under every scheduler, or that scheduler refuses it with one line:
none is silently dropped. The table lists, per scheduler, the JobSpec fields it cannot carry out and what to
do instead; a field listed there is refused when its value differs from the built-in default (a default
asks for nothing). tests/app/test_option_meaning.py walks the whole option table against every scheduler's dry
run, so a new option has to land here or show its effect.
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import SpecError
from .spec import MPI_FLAVOURS, SRUN_MPI_TYPES, JobSpec

# What the local scheduler shows the tasks as Slurm would (SLURM_MEM_PER_NODE, SLURM_JOB_PARTITION, ...) but
# cannot reserve or enforce on one machine: said in one line at submission, never silently.
SHOWN_NOT_ENFORCED = ("mem", "partition", "account", "qos", "exclusive", "gpu_flag")
NOT_CARRIED_OUT: Mapping[str, Mapping[str, str]] = {
    "local": {
        "constraint": "the local scheduler has one kind of node, this machine: no features to ask for (leave "
                      "it out, or --scheduler slurm)",
        "sbatch_args": "there is no batch script to add directives to (leave it out, or --scheduler slurm/pbs)",
        "container_image": "it uses Slurm's pyxis plugin through srun (use --apptainer IMAGE here)",
        "pbs_flavour": "it is for PBS (leave it out, or --scheduler pbs)",
        "mpi": "it chooses how PBS's mpiexec or Slurm's srun starts MPI ranks, and the local scheduler offers "
               "MPI no PMI (leave it out, or --scheduler slurm/pbs)",
        "pbs_resources": "it is a PBS site resource (leave it out, or --scheduler pbs)",
        "pbs_chunk": "it is a PBS select-chunk resource (leave it out, or --scheduler pbs)",
        "project": "it is PBS's -P project (leave it out; --account is the account charged)",
        "pbs_request": "it chooses how a PBS job asks for resources (leave it out, or --scheduler pbs)",
        "pbs_queues": "it chooses a PBS queue by node count (leave it out; --partition chooses the partition)",
        "mpiexec_args": "it starts the ranks itself, without mpiexec (leave it out, or --scheduler pbs)",
    },
    "slurm": {
        "pbs_flavour": "it is for PBS (leave it out, or --scheduler pbs)",
        "pbs_resources": "it is a PBS site resource (leave it out, or --scheduler pbs)",
        "pbs_chunk": "it is a PBS select-chunk resource (leave it out, or --scheduler pbs)",
        "project": "it is PBS's -P project (leave it out; --account is the account charged)",
        "pbs_request": "it chooses how a PBS job asks for resources (leave it out, or --scheduler pbs)",
        "pbs_queues": "it chooses a PBS queue by node count (leave it out; --partition chooses the partition)",
        "mpiexec_args": "under Slurm srun starts the ranks (leave it out, or --scheduler pbs)",
    },
    "pbs": {
        "qos": "PBS has no QOS (a site's equivalent is a queue, --partition, or a resource, --pbs-resource "
               "KEY=VALUE)",
        "constraint": "PBS has no node features list (ask for a site resource of every node with --pbs-chunk "
                      "KEY=VALUE, e.g. system=polaris)",
        "gpu_flag": "it only chooses how sbatch is asked for GPUs (leave it out)",
        "container_image": "it uses Slurm's pyxis plugin through srun (use --apptainer IMAGE under PBS)",
        "max_requeues": "PBS reruns a -r y job itself and slurmlaunch does not count them (leave it out)",
        "signal": "the qsub script asks PBS for no warning signal before the walltime (leave it out; PBS sends "
                  "SIGTERM at the walltime, then SIGKILL after the server's kill_delay)",
        "mode": "under PBS mpiexec starts one launcher per rank (leave out --mode)",
    },
}
# Options whose values mean something under one scheduler only: (the values it takes, what they are).
VALUES_BY_SCHEDULER: Mapping[str, Mapping[str, tuple[tuple[str, ...], str]]] = {
    "slurm": {"mpi": (SRUN_MPI_TYPES, "srun's --mpi plugin type")},
    "pbs": {"mpi": (MPI_FLAVOURS, "the MPI whose mpiexec starts the ranks")},
}
# Fields whose option name differs from the field's.
FLAGS = {"sbatch_args": "--sbatch-arg", "container_mounts": "--container-mount", "pbs_resources": "--pbs-resource",
         "mpiexec_args": "--mpiexec-arg"}
_TORQUE = {"exclusive": "Torque's qsub script has no exclusive placement (leave it out, or --pbs-flavour pro)"}


def flag(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))


_DEFAULTS = JobSpec(script="")


def _default(name: str) -> object:
    return getattr(_DEFAULTS, name)


def shown_not_enforced(spec: JobSpec) -> list[str]:
    """The options of ``spec`` (as "--flag value") the local scheduler only shows its tasks."""
    out = []
    for name in SHOWN_NOT_ENFORCED:
        value = getattr(spec, name)
        if value != _default(name) and value not in (None, False):
            out.append(flag(name) if value is True else f"{flag(name)} {value}")
    return out


def _where(origin: str | None) -> str:
    return f" (from {origin})" if origin and origin not in ("command line", "built-in default") else ""


def refuse_unsupported(spec: JobSpec, scheduler: str, origins: Mapping[str, str] | None = None) -> None:
    """SpecError for the first option ``scheduler`` cannot carry out (see NOT_CARRIED_OUT) or whose value is
    another scheduler's (VALUES_BY_SCHEDULER); ``origins`` (as the profiles give them, by option dest) names
    where a value came from."""
    table = dict(NOT_CARRIED_OUT.get(scheduler, {}))
    if scheduler == "pbs" and spec.pbs_flavour == "torque":
        table.update(_TORQUE)
    for name, (values, meaning) in VALUES_BY_SCHEDULER.get(scheduler, {}).items():
        value = getattr(spec, name)
        if value is not None and value not in values:
            where = _where((origins or {}).get(name))
            raise SpecError(f"{flag(name)} {value}{where}: not valid under {scheduler} (expected {meaning}: one of "
                            f"{', '.join(values)})")
    for name, why in table.items():
        value = getattr(spec, name)
        if value == _default(name) or value in ((), None, False) or (name == "signal" and spec.warning is None):
            continue
        where = _where((origins or {}).get(name) or (origins or {}).get(name.rstrip("s")))
        shown = value if not isinstance(value, tuple) else " ".join(map(str, value))
        raise SpecError(f"{flag(name)} {shown!s}{where}: the {scheduler} scheduler cannot carry it out: {why}")
