"""Job commands over the records `submit` keeps: list, status, logs, cancel.

Every submission appends one line to a per-user index ($XDG_STATE_HOME/slurmlaunch/jobs.jsonl, by default
~/.local/state/slurmlaunch/jobs.jsonl) pointing at the record beside the job's logs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from .errors import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .spec import JobSpec


def index_path(environ: Mapping[str, str] = os.environ) -> str:
    from .paths import state_dir

    return os.path.join(state_dir(environ), "jobs.jsonl")


def remember(job_id: str, scheduler: str, record_path: str, name: str) -> None:
    path = index_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    line = json.dumps({"job_id": job_id, "scheduler": scheduler, "record": record_path, "name": name,
                       "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(line + "\n")


def entries() -> list[dict[str, Any]]:
    try:
        with open(index_path()) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def find(job_id: str) -> dict[str, Any]:
    """The record of ``job_id`` (the latest submission of that id: ids restart on a new cluster).
    ARRAYID_INDEX names one element of a job array (its record then has ``_element``)."""
    from .limits import MAX_ARRAY_INDEX, is_digits, parse_count

    base, sep, element = job_id.partition("_")
    if sep and is_digits(element):
        array = find(base)
        indices = array_indices(array)
        if parse_count(f"job {base}: array element", element, 0, MAX_ARRAY_INDEX) not in indices:
            raise SpecError(f"job {job_id!r}: job {base} has no array element {element} "
                            f"(its elements: {_shown_indices(indices)})")
        return {**array, "_element": element, "_full_id": f"{array['_full_id']}_{element}"}
    for entry in reversed(entries()):
        if entry["job_id"] == job_id or entry["job_id"].split(".", 1)[0] == job_id:
            try:
                with open(entry["record"]) as f:
                    record: dict[str, Any] = json.load(f)
            except (OSError, ValueError):
                raise SpecError(f"job {job_id}: its record {entry['record']!r} is gone") from None
            record["_full_id"] = entry["job_id"]
            return record
    raise SpecError(f"job {job_id!r} was not submitted from here (slurmlaunch list shows those that were)")


def _edge(record: Mapping[str, Any]) -> Any:
    from .schedulers import pbs, slurm

    scheduler = record["scheduler"]
    if scheduler == "local":
        raise SpecError(f"job {record['job_id']} ran on the local scheduler, in the foreground: it has ended")
    return pbs if scheduler == "pbs" else slurm


def recorded_spec(record: Mapping[str, Any]) -> JobSpec:
    """The job description a record holds, as far as the job commands need it (layout, array, mode)."""
    from .spec import JobSpec

    saved = record.get("spec", {})
    keep = ("nodes", "gpus_per_node", "tasks_per_node", "array", "mode", "nproc_per_node", "output_dir")
    sweep = tuple((k, tuple(v)) for k, v in saved.get("sweep", ()))
    return JobSpec(script="", sweep=sweep, **{k: saved[k] for k in keep if k in saved})


def array_indices(record: Mapping[str, Any]) -> list[int]:
    """The indices of a recorded job array's elements ([] for a plain job)."""
    return recorded_spec(record).array_indices


def _shown_indices(indices: list[int]) -> str:
    return ", ".join(map(str, indices[:10])) + (", ..." if len(indices) > 10 else "")


def _tag(record: Mapping[str, Any]) -> str:
    """What the job's file names carry: its id, or ARRAYID_INDEX for an array element."""
    element = record.get("_element")
    return f"{record['job_id']}_{element}" if element is not None else str(record["job_id"])


def status(record: Mapping[str, Any]) -> dict[str, Any]:
    shown_id = _tag(record)
    if record["scheduler"] == "local":
        code = _exit_file(record)
        return {"job_id": shown_id, "scheduler": "local", "state": "COMPLETED" if code == 0 else "FAILED",
                "exit_code": code, "nodes": None, "elapsed": None}
    from .schedulers import job_status

    indices = array_indices(record) if record.get("_element") is None else []
    st = job_status(_edge(record), record["_full_id"], record["log_dir"], indices)
    info = {"job_id": shown_id, "scheduler": record["scheduler"], "state": st.state,
            "exit_code": st.exit_code, "nodes": st.nodes, "elapsed": st.elapsed}
    if st.elements is not None:
        info["elements"] = st.elements
    return info


def _exit_file(record: Mapping[str, Any]) -> int | None:
    try:
        with open(os.path.join(record["log_dir"], f"job-{_tag(record)}.exitcode")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def log_path(record: Mapping[str, Any], rank: int | None) -> str:
    log_dir, job = str(record["log_dir"]), _tag(record)
    indices = array_indices(record)
    if indices and record.get("_element") is None:
        raise SpecError(f"job {job} is an array of {len(indices)} jobs: name one, e.g. {job}_{indices[0]} "
                        f"(its elements: {_shown_indices(indices)})")
    if rank is not None and record["scheduler"] == "pbs":
        raise SpecError("logs --rank: under PBS every rank's lines are in the job's one output, tagged by "
                        "mpiexec (leave out --rank)")
    spec = recorded_spec(record)
    if rank is not None:  # in torchrun mode one file per node holds all its ranks
        return os.path.join(log_dir, f"job-{job}.{spec.log_unit}-{rank // spec.ranks_per_log}.log")
    if record["scheduler"] == "slurm":
        return os.path.join(log_dir, f"job-{job}.batch.log")
    if record["scheduler"] == "pbs":
        # qsub -o DIR/: PBS Pro writes DIR/<full id>.OU, Torque DIR/<name>.o<number>; mpiexec tags each
        # line with its rank, so one file holds every rank's output.
        full = str(record.get("pbs_job_id", job))
        for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
            if name.startswith(f"{full}.") or name.endswith(f".o{job}"):
                return os.path.join(log_dir, name)
        return os.path.join(log_dir, f"{full}.OU")
    return os.path.join(log_dir, f"job-{job}.{spec.log_unit}-0.log")


def cmd_list(as_json: bool) -> int:
    rows = entries()
    if as_json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        print(f"{row['job_id']:>12}  {row['scheduler']:<6} {row['submitted_at']}  {row['name']}")
    return 0


def cmd_status(job_id: str, as_json: bool) -> int:
    info = status(find(job_id))
    if as_json:
        print(json.dumps(info))
    else:
        code = "" if info["exit_code"] is None else f", exit code {info['exit_code']}"
        nodes = f" on {info['nodes']}" if info["nodes"] else ""
        elapsed = f", elapsed {info['elapsed']}" if info.get("elapsed") else ""
        print(f"job {info['job_id']} ({info['scheduler']}): {info['state']}{nodes}{elapsed}{code}")
        for index, state in info.get("elements", {}).items():
            print(f"  {info['job_id']}_{index}: {state}")
    return 0


def cmd_logs(job_id: str, rank: int | None, follow: bool) -> int:
    record = find(job_id)
    path = log_path(record, rank)
    if not follow:
        try:
            with open(path, "rb") as f:
                sys.stdout.buffer.write(f.read())
        except OSError as e:
            raise SpecError(f"no log {path!r} yet ({e.strerror})") from None
        return 0
    from .follow import follow as follow_job

    edge = _edge(record)
    return follow_job(_tag(record), lambda: edge.status(record["_full_id"], record["log_dir"]), path)


def cmd_cancel(job_id: str) -> int:
    record = find(job_id)
    _edge(record).cancel(record["_full_id"])
    print(f"cancelled job {record['_full_id']}")
    return 0
