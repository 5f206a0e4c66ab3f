"""The local scheduler's controller: runs one job's tasks in place of submitit's own."""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ...core.signals import WARNING_VAR, ignored_until_handled
from .collect import _STATUS_FILE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...core.spec import JobSpec

# After the first rank fails, the others get SIGINT (submitit's tasks ignore SIGTERM), then SIGKILL after
# this many seconds: long enough for `finally` blocks, short enough that the caller hears within seconds.
_STOP_GRACE_S = 3.0
_POLL_MS = 50  # the controller's timer (signals received, time limit); a rank's end wakes it at once
_REQUEUE_CODE = 144  # what submitit's local tasks exit with to be started again (after a checkpoint)
_MAX_STARTS = 6  # submitit's local bound on requeues; its per-job timeout countdown applies as well
_JOB_ID_VARIABLE = "SLURMLAUNCH_LOCAL_JOB_ID"  # the job's id and log directory, for the controller
_LOG_DIR_VARIABLE = "SLURMLAUNCH_LOCAL_LOG_DIR"


class _LocalController:
    """One local job's tasks, in place of submitit's controller: the same variables and files, but it
    records how every rank ended (exit code, or negative: the signal) and, like srun --kill-on-bad-exit,
    stops the other ranks as soon as one fails (submitit's waits for all of them: a rank that died left the
    others in a collective, or computing, for as long as it took)."""

    def __init__(self, folder: str) -> None:
        env = os.environ
        self.ntasks = int(env["SUBMITIT_LOCAL_NTASKS"])
        self.command = shlex.split(env["SUBMITIT_LOCAL_COMMAND"])
        self.timeout_s = float(env["SUBMITIT_LOCAL_TIMEOUT_S"])
        delay = env["SUBMITIT_LOCAL_SIGNAL_DELAY_S"]  # empty: no warning (signal="none")
        self.warn_s = self.timeout_s - float(delay) if delay else 0.0
        # the local scheduler's job id, claimed by the submitter (_local_executor): the files, SUBMITIT_LOCAL_JOB_ID
        self.job_id = env.get(_JOB_ID_VARIABLE) or str(os.getpid())
        self.log_dir = env.get(_LOG_DIR_VARIABLE)
        self.folder = folder
        self.received: list[int] = []
        self.received_stop: int | None = None  # the SIGINT or SIGTERM that cancelled the job

    def run(self) -> int:
        from submitit.core.utils import JobPaths

        paths = [JobPaths(self.folder, self.job_id, k) for k in range(self.ntasks)]
        paths[0].folder.mkdir(parents=True, exist_ok=True)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, lambda number, _frame: self.received.append(number))
        for _ in range(_MAX_STARTS):
            ended, reason = self._attempt(paths)
            if reason != "requeued":
                break
            for p in paths:  # the stopped ranks' errors must not pass for the next start's results
                p.result_pickle.unlink(missing_ok=True)
        status = {"ranks": {str(k): v for k, v in sorted(ended.items())}, "reason": reason}
        target = paths[0].folder / _STATUS_FILE.format(job_id=self.job_id)
        temporary = target.with_suffix(".tmp")
        temporary.write_text(json.dumps(status))
        os.replace(temporary, target)  # the caller reads it once this process has ended; atomic anyway
        self._write_end(ended, reason)
        if reason and reason.startswith("cancelled"):
            number = self.received_stop or signal.SIGINT
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)  # the job's state reads INTERRUPTED, as with submitit's controller
        return 0 if all(v["code"] == 0 for v in ended.values()) else 1

    def _write_end(self, ended: dict[int, dict[str, Any]], reason: str | None) -> None:
        """The job's exit file, as the local scheduler's supervisor writes it (`slurmlaunch status JOB`)."""
        if not self.log_dir:
            return
        from ...schedulers.local import write_end

        failed = sorted((v["at"], k) for k, v in ended.items() if v["code"] != 0 and not v.get("stopped"))
        if reason and reason.startswith("cancelled"):
            state, code = "CANCELLED", 128 + (self.received_stop or signal.SIGINT)
        elif reason == "stopped at its time limit":
            state, code = "TIMEOUT", 128 + signal.SIGTERM
        elif failed or any(v["code"] != 0 for v in ended.values()):
            first = ended[failed[0][1]]["code"] if failed else next(v["code"] for v in ended.values() if v["code"])
            state, code = "FAILED", 128 - first if first < 0 else first
        else:
            state, code = "COMPLETED", 0
        try:
            write_end(self.log_dir, self.job_id, code, state)
        except OSError:
            pass

    def _attempt(self, paths: list[Any]) -> tuple[dict[int, dict[str, Any]], str | None]:
        attempt = _Attempt(self, paths)
        attempt.run()
        return attempt.ended, attempt.reason


