"""The per-user index of submissions ($XDG_STATE_HOME/slurmlaunch/jobs.jsonl): one JSON line per job, pointing
at its record. Written at submission (by app/submit.py for Slurm and PBS, by the local scheduler for its own jobs);
read by the job commands (app/jobs/commands.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

from ..allocation.smallfile import read_small

MAX_RECORD_BYTES = 4 << 20  # a record is a few KB; a bigger "record" is not one of ours


def index_path(environ: Mapping[str, str] = os.environ) -> str:
    from ..core.paths import state_dir

    return os.path.join(state_dir(environ), "jobs.jsonl")


def remember(job_id: str, scheduler: str, record_path: str, name: str, remote: str | None = None) -> None:
    """Append a submission to the index; ``remote``: the ssh destination the job lives on (its record is
    here, its files there)."""
    path = index_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    row = {"job_id": job_id, "scheduler": scheduler, "record": record_path, "name": name,
           "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if remote:
        row["remote"] = remote
    line = json.dumps(row)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(line + "\n")


def read_bounded(path: str, limit: int = MAX_RECORD_BYTES) -> bytes:
    """A record's (or another small file's) whole bytes; OSError for a link, a device, a FIFO, or a file
    over ``limit``: a tampered index must not make us read /dev/zero forever or block on a pipe."""
    return read_small(path, limit, whole=True)
