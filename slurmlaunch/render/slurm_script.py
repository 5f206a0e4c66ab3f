"""The Slurm request -> sbatch script step (what --dry-run prints): directives, the srun line, the context
the template is rendered with. Pure: no sbatch, no files written."""

from __future__ import annotations

import os
from typing import Any

from ..core import __version__
from ..core.errors import SpecError
from ..core.jobfiles import SUBMISSION_MARK, JobFiles, own_dir
from ..core.spec import SRUN_MPI_TYPES, JobSpec
from .jinja import render
from .launch import batch_step_command, container_mounts, host_python_check, launch_command, script_env

TEMPLATE = "slurm.sbatch.j2"


def directives(spec: JobSpec) -> list[str]:
    """The #SBATCH lines. Free text (job name, log paths) goes on sbatch's command line instead, where
    no quoting rule of the #SBATCH parser can cut or reinterpret it."""
    res = spec.resources
    out = [f"--nodes={spec.node_range('-')}", f"--ntasks-per-node={spec.slurm_tasks_per_node}"]
    if res.gpus_per_node:
        out.append(f"--gpus-per-node={res.gpus_per_node}" if res.gpu_flag == "gpus-per-node"
                   else f"--gres=gpu:{res.gpus_per_node}")
    if spec.slurm_cpus_per_task is not None:
        out.append(f"--cpus-per-task={spec.slurm_cpus_per_task}")
    for flag, value in (("mem", res.mem), ("time", res.time), ("partition", res.partition),
                        ("account", res.account), ("qos", res.qos), ("constraint", res.constraint)):
        if value is not None:
            out.append(f"--{flag}={value}")
    if res.exclusive:
        out.append("--exclusive")
    if spec.warning:
        # B: gives the warning to the batch shell, which forwards it to srun (and so to every rank) and
        # knows to requeue; a plain --signal would reach the steps only.
        out.append(f"--signal=B:{spec.warning[0]}@{spec.warning[1]}")
    if spec.preemption.requeue:
        out.append("--requeue")
    if spec.array_directive:
        out.append(f"--array={spec.array_directive}")
    out.append("--open-mode=append")
    out.extend(spec.site.sbatch_args)
    return out


def srun_args(spec: JobSpec) -> list[str]:
    args = ["--kill-on-bad-exit=1"]
    if spec.resources.min_nodes is None:  # an elastic job's step spans whatever the allocation got
        tasks = spec.resources.nodes * spec.slurm_tasks_per_node
        args += [f"--nodes={spec.resources.nodes}", f"--ntasks-per-node={spec.slurm_tasks_per_node}",
                 f"--ntasks={tasks}"]
    else:
        args.append("--ntasks-per-node=1")
    if spec.slurm_cpus_per_task is not None:
        # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the batch allocation.
        args.append(f"--cpus-per-task={spec.slurm_cpus_per_task}")
    if spec.launch.mpi is not None:  # the PMI the ranks' MPI library talks to (one of srun's own mpi plugins)
        if spec.launch.mpi not in SRUN_MPI_TYPES:
            raise SpecError(f"--mpi {spec.launch.mpi} is not valid under Slurm (expected one of "
                            f"{', '.join(SRUN_MPI_TYPES)}: srun's --mpi plugin type)")
        args.append(f"--mpi={spec.launch.mpi}")
    args.append("--open-mode=append")  # --output: the template's, in the script's own $log_dir (rank_logs)
    if spec.containers.container_image:  # pyxis: every task of the step runs in the image
        args += [f"--container-image={spec.containers.container_image}",
                 f"--container-mounts={','.join(container_mounts(spec))}",
                 f"--container-workdir={spec.containers.container_workdir or spec.program.workdir}"]
    return args


def file_tag(spec: JobSpec) -> str:
    """How log file names say which job: its id, or for an array element ARRAYID_INDEX (as squeue shows it)."""
    return "%A_%a" if spec.is_array else "%j"


def rank_logs(spec: JobSpec) -> str:
    """srun's --output pattern of the rank logs, relative to the script's $log_dir (a job whose id older files
    carry has its files in a directory of its own, jobfiles.own_dir, which the script chooses)."""
    return os.path.basename(JobFiles("", file_tag(spec), spec.log_unit).log("%t"))


def shell_files(spec: JobSpec) -> JobFiles:
    """The job's file names as the batch script spells them, with its own $log_dir and $job_tag."""
    return JobFiles("$log_dir", "$job_tag", spec.log_unit)


def batch_step_plan(spec: JobSpec) -> list[str]:
    """The batch step's plan (allocation/batch_step.py's options, before its --log-dir and --job): what one
    output file holds, the world, the warning signal, the requeue rule, the stacks at a stop."""
    plan = ["--srun", "--unit", spec.log_unit, "--ranks", str(spec.world_size), "--nodes",
            str(spec.resources.nodes)]
    if spec.launch.mode == "torchrun":
        plan.append("--torchrun")
    if spec.warning:
        plan += ["--warning", spec.warning[0]]
    if spec.preemption.requeue:
        plan += ["--requeue", str(spec.preemption.max_requeues)]
        if spec.preemption.requeued_by == "script":
            plan.append("--requeued-by-script")
    if not spec.container:  # the batch shell runs outside the container, where the ranks' stacks are not said
        plan.append("--stacks")
    if spec.environment.stage_env:
        plan += ["--stage-env", spec.environment.stage_env]
    return plan


def script_context(spec: JobSpec) -> dict[str, Any]:
    env = script_env(spec)
    return {
        "version": __version__,
        "world_size": spec.world_size,
        "nodes": spec.nodes_text,
        "multi_node": spec.resources.nodes > 1,
        "tasks_per_node": spec.slurm_tasks_per_node,
        "directives": directives(spec),
        "setup": list(spec.environment.setup),
        "env": env,
        "log_dir": spec.log_dir,
        "workdir": spec.program.workdir,
        "srun_args": srun_args(spec),
        "rank_logs": rank_logs(spec),
        # a job whose id older files carry has its files in a directory of its own (jobfiles.own_dir)
        "own_dir": own_dir("$log_dir", "$SLURM_ARRAY_JOB_ID" if spec.is_array else "$SLURM_JOB_ID", SUBMISSION_MARK),
        "launch_cmd": launch_command(spec),
        "batch_step": [*batch_step_command(spec), *batch_step_plan(spec)], "host_check": host_python_check(spec),
        "array": spec.is_array,
        "torchrun": spec.launch.mode == "torchrun",
        "sweep_points": list(enumerate(spec.sweep_points)),
    }


def render_script(spec: JobSpec, template_dir: str | None = None) -> str:
    return render(TEMPLATE, script_context(spec), template_dir)

