"""Runs a set of rank processes on this machine: the local scheduler's and `slurmlaunch run`'s engine.

* each rank in its own session (process group), so a stop reaches its children too;
* nothing of the job outlives it: on Linux every rank dies with the supervisor (PR_SET_PDEATHSIG: a supervisor
  killed by SIGKILL or the OOM killer leaves no rank running unsupervised), and the supervisor is a child
  subreaper while it runs, so a process a
  rank started in a session of its own (setsid, a daemon) is re-parented to the supervisor when its parent
  dies and is killed with the job; such processes are told apart from the supervisor's other children by
  a per-run token in their environment;
* output prefixed with the rank (``[rank 3] ...``), and copied to a per-rank log file when asked; the log gets
  every byte whatever happens to the console (a reader that went away, a closed terminal): a rank is never
  blocked on a full pipe, and once every process of the job is gone the output threads end within
  ``DRAIN_BOUND`` seconds;
* the first rank to fail stops the others (SIGTERM, then SIGKILL after ``grace`` seconds) and its exit
  code is the result; a rank killed by signal N counts as exit code 128+N;
* SIGINT, SIGTERM and SIGHUP (a closed terminal or SSH session) stop the job: the ranks get SIGINT,
  SIGTERM and SIGTERM respectively, then SIGKILL after ``grace``; the outcome says which signal stopped it
  and no rank's consequent exit counts as a failure; SIGUSR1 and SIGUSR2 are forwarded to every rank.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from ..allocation.script_runner import STACKS_DIR
from ..allocation.warning import WATCH_POLL_S, LateWatch, WarningTimer, deliver, late_said, node_ranks, said

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # after these, ranks get `grace` seconds before SIGKILL
# What a rank receives for a stop signal: a hang-up is not the rank's terminal (it has none), so it is
# told to stop the usual way, which checkpointing code listens for.
AS_RECEIVED_BY_RANKS = {signal.SIGHUP: signal.SIGTERM}
DRAIN_BOUND = 2.0  # seconds the output threads may take once every process of the job has ended
TOKEN_VARIABLE = "SLURMLAUNCH_SUPERVISOR_TOKEN"
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankProcess:
    rank: int
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: str | None = None
    cwd: str | None = None
    unit: str = "rank"  # what the process is, for its output prefix: a rank, or (torchrun mode) a node
    log_append: bool = False  # go on in a log this job already made (a requeued run); else the log is new


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    first_failed_rank: int | None  # None when every rank succeeded, or when a stop signal came first
    codes: Mapping[int, int]
    interrupted_by: int | None = None  # the signal number that stopped the run, if any
    console_lost: bool = False  # the console stopped taking output; the logs have all of it
    warned: bool = False  # the warning signal was sent before the time limit
    timed_out: bool = False  # the time limit stopped the run
    # ranks a signal ended (rank -> signal number), which ``codes`` shows as 128+N like an exit with that
    # code: a rank killed by the warning signal saved nothing, one that exited 128+N may have
    signaled: Mapping[int, int] = field(default_factory=dict)


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Console:
    """The shared output stream. A write that fails (the reader went away: EPIPE; the terminal closed: EIO)
    marks it gone for good and is said once on stderr; the ranks' output then goes on to their logs only."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.gone = False

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.gone:
                return
            try:
                self.out.write(data)
                self.out.flush()
            except (OSError, ValueError) as e:
                self.gone = True
                self._silence()
                why = getattr(e, "strerror", None) or str(e)
                try:
                    sys.stderr.write(f"slurmlaunch: the console stopped taking output ({why}); the job goes on, "
                                     f"its output goes to the rank logs only\n")
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass

    def _silence(self) -> None:
        # Point the dead stream at /dev/null so nothing later (the interpreter's own flush at exit) trips on
        # it again; the usual way for a Unix tool whose reader went away.
        try:
            fd = self.out.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass


def _pump(fd: int, prefix: bytes, log_fd: int | None, console: Console, stop: threading.Event) -> None:
    """Drain one rank's pipe until EOF, or until ``stop`` once nothing more is ready to read."""
    partial = b""
    log_ok = log_fd is not None
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], 0.1)
        except (OSError, ValueError):
            break
        if not ready:
            if stop.is_set():
                break
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        if log_ok:
            assert log_fd is not None
            try:
                _write_all(log_fd, chunk)
            except OSError as e:  # a full disk must not block the rank: keep draining, say it once
                log_ok = False
                console.write(prefix + f"slurmlaunch: cannot write this rank's log any more: {e.strerror}\n".encode())
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()
        if lines:
            console.write(b"".join(prefix + line + b"\n" for line in lines))
    if partial:
        console.write(prefix + partial + b"\n")
    os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group (session) that ``pid`` leads; one that has ended is no error."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    signal_group(proc.pid, sig)


