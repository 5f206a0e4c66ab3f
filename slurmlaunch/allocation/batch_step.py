"""The batch step's supervisor: what a Slurm or PBS batch script does once its set-up lines have run.

`slurmlaunch batch-step [PLAN] -- COMMAND...` is the one command a generated script ends with (it `exec`s
it, so the batch shell's pid, which Slurm's ``--signal=B:`` and PBS's qdel signal, is this process). It
prepares the job's files, runs COMMAND (srun, or the site's mpiexec) and carries out the plan the renderer
computed (render/slurm_script.py, render/pbs_script.py) and passed as options:

* the warning signal (``--warning NAME``): sent, node by node, to the ranks whose script handles it, the
  others left to run on to the time limit (allocation/warning.py); under PBS, which sends none, raised here
  ``--warn-before`` seconds before ``--walltime`` (measured from the batch shell's start, which is the job's);
* the first failure: the earliest line a rank slurmlaunch stopped left in the reasons directory, else
  srun's first word on a task that ended (or Open MPI's "Process name"/"Exit code" under PBS); its code
  becomes the job's, its line goes to stderr and to the failure file;
* the teardown-abort rule: a rank killed by SIGABRT after its script returned is named; one whose script
  had asked for 128 + the warning signal keeps that code;
* ranks killed by the warning signal (nothing saved), and the requeue rule (``--requeue MAX``);
* at a stop (SIGTERM: scancel, qdel, the time limit), the summary of where the ranks were.

The rules it applies and srun's and Open MPI's words are in allocation/step_rules.py (pure; the local scheduler
and the Python API use them too), the plan's options in allocation/step_args.py, and its scheduler commands
(scontrol requeue, qsub, qdel) run through allocation/scheduler_commands.py; this module is the process.

It reads $SLURM_JOB_ID and $SLURM_RESTART_COUNT (Slurm), $PBS_NODEFILE (PBS) and the job's files named by
core.jobfiles; it sets $SLURMLAUNCH_RETURNED_DIR, $SLURMLAUNCH_REASONS_DIR, $SLURMLAUNCH_STACKS_DIR and
$SLURMLAUNCH_TIMELINE_DIR for COMMAND. Standard library only: it runs inside the allocation, once per job.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module, as the launcher's: `signal` loads enum
import os
import sys
import time

from ..core import REQUEUE_OF, RESTART_COUNT
from ..core.parse import signal_number
from .step_args import parse
from .step_rules import (
    OPENMPI_CODE,
    OPENMPI_LOST,
    OPENMPI_RANK,
    OPENMPI_ROOT,
    OPENMPI_SIGNAL,
    ROOT_FIX,
    asked_abort_message,
    keeps_asked_code,
    openmpi_signalled,
    pbs_id,
    ranks_word,
    srun_aborted,
    srun_first,
    srun_killed_by,
    stopped_line,
    wants_requeue,
    warning_code,
    warning_fix,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    import subprocess
    import threading
    from collections.abc import Sequence
    from types import FrameType, SimpleNamespace
    from typing import IO

    from ..core.jobfiles import JobFiles

# What the batch step imports at its start is kept to the above (issue 32: it starts once per job, the API's
# short jobs included, and its start is paid before srun's). The rest (argparse, subprocess, the job files,
# the stacks, the regular expressions) is imported where a path needs it: the failure path, the CLI's files.


def _unlink(path: str) -> None:
    """``path`` removed (a link itself, never its target), when it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _say(text: str) -> None:
    sys.stderr.write(f"slurmlaunch: {text}\n")
    sys.stderr.flush()


def put_file(path: str, text: str) -> bool:
    """``text`` and a newline into ``path``, never through a link planted there: a new file (O_EXCL, mode 600,
    a name nobody could plant beforehand) renamed over whatever ``path`` was (rename replaces a link itself)."""
    # a name of its own, made as tempfile.mkstemp makes one, without tempfile's import (as preflight's)
    tmp = os.path.join(os.path.dirname(path) or ".", f"{os.path.basename(path)}.{os.urandom(6).hex()}")
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
        return True
    except OSError:
        _unlink(tmp)
        return False


def preflight(log_dir: str) -> str | None:
    """None when the output directory takes a write of 4 KiB (more than a page), else why not. A full file
    system or one gone read-only would otherwise lose every word of the job, the scheduler's logs included."""
    # a name of its own, made as tempfile.mkstemp makes one (O_EXCL, never through a link), without tempfile's
    # import: this runs at every job's start (issue 32)
    tmp = os.path.join(log_dir, f".slurmlaunch-probe.{os.getpid()}.{os.urandom(6).hex()}")
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        return e.strerror or str(e)
    try:
        os.write(fd, bytes(4096))
    except OSError as e:
        return e.strerror or str(e)
    finally:
        os.close(fd)
        _unlink(tmp)
    return None


