"""`slurmlaunch doctor`: what this Slurm site accepts, checked from the login node before an allocation is
spent; with --allocate N, a tiny job on N nodes that checks what the ranks will need (see probe.py).

What it learns that submission can use (the GPU request style) is kept per cluster in
$XDG_STATE_HOME/slurmlaunch/site.json; `submit` reads it when --gpu-flag was given neither on the command
line nor in a profile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..allocation.probe import report_name
from ..core.errors import SchedulerError, SpecError
from ..core.jobfiles import JobFiles
from .site import cluster_name, remember_site, try_command

COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel")
REPORT_EVERY = 15.0  # seconds between "still PENDING" lines while the probe job is waited for


@dataclass
class Check:
    name: str
    state: str  # ok, warn, fail
    detail: str


def slurm_version(text: str) -> tuple[int, int] | None:
    """("slurm 22.05.8" | "slurm-wlm 23.11.4") -> (22, 5)."""
    m = re.search(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def choose_gpu_flag(per_node_ok: bool, gres_ok: bool) -> str | None:
    """The style submission should use: --gpus-per-node where accepted (it also works with --gpus-per-task
    sites), else --gres=gpu:N, else None (neither: no GPUs in the partition, or a site-specific GRES name)."""
    return "gpus-per-node" if per_node_ok else "gres" if gres_ok else None


def login_checks(partition: str | None) -> tuple[list[Check], list[list[str]], dict[str, Any]]:
    """(checks, partition table rows, facts to remember)."""
    checks: list[Check] = []
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    checks.append(Check("commands", "fail" if missing else "ok",
                        f"missing: {', '.join(missing)}" if missing else ", ".join(COMMANDS) + " on PATH"))
    if "sbatch" in missing or "scontrol" in missing:
        return checks, [], {}
    up, out = try_command(["scontrol", "ping"], timeout=15)
    checks.append(Check("controller", "ok" if up and "UP" in out else "fail", out.replace("\n", "; ")))
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
    rows = [line.split("|") for line in table.splitlines() if line.count("|") == 6] if ok else []
    checks.append(Check("partitions", "ok" if rows else "warn", f"{len(rows)} partition(s)" if rows else table))
    return checks, rows, facts


def gpus_per_node(gres: str) -> str:
    m = re.search(r"gpu(?::[^:(,]+)?:(\d+)", gres)
    return m.group(1) if m else "0"


def render_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in [header, *rows]) + "\n"


def allocate(nodes: int, gpus: int, partition: str | None, timeout: float) -> tuple[list[dict[str, Any]], str]:
    """Submit the probe on ``nodes`` nodes and wait for it; returns the ranks' records and the job id."""
    from ..core.spec import JobSpec
    from ..schedulers import slurm
    from .resolve import resolve

    out_dir = os.path.abspath(os.path.join("slurmlaunch-logs", f"doctor-{int(time.time())}"))
    os.makedirs(out_dir, exist_ok=True)
    spec = resolve(JobSpec(
        script="slurmlaunch.allocation.probe", module=True, args=(out_dir,), nodes=nodes, gpus_per_node=gpus,
        partition=partition, time="5", job_name="slurmlaunch-doctor", signal="none",
        env=(("SLURMLAUNCH_PROBE_TIMEOUT", f"{max(10.0, min(timeout / 2, 120.0)):g}"),
             ("SLURMLAUNCH_NO_PREFLIGHT", "1")),
    ))
    sub = slurm.submit(spec, slurm.render_script(spec))
    sys.stderr.write(f"slurmlaunch doctor: probe job {sub.job_id} on {nodes} node(s), {spec.world_size} "
                     f"rank(s); waiting at most {timeout:.0f}s\n")
    start = time.monotonic()
    deadline = start + timeout
    seen, next_report = "", start + REPORT_EVERY
    while True:
        st = slurm.status(sub.job_id, spec.log_dir)
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
            slurm.cancel(sub.job_id)
            raise SchedulerError(f"doctor: probe job {sub.job_id} did not finish within {timeout:.0f}s (still "
                                 f"{st.state}; cancelled); is the partition busy? (--timeout S waits longer)")
        time.sleep(1)
    files = JobFiles(spec.log_dir, sub.job_id, spec.log_unit, spec.ranks_per_log)
    records = []
    for rank in range(spec.world_size):
        try:
            with open(os.path.join(out_dir, report_name(rank))) as f:
                records.append(json.load(f))
        except (OSError, ValueError):
            records.append({"rank": rank, "missing": f"no report (see {files.rank_log(rank)})"})
    return records, sub.job_id