def _set_subreaper(on: bool) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _die_with_parent() -> Callable[[], None] | None:
    """What a rank runs between fork and exec so that it gets SIGKILL when the supervisor dies (Linux); libc
    is loaded here, before any fork, so the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    return arm


def detach(argv: Sequence[str], env: Mapping[str, str], payload: bytes, log_path: str) -> int:
    """Start ``argv`` as a supervisor of its own, for a job that outlives this process: a session of its own
    (no controlling terminal: neither its hang-up nor Ctrl-C reaches it), ``payload`` on its stdin (it reads
    it whole, then takes /dev/null), stdout on /dev/null, stderr to the new file ``log_path``; its pid. A
    daemon thread reaps it in a long-lived caller (the Python API); a CLI caller simply exits."""
    err = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                                env=dict(env), start_new_session=True, close_fds=True)
    finally:
        os.close(err)
    assert proc.stdin is not None
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except OSError:  # it died at once: its log says why
        pass
    threading.Thread(target=proc.wait, daemon=True, name=f"slurmlaunch-reap-{proc.pid}").start()
    return proc.pid


def _children() -> list[int]:
    pids: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.extend(int(p) for p in f.read().split())
    except OSError:
        pass
    return pids


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def _carries(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def kill_leftovers(token: str, known: set[int], bound: float = 5.0) -> int:
    """SIGKILL every child of this process that carries ``token`` (re-parented here because we are a
    subreaper), then their children as they are re-parented in turn; returns how many were killed."""
    marker = f"{TOKEN_VARIABLE}={token}".encode()
    killed = 0
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        for pid in _children():  # orphans that ended while the job ran came back to us as zombies
            if pid not in known and _zombie(pid):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        mine = [pid for pid in _children() if pid not in known and _carries(pid, marker)]
        if not mine:
            break
        for pid in mine:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for pid in mine:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return killed


class _Job:
    """One :func:`supervise` run: the rank processes, their output threads and logs, what they returned, and
    the deadlines (the warning, the time limit, SIGKILL after ``grace``)."""

    def __init__(self, console: Console, grace: float) -> None:
        self.console, self.grace = console, grace
        self.token = os.urandom(8).hex()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stacks: dict[int, str] = {}  # each rank's $SLURMLAUNCH_STACKS_DIR, where its RANK.pid is
        self.threads: list[threading.Thread] = []
        self.logs: list[int] = []
        self.received: list[int] = []
        self.stop_output = threading.Event()
        self.codes: dict[int, int] = {}
        self.signaled: dict[int, int] = {}
        self.first_failed: int | None = None
        self.stop_deadline: float | None = None
        self.warned = self.timed_out = False
        self.limit_at: float | None = None  # the time limit, time.monotonic()'s reading
        self.late: LateWatch | None = None  # the ranks left alone at the warning, until their handler comes
        self.late_since = self.late_polled = 0.0
        self.die_with_parent = _die_with_parent()

    def forward(self, signum: int, _frame: object) -> None:
        """The signal handler: a stop signal to the supervisor goes on to every rank still running; a warning
        (USR1, USR2: a batch script's --signal=B:) to the ranks whose script handles it."""
        self.received.append(signum)
        if signum not in STOPPING:
            self.warn(signum)
            return
        sent = AS_RECEIVED_BY_RANKS.get(signal.Signals(signum), signum)
        for p in self.procs.values():
            if p.poll() is None:
                _signal_group(p, sent)

    def warn(self, sig: int) -> None:
        """The warning ``sig`` to each running rank whose script handles it (allocation/warning.py: its RANK.pid
        when it wrote one, else the rank's own process); one line on stderr says who got it and who was left.
        Those left are watched (:meth:`watch_late`) until the time limit."""
        warned, left = deliver(self.running(), sig, sig in STOPPING)  # a stop signal: to every rank
        self.warned = self.warned or bool(warned)
        self.say(said(signal.Signals(sig).name, warned, left))
        if left:
            self.late = LateWatch(sig, left, self.limit_at)
            self.late_since = self.late_polled = time.monotonic()

    def running(self) -> list[tuple[int, int]]:
        """(rank, pid) of each rank running now: its RANK.pid's process where it wrote one (still that process),
        else the rank's own."""
        targets: dict[int, int] = {}
        for directory in dict.fromkeys(d for d in self.stacks.values() if d):
            targets.update(node_ranks(directory, None))
        for rank, p in self.procs.items():
            if rank not in targets and rank not in self.codes and not self.stacks.get(rank) and p.poll() is None:
                targets[rank] = p.pid
        return sorted(targets.items())

    def watch_late(self, now: float) -> None:
        """The warning to each rank left alone whose script has installed its handler since (looked at every
        WATCH_POLL_S), one line each; none once the limit has come."""
        if self.late is None or self.timed_out or now < self.late_polled + WATCH_POLL_S:
            return
        self.late_polled = now
        sent = self.late.poll(self.running(), now)
        if sent:
            self.warned = True
            self.say(late_said(signal.Signals(self.late.signum).name, sent, now - self.late_since))
        if self.late.over(now):
            self.late = None

    def say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"slurmlaunch: {line}\n")
            sys.stderr.flush()

    def start(self, r: RankProcess, prefix: bool) -> None:
        log_fd: int | None = None
        if r.log_path:
            # created here, never an existing file or a planted link: no job writes into another's log
            how = os.O_APPEND if r.log_append else os.O_CREAT | os.O_EXCL
            log_fd = os.open(r.log_path, os.O_WRONLY | how | os.O_NOFOLLOW, 0o640)
            self.logs.append(log_fd)
        p = subprocess.Popen(list(r.argv), env={**r.env, TOKEN_VARIABLE: self.token}, cwd=r.cwd,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, preexec_fn=self.die_with_parent)
        self.procs[r.rank] = p
        self.stacks[r.rank] = r.env.get(STACKS_DIR, "")
        label = f"[{r.unit} {r.rank}] ".encode() if prefix else b""
        assert p.stdout is not None
        t = threading.Thread(target=_pump, args=(os.dup(p.stdout.fileno()), label, log_fd, self.console,
                                                 self.stop_output), daemon=True)
        p.stdout.close()
        t.start()
        self.threads.append(t)

    def signal_unfinished(self, sig: int) -> None:
        for rank, p in self.procs.items():
            if rank not in self.codes:
                _signal_group(p, sig)

    def collect(self) -> None:
        """Note the ranks that ended; the first to fail (not after a stop signal or the limit) stops the rest."""
        for rank, p in self.procs.items():
            if rank in self.codes:
                continue
            rc = p.poll()
            if rc is None:
                continue
            self.codes[rank] = _code(rc)
            if rc < 0:
                self.signaled[rank] = -rc
            if self.codes[rank] != 0 and self.first_failed is None and not _stopping(self.received) \
                    and not self.timed_out:
                self.first_failed = rank
                for other, q in self.procs.items():
                    if other not in self.codes and q.poll() is None:
                        _signal_group(q, signal.SIGTERM)
                self.stop_deadline = time.monotonic() + self.grace
        if self.stop_deadline is None and _stopping(self.received):
            self.stop_deadline = time.monotonic() + self.grace

    def keep_time(self, timer: WarningTimer, limit_at: float | None, warning: tuple[int, float] | None) -> None:
        """The warning signal when ``timer`` says, SIGTERM at ``limit_at``, SIGKILL once the stop deadline passed."""
        now = time.monotonic()
        if warning is not None and timer.due(now):
            self.warn(warning[0])
        self.watch_late(now)
        if limit_at is not None and not self.timed_out and now >= limit_at and self.stop_deadline is None:
            self.timed_out = True
            self.signal_unfinished(signal.SIGTERM)
            self.stop_deadline = now + self.grace
        if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
            self.signal_unfinished(signal.SIGKILL)

    def end(self, subreaper: bool, known: set[int]) -> None:
        """Nothing of the job left alive (an exception in the loop included), its output read, its logs closed."""
        for p in self.procs.values():  # an exception above must not leave ranks behind
            if p.poll() is None:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        for p in self.procs.values():  # the rank has exited; its children must not outlive it
            _signal_group(p, signal.SIGKILL)
        if subreaper:
            kill_leftovers(self.token, known)
            _set_subreaper(False)
        deadline = time.monotonic() + DRAIN_BOUND
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self.stop_output.set()  # a pipe still held open by something we could not reach: stop reading it
        for t in self.threads:
            t.join(timeout=0.5)
        for fd in self.logs:
            try:
                os.close(fd)
            except OSError:
                pass

    def outcome(self) -> Outcome:
        interrupted = _stopping(self.received)
        if self.first_failed is not None:
            exit_code = self.codes[self.first_failed]
        elif interrupted is not None:
            exit_code = 128 + interrupted
        elif self.timed_out:
            exit_code = 128 + signal.SIGTERM
        else:
            exit_code = 0
        return Outcome(exit_code, self.first_failed, self.codes, interrupted, self.console.gone, self.warned,
                       self.timed_out, self.signaled)


