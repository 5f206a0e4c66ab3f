"""`slurmlaunch doctor --scheduler pbs`: what a PBS Pro / OpenPBS site offers, checked from the login node
through its own clients (qstat -B/-Q -f -F json, pbsnodes -a -F json); --allocate's probe job is the same as
under Slurm (doctor/probe.py), rendered as a qsub script and followed through the PBS edge.

Checked against a real OpenPBS 23.06 (the PBS dev cluster, tests/real/test_pbs_real_doctor.py). Torque's clients
have no JSON form: there the server check fails and says so.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from ..site import try_command
from .check import Check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...schedulers.interface import Scheduler

COMMANDS = ("qsub", "qstat", "qdel", "pbsnodes")


def _json(argv: list[str], key: str) -> tuple[dict[str, Any] | None, str]:
    """``argv``'s JSON answer's ``key`` table, or (None, why)."""
    ok, out = try_command(argv, timeout=30)
    if not ok:
        return None, out
    try:
        table = json.loads(out).get(key)
    except (ValueError, AttributeError):
        return None, f"`{' '.join(argv)}` printed no JSON (Torque's qstat has no -F json): {out[:200]!r}"
    return (dict(table) if isinstance(table, dict) else {}), ""


def login_checks(queue: str | None, edge: Scheduler) -> tuple[list[Check], list[Any], dict[str, Any]]:
    """(checks, partition rows: none, PBS has no table of sinfo's shape, facts): the clients, the server
    (state, version, history of finished jobs), the queue (``queue``, else the server's default) enabled and
    started, the execution hosts (how many, their state, ncpus and ngpus)."""
    checks: list[Check] = []
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    checks.append(Check("commands", "fail" if missing else "ok",
                        f"missing: {', '.join(missing)}" if missing else ", ".join(COMMANDS) + " on PATH"))
    if "qsub" in missing or "qstat" in missing:
        return checks, [], {}
    servers, why = _json(["qstat", "-B", "-f", "-F", "json"], "Server")
    if not servers:
        checks.append(Check("server", "fail", why or "qstat -B names no server"))
        return checks, [], {}
    name, server = next(iter(servers.items()))
    state = str(server.get("server_state", "?"))
    version = str(server.get("pbs_version", "?"))
    facts: dict[str, Any] = {"pbs_server": name, "pbs_version": version}
    checks.append(Check("server", "ok" if state == "Active" else "fail", f"{name}: {state}, PBS {version}"))
    if state != "Active":
        return checks, [], facts
    history = str(server.get("job_history_enable", "False")) == "True"
    checks.append(Check("history", "ok" if history else "warn",
                        "job_history_enable: finished jobs stay in qstat -x" if history else
                        "job_history_enable is off: a finished job leaves qstat at once; status then knows only "
                        "what the job's exit-code file says"))
    wanted = queue or str(server.get("default_queue", ""))
    if not wanted:
        checks.append(Check("queue", "fail", "no --partition given and the server has no default_queue"))
        return checks, [], facts
    queues, why = _json(["qstat", "-Q", "-f", "-F", "json", wanted], "Queue")
    q = (queues or {}).get(wanted)
    if q is None:
        _, names = try_command(["qstat", "-Q"])
        known = sorted({line.split()[0] for line in names.splitlines()[2:] if line.split()})
        checks.append(Check("queue", "fail", f"--partition {wanted}: no such queue here (known: "
                                             f"{', '.join(known) or 'none'})" if queue else f"{why}"))
        return checks, [], facts
    usable = q.get("enabled") == "True" and q.get("started") == "True"
    checks.append(Check("queue", "ok" if usable else "fail",
                        f"{wanted} ({'given' if queue else 'the default'}): {q.get('queue_type', '?')}, "
                        f"enabled {q.get('enabled', '?')}, started {q.get('started', '?')}"))
    nodes, why = _json(["pbsnodes", "-a", "-F", "json"], "nodes")
    if nodes is None:
        checks.append(Check("nodes", "warn", why))
        return checks, [], facts
    free = sum(1 for n in nodes.values() if str(n.get("state", "")) == "free")
    shapes = sorted({(str((n.get("resources_available") or {}).get("ncpus", "?")),
                      str((n.get("resources_available") or {}).get("ngpus", 0))) for n in nodes.values()})
    checks.append(Check("nodes", "ok" if nodes else "fail",
                        f"{len(nodes)} host(s), {free} free; " + ", ".join(f"ncpus {c} ngpus {g}" for c, g in shapes)))
    gpus = any(str((n.get("resources_available") or {}).get("ngpus", "0")) not in ("0", "") for n in nodes.values())
    checks.append(Check("gpu request", "ok" if gpus else "warn",
                        "ngpus=G in every select chunk (--gpus-per-node G)" if gpus else
                        "no host offers ngpus: --gpus-per-node would ask for a resource none has"))
    return checks, [], facts


def cluster(facts: dict[str, Any]) -> str | None:
    """The cluster's name: its server's, as qstat -B named it."""
    server = facts.get("pbs_server")
    return str(server) if server is not None else None
