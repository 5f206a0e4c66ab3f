"""PBS Pro / OpenPBS and Torque: render the qsub script, submit, ask for the state, cancel.

No PBS server can be installed on the machines this is developed on: the scripts are pinned by golden
files and the qsub/qstat/qdel edges are tested against a labelled emulation of those commands; the rank
start (mpiexec through the launcher) is tested with a real Open MPI mpirun.
"""

from __future__ import annotations

import re
import shutil
from typing import Any

from .. import __version__
from ..errors import SchedulerError
from ..render import render
from ..spec import JobSpec
from . import JobStatus, Submission, run_command, script_env, submit_with
from .slurm import launch_command

TEMPLATE = "pbs.qsub.j2"
# job_state letters; F (PBS Pro) and C (Torque) are finished: the exit status says how.
_STATES = {"Q": "PENDING", "H": "PENDING", "W": "PENDING", "T": "PENDING", "S": "SUSPENDED", "R": "RUNNING",
           "E": "COMPLETING", "B": "RUNNING", "X": "COMPLETED", "F": "COMPLETED", "C": "COMPLETED"}


def available() -> bool:
    return shutil.which("qsub") is not None


def walltime(time: str) -> str:
    """A time in one of Slurm's formats (as --time takes them, already validated) as PBS's H:MM:SS."""
    day_text, dash, rest = time.partition("-")
    if not dash:
        day_text, rest = "0", time
    parts = [int(p) for p in rest.split(":")]
    if dash:  # D-H, D-H:M, D-H:M:S
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:  # H:M:S
        h, m, s = parts
    else:  # M or M:S
        h, m, s = 0, parts[0], parts[1] if len(parts) == 2 else 0
    total = ((int(day_text) * 24 + h) * 60 + m) * 60 + s
    return f"{total // 3600:d}:{total // 60 % 60:02d}:{total % 60:02d}"


def directives(spec: JobSpec) -> list[str]:
    tpn = spec.ntasks_per_node
    cpus = tpn * (spec.per_task_cpus or 1)
    out = []
    if spec.pbs_flavour == "torque":
        gpus = f":gpus={spec.gpus_per_node}" if spec.gpus_per_node else ""
        out.append(f"-l nodes={spec.nodes}:ppn={cpus}{gpus}")
        if spec.mem:
            out.append(f"-l mem={spec.mem.lower()}b" if spec.mem[-1].isalpha() else f"-l mem={spec.mem}mb")
    else:
        chunk = f"select={spec.nodes}:ncpus={cpus}:mpiprocs={tpn}"
        if spec.gpus_per_node:
            chunk += f":ngpus={spec.gpus_per_node}"
        if spec.mem:
            chunk += f":mem={spec.mem.lower()}b" if spec.mem[-1].isalpha() else f":mem={spec.mem}mb"
        out.append(f"-l {chunk}")
        out.append("-l place=scatter:excl" if spec.exclusive else "-l place=scatter")  # one chunk per node
    if spec.time and spec.time.upper() not in ("UNLIMITED", "INFINITE"):
        out.append(f"-l walltime={walltime(spec.time)}")
    if spec.partition:
        out.append(f"-q {spec.partition}")
    if spec.account:
        out.append(f"-A {spec.account}")
    out.append("-j oe")
    out.extend(spec.sbatch_args)
    return out


def mpiexec_args(spec: JobSpec, env: list[tuple[str, str]]) -> tuple[list[str], str | None]:
    """The flags of the site's MPI, and its hostfile flag (the hostfile itself is $PBS_NODEFILE)."""
    tpn = spec.ntasks_per_node
    if spec.mpi == "openmpi":
        # Open MPI forwards only the variables named with -x (and warns about unset ones).
        names = ["PBS_NODEFILE", "PBS_JOBID", "PATH", *(k for k, _ in env)]
        forwards = [a for n in dict.fromkeys(names) for a in ("-x", n)]
        return ["-np", str(spec.world_size), "--map-by", f"ppr:{tpn}:node", "--tag-output", *forwards], "--hostfile"
    if spec.mpi == "mpich":
        return ["-n", str(spec.world_size), "-ppn", str(tpn), "-genvall", "-prepend-rank"], "-f"
    depth = spec.per_task_cpus or 1  # Cray PALS places by its own node list
    return ["-n", str(spec.world_size), "--ppn", str(tpn), "--depth", str(depth), "--cpu-bind", "depth",
            "--label"], None


def script_context(spec: JobSpec) -> dict[str, Any]:
    env = script_env(spec)
    args, hostfile_flag = mpiexec_args(spec, env)
    return {
        "version": __version__, "flavour": f"PBS {spec.pbs_flavour}", "mpi": spec.mpi,
        "world_size": spec.world_size, "nodes": spec.nodes, "tasks_per_node": spec.ntasks_per_node,
        "directives": directives(spec), "setup": list(spec.setup), "env": env, "log_dir": spec.log_dir,
        "workdir": spec.workdir, "mpiexec_args": args, "hostfile_flag": hostfile_flag,
        "launch_cmd": launch_command(spec),
    }


def render_script(spec: JobSpec, template_dir: str | None = None) -> str:
    return render(TEMPLATE, script_context(spec), template_dir)


def qsub_command(spec: JobSpec, script_path: str) -> list[str]:
    # A directory as -o: PBS names the file after the job id inside it.
    return ["qsub", "-N", spec.name, "-o", spec.log_dir.rstrip("/") + "/", script_path]


def submit(spec: JobSpec, script_text: str) -> Submission:
    """Save the script beside the logs, qsub it, and keep a record; SchedulerError when PBS refuses."""

    def parse(out: str) -> str | None:  # 1234.server, 1234[].server (arrays)
        return out.split(".", 1)[0] if re.fullmatch(r"\d+(\[\d*\])?(\.[\w.-]+)?", out) else None

    return submit_with(spec, script_text, "pbs", "qsub", qsub_command, parse)


def status(job_id: str, log_dir: str | None = None) -> JobStatus:
    """qstat -x -f (PBS Pro keeps finished jobs with -x), else qstat -f (Torque)."""
    try:
        text = run_command(["qstat", "-x", "-f", job_id], timeout=30).stdout
    except SchedulerError:
        text = run_command(["qstat", "-f", job_id], timeout=30).stdout
    fields = dict(re.findall(r"^\s*(job_state|Exit_status|exit_status|exec_host)\s*=\s*(\S+)", text, re.M))
    letter = fields.get("job_state", "")
    if letter not in _STATES:
        raise SchedulerError(f"qstat -f {job_id}: unknown job_state {letter!r}")
    state = _STATES[letter]
    code_text = fields.get("Exit_status") or fields.get("exit_status")
    code = int(code_text) if code_text and code_text.lstrip("-").isdigit() else None
    if state == "COMPLETED":
        if code is None:
            code = 0
        if code != 0:
            state = "FAILED"
        if code < 0:  # PBS's own negative codes: the job never ran properly
            code = 1
        return JobStatus(state, code, fields.get("exec_host"))
    return JobStatus(state, None, fields.get("exec_host"))


def cancel(job_id: str) -> None:
    run_command(["qdel", job_id], timeout=30)
