"""Slurm: render the sbatch script, submit it, ask for its state, cancel it."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence

from ..core.errors import SchedulerError, SpecError
from ..core.hostlist import expand
from ..core.jobfiles import JobFiles
from ..core.spec import JobSpec
from ..render.slurm_script import file_tag
from ..render.slurm_script import render_script as render_script  # the edge renders what it submits
from . import JobStatus, Submission, array_outcome, is_final, rank_log, run_command, submit_with
from .interface import QueuedEdge
from .runner import read_file, which


def available() -> bool:
    return shutil.which("sbatch") is not None


def controller_answers(timeout: float = 10.0) -> tuple[bool, str]:
    """Whether a Slurm controller answers `scontrol ping` (an installed client alone is no cluster)."""
    try:
        out = run_command(["scontrol", "ping"], timeout=timeout).stdout
    except SchedulerError as e:
        return False, str(e)
    return "UP" in out, out.strip()



def sbatch_command(spec: JobSpec, script_path: str) -> list[str]:
    return [
        "sbatch", "--parsable",
        f"--job-name={spec.name}",
        f"--output={JobFiles(spec.log_dir, file_tag(spec)).batch_log}",
        f"--chdir={spec.workdir}",
        script_path,
    ]


def parse_job_id(out: str) -> str | None:
    """The job id in what sbatch --parsable printed ("1234" or "1234;cluster"), or None."""
    job_id = out.split(";")[0]
    return job_id if job_id.isdigit() else None


def mpi_plugins(listing: str) -> list[str]:
    """The --mpi types in what `srun --mpi=list` printed: the plugin names (one per indented line) and the
    versioned ones of its "specific pmix plugin versions available: pmix_v4,..." line."""
    names = []
    for line in listing.splitlines():
        if line[:1] in (" ", "\t") and line.strip():
            names.append(line.strip())
        elif "versions available:" in line:
            names += [v.strip() for v in re.split(r"[,\s]+", line.split("available:", 1)[1]) if v.strip()]
    return names


def check_mpi_plugin(mpi: str) -> None:
    """SpecError when this cluster's srun has no mpi plugin ``mpi`` (else the job would wait in the queue to fail
    at its step); when `srun --mpi=list` itself fails, the step decides."""
    try:
        listing = run_command(["srun", "--mpi=list"], timeout=30)
    except SchedulerError:
        return
    found = mpi_plugins(listing.stdout + listing.stderr)
    if found and mpi not in found:
        raise SpecError(f"--mpi {mpi}: this cluster's srun has no such mpi plugin (expected one of "
                        f"{', '.join(found)}, as `srun --mpi=list` shows)")


def submit(spec: JobSpec, script_text: str) -> Submission:
    """Save the script beside the logs, sbatch it, and keep a record; SchedulerError when Slurm refuses,
    SpecError (nothing submitted) when --mpi names a plugin this cluster's srun lacks."""
    if spec.mpi is not None:
        check_mpi_plugin(spec.mpi)
    return submit_with(spec, script_text, "slurm", "sbatch", sbatch_command, parse_job_id)


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
        if not is_final(state):
            return JobStatus(state, None, nodes or None, elapsed=elapsed or None)
    fields = _accounting(job_id) or _scontrol(job_id)
    code: int | None = None
    if log_dir:
        code = _exit_code(JobFiles(log_dir, job_id).exit_code)
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


def _exit_code(path: str) -> int | None:
    """The code in the exit-code file the batch script wrote (read where the job ran: through the runner)."""
    text = read_file(path, limit=64)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _accounting(job_id: str) -> dict[str, str]:
    """The job's line from sacct, or {} where there is no accounting (or it does not know the job yet)."""
    if not which("sacct"):
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


def accounted_states(job_ids: list[str]) -> dict[str, str]:
    """sacct's state of each of ``job_ids`` (plain jobs or job arrays), in one call: job id -> its state word
    (CANCELLED of "CANCELLED by 1000"); an array is COMPLETED when every element is, else the state of its
    first element (by index) that is not. {} where there is no accounting; a job sacct does not know is left
    out."""
    if not job_ids or not which("sacct"):
        return {}
    try:
        out = run_command(["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,State"],
                          timeout=30).stdout
    except SchedulerError:
        return {}  # "Slurm accounting storage is disabled", or slurmdbd is down
    elements: dict[str, list[tuple[int, str]]] = {}
    for line in out.splitlines():
        tag, sep, state = line.partition("|")
        base, _, index = tag.partition("_")
        if sep and base in job_ids and state.split():
            # an element's index, or a range of elements never started ("[3-5]"): after the started ones
            elements.setdefault(base, []).append((int(index) if index.isdigit() else 1 << 62, state.split()[0]))
    out_states: dict[str, str] = {}
    for base, states in elements.items():
        states.sort()
        unfinished = [state for _, state in states if state != "COMPLETED"]
        out_states[base] = unfinished[0] if unfinished else "COMPLETED"
    return out_states


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
        if index.isdigit() and state and not is_final(state):
            live[int(index)] = (state, nodes)
    return array_outcome(job_id, log_dir, indices, live, {}, "cancelled or timed out")


def cancel(job_id: str) -> None:
    run_command(["scancel", job_id], timeout=30)


def _rank_log(spec: JobSpec, job_id: str, rank: int) -> str | None:
    return None if spec.is_array else rank_log(spec, job_id, rank)  # srun writes one file per rank


def _batch_log(spec: JobSpec, job_id: str) -> str | None:
    return None if spec.is_array else JobFiles(spec.log_dir, job_id).batch_log


def node_commands(job_id: str, nodes: str, argv: Sequence[str]) -> dict[str, list[str]]:
    """A step of one task on each node of the running job, sharing the ranks' resources (--overlap, Slurm
    20.11+): it runs in the job's cgroup, as the job's user, so it may signal the ranks there."""
    return {node: ["srun", "--overlap", f"--jobid={job_id}", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
                   "--quiet", *argv] for node in expand(nodes)}


# The slurm edge as a Scheduler (schedulers.interface)
EDGE = QueuedEdge("slurm", available, render_script, sbatch_command, submit, status, array_status, cancel, _rank_log,
                  _batch_log, node_commands)