def supervise(ranks: Sequence[RankProcess], *, grace: float = 10.0, prefix: bool = True,
              out: BinaryIO | None = None, poll: float = 0.01, time_limit: float | None = None,
              warning: tuple[int, float] | None = None) -> Outcome:
    """Start every rank, wait for all, stop all at the first failure; never returns with a process of the
    job alive (on Linux: none of their descendants either).

    As Slurm does: ``warning`` (signal, seconds) is sent that many seconds before ``time_limit`` (seconds from
    the start), to the ranks whose script handles it (the others run on); at the limit the ranks get SIGTERM,
    then SIGKILL after ``grace``."""
    job = _Job(Console(out if out is not None else sys.stdout.buffer), grace)
    known = set(_children())  # the caller's own children are not the job's
    subreaper = _set_subreaper(True)
    previous = {}
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        for sig in FORWARDED:
            previous[sig] = signal.signal(sig, job.forward)
    started = time.monotonic()
    timer = WarningTimer(started, time_limit, warning[1] if warning else None)
    limit_at = job.limit_at = started + time_limit if time_limit is not None else None
    try:
        for r in ranks:
            job.start(r, prefix)
        while len(job.codes) < len(job.procs):
            job.collect()
            job.keep_time(timer, limit_at, warning)
            time.sleep(poll)
    finally:
        job.end(subreaper, known)
        if in_main_thread:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return job.outcome()


def _stopping(received: Sequence[int]) -> int | None:
    return next((s for s in received if s in STOPPING), None)
