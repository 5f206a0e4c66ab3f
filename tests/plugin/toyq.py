"""A scheduler slurmlaunch does not ship, written as a plug-in package would write one: "toyq", a queue whose
clients are three stand-in commands (toyq-submit, toyq-stat, toyq-del: standin.py, put on PATH by the tests).
It uses only the public plug-in surface: slurmlaunch.schedulers (submit_with, JobStatus, write_private's
kin), slurmlaunch.schedulers.interface (QueuedEdge), slurmlaunch.schedulers.support (Refusals) and
slurmlaunch.core (JobSpec, JobFiles). It is registered through the entry point group
``slurmlaunch.schedulers`` of a distribution the tests write (test_out_of_tree.py); no file of slurmlaunch/
names it."""

from __future__ import annotations

import shlex
import shutil

from slurmlaunch.core.errors import SchedulerError
from slurmlaunch.core.jobfiles import JobFiles
from slurmlaunch.core.spec import JobSpec
from slurmlaunch.schedulers import Held, JobStatus, Submission, run_command, submit_with
from slurmlaunch.schedulers.interface import QueuedEdge
from slurmlaunch.schedulers.support import Refusals

NAME = "toyq"
JOB_ID_VAR = "TOYQ_JOB_ID"  # what toyq-submit gives the script: its job's id


def render(spec: JobSpec, template_dir: str | None = None) -> str:
    """One rank on one node: the script runs SCRIPT with its arguments in the job's directory through the
    launcher, its output in rank 0's log and its exit code in the job's exit-code file (what `status` reads), as
    JobFiles names them."""
    files = JobFiles(spec.log_dir, "${" + JOB_ID_VAR + "}", spec.log_unit)
    # the one rank through slurmlaunch's launcher, which reads its place from RANK and WORLD_SIZE (read_preset)
    run = "RANK=0 WORLD_SIZE=1 " + shlex.join([spec.program.python, "-u", "-m", "slurmlaunch", "launch",
                                              *(["-m"] if spec.program.module else []), spec.program.script,
                                              *spec.program.args])
    return "\n".join([
        "#!/bin/bash",
        f"# toyq job {spec.name}: {spec.world_size} rank",
        f"cd {shlex.quote(spec.program.workdir)}",
        f'{run} > "{files.log(0)}" 2>&1',
        "code=$?",
        f'echo "$code" > "{files.exit_code}"',
        'exit "$code"',
        "",
    ])


def submit_command(spec: JobSpec, script_path: str) -> list[str]:
    return ["toyq-submit", script_path]


def identity(job_id: str) -> dict[str, str] | None:
    """What toyq says of the job that a later job of the same id cannot share: its submit time."""
    try:
        said = run_command(["toyq-stat", job_id]).stdout.splitlines()
    except SchedulerError as e:
        if "no job" in str(e):
            return None
        raise
    return {"submitted": said[1].split()[1]}


# Submitted on hold, released once its record (which names its identity) is in place, as Slurm's and PBS's are.
HELD = Held(
    hold=lambda spec, command: [command[0], "--hold", *command[1:]],
    cluster=lambda: {},
    identity=identity,
    prepare=lambda spec, command_id, short, log_dir: None,
    release=lambda spec, command_id: release(command_id),
    cancel=lambda job_id: cancel(job_id),
)


def release(job_id: str) -> None:
    run_command(["toyq-release", job_id])


def submit(spec: JobSpec, script_text: str) -> Submission:
    return submit_with(spec, script_text, NAME, "toyq", submit_command, lambda out: out if out.isdigit() else None,
                       held=HELD)


def job_status(job_id: str, log_dir: str | None) -> JobStatus:
    try:
        said = run_command(["toyq-stat", job_id]).stdout.split()
    except SchedulerError:
        return JobStatus("UNKNOWN")
    if said[0] in ("HELD", "RUNNING"):
        return JobStatus("PENDING" if said[0] == "HELD" else "RUNNING", None, "toyhost")
    if said[0] == "CANCELLED":
        return JobStatus("CANCELLED", None)
    code = int(said[1])
    return JobStatus("COMPLETED" if code == 0 else "FAILED", code)


def array_status(job_id: str, log_dir: str, indices: list[int]) -> JobStatus:
    raise SchedulerError("toyq runs no job arrays")


def cancel(job_id: str) -> None:
    run_command(["toyq-del", job_id])


EDGE = QueuedEdge(
    name=NAME,
    title="Toy queue",
    client="toyq-submit",
    readers=("read_preset",),
    refusals=Refusals(not_carried_out={"nodes": "toyq runs one node", "array": "toyq runs no job arrays"}),
    script_suffix="toyq",
    is_available=lambda: shutil.which("toyq-submit") is not None,
    check_auto=lambda: (True, ""),
    render_script=render,
    submit_script_command=submit_command,
    submit_script=submit,
    parse_id=lambda out: out if out.isdigit() else None,
    job_status=job_status,
    array_status=array_status,
    cancel_job=cancel,
    rank_log_of=lambda spec, job_id, rank: JobFiles(spec.log_dir, job_id, spec.log_unit).log(rank),
    batch_log_of=lambda spec, job_id: None,
    output_log_of=lambda log_dir, job, printed: None,
    identity_of=identity,
    warning_signal=False,
    job_id_variable=JOB_ID_VAR,  # the Python API's ranks read their job's id from it
)
