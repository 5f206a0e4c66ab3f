"""`slurmlaunch doctor`: what this Slurm site accepts, checked from the login node before an allocation is
spent; with --allocate N, a tiny job on N nodes that checks what the ranks will need (see probe.py).

What it learns that submission can use (the GPU request style) is kept per cluster in
$XDG_STATE_HOME/slurmlaunch/site.json; `submit` reads it when --gpu-flag was given neither on the command
line nor in a profile.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass, fields
from typing import Any

from ...core.errors import SchedulerError, SpecError
from ..site import remember_site, try_command
from .check import Check
from .probe import ProbeJob, Report, allocate, gpu_problem, probe_job, rank_rows

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ...schedulers.interface import Scheduler

COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel")


@dataclass(frozen=True)
class Partition:
    """One row of sinfo's partition table (its words, as sinfo prints them)."""

    partition: str
    avail: str
    nodes: str
    gres: str
    cpus: str
    memory: str
    timelimit: str

    def to_json(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def slurm_version(text: str) -> tuple[int, int] | None:
    """("slurm 22.05.8" | "slurm-wlm 23.11.4") -> (22, 5)."""
    m = re.search(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def choose_gpu_flag(per_node_ok: bool, gres_ok: bool) -> str | None:
    """The style submission should use: --gpus-per-node where accepted (it also works with --gpus-per-task
    sites), else --gres=gpu:N, else None (neither: no GPUs in the partition, or a site-specific GRES name)."""
    return "gpus-per-node" if per_node_ok else "gres" if gres_ok else None


def configured(edge: Scheduler) -> bool:
    """Whether a cluster of ``edge``'s is configured here, as --scheduler auto tells it (its auto_check: not
    taken only where none is; a silent controller of a configured one is an error there)."""
    try:
        taken, _ = edge.auto_check()
    except SchedulerError:
        return True
    return taken


def login_checks(partition: str | None, edge: Scheduler) -> tuple[list[Check], list[Partition], dict[str, Any]]:
    """(checks, partition table rows, facts to remember); ``edge``: Slurm's, asked whether a cluster is
    configured where its controller does not answer."""
    checks: list[Check] = []
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    checks.append(Check("commands", "fail" if missing else "ok",
                        f"missing: {', '.join(missing)}" if missing else ", ".join(COMMANDS) + " on PATH"))
    if "sbatch" in missing or "scontrol" in missing:
        return checks, [], {}
    up, out = try_command(["scontrol", "ping"], timeout=15)
    said = out.replace("\n", "; ")
    if not up and not configured(edge):  # an installed client alone: scontrol's own words do not say so
        said = ("no Slurm cluster is configured here (no slurm.conf, SLURM_CONF or DNS SRV record: on a login "
                "node the site's Slurm module sets it up; the dev cluster prints its SLURM_CONF; a submit "
                f"without a cluster runs on this machine); scontrol said: {said}")
    checks.append(Check("controller", "ok" if up and "UP" in out else "fail", said))
    if not (up and "UP" in out):
        return checks, [], {}
    _, text = try_command(["sbatch", "--version"])
    version = slurm_version(text)
    facts: dict[str, Any] = {"slurm_version": text}
    if version is None:
        checks.append(Check("version", "warn", f"cannot read a version from {text!r}"))
    elif version >= (22, 5):
        checks.append(Check("version", "ok", f"{text}: srun no longer inherits --cpus-per-task from the job "
                                             f"(SRUN_CPUS_PER_TASK); slurmlaunch passes it to srun itself"))
    else:
        checks.append(Check("version", "ok", f"{text}: srun inherits --cpus-per-task from the job"))
    has_sacct, _ = try_command(["sacct", "-n", "-X", "-S", "now"]) if shutil.which("sacct") else (False, "")
    checks.append(Check("accounting", "ok" if has_sacct else "warn",
                        "sacct answers" if has_sacct else "no accounting (sacct): finished jobs are known from "
                                                          "scontrol for MinJobAge seconds, then from the exit files"))
    if partition:  # what was asked for must exist: the probes below would only warn
        known, text = try_command(["scontrol", "show", "partition", partition])
        if not known:
            _, names = try_command(["sinfo", "-h", "-o", "%R"])
            checks.append(Check("partition", "fail", f"--partition {partition}: no such partition here (known: "
                                                    f"{', '.join(sorted(set(names.split()))) or 'none'})"))
            return checks, [], facts
        checks.append(Check("partition", "ok", f"{partition} exists"))
    where = [f"--partition={partition}"] if partition else []
    probe = ["sbatch", "--test-only", "--nodes=1", *where, "--wrap", "true"]
    per_node_ok, per_node = try_command([*probe[:2], "--gpus-per-node=1", *probe[2:]])
    gres_ok, gres = try_command([*probe[:2], "--gres=gpu:1", *probe[2:]])
    flag = choose_gpu_flag(per_node_ok, gres_ok)
    facts["gpu_flag"] = flag
    if flag is None:
        checks.append(Check("gpu request", "warn", "neither --gpus-per-node=1 nor --gres=gpu:1 is accepted "
                                                   f"{'in ' + partition if partition else 'here'}: {gres}"))
    else:
        refused = "" if per_node_ok else f" (--gpus-per-node refused: {per_node})"
        checks.append(Check("gpu request", "ok", f"--{flag}{'=N' if flag == 'gpus-per-node' else '=gpu:N'} "
                                                 f"accepted{refused}; submit uses it"))
    ok, table = try_command(["sinfo", "-h", "-o", "%P|%a|%D|%G|%c|%m|%l"])
    rows = [Partition(*line.split("|")) for line in table.splitlines() if line.count("|") == 6] if ok else []
    checks.append(Check("partitions", "ok" if rows else "warn", f"{len(rows)} partition(s)" if rows else table))
    return checks, rows, facts


def cluster(facts: dict[str, Any]) -> str | None:
    """The cluster's name as Slurm knows it (scontrol show config's ClusterName, as Slurm's edge's cluster()
    names it): its site.json key."""
    ok, out = try_command(["scontrol", "show", "config"])
    m = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.MULTILINE) if ok else None
    return m.group(1) if m else None


def gpus_per_node(gres: str) -> str:
    m = re.search(r"gpu(?::[^:(,]+)?:(\d+)", gres)
    return m.group(1) if m else "0"


def render_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in [header, *rows]) + "\n"