def gpu_problem(records: list[dict[str, Any]], gpus: int) -> str | None:
    """With --gpus-per-node G > 0, every rank must see a CUDA device through torch: the ranks that do not."""
    if gpus == 0:
        return None
    blind = sorted(r["rank"] for r in records if "missing" not in r and not r["torch"].get("cuda"))
    if not blind:
        return None
    return (f"--gpus-per-node {gpus} was asked for, but rank(s) {', '.join(map(str, blind))} see no CUDA device "
            f"(torch.cuda.is_available() is False, or torch did not import): this site cannot serve the request "
            f"as given")


def rank_rows(records: list[dict[str, Any]]) -> tuple[list[list[str]], bool]:
    rows, healthy = [], True
    for r in records:
        if "missing" in r:
            rows.append([str(r["rank"]), "?", "FAIL", "FAIL", "?", "?", r["missing"]])
            healthy = False
            continue
        mark = {True: "ok", False: "FAIL"}
        gpus = r["gpus"]["CUDA_VISIBLE_DEVICES"]
        gpus = f"{gpus} (device {r['gpus']['local_device']})" if gpus else f"none ({r['gpus']['dev']} in /dev)"
        torch = r["torch"]["detail"] if r["torch"]["ok"] else "FAIL: " + r["torch"]["detail"]
        rows.append([str(r["rank"]), r["host"], f"{mark[r['resolve']['ok']]} {r['master_addr']} -> "
                     f"{r['resolve']['detail']}", f"{mark[r['port']['ok']]} {r['port']['detail']}", gpus,
                     r["python"]["detail"], torch])
        healthy = healthy and r["resolve"]["ok"] and r["port"]["ok"]
    return rows, healthy


def cmd_doctor(partition: str | None, as_json: bool, nodes: int | None, gpus: int, timeout: float, *,
               remote: str | None = None, remote_setup: list[str] | None = None, python: str | None = None) -> int:
    if nodes is not None and nodes < 1:
        raise SpecError(f"--allocate {nodes} is not valid (expected a number of nodes >= 1)")
    if remote is not None:
        from .remote_jobs import doctor_remote

        argv = [*(["--partition", partition] if partition else []), *(["--json"] if as_json else []),
                *(["--allocate", str(nodes), "--gpus-per-node", str(gpus), "--timeout", f"{timeout:g}"]
                  if nodes is not None else [])]
        return doctor_remote(remote, remote_setup or [], python, argv, timeout if nodes is not None else 0.0)
    if remote_setup or python:
        raise SpecError(f"{'--remote-setup' if remote_setup else '--python'}: only with doctor --remote "
                        f"[USER@]HOST[:DIR] (leave it out, or add --remote)")
    checks, partitions, facts = login_checks(partition)
    failed = any(c.state == "fail" for c in checks)
    cluster = cluster_name() if not failed else None
    if cluster and facts:
        remember_site(cluster, facts)
    records: list[dict[str, Any]] = []
    job = None
    if nodes is not None and not failed:
        records, job = allocate(nodes, gpus, partition, timeout)
    ranks, healthy = rank_rows(records)
    problem = gpu_problem(records, gpus) if records else None
    if as_json:
        print(json.dumps({"cluster": cluster, "checks": [c.__dict__ for c in checks], "problems": [
                              *(f"{c.name}: {c.detail}" for c in checks if c.state == "fail"),
                              *([problem] if problem else [])],
                          "partitions": [dict(zip(["partition", "avail", "nodes", "gres", "cpus", "memory",
                                                   "timelimit"], p, strict=True)) for p in partitions],
                          "probe_job": job, "ranks": records}, indent=2))
    else:
        out = sys.stdout
        out.write(f"cluster: {cluster or 'unknown'}\n")
        out.write(render_table(["check", "state", "detail"], [[c.name, c.state, c.detail] for c in checks]))
        if partitions:
            out.write("\n" + render_table(["partition", "avail", "nodes", "gpus/node", "cpus/node", "memory (MB)",
                                           "time limit"],
                                          [[p[0], p[1], p[2], gpus_per_node(p[3]), p[4], p[5], p[6]]
                                           for p in partitions]))
        if records:
            out.write(f"\nprobe job {job}:\n" + render_table(
                ["rank", "host", "MASTER_ADDR resolves", "MASTER_PORT", "GPUs", "python", "torch"], ranks))
        if problem:
            out.write(f"\nFAIL: {problem}\n")
    return 1 if failed or not healthy or problem else 0
