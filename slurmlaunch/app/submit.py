"""`slurmlaunch submit`: options -> validated JobSpec -> scheduler (a queued one, or one that runs here) -> follow."""

from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

from ..core.errors import SpecError
from ..core.signals import STOP_SIGNALS
from ..core.spec import JobSpec
from .resolve import resolve

if TYPE_CHECKING:
    from ..schedulers.interface import Scheduler


def spec_from_args(ns: Any) -> JobSpec:
    """The request the options in ``ns`` make (every field from the options table: app/options.py)."""
    from .options import spec_values

    if ns.module and ns.no_python:
        raise SpecError("-m/--module and --no-python cannot be used together")
    return resolve(JobSpec.of(script=ns.script, args=tuple(ns.args), **spec_values(ns)), python=ns.python)


def choose_scheduler(requested: str, preview: bool = False) -> str:
    """--scheduler's choice (schedulers/choice.py); ``preview`` (--dry-run): a named one needs no client."""
    from ..schedulers.choice import choose

    return choose(requested, preview=preview)


def merged_options(ns: Any) -> Any:
    """The command line over the profiles (docs: Profiles)."""
    from . import profiles

    resolved = profiles.resolve(ns, ns.options_table, os.environ, os.getcwd())
    merged = profiles.apply(ns, resolved)
    merged.option_origins = resolved.origins
    return merged


def adapt_to_site(spec: JobSpec, origins: dict[str, str], edge: Scheduler) -> JobSpec:
    """Use the GPU request style `slurmlaunch doctor` found for this cluster, unless one was asked for, where
    ``edge`` takes more than one (its gpu_request_styles)."""
    from .profiles import BUILTIN

    if not edge.gpu_request_styles or not spec.resources.gpus_per_node or \
            origins.get("gpu_flag", BUILTIN) != BUILTIN:
        return spec
    from .site import learned_gpu_flag

    learned = learned_gpu_flag(edge)
    if learned is None or learned[0] == spec.resources.gpu_flag:
        return spec
    sys.stderr.write(f"slurmlaunch: requesting GPUs with --{learned[0]} (slurmlaunch doctor found that "
                     f"cluster {learned[1]} wants it; --gpu-flag overrides)\n")
    return spec.changed(gpu_flag=learned[0])


def adapt_to_client(spec: JobSpec, origins: dict[str, str], edge: Scheduler) -> JobSpec:
    """Send Lightning the warning signal it saves and requeues on, unless --signal was given (docs: Time
    limits, preemption, requeue), where the scheduler sends a warning signal. Where the scheduler offers its
    ranks the very requeue command Lightning runs (its rank_requeue: Slurm's `scontrol requeue`), Lightning's
    rank 0 then requeues the job itself and the batch shell does not; elsewhere (the local scheduler, which
    Lightning's scontrol cannot reach) the scheduler requeues as before."""
    from . import clients
    from .profiles import BUILTIN

    if not edge.warning_signal or spec.program.no_python:
        return spec
    source = clients.script_source(spec.program.script, spec.program.module, spec.program.workdir)
    found = clients.lightning_signal(source) if source is not None else None
    if found is None or not found.requeues:
        return spec
    given = origins.get("signal", BUILTIN) != BUILTIN
    what = f"{_said(spec.program.script)} uses {found.client} ({found.detail})"
    if found.signal is None:
        if not given:
            sys.stderr.write(f"slurmlaunch: {what}, whose requeue signal is not readable from the source: the "
                             f"warning stays SIG{spec.warning[0] if spec.warning else 'none'}; pass --signal "
                             f"NAME@90 with the signal Lightning listens for\n")
        return spec
    if given:
        if spec.warning is not None and spec.warning[0] != found.signal:
            # the warning goes only to ranks with a handler (allocation/warning.py), but a stop signal to all
            effect = "will end its ranks" if spec.warning[0] in STOP_SIGNALS else \
                "reaches no handler (the ranks are not sent it: nothing is saved)"
            sys.stderr.write(f"slurmlaunch: {what}, which saves and requeues on SIG{found.signal} only: "
                             f"--signal {spec.preemption.signal} {effect} unless the script handles "
                             f"SIG{spec.warning[0]} itself\n")
        if spec.warning is None or spec.warning[0] != found.signal:
            return spec
    else:
        spec = spec.changed(signal=f"{found.signal}@{spec.asked_warning[1] if spec.asked_warning else 90}")
    if edge.rank_requeue is not None and edge.rank_requeue == found.requeue_command:
        spec = spec.changed(requeued_by="script")
        how = (f"{found.client} saves a checkpoint on it and requeues the job itself, so the batch script will "
               f"not requeue it again")
    else:
        requeues = f"; {edge.title} requeues" if spec.preemption.requeue else ""
        how = f"{found.client} saves a checkpoint on it" + requeues
    seconds = spec.warning[1] if spec.warning else 90
    sys.stderr.write(f"slurmlaunch: {what}: warning signal SIG{found.signal} {seconds}s before the time limit; "
                     f"{how} (--signal NAME@SECONDS overrides)\n")
    return spec


