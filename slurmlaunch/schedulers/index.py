"""The per-user index of submissions ($XDG_STATE_HOME/slurmlaunch/jobs.jsonl): one JSON line per job, pointing
at its record. Written at submission (by app/submit.py for Slurm and PBS, by the local scheduler for its own jobs);
read by the job commands (app/jobs.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping


def index_path(environ: Mapping[str, str] = os.environ) -> str:
    from ..core.paths import state_dir

    return os.path.join(state_dir(environ), "jobs.jsonl")


def remember(job_id: str, scheduler: str, record_path: str, name: str) -> None:
    path = index_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    line = json.dumps({"job_id": job_id, "scheduler": scheduler, "record": record_path, "name": name,
                       "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(line + "\n")
