"""Slurm: render the sbatch script, submit it, ask for its state, cancel it."""

from __future__ import annotations

import os
import re
import shutil
from signal import Signals, strsignal
from typing import Any

from ..core import __version__
from ..core.errors import SchedulerError
from ..core.spec import JobSpec
from ..render.jinja import render
from . import JobStatus, Submission, array_outcome, run_command, script_env, submit_with

TEMPLATE = "slurm.sbatch.j2"


def available() -> bool:
    return shutil.which("sbatch") is not None


def controller_answers(timeout: float = 10.0) -> tuple[bool, str]:
    """Whether a Slurm controller answers `scontrol ping` (an installed client alone is no cluster)."""
    try:
        out = run_command(["scontrol", "ping"], timeout=timeout).stdout
    except SchedulerError as e:
        return False, str(e)
    return "UP" in out, out.strip()


# Inside a container, slurmlaunch is this installation's package, mounted read-only (the image need not have
# it, and the script's side matches the side that rendered it); the bootstrap puts it first on sys.path.
CONTAINER_PKG = "/opt/slurmlaunch-pkg"
BOOTSTRAP = (f'import sys; sys.path.insert(0, "{CONTAINER_PKG}"); '
             "from slurmlaunch.cli import main; sys.exit(main())")


def container_mounts(spec: JobSpec) -> list[str]:
    """The working directory at its own path (the script, its data), slurmlaunch, then --container-mount's."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [f"{spec.workdir}:{spec.workdir}", f"{package}:{CONTAINER_PKG}/slurmlaunch:ro", *spec.container_mounts]


def launch_command(spec: JobSpec) -> list[str]:
    """What each task runs: the launcher in front of the script (no shell in between); in torchrun mode,
    the per-node torchrun starter; with --apptainer, `apptainer exec` in front of either."""
    entry = [spec.python, "-c", BOOTSTRAP] if spec.container else [spec.python, "-m", "slurmlaunch"]
    cmd = [*entry, "launch"]
    if spec.apptainer:
        binds = [a for m in container_mounts(spec) for a in ("--bind", m)]
        gpus = ["--nv"] if spec.gpus_per_node else []
        entry = ["apptainer", "exec", *gpus, *binds, "--pwd", spec.container_workdir or spec.workdir,
                 spec.apptainer, *entry]
        cmd = [*entry, "launch"]
    if spec.mode == "torchrun":
        cmd = [*entry, "torchrun-node", f"--nproc-per-node={spec.ntasks_per_node}",
               f"--max-restarts={spec.max_restarts}"]
        if spec.min_nodes is not None:
            cmd.append(f"--nnodes={spec.min_nodes}:{spec.nodes}")
        if spec.warning:
            cmd.append(f"--forward-signal={spec.warning[0]}")
    if spec.module:
        cmd.append("-m")
    if spec.no_python:
        cmd.append("--no-python")
    if spec.legacy_local_rank_arg:  # launch and torchrun-node both take it; PBS and local run this same command
        cmd.append("--legacy-local-rank-arg")
    script = spec.script
    if not (spec.module or spec.no_python or os.path.isabs(script)):
        script = os.path.join(spec.workdir, script)
    return [*cmd, script, *spec.args]


def directives(spec: JobSpec) -> list[str]:
    """The #SBATCH lines. Free text (job name, log paths) goes on sbatch's command line instead, where
    no quoting rule of the #SBATCH parser can cut or reinterpret it."""
    nodes = f"{spec.min_nodes}-{spec.nodes}" if spec.min_nodes is not None else str(spec.nodes)
    out = [f"--nodes={nodes}", f"--ntasks-per-node={spec.slurm_tasks_per_node}"]
    if spec.gpus_per_node:
        out.append(f"--gpus-per-node={spec.gpus_per_node}" if spec.gpu_flag == "gpus-per-node"
                   else f"--gres=gpu:{spec.gpus_per_node}")
    if spec.slurm_cpus_per_task is not None:
        out.append(f"--cpus-per-task={spec.slurm_cpus_per_task}")
    for flag, value in (("mem", spec.mem), ("time", spec.time), ("partition", spec.partition),
                        ("account", spec.account), ("qos", spec.qos), ("constraint", spec.constraint)):
        if value is not None:
            out.append(f"--{flag}={value}")
    if spec.exclusive:
        out.append("--exclusive")
    if spec.warning:
        # B: gives the warning to the batch shell, which forwards it to srun (and so to every rank) and
        # knows to requeue; a plain --signal would reach the steps only.
        out.append(f"--signal=B:{spec.warning[0]}@{spec.warning[1]}")
    if spec.requeue:
        out.append("--requeue")
    if spec.array_directive:
        out.append(f"--array={spec.array_directive}")
    out.append("--open-mode=append")
    out.extend(spec.sbatch_args)
    return out


