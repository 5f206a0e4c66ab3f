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

from .collect import _STATUS_FILE

# After the first rank fails, the others get SIGINT (submitit's tasks ignore SIGTERM), then SIGKILL after
# this many seconds: long enough for `finally` blocks, short enough that the caller hears within seconds.
_STOP_GRACE_S = 3.0
_POLL_MS = 50  # the controller's timer (signals received, time limit); a rank's end wakes it at once
_REQUEUE_CODE = 144  # what submitit's local tasks exit with to be started again (after a checkpoint)
_MAX_STARTS = 6  # submitit's local bound on requeues; its per-job timeout countdown applies as well


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
        self.warn_s = self.timeout_s - float(env["SUBMITIT_LOCAL_SIGNAL_DELAY_S"])
        self.job_id = str(os.getpid())
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
        if reason and reason.startswith("cancelled"):
            number = self.received_stop or signal.SIGINT
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)  # the job's state reads INTERRUPTED, as with submitit's controller
        return 0 if all(v["code"] == 0 for v in ended.values()) else 1

    def _attempt(self, paths: list[Any]) -> tuple[dict[int, dict[str, Any]], str | None]:
        import ctypes  # before any fork: the children only call into it

        from submitit.local.local import LocalJobEnvironment

        def die_with_controller() -> None:  # PR_SET_PDEATHSIG: a killed controller leaves no rank behind
            try:
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)
            except (OSError, AttributeError):
                pass

        files: list[Any] = []
        procs: dict[int, subprocess.Popen[bytes]] = {}
        ended: dict[int, dict[str, Any]] = {}
        reason: str | None = None
        poller, pidfds = select.poll(), dict[int, int]()
        try:
            for k, p in enumerate(paths):
                out, err = open(p.stdout, "ab"), open(p.stderr, "ab")  # noqa: SIM115 (closed below)
                files += [out, err]
                env = dict(os.environ, SUBMITIT_LOCAL_LOCALID=str(k), SUBMITIT_LOCAL_GLOBALID=str(k),
                           SUBMITIT_LOCAL_JOB_ID=self.job_id)
                procs[k] = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                            start_new_session=True, preexec_fn=die_with_controller)
            # Woken by a rank's end through its pidfd rather than by a timer, so that "at" is when it ended,
            # give or take the scheduler: it decides which failure came first (see _DEATH_SLACK_S).
            for k, proc in procs.items():
                try:
                    pidfds[k] = os.pidfd_open(proc.pid)
                    poller.register(pidfds[k], select.POLLIN)
                except (AttributeError, OSError):  # Linux < 5.3: the poll below is a plain timer
                    pass
            start, warned, kill_at = time.monotonic(), False, None
            while len(ended) < len(procs):
                for k, proc in procs.items():
                    code = None if k in ended else proc.poll()
                    if code is None:
                        continue
                    ended[k] = {"code": code, "at": time.time(), "stopped": reason is not None}
                    if k in pidfds:
                        poller.unregister(pidfds[k])
                    if reason is None and code != 0:
                        reason = "requeued" if code == _REQUEUE_CODE else f"stopped after rank {k} failed"
                while self.received:
                    number = self.received.pop(0)
                    if number in (signal.SIGINT, signal.SIGTERM):
                        self.received_stop = self.received_stop or number
                        reason = reason or f"cancelled ({signal.Signals(number).name})"
                    else:
                        _signal_ranks(procs, ended, number)
                elapsed = time.monotonic() - start
                # as submitit's controller: no warning when the delay exceeds the time limit (a warning
                # signal before the tasks have installed submitit's handler would kill them)
                if not warned and 0 < self.warn_s <= elapsed:
                    warned = True
                    _signal_ranks(procs, ended, LocalJobEnvironment._usr_sig())
                if reason is None and elapsed >= self.timeout_s:
                    reason = "stopped at its time limit"
                if reason is not None and kill_at is None:
                    kill_at = time.monotonic() + _STOP_GRACE_S
                    _signal_ranks(procs, ended, signal.SIGINT)
                if kill_at is not None and time.monotonic() >= kill_at:
                    _signal_ranks(procs, ended, signal.SIGKILL)
                poller.poll(_POLL_MS)
        finally:
            for proc in procs.values():  # whatever a rank started in its session goes with it
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            for f in files:
                f.close()
            for fd in pidfds.values():
                os.close(fd)
        return ended, reason


def _signal_group(pid: int, number: int) -> None:
    try:
        os.killpg(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_ranks(procs: dict[int, Any], ended: dict[int, Any], number: int) -> None:
    for k, proc in procs.items():
        if k not in ended:
            _signal_group(proc.pid, number)


def _controller_main() -> None:
    """Entry point of the local controller process (see _start_controller)."""
    sys.exit(_LocalController(sys.argv[1]).run())


def _start_controller(folder: Path, command: str, ntasks: int, timeout_min: float,
                      signal_delay_s: int) -> subprocess.Popen[bytes]:
    """submitit's start_controller, with our controller, and without blanking CUDA_VISIBLE_DEVICES:
    the emulated nodes hand out the GPUs themselves (_export_distributed_env)."""
    env = dict(os.environ, SUBMITIT_LOCAL_NTASKS=str(ntasks), SUBMITIT_LOCAL_COMMAND=command,
               SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * timeout_min)), SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(signal_delay_s),
               SUBMITIT_LOCAL_NODEID="0", SUBMITIT_LOCAL_JOB_NUM_NODES="1", SUBMITIT_STDERR_TO_STDOUT="",
               SUBMITIT_EXECUTOR="local")
    code = "from slurmlaunch.app.api.local import _controller_main; _controller_main()"
    return subprocess.Popen([sys.executable, "-c", code, str(folder)], env=env)


def _local_executor(folder: str, python: str) -> Any:
    """submitit's LocalExecutor (pickling, paths, arrays) starting _LocalController for every job."""
    import submitit
    from submitit.local.local import LocalJob

    class Executor(submitit.LocalExecutor):
        def _submit_command(self, command: str) -> LocalJob[Any]:
            ntasks = int(self.parameters.get("tasks_per_node", 1))
            process = _start_controller(self.folder, command, ntasks, float(self.parameters["timeout_min"]),
                                        int(self.parameters["signal_delay_s"]))
            return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(ntasks)))

    return Executor(folder=folder, python=python)