def remove_dir(path: str) -> None:
    """The directory ``path`` and what it holds, when it is there; never a link's target (a link there is left,
    as shutil.rmtree leaves one). The job's own directories hold files only (marks, reasons, timelines, dumps):
    shutil, whose import with the compression modules it loads is about 5 ms of CPU, is loaded only for one
    that holds more (issue 39: every job, the API's short ones too, starts and ends here)."""
    if os.path.islink(path):
        return
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        _unlink(os.path.join(path, name))
    try:
        os.rmdir(path)
    except OSError:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def fresh_dir(path: str, variable: str) -> None:
    """``path`` as a new private directory (a requeued run starts clean), named to COMMAND in ``variable``; one
    that cannot be made is said, and the ranks run without it (what it holds is a report, not the work)."""
    remove_dir(path)
    _unlink(path)  # a link planted there: the link itself, never its target
    try:
        os.mkdir(path, 0o700)
    except OSError as e:
        _say(f"could not create {path}: {e.strerror or e}")
    os.environ[variable] = path


def start_timeline(directory: str, step: bool = True) -> None:
    """The start-up's moments (docs: Where start-up goes): a fresh directory for the ranks' files, and the batch
    step's own two, its start (the batch shell's) and now, as COMMAND is about to start the ranks (with
    ``step`` False the second comes later, after the staging: timeline.step_started)."""
    from .timeline import TIMELINE_DIR, batch_started

    fresh_dir(directory, TIMELINE_DIR)
    batch_started(os.environ, int(_started_at() * 1e9), step)


def _short(host: str) -> str:
    return host.split(".")[0]


def _node_hosts() -> list[str]:
    """The job's hosts in $PBS_NODEFILE's order (mpiexec --map-by ppr:N:node gives each its block of ranks);
    none once PBS has removed the file."""
    try:
        with open(os.environ.get("PBS_NODEFILE", "")) as f:
            return list(dict.fromkeys(h.strip() for h in f if h.strip()))
    except OSError:
        return []


def _relay(source: IO[bytes], sink: IO[bytes]) -> None:
    """mpiexec's standard output passed on whole lines at a time, as it comes, until it ends."""
    from .mpi_output import PENDING_MAX, joined

    for line in joined(iter(lambda: source.readline(PENDING_MAX), b"")):
        try:
            sink.write(line)
            sink.flush()
        except OSError:  # the job's output is gone (a full file system): the ranks go on
            pass


def _restarts(text: str) -> int:
    return int(text) if text.isdigit() else 0