def note_clients(spec: JobSpec, edge: Scheduler) -> None:
    """One line per client of the script that cannot join the world this job gives it, and for a torchrun in
    every task (app/clients.py); the job is submitted all the same (the scan is a heuristic, the script may
    not reach that code, and the user's torchruns may have a rendezvous of their own)."""
    from . import clients

    if spec.launch.mode == "srun":  # --mode torchrun already starts one torchrun per node
        nested = clients.nested_torchrun(spec.program.script, spec.program.args, spec.program.module, spec.world_size)
        if nested:
            sys.stderr.write(f"slurmlaunch: {nested}\n")
    if spec.program.no_python:
        return
    source = clients.script_source(spec.program.script, spec.program.module, spec.program.workdir)
    if source is None:
        return
    from ..schedulers.interface import slurm_step_variables

    for note in clients.client_notes(source, slurm_step_variables(edge), spec.resources.gpus_per_node):
        sys.stderr.write(f"slurmlaunch: {_said(spec.program.script)} uses {note}\n")


def _said(script: str) -> str:
    """SCRIPT in a note's one line: as given, or quoted with its escapes where it holds a newline or a control
    character (a terminal escape), which would break the line or reach the terminal."""
    return script if script.isprintable() else repr(script)


_OMPI_AS_ROOT = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def note_root(spec: JobSpec, edge: Scheduler) -> None:
    """One line when root submits to an edge that passes on none of the shell's variables (PBS) and Open MPI's
    mpiexec will start the ranks: it starts none as root unless both OMPI_ALLOW_RUN_AS_ROOT variables reach it,
    and the job (the PBS dev cluster's, whose jobs are root's) fails at once with exit code 1. The consent is
    the user's: the job is submitted as asked."""
    if edge.exports_environment or os.geteuid() != 0 or spec.launch.mpi not in (None, "openmpi"):
        return
    given = {name for name, _ in spec.environment.env}
    missing = [name for name in _OMPI_AS_ROOT
               if name not in given and not any(name in line for line in spec.environment.setup)]
    if missing:
        sys.stderr.write(f"slurmlaunch: this job is root's: Open MPI's mpiexec starts no rank as root unless "
                         f"{' and '.join(f'{name}=1' for name in _OMPI_AS_ROOT)} reach it, and {edge.title} passes "
                         f"none of this shell's variables: add {' '.join(f'--env {name}=1' for name in missing)}, "
                         f"or the job fails at once\n")


def cmd_submit(ns: Any) -> int:
    ns = merged_options(ns)
    if ns.remote:
        from .remote.jobs import submit_remote

        return submit_remote(ns, spec_from_args)
    from .options import refuse_remote_only

    refuse_remote_only(ns)
    spec = spec_from_args(ns)
    from ..schedulers.registry import scheduler

    edge = scheduler(choose_scheduler(ns.scheduler, preview=ns.dry_run))
    edge.refuse_unsupported(spec, getattr(ns, "option_origins", {}))
    spec = adapt_to_client(spec, getattr(ns, "option_origins", {}), edge)
    note_clients(spec, edge)
    note_root(spec, edge)
    if spec.warning_note:
        sys.stderr.write(f"slurmlaunch: {spec.warning_note}\n")
    if not edge.queued:
        return submit_here(spec, ns, edge)
    spec = adapt_to_site(spec, getattr(ns, "option_origins", {}), edge)
    script = edge.render(spec, ns.template_dir)
    if ns.dry_run:
        sys.stderr.write("# would run: " + shlex.join(edge.submit_command(spec, "<this script>")) + "\n")
        sys.stdout.write(script)
        return 0
    sub = edge.submit(spec, script)
    if sub.note:
        sys.stderr.write(f"slurmlaunch: {sub.note}\n")
    if sub.log_dir and sub.log_dir != spec.log_dir:  # an id older files carry: its files are in their own directory
        spec = spec.changed(output_dir=sub.log_dir)
    from ..schedulers.index import remember

    remember(sub.job_id, edge.name, sub.record_path, spec.name)
    sys.stderr.write(f"slurmlaunch: submitted job {sub.job_id} ({spec.world_size} ranks on {spec.resources.nodes} "
                     f"node(s)); script {sub.script_path}\n")
    describe_array(spec, sub.job_id)
    print(sub.job_id)
    if not ns.wait:
        return 0
    return wait_for(edge, sub.job_id, spec, ns.cancel_on_interrupt, ns.wait_timeout, sub.files_id or None)


