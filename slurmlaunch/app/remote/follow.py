"""Following a remote job from the laptop (`submit --remote --wait`, `logs --follow`): follow()'s status
callable over the ssh runner, with a bounded back-off when the connection drops."""

from __future__ import annotations

import codecs
import sys
import time

from ...core.errors import SchedulerError, SlurmLaunchError
from ...core.jobfiles import JobFiles
from ...core.spec import JobSpec
from ...schedulers import JobStatus
from ...schedulers.interface import Scheduler
from ...schedulers.runner import READ_LIMIT, use_runner
from .runner import SshRunner
from .shell import Unreachable


class RemoteCommandFailed(SlurmLaunchError):
    """A remote command the follower ran failed (not the connection): not a SchedulerError, so follow()
    does not retry it for LOST_CONTACT_S."""


MAX_BACKOFF_S = 15.0


class RemoteFollower:
    """follow()'s status callable for a remote job: each call asks the scheduler's edge over the ssh runner (a
    running Slurm job: one squeue round trip), then reads what ``log`` gained (one bounded read; once the job
    has ended, until the end of the file) and prints it. When the connection drops, each failed call waits
    longer before it reports (1, 2, 4 ... 15 s), so that follow()'s retries back off; follow() gives up after
    its LOST_CONTACT_S with one line. Only ssh's own failures (remote_shell.Unreachable) are retried that way;
    a command that runs and fails (a --remote-setup line, squeue refusing) is RemoteCommandFailed, which
    follow() does not retry: one line at once."""

    def __init__(self, runner: SshRunner, edge: Scheduler, job_id: str, log_dir: str, log: str | None,
                 files_id: str | None = None) -> None:
        self.runner, self.edge, self.job_id, self.log_dir, self.log = runner, edge, job_id, log_dir, log
        self.files_id = files_id or job_id  # the id in the job's file names (PBS's 1234 of 1234.server)
        self.offset = 0
        self.failures = 0
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character split by a chunk

    def _pump(self, to_the_end: bool) -> None:
        while self.log:
            data = self.runner.read(self.log, self.offset, READ_LIMIT)
            if data:
                self.offset += len(data)
                sys.stdout.write(self._text.decode(data))
                sys.stdout.flush()
            if not to_the_end or data is None or len(data) < READ_LIMIT:
                return

    def __call__(self) -> JobStatus:
        target = self.runner.conn.dest.target
        try:
            with use_runner(self.runner):
                st = self.edge.status(self.job_id, self.log_dir)
            self._pump(to_the_end=st.finished)
        except Unreachable as e:
            self.failures += 1
            if self.failures == 1:
                sys.stderr.write(f"slurmlaunch: lost contact with {target} ({e}); trying again, the job is not "
                                 f"affected\n")
            time.sleep(min(2.0 ** (self.failures - 1), MAX_BACKOFF_S) - 1.0)  # follow() sleeps 1 s more
            raise
        except SchedulerError as e:
            # A command that ran and failed fails the same way next second: not a dropped connection.
            raise RemoteCommandFailed(str(e)) from None
        if self.failures:
            sys.stderr.write(f"slurmlaunch: reconnected to {target} after {self.failures} failed attempt(s)\n")
            self.failures = 0
        return st


    def failure_lines(self) -> list[str]:
        """The job's first-failure line, read on the login node where the batch script left it (one more ssh
        call, once, after a failed job ended); nothing when it cannot be read (the exit code still says it)."""
        from ..follow import FAILURE_BOUND

        try:
            data = self.runner.read(JobFiles(self.log_dir, self.files_id).failure, 0, FAILURE_BOUND)
        except SlurmLaunchError:
            return []
        text = (data or b"").decode("utf-8", errors="replace")
        return [line for line in text.splitlines() if line.strip()][:1]


def wait_remote(runner: SshRunner, edge: Scheduler, spec: JobSpec, job_id: str, cancel_on_interrupt: bool,
                timeout: float | None) -> int:
    """Follow the job from here: its states and rank 0's output (where the scheduler writes one; PBS: the
    states) and, when it failed, its first-failure line, as `submit --wait` does locally. A dropped connection
    is retried on every poll (a new master each time) for follow's LOST_CONTACT_S."""
    from ..follow import cancel_where_it_runs, follow, interrupted

    target = runner.conn.dest.target
    files_id = edge.parse_job_id(job_id) or job_id  # the id in the job's file names (PBS's 1234 of 1234.server)
    status = RemoteFollower(runner, edge, job_id, spec.log_dir, edge.rank_log(spec, files_id, 0), files_id)
    try:
        code: int = follow(job_id, status, None, timeout=timeout, failures=status.failure_lines)
    except KeyboardInterrupt:
        def cancel() -> str:
            with use_runner(runner):
                return cancel_where_it_runs(edge, job_id, spec.log_dir)

        return interrupted(job_id, cancel, cancel_on_interrupt, target)
    sys.stderr.write(f"slurmlaunch: logs on {target}:{spec.log_dir}\n")
    return code
