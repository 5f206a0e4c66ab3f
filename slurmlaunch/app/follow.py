"""Following a submitted job: its state changes with elapsed time, and rank 0's output as it comes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

from ..core.errors import SchedulerError, WaitTimeout
from ..schedulers import JobStatus

LOST_CONTACT_S = 120.0


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}"


class LogTail:
    """Prints what a file gains, from where we last read; the file may not exist yet."""

    def __init__(self, path: str, out: TextIO) -> None:
        self.path = path
        self.out = out
        self.pos = 0

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return
        if data:
            self.pos += len(data)
            self.out.write(data.decode("utf-8", errors="replace"))
            self.out.flush()


def follow(job_id: str, status: Callable[[], JobStatus], rank0_log: str | None, *, poll: float = 1.0,
           timeout: float | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Wait for the job to end and return its exit code. Raises SchedulerError when the scheduler stops
    answering for LOST_CONTACT_S, or after ``timeout`` seconds (the job itself keeps running)."""
    start = time.monotonic()
    last_state = None
    failing_since: float | None = None
    tail = LogTail(rank0_log, out) if rank0_log else None
    while True:
        now = time.monotonic()
        try:
            st = status()
            failing_since = None
        except SchedulerError as e:
            failing_since = failing_since or now
            if now - failing_since > LOST_CONTACT_S:
                raise SchedulerError(
                    f"no answer about job {job_id} for {LOST_CONTACT_S:.0f}s (last error: {e})"
                ) from None
            time.sleep(poll)
            continue
        if st.state != last_state:
            where = f" on {st.nodes}" if st.nodes and st.state == "RUNNING" else ""
            err.write(f"slurmlaunch: [{_elapsed(now - start)}] job {job_id} {st.state}{where}\n")
            err.flush()
            last_state = st.state
        if tail:
            tail.pump()
        if st.finished:
            if tail:
                tail.pump()
            code = st.exit_code if st.exit_code is not None else 1
            where = f" (logs: {os.path.dirname(rank0_log)})" if rank0_log else ""
            err.write(f"slurmlaunch: job {job_id} ended {st.state}, exit code {code}{where}\n")
            return code
        if timeout is not None and now - start > timeout:
            raise WaitTimeout(
                f"waited {timeout:.0f}s for job {job_id} (still {st.state}); it keeps running: "
                f"follow it with slurmlaunch logs --follow {job_id}, cancel it with slurmlaunch cancel {job_id}"
            )
        time.sleep(poll)