def submit_here(spec: JobSpec, ns: Any, edge: Scheduler) -> int:
    """Run the job on a scheduler without a queue, on this machine (or print its plan for --dry-run): with
    --no-wait detached, its id printed at once; with --wait detached and followed as a queued job is (Ctrl-C
    asks whether to cancel it); without either, in this process, as in a terminal a training script runs
    (Ctrl-C or a hang-up stops it). Every way, `status`, `logs --follow`, `cancel` and `list` know it from any
    terminal."""
    edge.refuse_here(spec, ns.template_dir)
    from .profiles import BUILTIN

    detached = getattr(ns, "option_origins", {}).get("wait", BUILTIN) != BUILTIN
    if ns.wait_timeout is not None and not (detached and ns.wait):
        raise SpecError(f"--wait-timeout: on {edge.title} only with --wait (without it the job runs in this "
                        f"process: bound it with --time)")
    if ns.dry_run:
        sys.stdout.write(edge.render(spec))
        return 0
    for note in edge.start_notes(spec):
        sys.stderr.write(f"slurmlaunch: {note}\n")
    if not detached:
        return edge.run_here(spec)
    sub = edge.submit(spec, "")
    if sub.note:
        sys.stderr.write(f"slurmlaunch: {sub.note}\n")
    describe_array(spec, sub.job_id)
    print(sub.job_id)
    sys.stdout.flush()
    if not ns.wait:
        return 0
    return wait_for(edge, sub.job_id, spec, ns.cancel_on_interrupt, ns.wait_timeout)


def describe_array(spec: JobSpec, job_id: str) -> None:
    if not spec.is_array:
        return
    points = spec.sweep_points
    from .records import element_id

    sys.stderr.write(f"slurmlaunch: job {job_id} is an array of {len(spec.array_indices)} distributed jobs "
                     f"({element_id(job_id, 'INDEX')} in slurmlaunch status/logs)\n")
    for index, args in enumerate(points):
        sys.stderr.write(f"slurmlaunch:   {element_id(job_id, index)}: {shlex.join(args)}\n")


def wait_for(edge: Scheduler, job_id: str, spec: JobSpec, cancel_on_interrupt: bool, timeout: float | None,
             files_id: str | None = None) -> int:
    from ..schedulers import JobStatus
    from .follow import cancel_where_it_runs, follow, interrupted, poll_seconds
    from .records import element_id

    # Follow rank 0's own log where the scheduler writes one (an array has many rank 0s: its elements' states
    # are shown instead); where every rank writes to the job's one output, tagged (PBS: written in place
    # while the job runs, -k doe), that output.
    rank0 = edge.rank_log(spec, job_id, 0)
    shared = rank0 is None and edge.shared_output is not None and not spec.is_array
    if shared:  # the batch log too (-j oe): the batch step's own lines go to stderr, each once
        rank0 = edge.output_log(spec.log_dir, files_id or job_id, job_id)
    last: list[JobStatus] = []

    def status() -> JobStatus:
        st = edge.status(job_id, spec.log_dir, spec.array_indices)
        last[:] = [st]
        return st

    try:
        code: int = follow(job_id, status, rank0, timeout=timeout, log_dir=spec.log_dir, files_id=files_id,
                           poll=poll_seconds(edge), batch_log=shared)
        batch_log = edge.batch_log(spec, job_id)
        for line in warning_lines(batch_log) if batch_log else []:
            sys.stderr.write(line)
        said = slow_startup(spec, job_id, files_id or job_id)
        if said:
            sys.stderr.write(f"slurmlaunch: {said}\n")
        if last and last[0].elements:
            for index, state in last[0].elements.items():
                sys.stderr.write(f"slurmlaunch:   {element_id(job_id, index)}: {state}\n")
        return code
    except KeyboardInterrupt:
        return interrupted(job_id, lambda: cancel_where_it_runs(edge, job_id, spec.log_dir), cancel_on_interrupt)


def slow_startup(spec: JobSpec, job_id: str, files_id: str) -> str | None:
    """--wait's one line naming the slowest phase of a start-up that took at least core.timeline.SLOW_STARTUP_S
    (from the job's timeline directory); None for a quick one, an array, or one that recorded nothing."""
    if spec.is_array:
        return None
    from ..allocation.timeline import read
    from ..core.jobfiles import JobFiles
    from ..core.timeline import build, slow_startup_line

    texts = read(JobFiles(spec.log_dir, files_id).timeline)
    return slow_startup_line(build(job_id, texts, spec.world_size)) if texts else None


def warning_lines(batch_log: str) -> list[str]:
    """The batch log's lines saying the ranks died of the warning signal (--wait repeats them, since the
    batch log is not what it follows)."""
    try:
        with open(batch_log, encoding="utf-8", errors="replace") as f:
            return [line for line in f if line.startswith("slurmlaunch: ") and ", the warning signal: " in line]
    except OSError:
        return []
