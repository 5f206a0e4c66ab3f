"""doctor --allocate's probe job: made (validated, rendered), submitted, waited for, and its ranks' reports
read back as typed values (allocation/probe.py writes them)."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from ...allocation.probe import RankReport, report_name
from ...core.errors import SchedulerError
from ...core.jobfiles import JobFiles
from ...core.spec import JobSpec

REPORT_EVERY = 15.0  # seconds between "still PENDING" lines while the probe job is waited for


@dataclass(frozen=True)
class MissingReport:
    """A rank that wrote no report: why it is missing."""

    rank: int
    missing: str

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "missing": self.missing}


Report = RankReport | MissingReport


@dataclass(frozen=True)
class ProbeJob:
    """The probe job, rendered where doctor was asked (with --remote: on the laptop, so that the login node
    needs no Jinja2) and submitted where Slurm is; crosses that boundary as JSON."""

    spec: JobSpec
    script: str
    out_dir: str  # where the ranks write their reports
    scheduler: str = "slurm"  # whose script it is: slurm or pbs

    def to_json(self) -> str:
        return json.dumps({"spec": self.spec.values(), "script": self.script, "out_dir": self.out_dir,
                           "scheduler": self.scheduler})

    @classmethod
    def from_json(cls, text: str) -> ProbeJob:
        data = json.loads(text)
        return cls(JobSpec.of(**{k: _tuples(v) for k, v in data["spec"].items()}), str(data["script"]),
                   str(data["out_dir"]), str(data.get("scheduler", "slurm")))


def _tuples(value: Any) -> Any:
    """JSON's lists back as the tuples JobSpec holds."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


# Open MPI refuses to start ranks as root unless both are set; PBS passes nothing of the submitting shell's
# environment (its edge's exports_environment is False), so a probe job submitted by root under PBS carries
# them when doctor was given them (never otherwise: the consent is the user's).
_OMPI_AS_ROOT = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def probe_job(nodes: int, gpus: int, partition: str | None, timeout: float, *, workdir: str | None = None,
              python: str | None = None, setup: tuple[str, ...] = (), scheduler: str = "slurm") -> ProbeJob:
    """The probe job on ``nodes`` nodes, validated and rendered here for ``scheduler`` (slurm, pbs);
    ``workdir``, ``python`` and ``setup``: the remote's, for a job rendered here and submitted there (validated
    as this machine's would be). Reads OMPI_ALLOW_RUN_AS_ROOT[_CONFIRM] for a PBS job (see _OMPI_AS_ROOT)."""
    from ...schedulers.choice import scheduler as edge
    from ..resolve import resolve

    target = edge(scheduler)
    passes_env = target.exports_environment  # else the job has only what its script sets
    base = workdir or os.getcwd()
    out_dir = os.path.join(os.path.abspath(base), "slurmlaunch-logs", f"doctor-{int(time.time())}")
    spec = resolve(JobSpec.of(
        script="slurmlaunch.allocation.probe", module=True, args=(out_dir,), nodes=nodes, gpus_per_node=gpus,
        partition=partition, time="5", job_name="slurmlaunch-doctor", signal="none",
        env=(("SLURMLAUNCH_PROBE_TIMEOUT", f"{max(10.0, min(timeout / 2, 120.0)):g}"),
             ("SLURMLAUNCH_NO_PREFLIGHT", "1"),
             *((k, os.environ[k]) for k in _OMPI_AS_ROOT if not passes_env and os.environ.get(k))),
    ))
    if workdir is not None:
        spec = spec.changed(workdir=workdir, python=python or "python3", setup=(*spec.environment.setup, *setup))
    return ProbeJob(spec, target.render(spec), out_dir, scheduler)


def allocate(job: ProbeJob, timeout: float) -> tuple[list[Report], str]:
    """Submit the probe job and wait for it; returns the ranks' reports and the job id."""
    from ...schedulers.choice import scheduler

    edge = scheduler(job.scheduler)
    spec = job.spec
    os.makedirs(job.out_dir, exist_ok=True)
    sub = edge.submit(spec, job.script)
    sys.stderr.write(f"slurmlaunch doctor: probe job {sub.job_id} on {spec.resources.nodes} node(s), {spec.world_size} "
                     f"rank(s); waiting at most {timeout:.0f}s\n")
    start = time.monotonic()
    deadline = start + timeout
    seen, next_report = "", start + REPORT_EVERY
    while True:
        st = edge.status(sub.job_id, spec.log_dir)
        now = time.monotonic()
        # What is waited for, with the time so far: each state change, and a line every REPORT_EVERY s.
        if st.state != seen or now >= next_report:
            still = "still " if st.state == seen else ""
            sys.stderr.write(f"slurmlaunch doctor: probe job {sub.job_id} {still}{st.state} after "
                             f"{now - start:.0f}s\n")
            seen, next_report = st.state, now + REPORT_EVERY
        if st.finished:
            break
        if now > deadline:
            edge.cancel(sub.job_id)
            why = st.note or "is the partition busy?"  # the scheduler's own word on why it waits, when it says one
            raise SchedulerError(f"doctor: probe job {sub.job_id} did not finish within {timeout:.0f}s (still "
                                 f"{st.state}; cancelled); {why} (--timeout S waits longer)")
        time.sleep(1)
    return read_reports(job, sub.job_id), sub.job_id


def read_reports(job: ProbeJob, job_id: str) -> list[Report]:
    """Every rank's report, or why it is missing."""
    files = JobFiles(job.spec.log_dir, job_id, job.spec.log_unit, job.spec.ranks_per_log)
    reports: list[Report] = []
    for rank in range(job.spec.world_size):
        try:
            with open(os.path.join(job.out_dir, report_name(rank))) as f:
                reports.append(RankReport.from_json(json.load(f)))
        except (OSError, ValueError, KeyError, TypeError):
            reports.append(MissingReport(rank, f"no report (see {files.rank_log(rank)})"))
    return reports


def gpu_problem(reports: list[Report], gpus: int) -> str | None:
    """With --gpus-per-node G > 0, every rank must see a CUDA device through torch: the ranks that do not."""
    if gpus == 0:
        return None
    blind = sorted(r.rank for r in reports if isinstance(r, RankReport) and not r.torch.cuda)
    if not blind:
        return None
    return (f"--gpus-per-node {gpus} was asked for, but rank(s) {', '.join(map(str, blind))} see no CUDA device "
            f"(torch.cuda.is_available() is False, or torch did not import): this site cannot serve the request "
            f"as given")


def rank_rows(reports: list[Report]) -> tuple[list[list[str]], bool]:
    rows, healthy = [], True
    mark = {True: "ok", False: "FAIL"}
    for r in reports:
        if isinstance(r, MissingReport):
            rows.append([str(r.rank), "?", "FAIL", "FAIL", "?", "?", r.missing])
            healthy = False
            continue
        gpus = f"{r.gpus.visible} (device {r.gpus.local_device})" if r.gpus.visible else f"none ({r.gpus.dev} in /dev)"
        torch = r.torch.detail if r.torch.ok else "FAIL: " + r.torch.detail
        rows.append([str(r.rank), r.host, f"{mark[r.resolve.ok]} {r.master_addr} -> {r.resolve.detail}",
                     f"{mark[r.port.ok]} {r.port.detail}", gpus, r.python.detail, torch])
        healthy = healthy and r.resolve.ok and r.port.ok
    return rows, healthy
