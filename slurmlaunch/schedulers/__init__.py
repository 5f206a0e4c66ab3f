"""Thin edges to the schedulers: the only modules that run scheduler commands."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import SchedulerError
from ..spec import JobSpec


@dataclass(frozen=True)
class JobStatus:
    state: str  # Slurm's words: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: int | None = None  # known once the job has ended
    nodes: str | None = None
    elements: dict[str, str] | None = None  # a job array's elements: index -> "STATE" or "STATE CODE"
    elapsed: str | None = None  # as Slurm shows it: [D-][HH:]MM:SS

    @property
    def finished(self) -> bool:
        return self.state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                                  "REQUEUED", "RESIZING", "STOPPED", "SIGNALING", "STAGE_OUT", "UNKNOWN")


def job_status(edge: Any, job_id: str, log_dir: str, indices: Sequence[int] = ()) -> JobStatus:
    """A job's state from its scheduler edge; with ``indices``, a job array's (all its elements at once)."""
    st: JobStatus = edge.array_status(job_id, log_dir, list(indices)) if indices else edge.status(job_id, log_dir)
    return st


def run_command(cmd: Sequence[str], timeout: float = 60.0, input_text: str | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a scheduler command without a shell; failures raise SchedulerError with the command and output."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, input=input_text,
                              env=env, errors="replace")
    except FileNotFoundError:
        raise SchedulerError(f"{cmd[0]!r} not found on PATH (is the scheduler's client installed?)") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"no answer within {timeout:.0f}s from: {shlex.join(cmd)}") from None
    if proc.returncode != 0:
        output = (proc.stderr.strip() or proc.stdout.strip() or "(no output)").replace("\n", " | ")
        raise SchedulerError(f"{shlex.join(cmd)} failed (exit {proc.returncode}): {output}")
    return proc


def write_private(path: str, text: str, mode: int = 0o640) -> None:
    """Write a file that is not world-writable (nor world-readable): scripts and records hold env values."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def make_log_dir(path: str) -> None:
    os.makedirs(path, mode=0o750, exist_ok=True)


def write_record(spec: JobSpec, job_id: str, scheduler: str, command: Sequence[str],
                 extra: dict[str, Any] | None = None) -> str:
    """The record of a submission beside its logs: what was asked, how it was submitted, where logs go."""
    path = os.path.join(spec.log_dir, f"job-{job_id}.json")
    record = {
        "job_id": job_id,
        "scheduler": scheduler,
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(command),
        "log_dir": spec.log_dir,
        "rank_log": os.path.join(spec.log_dir, f"job-{job_id}.{spec.log_unit}-{{{spec.log_unit}}}.log"),
        "spec": asdict(spec),
        **(extra or {}),
    }
    write_private(path, json.dumps(record, indent=2) + "\n")
    return path


def rank_log(spec: JobSpec, job_id: str, rank: int) -> str:
    """Rank ``rank``'s output file (in torchrun mode: node ``rank``'s, which holds all its ranks)."""
    return os.path.join(spec.log_dir, f"job-{job_id}.{spec.log_unit}-{rank}.log")


@dataclass(frozen=True)
class Submission:
    job_id: str  # as the scheduler prints it (PBS: 1234.server)
    script_path: str
    record_path: str
    command: list[str]


def submit_with(spec: JobSpec, script_text: str, scheduler: str, suffix: str,
                command: Callable[[JobSpec, str], list[str]], parse_id: Callable[[str], str | None]) -> Submission:
    """Save the script beside the logs, submit it, keep a record; SchedulerError (with the command and the
    scheduler's words) when the scheduler refuses or prints no job id. ``parse_id`` maps the command's
    output to the short job id that names the files, or None."""
    make_log_dir(spec.log_dir)
    pending = os.path.join(spec.log_dir, f"job-pending-{os.getpid()}.{suffix}")
    write_private(pending, script_text, 0o750)
    cmd = command(spec, pending)
    try:
        out = run_command(cmd).stdout.strip()
    except SchedulerError:
        os.unlink(pending)
        raise
    short = parse_id(out)
    if short is None:
        os.unlink(pending)
        raise SchedulerError(f"{shlex.join(cmd)} printed {out!r}, not a job id")
    script_path = os.path.join(spec.log_dir, f"job-{short}.{suffix}")
    os.replace(pending, script_path)
    cmd[-1] = script_path
    extra = {"script": script_path} if out == short else {"script": script_path, f"{scheduler}_job_id": out}
    record = write_record(spec, short, scheduler, cmd, extra)
    return Submission(out, script_path, record, cmd)


def script_env(spec: JobSpec) -> list[tuple[str, str]]:
    """The variables a batch script exports for every rank: --env, then --master-port, --rdzv-timeout."""
    env = list(spec.env)
    if spec.master_port is not None:
        env.append(("MASTER_PORT", str(spec.master_port)))
    if spec.rdzv_timeout is not None:
        env.append(("SLURMLAUNCH_RDZV_TIMEOUT", f"{spec.rdzv_timeout:g}"))
    return env