def srun_args(spec: JobSpec) -> list[str]:
    args = ["--kill-on-bad-exit=1"]
    if spec.min_nodes is None:  # an elastic job's step spans whatever the allocation got
        tasks = spec.nodes * spec.slurm_tasks_per_node
        args += [f"--nodes={spec.nodes}", f"--ntasks-per-node={spec.slurm_tasks_per_node}", f"--ntasks={tasks}"]
    else:
        args.append("--ntasks-per-node=1")
    if spec.slurm_cpus_per_task is not None:
        # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the batch allocation.
        args.append(f"--cpus-per-task={spec.slurm_cpus_per_task}")
    log = f"job-{file_tag(spec)}.{spec.log_unit}-%t.log"
    args += ["--open-mode=append", "--output", os.path.join(spec.log_dir, log)]
    if spec.container_image:  # pyxis: every task of the step runs in the image
        args += [f"--container-image={spec.container_image}",
                 f"--container-mounts={','.join(container_mounts(spec))}",
                 f"--container-workdir={spec.container_workdir or spec.workdir}"]
    return args


def file_tag(spec: JobSpec) -> str:
    """How log file names say which job: its id, or for an array element ARRAYID_INDEX (as squeue shows it)."""
    return "%A_%a" if spec.is_array else "%j"


def script_context(spec: JobSpec) -> dict[str, Any]:
    env = script_env(spec)
    return {
        "version": __version__,
        "world_size": spec.world_size,
        "nodes": spec.nodes_text,
        "multi_node": spec.nodes > 1,
        "tasks_per_node": spec.slurm_tasks_per_node,
        "directives": directives(spec),
        "setup": list(spec.setup),
        "env": env,
        "log_dir": spec.log_dir,
        "workdir": spec.workdir,
        "srun_args": srun_args(spec),
        "launch_cmd": launch_command(spec),
        "warning_signal": spec.warning[0] if spec.warning else None,
        # how srun words a task killed by it (strsignal), and its number: to tell "died of it" from "saved"
        "warning_description": strsignal(Signals["SIG" + spec.warning[0]]) if spec.warning else None,
        "warning_number": int(Signals["SIG" + spec.warning[0]]) if spec.warning else 0,
        "requeue": spec.requeue,
        "requeued_by_script": spec.requeued_by == "script",
        "max_requeues": spec.max_requeues,
        "array": spec.is_array,
        "torchrun": spec.mode == "torchrun",
        "sweep_points": list(enumerate(spec.sweep_points)),
    }


def render_script(spec: JobSpec, template_dir: str | None = None) -> str:
    return render(TEMPLATE, script_context(spec), template_dir)


def sbatch_command(spec: JobSpec, script_path: str) -> list[str]:
    return [
        "sbatch", "--parsable",
        f"--job-name={spec.name}",
        f"--output={os.path.join(spec.log_dir, f'job-{file_tag(spec)}.batch.log')}",
        f"--chdir={spec.workdir}",
        script_path,
    ]


def submit(spec: JobSpec, script_text: str) -> Submission:
    """Save the script beside the logs, sbatch it, and keep a record; SchedulerError when Slurm refuses."""

    def parse(out: str) -> str | None:  # --parsable: "1234" or "1234;cluster"
        job_id = out.split(";")[0]
        return job_id if job_id.isdigit() else None

    return submit_with(spec, script_text, "slurm", "sbatch", sbatch_command, parse)


_FIELD = re.compile(r"\b(JobState|ExitCode|NodeList|RunTime)=(\S+)")


