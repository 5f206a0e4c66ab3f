"""Following a submitted job: its state changes with elapsed time, and rank 0's output as it comes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

from ..allocation.smallfile import read_small
from ..core.errors import SchedulerError, WaitTimeout
from ..core.jobfiles import JobFiles
from ..schedulers import JobStatus
from .faults import explain as explain_fault

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..schedulers.interface import Scheduler

LOST_CONTACT_S = 120.0
POLL_S = 1.0  # how often a follow asks a queued scheduler (squeue, qstat: a shared controller)
LOCAL_POLL_S = 0.2  # and a local job's files: nobody else's controller is asked


def poll_seconds(edge: Scheduler) -> float:
    """How often to ask ``edge`` while following one of its jobs."""
    return POLL_S if edge.queued else LOCAL_POLL_S


# PBS says a stopped job (qdel, the walltime) has ended before its batch step has said where the ranks were
# (about 1 s before, seen on OpenPBS 23.06); the batch step says it within PBS's kill_delay (10 s by default)
# or never, as it is killed then.
STOP_WORDS_S = 15.0


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}"


class LogTail:
    """Prints what a file gains, from where we last read; the file may not exist yet. ``said_to``: the file is
    also the batch log (PBS: -j oe, every rank's lines tagged by mpiexec), and the batch step's own lines
    ("slurmlaunch: ...": its first-failure line, where the ranks were at a stop) go there (--wait's stderr,
    where slurmlaunch speaks), whole lines at a time, kept in ``said`` so that --wait says none twice."""

    def __init__(self, path: str, out: TextIO, said_to: TextIO | None = None) -> None:
        self.path = path
        self.out = out
        self.said_to = said_to
        self.pos = 0
        self.said: set[str] = set()
        self._partial = b""

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return
        if not data:
            return
        self.pos += len(data)
        if self.said_to is None:
            self.out.write(data.decode("utf-8", errors="replace"))
            self.out.flush()
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            text = line.decode("utf-8", errors="replace")
            if text.startswith("slurmlaunch: "):
                self.said_to.write(text + "\n")
                self.said.add(text.rstrip())
            else:
                self.out.write(text + "\n")
        self.out.flush()
        self.said_to.flush()

    def finish(self) -> None:
        """What the file ends with after its last newline."""
        self.pump()
        if self._partial:
            self.out.write(self._partial.decode("utf-8", errors="replace"))
            self.out.flush()
            self._partial = b""


FAILURE_BOUND = 4096  # bytes read of a failure file: it holds one line


def failure_lines(log_dir: str, job_id: str) -> list[str]:
    """The first-failure lines the batch script left in ``log_dir`` (job-ID.failure; for an array, each
    element's job-ID_N.failure, in index order): which rank failed first, with which code, and why when
    slurmlaunch stopped it. Missing or unreadable files give nothing."""
    files = JobFiles(log_dir, job_id)
    names = [os.path.basename(files.failure)]
    # An element's file name, split where JobFiles.element puts the index ("\0" is in no file name).
    prefix, _, suffix = os.path.basename(files.element("\0").failure).partition("\0")
    try:
        indexed = [(n[len(prefix):-len(suffix)], n) for n in os.listdir(log_dir)
                   if n.startswith(prefix) and n.endswith(suffix)]
        names += [n for i, n in sorted(indexed, key=lambda e: int(e[0]) if e[0].isdigit() else -1)]
    except OSError:
        pass
    lines: list[str] = []
    for name in names:
        try:
            text = read_small(os.path.join(log_dir, name), FAILURE_BOUND).decode("utf-8", errors="replace")
        except OSError:
            continue
        lines += [line for line in text.splitlines() if line.strip()][:1]
    return lines


def stopped_summary(log_dir: str, job_id: str) -> list[str]:
    """The grouped summary of the stacks the ranks saved when they were stopped (one line per group, at most
    50), which the batch script left; [] when there is none."""
    try:
        text = read_small(JobFiles(log_dir, job_id).stacks_summary, 64 << 10).decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][:50]


def _await_stop_words(files: JobFiles, bound: float = STOP_WORDS_S) -> None:
    """Wait (``bound`` seconds at most) for the summary of where a stopped job's ranks were, when ranks ran
    (they left their pid files) and the batch step has not written it yet."""
    import glob

    if not glob.glob(glob.escape(files.stack_pid("\0")).replace("\0", "*")):
        return
    deadline = time.monotonic() + bound
    while not os.path.exists(files.stacks_summary) and time.monotonic() < deadline:
        time.sleep(0.2)


def follow(job_id: str, status: Callable[[], JobStatus], rank0_log: str | None, *, poll: float = POLL_S,
           timeout: float | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
           log_dir: str | None = None, files_id: str | None = None,
           failures: Callable[[], list[str]] | None = None, batch_log: bool = False) -> int:
    """Wait for the job to end and return its exit code. Raises SchedulerError when the scheduler stops
    answering for LOST_CONTACT_S, or after ``timeout`` seconds (the job itself keeps running). A failed
    job's first-failure line (from ``log_dir``, by default rank 0's log's directory) is shown before the
    last line, so the reason a rank stopped reaches the terminal and not only that rank's log. ``files_id``:
    the id in the job's file names when it is not ``job_id`` (PBS's 1234 of 1234.server). ``failures``: reads
    the first-failure lines where they are not files here (a remote job's, on its login node).
    ``batch_log``: ``rank0_log`` is also the batch log (every rank's output in one file, PBS's): the batch
    step's own lines in it go to ``err``, each once."""
    if log_dir is None and rank0_log:
        log_dir = os.path.dirname(rank0_log)
    files = JobFiles(log_dir or "", files_id or job_id)  # the job's files: named by files_id, never by job_id
    start = time.monotonic()
    last_state: tuple[str, str | None] | None = None
    failing_since: float | None = None
    tail = LogTail(rank0_log, out, err if batch_log else None) if rank0_log else None
    while True:
        now = time.monotonic()
        try:
            st = status()
            failing_since = None
        except SchedulerError as e:
            failing_since = failing_since or now
            if now - failing_since > LOST_CONTACT_S:
                raise SchedulerError(
                    f"no answer about job {job_id} for {LOST_CONTACT_S:.0f}s (last error: {e}); the job itself "
                    f"is untouched (stopping --wait cancels nothing): follow it later with slurmlaunch status "
                    f"{job_id} and slurmlaunch logs --follow {job_id}"
                ) from None
            time.sleep(poll)
            continue
        if (st.state, st.note) != last_state:
            where = f" on {st.nodes}" if st.nodes and st.state == "RUNNING" else ""
            note = f" ({st.note})" if st.note and not st.finished else ""
            err.write(f"slurmlaunch: [{_elapsed(now - start)}] job {job_id} {st.state}{where}{note}\n")
            err.flush()
            last_state = (st.state, st.note)
        if tail:
            tail.pump()
        if st.finished:
            if st.state in ("CANCELLED", "TIMEOUT") and log_dir:
                _await_stop_words(files)
            if tail:
                tail.finish()
            code = st.exit_code if st.exit_code is not None else 1
            if code != 0 and (log_dir or failures):
                found = failures() if failures else failure_lines(log_dir or "", files.job)
                for line in found:
                    if not (tail and line.rstrip() in tail.said):  # shown already: the output is the batch log
                        err.write(line + "\n")
            if code != 0 and log_dir:
                fault = explain_fault(code, log_dir)  # the output directory failed the job (74, 181)
                if fault:
                    err.write(f"slurmlaunch: job {job_id}: {fault}\n")
                stacks = stopped_summary(log_dir, files.job)
                if stacks and not (tail and all(f"slurmlaunch:   {line}".rstrip() in tail.said for line in stacks)):
                    err.write(f"slurmlaunch: where the ranks were when they were stopped (every thread in "
                              f"{files.stacks}):\n")
                    err.write("".join(f"slurmlaunch:   {line}\n" for line in stacks))
            where = f" (logs: {log_dir})" if log_dir else ""
            said = f"exit code {code}" if st.exit_code is not None else \
                "exit code unknown" + (f" ({st.note})" if st.note else "")  # still a failure: --wait exits 1
            err.write(f"slurmlaunch: job {job_id} ended {st.state}, {said}{where}\n")
            return code
        if timeout is not None and now - start > timeout:
            raise WaitTimeout(
                f"waited {timeout:.0f}s for job {job_id} (still {st.state}); it keeps running: "
                f"follow it with slurmlaunch logs --follow {job_id}, cancel it with slurmlaunch cancel {job_id}"
            )
        time.sleep(poll)


def cancel_where_it_runs(edge: Scheduler, job_id: str, log_dir: str | None, shown: str | None = None) -> str:
    """Cancel job ``job_id`` where it runs now (PBS: its latest resubmission at the warning, as its files in
    ``log_dir`` list them); what was cancelled, in words: "job 7.head (run 3 of job 5.head)", or "job 5.head".
    ``shown``: the job's id as the user sees it, where it is not ``job_id`` (a PBS array element: 5[2].head)."""
    sent = edge.cancel(job_id, log_dir)
    if sent == job_id or log_dir is None:
        return f"job {shown or job_id}"
    chain = edge.resubmissions(job_id, log_dir)
    run = f"run {chain.index(sent) + 2}" if sent in chain else "a later run"
    return f"job {sent} ({run} of job {shown or job_id})"


def interrupted(job_id: str, cancel: Callable[[], str], cancel_on_interrupt: bool, where: str = "") -> int:
    """Ctrl-C while following a job: cancel it (asked on a terminal, unless --cancel-on-interrupt) or say
    how to find it again; the exit code is 130 either way. ``cancel`` says what it cancelled ("job 5.head").
    ``where``: the ssh destination of a remote job."""
    on = f" on {where}" if where else ""
    if cancel_on_interrupt or ask(f"\nslurmlaunch: cancel job {job_id}{on}? [y/N] "):
        said = cancel()
        sys.stderr.write(f"slurmlaunch: cancelled {said}\n")
    else:
        sys.stderr.write(f"slurmlaunch: job {job_id} keeps running{on} (slurmlaunch cancel {job_id} cancels it; "
                         f"slurmlaunch logs --follow {job_id} follows it)\n")
    return 130


def ask(question: str) -> bool:
    """A yes/no question on the terminal; no (without asking) when stdin is not one."""
    if not sys.stdin.isatty():
        return False
    sys.stderr.write(question)
    sys.stderr.flush()
    try:
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    except (KeyboardInterrupt, EOFError):
        return False