def _started_at() -> float:
    """When this process (the batch shell, which exec'd it) started, in time.time()'s clock."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


# How long mpiexec's last output is waited for once it has ended.
OUTPUT_DRAIN_S = 10.0
# How much earlier than this process PBS may count a job's walltime from (its prologue, the shell's start).
WALLTIME_SLACK_S = 2.0
WARN_NODES_S = 60.0  # seconds the warning's per-node steps may take (an srun step, pbs_tmrsh) before named late
WARN_LATE_S = 10.0  # seconds the job's end waits, after the first reports, for warn-nodes' last late reports


class Step:
    """One run of COMMAND under the plan ``args`` (see allocation/step_args.py's :func:`parser`)."""

    def __init__(self, args: argparse.Namespace | SimpleNamespace) -> None:
        self.args = args
        first = os.environ.get(REQUEUE_OF, "")
        # a PBS job resubmitted at the warning: its files are the first job's, as a Slurm requeue's are its id's
        self.tag = first.split(".", 1)[0] if args.resubmit is not None and pbs_id(first) else args.job
        if args.resubmit is not None:  # the ranks see which run this is (mpiexec -x passes it on)
            os.environ[RESTART_COUNT] = str(_restarts(os.environ.get(RESTART_COUNT, "")))
        self.warning: int | None = signal_number(args.warning) if args.warning else None
        self.warned = False  # a rank got the warning (or COMMAND did, passed on)
        self.warning_came = False
        self.warn_thread: threading.Thread | None = None  # _warn_nodes, once the warning came
        self.stopped = False
        self.stopped_after = 0.0  # seconds from the job's start to PBS's stop
        self.pid: int | None = None  # COMMAND's
        self.pending: int | None = None  # a warning that came while COMMAND was being started (no pid yet)
        self.openmpi: list[str] = []  # Open MPI's lines naming the first rank that failed (PBS)
        self._files: JobFiles | None = None

    @property
    def files(self) -> JobFiles:
        """The job's files (core.jobfiles), on the paths that use them: not the API's, which has none."""
        if self._files is None:
            from ..core.jobfiles import JobFiles

            self._files = JobFiles(self.args.log_dir or "", self.tag or "", self.args.unit)
        return self._files

    # --- signals -------------------------------------------------------------------------------------------

    def _ended(self) -> bool:
        """Whether COMMAND has ended, asked without reaping it: from a signal handler, while the main thread
        waits for it (Popen.poll would answer None then: wait() holds its lock)."""
        if self.pid is None:
            return False
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        """The warning: to the ranks that handle it, node by node (allocation/warning.py), from a thread (it
        runs a step per node); without the ranks' pid files (the API's submitit script, --no-python) passed on
        to COMMAND, which forwards it to every task."""
        if self.warning_came:
            return
        self.warning_came = self.warned = True
        extra = " (the script's framework saves and requeues the job itself)" if self.args.requeued_by_script else ""
        if not (self.args.stacks and self.args.log_dir):
            _say(f"SIG{self.args.warning} received, passing it on to the ranks{extra}")
            if self.pid is None:  # between the spawn and its pid's assignment (seen under load): sent once known
                self.pending = signum
            elif not self._ended():
                os.kill(self.pid, signum)
            return
        import threading

        from .warning import to_all

        # until a rank got it (a job none of whose ranks listens was not warned); a stop signal goes to every rank
        self.warned = to_all(self.args.warning)
        _say(f"SIG{self.args.warning} received: sending it to the ranks whose script handles it{extra}")
        self.warn_thread = threading.Thread(target=self._warn_nodes, daemon=True)
        self.warn_thread.start()

    def _warn_nodes_said(self) -> None:
        """Wait for _warn_nodes to end (bounded: WARN_NODES_S for the first reports, then the late ones of
        warn-nodes that end with the ranks): ranks that end soon after the warning (they saved, or were made
        to stop) would otherwise end this process before its line says who got it (seen on PBS)."""
        if self.warn_thread is not None:
            self.warn_thread.join(WARN_NODES_S + WARN_LATE_S)

    def _warn_nodes(self) -> None:
        """Run `slurmlaunch warn-node` next to the ranks on every node (Slurm: one srun --overlap step of one
        task per node; PBS: this host's own, pbs_tmrsh to each other host), say in one line which ranks got the
        warning and which were left alone once every node answered (WARN_NODES_S at most), then one line per
        rank sent it later, when its script installed its handler (warn-node watches those left alone until the
        job's end: :meth:`_job_end`, or their own end, which the limit brings)."""
        import subprocess

        from .warning import REPORT_SUFFIX, said

        a, name = self.args, self.args.warning
        until = self._job_end()
        argv = [sys.executable, "-m", "slurmlaunch", "warn-node", self.files.stacks, name,
                *([f"{until:.0f}"] if until is not None else [])]
        commands: dict[str, list[str]] = {}
        if a.srun:
            env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
            commands["the srun step"] = ["srun", "--overlap", f"--jobid={os.environ.get('SLURM_JOB_ID', '')}",
                                         f"--nodes={a.nodes}", f"--ntasks={a.nodes}", "--ntasks-per-node=1",
                                         "--quiet", *argv]
        else:
            from .stacks import this_host
            from .tmrsh import _read, find_tmrsh

            env = dict(os.environ)
            here = this_host()
            tmrsh = find_tmrsh(env, lambda p: os.access(p, os.X_OK), _read)
            for host in _node_hosts() or [here]:
                if _short(host) == _short(here):
                    commands[host] = argv
                elif tmrsh is not None:
                    commands[host] = [tmrsh, host, *argv]
                else:
                    commands[host] = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, *argv]
        for old in os.listdir(self.files.stacks):
            if old.endswith(REPORT_SUFFIX):
                _unlink(os.path.join(self.files.stacks, old))
        started = {where: subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE) for where, cmd in commands.items()}
        first, unreached = self._first_reports(started, a.nodes if a.srun else None)
        warned = [r for e in first for r in e.get("warned", []) if isinstance(r, int)]  # type: ignore[attr-defined]
        left = [r for e in first for r in e.get("left", []) if isinstance(r, int)]  # type: ignore[attr-defined]
        self.warned = self.warned or bool(warned)
        _say(said(f"SIG{name}", warned, left, unreached))
        if left:
            self._late_reports(started, named=(a.nodes if a.srun else len(started)) > 1)

    def _job_end(self) -> float | None:
        """When the job's limit ends it, in Unix time: PBS's walltime from the batch shell's start; Slurm's
        $SLURM_JOB_END_TIME (Slurm 23.02 and later); None where neither says."""
        if self.args.walltime is not None:
            return _started_at() + float(self.args.walltime)
        end = os.environ.get("SLURM_JOB_END_TIME", "")
        return float(int(end)) if end.isdigit() and int(end) > 0 else None

    def _first_reports(self, started: dict[str, subprocess.Popen[bytes]],
                       nodes: int | None) -> tuple[list[dict[str, object]], list[str]]:
        """Each node's first report (the ranks warned and left alone), waited for until every node's is there
        or its command ended, WARN_NODES_S at most; and the nodes not reached, in words. ``nodes``: how many
        reports one command (the srun step) gives; None: one per command, named by its host."""
        from .warning import reports

        def firsts() -> list[dict[str, object]]:
            return [e for e in reports(self.files.stacks) if "left" in e]

        deadline = time.monotonic() + WARN_NODES_S
        expected = nodes if nodes is not None else len(started)
        while len(firsts()) < expected and any(p.poll() is None for p in started.values()) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        entries = firsts()
        hosts = {_short(str(e.get("host", ""))) for e in entries}
        unreached: list[str] = []
        for where, proc in started.items():
            answered = len(entries) >= expected if nodes is not None else _short(where) in hosts
            if answered:
                continue
            if proc.poll() is None:
                if not entries or nodes is None:  # none of its nodes answered: it hangs
                    proc.kill()
                    proc.wait()
                got = f" ({len(entries)} of {expected} nodes answered)" if nodes is not None and entries else ""
                unreached.append(f"{where} did not answer within {WARN_NODES_S:g}s{got}")
            elif proc.returncode:
                err = proc.stderr.read() if proc.stderr is not None else b""
                unreached.append(f"{where} (exit {proc.returncode}: {err.decode(errors='replace').strip()[-300:]})")
        return entries, unreached

    def _late_reports(self, started: dict[str, subprocess.Popen[bytes]], named: bool) -> None:
        """One line per rank sent the warning late (its handler came after it), as each node's warn-node
        reports it, until every warn-node has ended (its ranks sent it or ended, or the job's end); ``named``:
        the line names the node."""
        from .warning import WATCH_POLL_S, late_said, reports

        seen: set[tuple[str, str]] = set()
        while True:
            running = any(p.poll() is None for p in started.values())
            for e in reports(self.files.stacks):
                key = (str(e.get("host")), str(e.get("at")))
                if "late" not in e or key in seen:
                    continue
                seen.add(key)
                ranks = [r for r in e.get("late", []) if isinstance(r, int)]  # type: ignore[attr-defined]
                after = e.get("after")
                self.warned = self.warned or bool(ranks)
                _say(late_said(f"SIG{self.args.warning}", ranks, after if isinstance(after, (int, float)) else 0.0,
                               key[0] if named else None))
            if not running:
                return
            time.sleep(WATCH_POLL_S)

    def _stacks_at_stop(self, signum: int, frame: FrameType | None) -> None:
        """Slurm's SIGTERM (the time limit, scancel): once the ranks have written their stacks (3 s at most),
        say where they were, then end by the signal as the shell would."""
        from .stacks import summary_main

        _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
        until = time.monotonic() + 3.0  # the whole wait, the dumps' included: Slurm's KillWait comes after it
        while time.monotonic() < until and self.pid is not None and not self._ended():
            time.sleep(0.1)
        summary_main([self.files.stacks], wait=max(0.0, until - time.monotonic()))
        sys.stderr.flush()
        os.kill(os.getpid(), _signal.SIGTERM)

    def _pbs_stop(self, signum: int, frame: FrameType | None) -> None:
        """PBS's SIGTERM (qdel, the walltime): outlive it, so that once mpiexec has ended the stacks are said.
        A stopped job writes no exit code of its own: PBS's word (deleted; the walltime: -29) is the job's."""
        self.stopped = True
        self.stopped_after = time.time() - _started_at()
        _say(f"the job was stopped {self.stopped_after:.0f}s into its run (SIGTERM): {self.stop_cause()}")

    def stop_cause(self) -> str:
        """Which stop PBS's SIGTERM was, told by the time against the walltime (PBS's own word, its
        Exit_status, is set only once the job has ended): the MoM stops a job at its walltime once it has run
        past it, counted from the job's start, a moment before this process's (WALLTIME_SLACK_S)."""
        limit = self.args.walltime
        if limit is None:
            return "qdel or qrerun (the job asked for no walltime; a queue's default one would say so too)"
        if self.stopped_after < limit - WALLTIME_SLACK_S:
            return f"qdel or qrerun, before its walltime of {limit:.0f}s"
        return f"its walltime of {limit:.0f}s ran out"

    def stopped_by_hand(self) -> bool:
        """A PBS stop before the walltime (or without one known): qdel or qrerun, which no requeue may undo.
        The MoM stops a job at its walltime only after it (when it next polls), so an earlier stop is not it."""
        limit = self.args.walltime
        return self.stopped and (limit is None or self.stopped_after < limit)

    def _arm(self) -> None:
        a = self.args
        if a.stacks and self.warning != _signal.SIGTERM:
            _signal.signal(_signal.SIGTERM, self._pbs_stop if a.outlive_stop else self._stacks_at_stop)
        if self.warning is not None:
            _signal.signal(self.warning, self._forward)
            if a.walltime is not None and a.warn_before is not None:  # PBS: nobody else sends it
                from .warning import WarningTimer

                warning = self.warning
                WarningTimer(_started_at(), a.walltime, a.warn_before).start(
                    time.time(), lambda: os.kill(os.getpid(), warning))

    # --- the run -------------------------------------------------------------------------------------------

    def prepare(self) -> int | None:
        """The job's files before any rank starts; an exit code when they cannot be made."""
        import glob

        from ..core.jobfiles import WRITE_FAILED
        from .reasons import REASONS_DIR
        from .script_runner import RETURNED_DIR, STACKS_DIR

        f = self.files
        why = preflight(self.args.log_dir)
        if why is not None:
            _say(f"cannot write in the output directory {self.args.log_dir}: {why}; no rank was started "
                 f"(exit code {WRITE_FAILED})")
            return WRITE_FAILED
        if self.args.srun:
            # What srun creates or appends to is never a link planted in advance (srun follows links).
            for planted in glob.glob(glob.escape(f.log("\0")).replace("\0", "*")):
                if os.path.islink(planted):
                    os.unlink(planted)
            try:
                _unlink(f.srun_log)
                os.close(os.open(f.srun_log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
            except OSError:
                _say(f"cannot create {f.srun_log}")
                return WRITE_FAILED
        if self.args.srun or self.args.mpi == "openmpi":  # the runs whose words name an aborted rank
            fresh_dir(f.returned, RETURNED_DIR)  # each rank whose script returned leaves a mark here
        fresh_dir(f.reasons, REASONS_DIR)  # a rank slurmlaunch stops itself leaves why here
        _unlink(f.failure)
        fresh_dir(f.stacks, STACKS_DIR)  # each rank's stacks, on demand and at a stop; kept after the job
        start_timeline(f.timeline, step=self.args.stage_env is None)
        return None

    def run(self, command: list[str]) -> int:
        """COMMAND's exit status (128 + N for a signal), its stderr into srun's log (Slurm) or passed through
        with Open MPI's naming lines kept (PBS)."""
        self._arm()
        if not (self.args.srun and self.args.log_dir) and self.args.mpi != "openmpi":
            return self._spawn(command)  # nothing of COMMAND's output to keep
        if self.args.srun and self.args.log_dir:  # srun's stderr into its log, stdin none, without subprocess
            return self._spawn(command, [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                         (os.POSIX_SPAWN_OPEN, 2, self.files.srun_log,
                                          os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)])
        import re
        import subprocess

        proc: subprocess.Popen[bytes]
        if self.args.srun and self.args.log_dir:
            with open(self.files.srun_log, "ab") as log:
                proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=log)
                self._started(proc.pid)
        else:  # mpiexec --tag-output: both streams passed on whole lines at a time (allocation/mpi_output.py)
            import threading

            from .mpi_output import PENDING_MAX, joined

            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self._started(proc.pid)
            assert proc.stdout is not None and proc.stderr is not None
            out = threading.Thread(target=_relay, args=(proc.stdout, sys.stdout.buffer), daemon=True)
            out.start()
            for raw in joined(iter(lambda: proc.stderr.readline(PENDING_MAX), b"")):  # type: ignore[union-attr]
                sys.stderr.buffer.write(raw)
                sys.stderr.flush()
                line = raw.decode("utf-8", errors="replace")
                if re.match(OPENMPI_RANK, line) or re.match(OPENMPI_CODE, line) or re.search(OPENMPI_SIGNAL, line) \
                        or re.match(OPENMPI_ROOT, line) or re.search(OPENMPI_LOST, line):
                    self.openmpi.append(line)
            proc.wait()
            out.join(OUTPUT_DRAIN_S)  # bounded: a process the ranks left behind may hold the pipe open
        rc = proc.wait()
        return 128 - rc if rc < 0 else rc

    def _started(self, pid: int) -> None:
        """COMMAND's pid, known now; a warning that came before it is passed on now."""
        self.pid = pid
        signum, self.pending = self.pending, None
        if signum is not None:
            os.kill(pid, signum)

    def _spawn(self, command: list[str], file_actions: Sequence[tuple[object, ...]] = ()) -> int:
        """COMMAND with this process's stdio, started as subprocess would start it (SIGPIPE and SIGXFSZ, which
        Python ignores, back to their default), without loading subprocess: this is the path of every short
        job of the API, and subprocess with its imports is about a third of a bare interpreter's start."""
        try:
            pid = os.posix_spawnp(command[0], command, os.environ, file_actions=file_actions or None,
                                  setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ))
            self._started(pid)
        except OSError as e:  # as a shell says it: not found 127, not runnable 126
            _say(f"cannot run {command[0]!r}: {e.strerror or e}")
            return 127 if isinstance(e, FileNotFoundError) else 126
        _, status = os.waitpid(pid, 0)  # retried after a signal's handler (the warning's) has run
        rc = os.waitstatus_to_exitcode(status)
        return 128 - rc if rc < 0 else rc

    def others(self) -> str:
        a = self.args
        if a.torchrun:
            return "; the other nodes were stopped" if a.nodes > 1 else ""
        return "; the other ranks were stopped" if a.ranks > 1 else ""

    def first_failure(self, rc: int, lines: Sequence[str]) -> tuple[int, str, str]:
        """(the job's code, the summary line, how srun's first word says the rank was killed)."""
        import re
        from signal import Signals

        from .reasons import read_first

        a = self.args
        stopped = read_first(self.files.reasons)
        if stopped is not None:
            who = f"{'a task' if stopped.rank is None else f'rank {stopped.rank}'} on {stopped.host}"
            return stopped.code, stopped_line(who, stopped.code, stopped.text, self.others()), ""
        if a.srun:
            skip = (_signal.strsignal(self.warning) or "") if self.warning is not None else ""
            found = srun_first(lines, skip)
            if found is None:
                return rc, "", ""
            node, tasks, code, how = found
            shown = f" ({how})" if how else ""
            if a.torchrun:
                return code, f"torchrun on {node} (node task {tasks}) failed first with exit code {code}{shown}" \
                    f"{self.others()}", how
            return code, f"rank(s) {tasks} on {node} failed first with exit code {code}{shown}{self.others()}", how
        root = next((m for m in (re.match(OPENMPI_ROOT, x) for x in self.openmpi) if m), None)
        if root is not None:
            return rc, f"{root[1]} refused to start the ranks as root (Open MPI's run-as-root protection; no rank " \
                f"ran). Fix: {ROOT_FIX}", ""
        gone = self.lost_host()
        if gone is not None:  # a host's daemon gone: its ranks with it, Open MPI names none
            lost, ranks = gone
            who = ranks_word(ranks[0], ranks[-1]) if ranks else "its ranks"
            code = rc or 1
            return code, f"{who} on {lost} failed first with exit code {code} (their host was lost: mpiexec lost " \
                f"contact with its daemon on {lost}, whose host went down or whose processes were killed)" \
                f"{self.others()}", ""
        named = [re.match(OPENMPI_RANK, x) for x in self.openmpi]
        codes = [re.match(OPENMPI_CODE, x) for x in self.openmpi]
        rank = next((int(m[1]) for m in named if m), None)
        said = next((int(m[1]) for m in codes if m), None)
        if rank is None or said is None:
            signalled = openmpi_signalled(self.openmpi)
            # not after a qdel or the walltime (the job was stopped, no rank failed), nor for the warning signal,
            # whose own rule says those (finish)
            if signalled is None or self.stopped or (self.warning is not None and signalled[2] == self.warning):
                return rc, "", ""
            rank, node, number = signalled
            how = f"killed by {Signals(number).name}" if number in Signals._value2member_map_ else \
                f"killed by signal {number}"
            return 128 + number, f"rank {rank} on {node} failed first with exit code {128 + number} ({how})" \
                f"{self.others()}", how
        code = said
        hosts = _node_hosts()  # the rank's host: its block of the node file's hosts
        node = hosts[rank // a.tasks_per_node] if rank // a.tasks_per_node < len(hosts) else "?"
        return code, f"rank {rank} on {node} failed first with exit code {code}{self.others()}", ""

    def lost_host(self) -> tuple[str, list[int]] | None:
        """The host whose daemon Open MPI lost, and the ranks that ran there (its block of the node file's
        hosts; none where the file does not name it); None when it lost none, or the job was stopped."""
        import re

        lost = next((m[1] for m in (re.search(OPENMPI_LOST, x) for x in self.openmpi) if m), None)
        if lost is None or self.stopped:
            return None
        hosts, per = _node_hosts(), self.args.tasks_per_node
        return lost, list(range(hosts.index(lost) * per, (hosts.index(lost) + 1) * per)) if lost in hosts else []

    def killed_by_warning(self, lines: Sequence[str]) -> str:
        """The ranks the warning signal ended ("task 0 on node1" in srun's words, "rank 0 on node1" in Open
        MPI's, which names the first only); "" when none did."""
        assert self.warning is not None
        # srun (and mpiexec) stop the rest of a failed run with SIGTERM: only after the warning is it the warning's
        if self.warning == _signal.SIGTERM and not self.warned:
            return ""
        if self.args.srun:
            return srun_killed_by(lines, _signal.strsignal(self.warning) or "")
        signalled = openmpi_signalled(self.openmpi)
        if signalled is None or signalled[2] != self.warning:
            return ""
        return f"rank {signalled[0]} on {signalled[1]}"

    def teardown_aborts(self, rc: int, summary: str, first_signal: str, lines: Sequence[str]) -> int:
        """Name the ranks SIGABRT ended after their script returned; one that had asked for 128 + the warning
        signal (saved, requeue me) keeps that code."""
        import glob
        from contextlib import suppress

        from .script_runner import recorded_exit
        from .torchrun_mode import aborted_workers, teardown_message

        if self.args.torchrun:
            aborted: set[int] = set()
            for path in glob.glob(glob.escape(self.files.log("\0")).replace("\0", "*")):
                with suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
                    aborted.update(aborted_workers(f.read()))
            ranks = sorted(aborted)
        elif self.args.srun:
            ranks = srun_aborted(lines)
        else:  # Open MPI names the first rank a signal ended, and only that one
            signalled = openmpi_signalled(self.openmpi)
            ranks = [signalled[0]] if signalled is not None and signalled[2] == _signal.SIGABRT else []
        for r in ranks:
            if os.path.exists(self.files.returned_mark(r)):
                _say(teardown_message(r))
            if self.args.warning and not self.args.torchrun:
                code = warning_code(self.args.warning)
                aborted_first = not summary or first_signal.endswith("SIGABRT")
                if keeps_asked_code(recorded_exit(self.files.exit_mark(r)), code, aborted_first):
                    rc = code
                    _say(asked_abort_message(r, code))
        return rc

    def finish(self, rc: int) -> int:
        """The plan after COMMAND ended: the first failure, the warning's rules, the exit code file."""
        from contextlib import suppress

        a, f = self.args, self.files
        self._warn_nodes_said()
        lines: list[str] = []
        if a.srun:
            with suppress(OSError), open(f.srun_log, "rb") as log:
                data = log.read()
                sys.stderr.buffer.write(data)
                sys.stderr.flush()
                lines = data.decode("utf-8", errors="replace").splitlines()
        if a.stacks and rc != 0:
            from .stacks import summary_main  # here: a job that ended well pays no import of it

            gone = self.lost_host() if a.mpi == "openmpi" else None  # its ranks saved nothing: named all the same
            summary_main([f.stacks], {r: (gone[0], "its host was lost: no stacks") for r in gone[1]} if gone else None)
        if rc != 0:
            rc, summary, first_signal = self.first_failure(rc, lines)
            if summary:
                _say(summary)
                if not put_file(f.failure, "slurmlaunch: " + summary):
                    _say(f"could not write {f.failure}")
            if a.srun or a.mpi == "openmpi":
                rc = self.teardown_aborts(rc, summary, first_signal, lines)
        remove_dir(f.returned)
        remove_dir(f.reasons)
        if self.warning is not None:
            code = warning_code(a.warning)
            killed = self.killed_by_warning(lines)
            if killed:  # no handler for it, so nothing was saved: not the "exited 128+N" that asks for a requeue
                fix = warning_fix(a.warning, a.requeue is not None)
                line = f"{killed} killed by SIG{a.warning}, the warning signal: {fix}"
                _say(line)
                if not a.srun:  # --wait says it from here (under Slurm: from the batch log, which PBS has not)
                    put_file(f.failure, "slurmlaunch: " + line)
            elif a.requeue is not None and not a.requeued_by_script and wants_requeue(self.warned, rc, False, code):
                if self.stopped_by_hand():
                    _say(f"not requeued: the job was stopped {self.stopped_after:.0f}s into its run, before its "
                         f"walltime (qdel or qrerun)")
                elif self.requeue(a.requeue):
                    return 0
            if killed:  # end as the ranks did, killed by the signal: sacct's ExitCode then reads 0:N; the job's
                # code says "killed by the warning", not the 128 + N that asks for a requeue
                from .reasons import WARNING_KILLED

                put_file(f.exit_code, str(WARNING_KILLED))
                sys.stderr.flush()
                _signal.signal(self.warning, _signal.SIG_DFL)
                os.kill(os.getpid(), self.warning)
        if not self.stopped and not put_file(f.exit_code, str(rc)):
            _say(f"could not write {f.exit_code}")
        return rc

    def requeue(self, most: int) -> bool:
        """Requeue this Slurm job (no scontrol needed inside the ranks' container), or resubmit this PBS job:
        True when it was."""
        if self.args.resubmit is not None:
            return self.resubmit(self.args.resubmit, most)
        job = os.environ.get("SLURM_JOB_ID", "")
        text = os.environ.get("SLURM_RESTART_COUNT", "") or "0"
        restarts = int(text) if text.isdigit() else 0
        if restarts >= most:
            _say(f"not requeued: job {job} was already requeued {restarts} time(s) (--max-requeues {most})")
            return False
        _say(f"requeueing job {job} (restart {restarts + 1} of at most {most})")
        from .scheduler_commands import run_command

        done = run_command(["scontrol", "requeue", job], capture=False)  # scontrol says why on the job's stderr
        if not isinstance(done, str) and done.returncode == 0:
            return True
        _say(f"scontrol requeue {job} failed" + (f": {done}" if isinstance(done, str) else ""))
        return False

    def resubmit(self, name: str, most: int) -> bool:
        """PBS has no requeue a job's own user may ask for (qrerun needs operator or manager rights), so the job's
        kept script is submitted again, as job ``name``: held until this job has ended (-W depend=afterany), its
        output appended to the first job's output file, its files the first job's, ``SLURMLAUNCH_RESTART_COUNT``
        one more. The first job's job-ID.requeued lists the resubmissions, one id a line: status, --wait, logs
        and cancel follow them (schedulers/pbs.py)."""
        this = os.environ.get("PBS_JOBID", "")
        first = os.environ.get(REQUEUE_OF, "")
        first = first if pbs_id(first) else this
        restarts = _restarts(os.environ.get(RESTART_COUNT, ""))
        if restarts >= most:
            _say(f"not requeued: job {first} was already requeued {restarts} time(s) (--max-requeues {most})")
            return False
        from .scheduler_commands import run_command

        f = self.files
        cmd = ["qsub", "-N", name, "-o", os.path.join(self.args.log_dir, f"{first}.OU"), "-W",
               f"depend=afterany:{this}", "-v", f"{RESTART_COUNT}={restarts + 1},{REQUEUE_OF}={first}",
               f.script("qsub")]
        from shlex import join  # only here: the batch step's start stays light (issue 32)

        done = run_command(cmd)
        if isinstance(done, str):
            _say(f"not requeued: {join(cmd)} failed: {done}")
            return False
        new = done.stdout.strip()
        if done.returncode != 0 or not pbs_id(new):
            said = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()[0]
            _say(f"not requeued: {join(cmd)} failed: {said}")
            return False
        chain = read_chain(f.requeued)
        if not put_file(f.requeued, "\n".join([*chain, new])):
            _say(f"could not write {f.requeued}: status and --wait of job {first} will not follow job {new}")
        if self.stopped_by_hand():  # a qdel came while qsub ran: the cancel, which may have read no chain yet, wins
            deleted = run_command(["qdel", new])
            gone = not isinstance(deleted, str) and deleted.returncode == 0
            _say(f"not requeued: the job was stopped (qdel or qrerun) while it was submitted again as job {new}, "
                 + ("which was deleted" if gone else f"which could not be deleted: qdel {new} deletes it"))
            return False
        _say(f"requeued: job {first} resubmitted as job {new} (restart {restarts + 1} of at most {most}), to start "
             f"once job {this} has ended")
        return True


def read_chain(path: str) -> list[str]:
    """The job ids a job-ID.requeued file lists, in order (none when it is missing)."""
    from .smallfile import read_small

    try:
        text = read_small(path, 64 << 10).decode("utf-8", errors="replace")  # never through a link, nor a FIFO
    except OSError:
        return []
    return [line for line in text.split() if pbs_id(line)]



def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        _say("error: batch-step needs a COMMAND after --")
        return 2
    if args.log_dir is not None and not args.job:
        _say("error: batch-step --log-dir needs --job (the job's tag in its file names)")
        return 2
    step = Step(args)
    if args.log_dir is None:  # the API's submitit script: the warning passed on, srun's status the job's
        return step.run(command)
    code = step.prepare()
    if code is not None:
        return code
    if args.stage_env is None:
        return step.finish(step.run(command))
    from functools import partial

    from .stage import slurm_nodes, stage  # the node-local copy (issue 42), removed at the end

    nodes = args.nodes
    if args.srun:
        to_nodes = partial(slurm_nodes, nodes)
    else:
        from .stage_pbs import pbs_hosts

        hosts = _node_hosts()
        report = os.path.join(step.files.log_dir, f"{step.files.stem}.stage")  # a failing host's line
        to_nodes, nodes = partial(pbs_hosts, hosts, report), len(hosts) or nodes
    staged = stage(args.stage_env, step.tag or "", command, to_nodes, nodes)
    if isinstance(staged, str):  # --wait shows the failure file's line
        from .stage import STAGE_FAILED

        put_file(step.files.failure, "slurmlaunch: " + staged)
        return step.finish(STAGE_FAILED)
    from .timeline import step_started

    step_started(os.environ)
    try:
        rc = step.run(staged.command)
    finally:
        staged.clean()
    return step.finish(rc)