def _die_with_controller() -> None:
    """PR_SET_PDEATHSIG in a rank (between fork and exec): a killed controller leaves no rank behind. And the
    warning ignored, as the launcher does it (core/signals.py), until the rank's submitit sets its handler: a
    warning in the rank's first moments must not kill it."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    for number in ignored_until_handled(os.environ.get(WARNING_VAR)):
        signal.signal(number, signal.SIG_IGN)


class _Attempt:
    """One start of a job's ranks, watched until every rank has ended: how each ended (``ended``) and why
    the others were stopped (``reason``: None when none was)."""

    def __init__(self, controller: _LocalController, paths: list[Any]) -> None:
        self.controller = controller
        self.paths = paths
        self.files: list[Any] = []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.ended: dict[int, dict[str, Any]] = {}
        self.reason: str | None = None
        self.poller = select.poll()
        self.pidfds: dict[int, int] = {}

    def run(self) -> None:
        import ctypes  # noqa: F401  (before any fork: the children only call into it)

        from ...schedulers.supervisor import signal_group  # the controller's alone: not on every API import

        try:
            self._start()
            self._watch()
        finally:
            for proc in self.procs.values():  # whatever a rank started in its session goes with it
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            for f in self.files:
                f.close()
            for fd in self.pidfds.values():
                os.close(fd)

    def _start(self) -> None:
        for k, p in enumerate(self.paths):
            out, err = open(p.stdout, "ab"), open(p.stderr, "ab")  # noqa: SIM115 (closed in run)
            self.files += [out, err]
            env = dict(os.environ, SUBMITIT_LOCAL_LOCALID=str(k), SUBMITIT_LOCAL_GLOBALID=str(k),
                       SUBMITIT_LOCAL_JOB_ID=self.controller.job_id)
            self.procs[k] = subprocess.Popen(self.controller.command, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=err, start_new_session=True, preexec_fn=_die_with_controller)
        # Woken by a rank's end through its pidfd rather than by a timer, so that "at" is when it ended,
        # give or take the scheduler: it decides which failure came first (see _DEATH_SLACK_S).
        for k, proc in self.procs.items():
            try:
                self.pidfds[k] = os.pidfd_open(proc.pid)
                self.poller.register(self.pidfds[k], select.POLLIN)
            except (AttributeError, OSError):  # Linux < 5.3: the poll below is a plain timer
                pass

    def _watch(self) -> None:
        from submitit.local.local import LocalJobEnvironment

        start, warned, kill_at = time.monotonic(), False, None
        while len(self.ended) < len(self.procs):
            self._reap()
            self._take_signals()
            elapsed = time.monotonic() - start
            # as submitit's controller: no warning when the delay exceeds the time limit (a warning
            # signal before the tasks have installed submitit's handler would kill them)
            if not warned and 0 < self.controller.warn_s <= elapsed:
                warned = True
                self._signal(LocalJobEnvironment._usr_sig())
            if self.reason is None and elapsed >= self.controller.timeout_s:
                self.reason = "stopped at its time limit"
            if self.reason is not None and kill_at is None:
                kill_at = time.monotonic() + _STOP_GRACE_S
                self._signal(signal.SIGINT)
            if kill_at is not None and time.monotonic() >= kill_at:
                self._signal(signal.SIGKILL)
            self.poller.poll(_POLL_MS)

    def _reap(self) -> None:
        for k, proc in self.procs.items():
            code = None if k in self.ended else proc.poll()
            if code is None:
                continue
            self.ended[k] = {"code": code, "at": time.time(), "stopped": self.reason is not None}
            if k in self.pidfds:
                self.poller.unregister(self.pidfds[k])
            if self.reason is None and code != 0:
                self.reason = "requeued" if code == _REQUEUE_CODE else f"stopped after rank {k} failed"

    def _take_signals(self) -> None:
        received = self.controller.received
        while received:
            number = received.pop(0)
            if number in (signal.SIGINT, signal.SIGTERM):
                self.controller.received_stop = self.controller.received_stop or number
                self.reason = self.reason or f"cancelled ({signal.Signals(number).name})"
            else:
                self._signal(number)

    def _signal(self, number: int) -> None:
        from ...schedulers.supervisor import signal_group

        for k, proc in self.procs.items():
            if k not in self.ended:
                signal_group(proc.pid, number)


def _controller_main() -> None:
    """Entry point of the local controller process (see _start_controller)."""
    sys.exit(_LocalController(sys.argv[1]).run())


def _start_controller(folder: Path, command: str, ntasks: int, timeout_min: float,
                      warning: tuple[str, int] | None, job: tuple[str, str] | None = None) -> subprocess.Popen[bytes]:
    """submitit's start_controller, with our controller, and without blanking CUDA_VISIBLE_DEVICES:
    the emulated nodes hand out the GPUs themselves (_export_distributed_env). ``warning``: the job's
    (JobSpec.warning): its NAME is submitit's preempt signal in the controller and the ranks (their handler),
    sent SECONDS before the limit; None sends none. ``job``: its local job id and log directory."""
    # WARNING_VAR: the ranks (and a script's launcher, submit_script) start with the warning ignored
    named = {"SUBMITIT_PREEMPT_SIGNAL": warning[0], WARNING_VAR: warning[0]} if warning else {}
    if job is not None:
        named.update({_JOB_ID_VARIABLE: job[0], _LOG_DIR_VARIABLE: job[1]})
    env = dict(os.environ, **named, SUBMITIT_LOCAL_NTASKS=str(ntasks), SUBMITIT_LOCAL_COMMAND=command,
               SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * timeout_min)),
               SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(warning[1]) if warning else "",
               SUBMITIT_LOCAL_NODEID="0", SUBMITIT_LOCAL_JOB_NUM_NODES="1", SUBMITIT_STDERR_TO_STDOUT="",
               SUBMITIT_EXECUTOR="local")
    code = "from slurmlaunch.app.api.local import _controller_main; _controller_main()"
    return subprocess.Popen([sys.executable, "-c", code, str(folder)], env=env)


def _local_executor(folder: str, spec: JobSpec) -> Any:
    """submitit's LocalExecutor (pickling, paths, arrays) starting _LocalController for every job, which sends
    the job's warning (JobSpec.warning: NAME, SECONDS before the limit; None: none). Every job is a local
    scheduler's job: its id claimed as the CLI's are (never below the Unix time), its record beside its logs
    naming the controller as its supervisor, a line in the index: `slurmlaunch list`, `status`, `logs`,
    `cancel` know it."""
    import submitit
    from submitit.local.local import LocalJob

    from ...schedulers.local import claim, name_supervisor
    from .job import link_logs

    class Executor(submitit.LocalExecutor):
        def _submit_command(self, command: str) -> LocalJob[Any]:
            ntasks = int(self.parameters.get("tasks_per_node", 1))
            job_id, record = claim(spec, os.environ, shlex.split(command))
            process = _start_controller(self.folder, command, ntasks, float(self.parameters["timeout_min"]),
                                        spec.warning, (job_id, spec.log_dir))
            name_supervisor(record, process.pid)
            job: LocalJob[Any] = LocalJob(folder=self.folder, job_id=job_id, process=process,
                                          tasks=list(range(ntasks)))
            link_logs(spec, job)
            return job

    return Executor(folder=folder, python=spec.program.python)