def status(job_id: str, log_dir: str | None = None) -> JobStatus:
    """squeue while the job is known to it; after that sacct where accounting exists, else scontrol (which
    forgets the job MinJobAge seconds after it ended). The exit code comes from the file the batch script
    writes at its end (the first failing rank's, exact even without accounting), else from Slurm's ExitCode."""
    try:
        line = run_command(["squeue", "-h", "-j", job_id, "-o", "%T %M %N"], timeout=30).stdout.strip()
    except SchedulerError as e:
        if "Invalid job id" not in str(e):
            raise
        line = ""  # squeue forgets a job MinJobAge seconds after it ended
    if line:
        state, _, rest = line.partition(" ")
        elapsed, _, nodes = rest.partition(" ")
        if state not in FINISHED:
            return JobStatus(state, None, nodes or None, elapsed=elapsed or None)
    fields = _accounting(job_id) or _scontrol(job_id)
    code: int | None = None
    if log_dir:
        try:
            with open(os.path.join(log_dir, f"job-{job_id}.exitcode")) as f:
                code = int(f.read().strip())
        except (OSError, ValueError):
            code = None
    state = fields.get("JobState") or ("COMPLETED" if code == 0 else "FAILED" if code else "GONE")
    if code is None and "ExitCode" in fields:
        status_code, _, signal = fields["ExitCode"].partition(":")
        code = int(status_code) if status_code.isdigit() else None
        if code == 0 and signal.isdigit() and int(signal):
            code = 128 + int(signal)
    if code is None or (code == 0 and state != "COMPLETED"):
        code = 0 if state == "COMPLETED" else 1
    assigned = fields.get("NodeList")
    return JobStatus(state, code, assigned if assigned not in (None, "None assigned", "(null)") else None,
                     elapsed=fields.get("Elapsed"))


def _accounting(job_id: str) -> dict[str, str]:
    """The job's line from sacct, or {} where there is no accounting (or it does not know the job yet)."""
    if not shutil.which("sacct"):
        return {}
    try:
        out = run_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,Elapsed,NodeList,ExitCode"],
                          timeout=30).stdout
    except SchedulerError:
        return {}  # "Slurm accounting storage is disabled", or slurmdbd is down
    line = next((ln for ln in out.splitlines() if ln.count("|") == 3), "")
    if not line:
        return {}
    state, elapsed, nodes, exit_code = line.split("|")
    # "CANCELLED by 0" -> CANCELLED; elapsed [D-]HH:MM:SS
    return {"JobState": state.split()[0], "Elapsed": elapsed, "NodeList": nodes, "ExitCode": exit_code}


def _scontrol(job_id: str) -> dict[str, str]:
    try:
        shown = run_command(["scontrol", "show", "job", "-o", job_id], timeout=30).stdout
    except SchedulerError:
        return {}  # the record is gone after MinJobAge; the exit-code file is all there is
    # JobName, free text that could read "JobState=...", comes before UserId; the fields we want after.
    fields = dict(reversed(_FIELD.findall(shown.split(" UserId=", 1)[-1])))
    if "RunTime" in fields:
        fields["Elapsed"] = fields.pop("RunTime")
    return fields


def array_status(job_id: str, log_dir: str, indices: list[int]) -> JobStatus:
    """A job array as one job: running while any element is, then FAILED with the first failing element's
    exit code (in index order), or COMPLETED. ``elements`` maps each index to "STATE" or "STATE CODE"."""
    try:
        lines = run_command(["squeue", "-h", "-r", "-j", job_id, "-o", "%i %T %N"], timeout=30).stdout.split("\n")
    except SchedulerError as e:
        if "Invalid job id" not in str(e):
            raise
        lines = []
    live: dict[int, tuple[str, str]] = {}
    for line in lines:
        tag, _, rest = line.strip().partition(" ")
        state, _, nodes = rest.partition(" ")
        index = tag.rpartition("_")[2]
        if index.isdigit() and state and state not in FINISHED:
            live[int(index)] = (state, nodes)
    return array_outcome(job_id, log_dir, indices, live, {}, "cancelled or timed out")


FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE")


def cancel(job_id: str) -> None:
    run_command(["scancel", job_id], timeout=30)