@dataclass(frozen=True)
class DoctorReport:
    """What doctor found (``--json`` prints to_json)."""

    cluster: str | None
    checks: list[Check]
    partitions: list[Partition]
    probe_job: str | None
    ranks: list[Report]
    problems: list[str]

    def to_json(self) -> str:
        return json.dumps({"cluster": self.cluster, "checks": [c.to_json() for c in self.checks],
                           "problems": self.problems, "partitions": [p.to_json() for p in self.partitions],
                           "probe_job": self.probe_job, "ranks": [r.to_json() for r in self.ranks]}, indent=2)

    def text(self) -> str:
        out = f"cluster: {self.cluster or 'unknown'}\n"
        out += render_table(["check", "state", "detail"], [[c.name, c.state, c.detail] for c in self.checks])
        if self.partitions:
            out += "\n" + render_table(["partition", "avail", "nodes", "gpus/node", "cpus/node", "memory (MB)",
                                         "time limit"], [[p.partition, p.avail, p.nodes, gpus_per_node(p.gres),
                                                          p.cpus, p.memory, p.timelimit] for p in self.partitions])
        if self.ranks:
            out += f"\nprobe job {self.probe_job}:\n" + render_table(
                ["rank", "host", "MASTER_ADDR resolves", "MASTER_PORT", "GPUs", "python", "torch"],
                rank_rows(self.ranks)[0])
        return out


def _checked() -> list[Scheduler]:
    """The schedulers doctor checks (each names its module of app/doctor/), in the registry's order."""
    from ...schedulers.registry import NAMES, scheduler

    return [e for e in map(scheduler, NAMES) if e.doctor_checks is not None]


def doctor_scheduler(requested: str, has_client: Callable[[Scheduler], bool] | None = None) -> str:
    """slurm or pbs: as named; auto is PBS where qsub is on PATH and sbatch is not, else Slurm (whose checks
    then say what is missing). ``has_client``: whether a client is there (default: on this PATH; doctor
    --remote: on the login node's)."""
    from ...schedulers.choice import login_choice
    from ...schedulers.registry import canonical

    checked = _checked()
    names = [e.name for e in checked]
    name = requested if requested == "auto" else canonical(requested)
    if name is None or (name != "auto" and name not in names):
        raise SpecError(f"--scheduler {requested!r} is not valid for doctor (expected auto, "
                        f"{', '.join(names[:-1])} or {names[-1]})")
    return login_choice(name, checked, has_client)


def cmd_doctor(partition: str | None, as_json: bool, nodes: int | None, gpus: int, timeout: float, *,
               remote_setup: list[str] | None = None, python: str | None = None,
               job: ProbeJob | None = None, scheduler: str = "auto") -> int:
    """`slurmlaunch doctor` here (doctor --remote: remote_doctor); ``job``: the probe job rendered elsewhere.
    ``scheduler``: auto, slurm or pbs (doctor_scheduler); each one's checks are its doctor_checks module's
    (Slurm's: login_checks above, PBS's: doctor/pbs.py)."""
    import importlib

    from ...schedulers.registry import scheduler as edge_of

    if nodes is not None and nodes < 1:
        raise SpecError(f"--allocate {nodes} is not valid (expected a number of nodes >= 1)")
    if remote_setup or python:
        raise SpecError(f"{'--remote-setup' if remote_setup else '--python'}: only with doctor --remote "
                        f"[USER@]HOST[:DIR] (leave it out, or add --remote)")
    name = job.scheduler if job is not None else doctor_scheduler(scheduler)
    edge = edge_of(name)
    assert edge.doctor_checks is not None
    # a module of app/doctor/ by its name there, or a plug-in's by its full dotted name
    checks_module = edge.doctor_checks if "." in edge.doctor_checks else f"{__package__}.{edge.doctor_checks}"
    site = importlib.import_module(checks_module)
    checks, partitions, facts = site.login_checks(partition, edge)
    failed = any(c.state == "fail" for c in checks)
    cluster = site.cluster(facts) if not failed else None
    if cluster and facts and edge.gpu_request_styles:  # what submit learns from it: the GPU request style
        remember_site(cluster, facts)
    reports: list[Report] = []
    job_id = None
    if nodes is not None and not failed:
        reports, job_id = allocate(job or probe_job(nodes, gpus, partition, timeout, scheduler=name), timeout)
    healthy = rank_rows(reports)[1]
    problem = gpu_problem(reports, gpus) if reports else None
    problems = [*(f"{c.name}: {c.detail}" for c in checks if c.state == "fail"), *([problem] if problem else [])]
    report = DoctorReport(cluster, checks, partitions, job_id, reports, problems)
    if as_json:
        print(report.to_json())
    else:
        sys.stdout.write(report.text() + (f"\nFAIL: {problem}\n" if problem else ""))
    return 1 if failed or not healthy or problem else 0
