"""The Python front end, built on submitit: run a function (or a script) as a distributed job.

    import slurmlaunch
    job = slurmlaunch.submit(train, cfg, nodes=2, gpus_per_node=4, time="4:00:00", partition="gpu")
    print(job.result())          # rank 0's return value
    print(job.results())         # every rank's, indexed by rank

The options are JobSpec's fields, validated by the same code as the CLI's. Under Slurm, submitit's
SlurmExecutor runs one task per GPU (srun --kill-on-bad-exit); ``scheduler="local"`` uses submitit's
LocalExecutor for the pickling and the files, with our own controller process in place of submitit's
(see _LocalController: it knows how each rank ended, and stops the others when one fails, as srun
does), and emulates the nodes the way the CLI's local scheduler does. Inside every task the torch
distributed environment is computed and exported by the launcher's own code (detect, checks, exports)
before ``fn`` runs.

How a job's outcome is collected (Job.results, the same on both schedulers): wait for the job to end
(under Slurm: until sacct says so, one batched sacct every 2 s for all the jobs being waited for), then
look at every rank's files at once, without waiting for any that is missing; the return value travels
pickled by the rank itself (_Packed), so a value that cannot be pickled is reported as such, with the part
that could not be; a rank that raised SystemExit left an exit record (its code, and when); a rank with
neither ended without a Python exception, and how (exit code or signal) comes from the local controller's
status file, or under Slurm from srun's own report of the step's tasks in the batch log. The first failure
by time is raised as RankFailed; a job that Slurm cancelled or stopped at its time limit says so instead.
Only the values asked for are loaded: result() reads rank 0's alone.

The warning signal under Slurm follows the CLI's plan (templates/slurm.sbatch.j2): ``--signal=B:SIG@secs``
goes to the batch shell, which traps it and passes it on through srun to the ranks, where submitit's
handler (told the signal's name) checkpoints and requeues. The batch script is submitit's; _batch_lines
are its setup lines.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..core.errors import SlurmLaunchError, SpecError
from ..core.spec import ENV_KEY, JobSpec
from .resolve import resolve as resolve_request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .remote_api import RemoteJob

_MARK = "slurmlaunch-rank-failure"
# `slurmlaunch submit` features the submitit-based API does not carry out: refused, never silently dropped.
CLI_ONLY = frozenset({"array", "max_parallel", "sweep", "mode", "nproc_per_node", "max_restarts", "min_nodes",
                      "container_image", "apptainer", "container_mounts", "container_workdir", "template_dir"})
OPTION_NAMES = frozenset(f.name for f in fields(JobSpec)) - {"script", "args", "module", "no_python", "python",
                                                             "workdir", "legacy_local_rank_arg"} - CLI_ONLY
# A profile's keys (the CLI's option names) as JobSpec fields, where they differ.
_PROFILE_FIELDS = {"sbatch_arg": "sbatch_args", "container_mount": "container_mounts", "pbs_resource": "pbs_resources",
                   "mpiexec_arg": "mpiexec_args"}


# The local controller's record of how every rank ended, next to submitit's files of the job.
_STATUS_FILE = "{job_id}_ranks.json"
# After the first rank fails, the others get SIGINT (submitit's tasks ignore SIGTERM), then SIGKILL after
# this many seconds: long enough for `finally` blocks, short enough that the caller hears within seconds.
_STOP_GRACE_S = 3.0
_POLL_MS = 50  # the controller's timer (signals received, time limit); a rank's end wakes it at once
# A rank that ended without a Python exception (os._exit, a signal) is only seen ending by the controller,
# a busy machine's scheduling delay late, while its peers' errors about the lost connection carry the
# time they happened: within this slack, the death comes first, as it caused them.
_DEATH_SLACK_S = 0.5
_REQUEUE_CODE = 144  # what submitit's local tasks exit with to be started again (after a checkpoint)
_MAX_STARTS = 6  # submitit's local bound on requeues; its per-job timeout countdown applies as well
# submitit waits this long for a result file that the file system may show late (NFS); here only when
# the job COMPLETED (every rank returned, so every result must come), once per job.
_RESULT_WAIT_S = 15.0
_SACCT_EVERY_S = 2  # at most one sacct per this many seconds, for all the jobs being waited for together
# Job states after which the ranks that left nothing were stopped from outside, not failed on their own.
_STOPPED_STATES = ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE")
# squeue's states (`-t all`) of a job that has ended (squeue(1), JOB STATE CODES)
_FINAL_QUEUE_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                       "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT")
# The first line the batch shell writes to the batch log at each start: srun's reports before the last
# one belong to an earlier run of a requeued job.
_BATCH_MARK = "slurmlaunch: batch shell started"
# srun's report of a task that ended badly, as the batch log has it (one line per task or task range).
_SRUN_TASK = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.+)$", re.MULTILINE)
# srun names a signal by its description (strsignal): "Segmentation fault (core dumped)", "Killed".
_SIGNAL_TEXTS = {signal.strsignal(s): int(s) for s in signal.Signals if signal.strsignal(s)}


class RankFailed(SlurmLaunchError):
    """A rank of a distributed job failed; ``rank`` is the first to fail, ``trace`` what it reported (its
    traceback, or how its process ended and its last log lines). How its process ended, where known (the
    local scheduler always knows, Slurm from srun's report): ``returncode`` as subprocess has it (-N: killed
    by signal N) and ``signal_name`` ("SIGSEGV"); None otherwise. ``at``: when it failed, where known."""

    def __init__(self, rank: int, trace: str, returncode: int | None = None, at: float | None = None) -> None:
        self.rank = rank
        self.trace = trace
        self.returncode = returncode
        self.at = at  # when it failed (time.time()), where known
        self.signal_name = _signal_name(-returncode).split()[0] if returncode is not None and returncode < 0 else None
        how = ("" if returncode is None else f" (killed by {_signal_name(-returncode)})" if returncode < 0
               else f" (exit code {returncode})")
        super().__init__(f"rank {rank} failed{how}:\n{trace}")

    def __reduce__(self) -> tuple[Any, ...]:
        # the API with remote= brings it back from the login node pickled: rebuilt from its fields
        return (RankFailed, (self.rank, self.trace, self.returncode, self.at))


def _mark() -> str:
    """The first line of the error a task raises, so that the caller can tell the first failure from its
    consequences in the other ranks: the rank and the time (taken before formatting a traceback)."""
    return f"{_MARK} rank={os.environ.get('RANK', '?')} at={time.time():.6f}\n"


def _failure(message: str) -> RuntimeError:
    return RuntimeError(_mark() + message)


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


class _Packed:
    """A rank's return value, pickled in the rank: submitit would pickle it after ``fn`` returned, and a
    value that cannot be pickled would then leave no result at all (its error dump collides with the
    half-written file), so the caller would wait and learn nothing."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def value(self) -> Any:
        import pickle

        return pickle.loads(self.payload)


def _type_name(value: object) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _unpicklable_part(value: object, dumps: Callable[[object], bytes], path: str, depth: int = 0) -> str | None:
    """Where in ``value`` the pickling fails: the deepest container entry or attribute that does not pickle
    (at most 5 levels, 1000 entries a level: this only runs on the failure path)."""
    if depth >= 5:
        return None
    parts: list[tuple[str, object]] = []
    if isinstance(value, dict):
        parts = [(f"{path}[{k!r}]", v) for k, v in list(value.items())[:1000]]
    elif isinstance(value, (list, tuple)):
        parts = [(f"{path}[{i}]", v) for i, v in enumerate(value[:1000])]
    elif isinstance(value, (set, frozenset)):
        parts = [(f"an element of {path}", v) for v in list(value)[:1000]]
    elif isinstance(getattr(value, "__dict__", None), dict):
        parts = [(f"{path}.{k}", v) for k, v in list(vars(value).items())[:1000]]
    for where, part in parts:
        try:
            dumps(part)
        except Exception:
            return _unpicklable_part(part, dumps, where, depth + 1) or f"{where} is a {_type_name(part)}"
    return None


def _pack(value: object) -> _Packed:
    import pickle

    import cloudpickle  # type: ignore[import-untyped]  # submitit's dependency, and its pickler for results

    def dumps(obj: object) -> bytes:
        return bytes(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    try:
        return _Packed(dumps(value))
    except Exception as e:
        where = _unpicklable_part(value, dumps, "the value") or f"the value is a {_type_name(value)}"
        raise _failure(f"the function returned a {_type_name(value)} that cannot be pickled to send it back "
                       f"({where}): {type(e).__name__}: {e}") from None


def _export_distributed_env(spec: JobSpec) -> None:
    """In a task: give submitit's local tasks the variables a Slurm step would have, then map them exactly
    as `slurmlaunch launch` does and export the result."""
    from ..allocation.launch import preflight, resolve

    environ = os.environ
    if "SUBMITIT_LOCAL_JOB_ID" in environ and "SLURM_PROCID" not in environ:
        from ..schedulers.local import gpu_plan, rank_env

        rank = int(environ["SUBMITIT_LOCAL_GLOBALID"])
        gpus, _ = gpu_plan(spec, environ)
        emulated = rank_env(spec, environ["SUBMITIT_LOCAL_JOB_ID"], rank, environ, gpus)
        if spec.gpus_per_node == 0:  # asked for no GPU, gets none (as under Slurm, and as before: submitit's
            emulated["CUDA_VISIBLE_DEVICES"] = ""  # controller blanked it, for every job, GPUs asked or not)
        environ.update({k: v for k, v in emulated.items() if environ.get(k) != v})
    dist = preflight(resolve(environ), environ)
    environ.update(dist.exports(environ))


def _exit_record(result_pickle: Path) -> Path:
    """Where a rank that raised SystemExit records its code and when, beside its (absent) result file."""
    return result_pickle.with_name(result_pickle.name.replace("_result.pkl", "_exit.json"))


def _own_exit_record() -> Path | None:
    try:
        import submitit

        return _exit_record(submitit.JobEnvironment().paths.result_pickle)
    except Exception:  # not run by submitit (a test calling it directly): nothing to record
        return None


def _raised_by_submitit(error: BaseException) -> bool:
    """submitit's own SystemExit: its signal handler leaves that way after requeueing a preempted job."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("submitit")


def _record_exit(path: Path, error: SystemExit) -> None:
    at = time.time()
    code = error.code
    number = 0 if code is None else code if isinstance(code, int) else 1  # sys.exit("text") exits 1
    message = "" if isinstance(code, int) or code is None else str(code)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"code": number, "at": at, "message": message}))
    os.replace(temporary, path)


class _DistributedCall:
    """What submitit runs in every task: the environment, then ``fn``; a failure is marked with its rank
    and time, so that the caller can tell the first failure from its consequences in the other ranks.
    SystemExit is not an error submitit reports (the process just exits with the code): the rank records
    the code and the time itself (_exit_record)."""

    def __init__(self, spec: JobSpec, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.spec, self.fn, self.args, self.kwargs = spec, fn, tuple(args), dict(kwargs)

    def __call__(self) -> _Packed:
        record = _own_exit_record()
        if record is not None:
            record.unlink(missing_ok=True)  # an earlier run's, before a requeue
        _export_distributed_env(self.spec)
        try:
            value = self.fn(*self.args, **self.kwargs)
        except SystemExit as e:  # passed on: submitit exits that way to requeue a preempted job
            if record is not None and not _raised_by_submitit(e):
                _record_exit(record, e)
            raise
        except Exception as e:
            mark = _mark()
            raise RuntimeError(mark + traceback.format_exc()) from e
        return _pack(value)


class _CheckpointableCall(_DistributedCall):
    """Only callables that can checkpoint get a ``checkpoint`` method: submitit requeues those alone."""

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        inner = self.fn.checkpoint(*self.args, **self.kwargs)  # type: ignore[attr-defined]
        if inner is None:
            return None
        call = _wrap(self.spec, inner.function, inner.args, inner.kwargs)
        return submitit.helpers.DelayedSubmission(call)


class _ScriptCall:
    """A script in every task, started through the launcher (exec), as the CLI does."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    def __call__(self) -> int:
        from ..render.launch import launch_command

        _export_distributed_env(self.spec)
        done = subprocess.run(launch_command(self.spec), cwd=self.spec.workdir)
        if done.returncode != 0:
            how = (f"was killed by {_signal_name(-done.returncode)}" if done.returncode < 0
                   else f"exited with code {done.returncode}")
            raise _failure(f"{self.spec.script} {how}")
        return done.returncode


def _wrap(spec: JobSpec, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> _DistributedCall:
    cls = _CheckpointableCall if hasattr(fn, "checkpoint") else _DistributedCall
    return cls(spec, fn, args, kwargs)


def _status(job: Any) -> dict[str, Any] | None:
    """The local controller's record of how the ranks ended (None: not a local job, or no record)."""
    try:
        with open(Path(job.paths.folder) / _STATUS_FILE.format(job_id=job.job_id), encoding="utf-8") as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return None


def _tail(task: Any, lines: int = 20) -> str:
    for path in (task.paths.stderr, task.paths.stdout):
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
                text = f.read().decode(errors="replace").rstrip()
        except OSError:
            continue
        if text:
            return f"--- the last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])
    return f"(nothing in {task.paths.stderr} nor {task.paths.stdout})"


def _outcome(result_pickle: Path) -> str:
    """"success" or "error", read from the start of a result file without loading the value after it
    (submitit pickles the tuple (outcome, value): the outcome is the first string)."""
    import pickletools

    with open(result_pickle, "rb") as f:
        for _, arg, _ in pickletools.genops(f):
            if isinstance(arg, str):
                return arg
    return "unreadable"


def _step_ends(batch_log: Path) -> dict[int, tuple[int, int | None, str]]:
    """srun's report of the tasks that ended badly in the job's last run, as the batch log has it: rank ->
    (the order of srun's report, the return code as subprocess has it (-N: signal N) or None, srun's words).
    srun reports a task when it sees it end, so the order is the order of the ends, as srun saw them."""
    try:
        with open(batch_log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - (1 << 20)))  # srun's lines come last
            text = f.read().decode(errors="replace")
    except OSError:
        return {}
    text = text[text.rfind(_BATCH_MARK) + 1:] if _BATCH_MARK in text else text
    ends: dict[int, tuple[int, int | None, str]] = {}
    for order, m in enumerate(_SRUN_TASK.finditer(text)):
        words = m.group(3).strip()
        exited = re.fullmatch(r"Exited with exit code (\d+)", words)
        code = int(exited.group(1)) if exited else _SIGNAL_TEXTS.get(words.removesuffix(" (core dumped)"))
        code = code if exited or code is None else -code
        for part in m.group(2).split(","):
            low, _, high = part.partition("-")
            for rank in range(int(low), int(high or low) + 1):
                ends.setdefault(rank, (order, code, words))
    return ends


def _how(code: int | None) -> str:
    return ("ended without a result" if code is None else
            f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}")


def _collect(job: Any, world: int, state: str | None, wanted: Iterable[int] | None = None) -> dict[int, Any]:
    """The values of the ranks in ``wanted`` (all: None) once the job has ended (Job.results); RankFailed
    for the first failure by time, SlurmLaunchError for a job cancelled or stopped from outside. ``state``:
    the job's final state under Slurm (None on the local scheduler, whose controller records the ranks)."""
    from submitit.core.utils import pickle_load

    status = _status(job)
    ended: dict[str, dict[str, Any]] = status["ranks"] if status else {}
    tasks = [job.task(rank) for rank in range(world)]
    results = [Path(t.paths.result_pickle) for t in tasks]
    if status is None and state == "COMPLETED":
        # Every rank returned, so every result file will come; a shared file system may show one late.
        deadline = time.monotonic() + _RESULT_WAIT_S
        while time.monotonic() < deadline and not all(r.exists() or _exit_record(r).exists() for r in results):
            time.sleep(0.5)
    steps = _step_ends(Path(tasks[0].paths.stderr)) if status is None else {}
    keep = set(range(world)) if wanted is None else set(wanted)
    values: dict[int, Any] = {}
    timed: list[tuple[float, int, str, int | None]] = []  # failures that carry their time
    deaths: list[tuple[int, int, str, int | None]] = []  # ends without a time, in srun's order
    stopped: list[int] = []
    for rank, task in enumerate(tasks):
        end = ended.get(str(rank))
        step = steps.get(rank)
        code = int(end["code"]) if end is not None else step[1] if step is not None else None
        exit_path = _exit_record(results[rank])
        if results[rank].exists():
            if _outcome(results[rank]) == "success":
                if rank in keep:
                    payload = pickle_load(results[rank])[1]
                    values[rank] = payload.value() if isinstance(payload, _Packed) else payload
                continue
            payload = pickle_load(results[rank])[1]
            mark = re.search(_MARK + r" rank=(\S+) at=([\d.]+)\n", payload)
            when = float(mark.group(2)) if mark else float(end["at"]) if end else float("inf")
            timed.append((when, rank, payload[mark.end():] if mark else payload, code))
        elif exit_path.exists():
            record = json.loads(exit_path.read_text())
            if record["code"] == 0 and not code:
                values[rank] = None  # sys.exit(0): ended well, returned nothing
                continue
            said = f": {record['message']}" if record["message"] else ""
            text = f"it raised SystemExit with exit code {record['code']}{said}\n{_tail(task)}"
            timed.append((float(record["at"]), rank, text, int(record["code"])))
        elif end is not None and end["stopped"]:
            stopped.append(rank)  # stopped because another rank failed, or the job was cancelled
        elif end is not None or step is not None:
            how = _how(code)
            seen = "" if end is not None else f" (srun: {step[2]})" if step is not None else ""
            text = (f"its process {how}{seen}, without a Python exception (os._exit, a crash in native code, "
                    f"a kill from outside, running out of memory)\n{_tail(task)}")
            if end is not None:
                timed.append((float(end["at"]) - _DEATH_SLACK_S, rank, text, code))
            elif step is not None:
                deaths.append((step[0], rank, text, code))
        else:
            timed.append((float("inf"), rank, f"its process ended without a result (the job ended {state})\n"
                          f"{_tail(task)}", None))
    if state is not None and state.split()[0] in _STOPPED_STATES:
        # The ranks' errors are the consequences (a peer killed first): the job's end is the news.
        unfinished = [r for r in range(world) if r not in values and not _success(results[r])]
        how = "was cancelled" if state.startswith("CANCELLED") else "was stopped"
        raise SlurmLaunchError(f"job {job.job_id} {how} ({state}) before rank(s) {_ranks(unfinished)} finished"
                               f" (no rank failed before that)")
    first = min(timed) if timed else None
    if deaths:
        death = min(deaths)
        step = steps.get(first[1]) if first is not None else None
        # A rank's error is timed, a death only ordered by srun's report: the death came first when srun
        # saw it end before the rank that erred (whose error then is the death's consequence).
        if first is None or step is None or step[0] > death[0]:
            _, rank, text, code = death
            raise RankFailed(rank, text, code)
    if first is not None:
        when, rank, text, code = first
        raise RankFailed(rank, text, code, None if when == float("inf") else when)
    if stopped:
        raise SlurmLaunchError(f"job {job.job_id} was {status['reason'] if status else 'stopped'} before "
                               f"rank(s) {_ranks(stopped)} finished (no rank failed)")
    return values


def _success(result_pickle: Path) -> bool:
    return result_pickle.exists() and _outcome(result_pickle) == "success"


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))


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
    code = "from slurmlaunch.app.api import _controller_main; _controller_main()"
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


class Job:
    """A submitted distributed job (one submitit job with one task per rank)."""

    def __init__(self, job: Any, spec: JobSpec, scheduler: str) -> None:
        self._job = job
        self.spec = spec
        self.scheduler = scheduler
        self._queue_asked = -float("inf")
        self._queued: str | None = None

    @property
    def job_id(self) -> str:
        return str(self._job.job_id)

    @property
    def state(self) -> str:
        """The scheduler's state: final (COMPLETED, FAILED, CANCELLED by ..., TIMEOUT; locally FINISHED or
        INTERRUPTED) exactly when done() is true. Under Slurm, sacct's (at most 2 s old), and PENDING for a
        job submitted but not in accounting yet."""
        if self.scheduler == "local":
            return str(self._job.state)
        state = str(_watcher().get_state(self.job_id, mode="standard"))
        if state == "UNKNOWN":  # not in accounting (yet, or at all): the queue's word
            queued = self._queue_state()
            # "" is a job gone from the queue with no accounting record: it ended, how is not known
            return queued if queued not in (None, "") else ("PENDING" if queued is None else "ENDED")
        return state

    def done(self) -> bool:
        """Whether the job has ended (under Slurm: sacct says so; rank result files alone do not end a job,
        so state and done() agree)."""
        if self.scheduler == "local":
            return bool(self._job.done())
        watcher = _watcher()
        if watcher.is_done(self.job_id, mode="standard"):
            return True
        if str(watcher.get_state(self.job_id, mode="cache")) != "UNKNOWN":
            return False
        # sacct has no record: accounting is off at this site (sacct fails), or not caught up yet. Without
        # this, a site without accounting would wait forever. squeue knows the job until MinJobAge after its
        # end (with its final state), and not at all after: either means it ended.
        queued = self._queue_state()
        return queued == "" or queued in _FINAL_QUEUE_STATES

    def _queue_state(self) -> str | None:
        """squeue's state of the job (final states too, while slurmctld keeps them), "" when squeue does not
        know it, None when squeue could not be asked; at most one squeue per _SACCT_EVERY_S per job."""
        now = time.monotonic()
        if now - self._queue_asked < _SACCT_EVERY_S:
            return self._queued
        self._queue_asked = now
        try:
            r = subprocess.run(["squeue", "-h", "-t", "all", "-j", self.job_id, "-o", "%T"], capture_output=True,
                               text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self._queued = None
            return None
        if r.returncode != 0:  # "Invalid job id specified": gone from slurmctld's memory
            self._queued = "" if "Invalid job id" in r.stderr else None
        else:
            self._queued = r.stdout.strip().split("\n")[0].strip()
        return self._queued

    def _wait(self) -> str | None:
        """Wait for the job's end; its final state under Slurm (None locally)."""
        if self.scheduler == "local":
            while not self._job.done():  # the controller has ended: every rank has, and it wrote its status
                time.sleep(0.1)
            return None
        while not self.done():
            time.sleep(0.5)
        return self.state

    def cancel(self) -> None:
        self._job.cancel(check=False)

    def logs(self, rank: int = 0) -> str:
        """What rank ``rank`` printed (stdout, then stderr)."""
        task = self._job.task(rank)
        return (task.stdout() or "") + (task.stderr() or "")

    def results(self) -> list[Any]:
        """Every rank's return value, by rank; waits for the job. Raises RankFailed for the first rank that
        failed (by time), with its traceback or how its process ended."""
        values = _collect(self._job, self.spec.world_size, self._wait())
        return [values[rank] for rank in range(self.spec.world_size)]

    def result(self) -> Any:
        """Rank 0's return value (waits for the job; raises RankFailed when any rank failed). Only rank 0's
        value is loaded: the others' are checked for failure, not read."""
        return _collect(self._job, self.spec.world_size, self._wait(), wanted=(0,))[0]

    def __repr__(self) -> str:
        return f"slurmlaunch.Job({self.job_id!r}, {self.scheduler}, {self.spec.world_size} ranks)"


_WATCHERS: list[Any] = []


def _watcher() -> Any:
    """One sacct watcher for every API job of this process (submitit's batches the ids it is asked about
    into one sacct call); ours refreshes at most every _SACCT_EVERY_S, where submitit's shared one backs off
    to minutes for long jobs, which would delay the news of a job's end as long."""
    if not _WATCHERS:
        from submitit.slurm.slurm import SlurmInfoWatcher

        _WATCHERS.append(SlurmInfoWatcher(delay_s=_SACCT_EVERY_S))
    return _WATCHERS[0]


def profile_options(name: str) -> dict[str, Any]:
    """The job options profile ``name`` (with the files' [defaults]) sets, as keyword arguments (README:
    Profiles). Settings the API does not carry out (mode, containers, ...) are refused; the scheduler,
    template and --wait settings are the CLI's and are not taken."""
    import argparse

    from ..core.spec import parse_env, parse_nodes
    from . import profiles
    from .options import add_submit_options

    parser = argparse.ArgumentParser(add_help=False)
    add_submit_options(parser)
    table = profiles.option_table(parser)
    resolved = profiles.resolve(argparse.Namespace(profile=name), table, os.environ, os.getcwd())
    out: dict[str, Any] = {}
    for dest, value in resolved.values.items():
        if resolved.origins[dest] == profiles.BUILTIN:
            continue
        field = _PROFILE_FIELDS.get(dest, dest)
        if field in CLI_ONLY and value:
            raise SpecError(f"profile {name!r} sets {table[dest].flag.lstrip('-')}, which only `slurmlaunch "
                            f"submit` carries out (from Python: leave it out of the profile, or use the CLI)")
        if field == "nodes":
            value, low = parse_nodes(value)
            if low is not None:
                raise SpecError(f"profile {name!r}: nodes = {low}:{value} needs `slurmlaunch submit --mode torchrun`")
        elif field == "env":
            value = parse_env(value)
        elif isinstance(value, list):
            value = tuple(value)
        if field in OPTION_NAMES:
            out[field] = value
    return out


def _split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """JobSpec's field names are job options; everything else goes to the function. ``profile=NAME`` gives
    defaults for the job options; the ones given here win."""
    refused = sorted(set(options) & CLI_ONLY)
    if refused:
        raise SpecError(f"option(s) {', '.join(refused)} are carried out by `slurmlaunch submit`, not by the "
                        f"submitit-based API (for arrays use map_array or batch)")
    if "profile" in options:
        options = {**profile_options(options.pop("profile")), **options}
    job = {k: v for k, v in options.items() if k in OPTION_NAMES}
    rest = {k: v for k, v in options.items() if k not in OPTION_NAMES}
    return job, rest


def _minutes(time_text: str | None) -> int:
    if time_text is None or time_text.upper() in ("UNLIMITED", "INFINITE"):
        return 60 * 24 * 365
    from ..core.spec import time_seconds

    return max(1, -(-(time_seconds(time_text) or 0) // 60))  # whole minutes, rounded up


def _batch_lines(signal_name: str) -> list[str]:
    """submitit's batch script, made to follow the CLI's signal plan (templates/slurm.sbatch.j2): these are
    its setup lines, before its own srun line. That srun runs in the background (a shell runs a trap only
    between commands), and the trap passes the warning signal on through srun (which forwards signals to
    the tasks). submitit's handler in the ranks listens to the signal its SUBMITIT_PREEMPT_SIGNAL names."""
    sig = shlex.quote(signal_name)
    return [
        "# slurmlaunch: what this job writes (results, logs) is the user's alone",
        "umask 077",
        f'echo "{_BATCH_MARK} (restart ${{SLURM_RESTART_COUNT:-0}})" >&2',
        f"export SUBMITIT_PREEMPT_SIGNAL={sig}",
        "srun() {",
        '    command srun "$@" &',
        "    slurmlaunch_srun=$!",
        "    while :; do  # the trap interrupts wait: keep waiting for srun itself",
        '        wait "$slurmlaunch_srun"',
        "        slurmlaunch_rc=$?",
        '        kill -0 "$slurmlaunch_srun" 2>/dev/null || break',
        "    done",
        '    if [ "$slurmlaunch_rc" -gt 128 ]; then  # srun ended while the trap ran: its own status, if kept',
        '        wait "$slurmlaunch_srun" 2>/dev/null',
        '        slurmlaunch_late=$?',
        '        [ "$slurmlaunch_late" -ne 127 ] && slurmlaunch_rc=$slurmlaunch_late',
        "    fi",
        '    return "$slurmlaunch_rc"',
        "}",
        "slurmlaunch_forward() {",
        f'    echo "slurmlaunch: SIG{signal_name} received, passing it on to the ranks" >&2',
        f'    [ -n "${{slurmlaunch_srun:-}}" ] && kill -s {sig} "$slurmlaunch_srun"',
        "}",
        f"trap slurmlaunch_forward {sig}",
    ]


def _private_folder(spec: JobSpec) -> Path:
    """The folder of submitit's files (the pickled arguments and results): the user's alone, as the CLI's
    job records are. Nothing removes them: submitit never does, and result() can be asked again later."""
    base = Path(spec.log_dir) / "submitit"
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o700)
    return base / "%j"


def _executor(spec: JobSpec, scheduler: str) -> Any:
    import submitit

    folder = _private_folder(spec)
    tpn = spec.ntasks_per_node
    if scheduler == "local":
        local = _local_executor(str(folder), spec.python)
        local.update_parameters(tasks_per_node=spec.world_size, nodes=1, timeout_min=_minutes(spec.time),
                                signal_delay_s=spec.warning[1] if spec.warning else 90)
        return local
    if spec.warning is None:
        raise SpecError(f"signal {spec.signal!r} is not carried out under Slurm by the submitit-based API (submitit "
                        f"always asks for a warning signal): give NAME@SECONDS, or use `slurmlaunch submit`")
    signal_name, signal_s = spec.warning
    # submitit counts its requeues after a time-out down from max_num_timeout (preemptions are not counted)
    ex = submitit.SlurmExecutor(folder=str(folder), python=spec.python, max_num_timeout=spec.max_requeues)
    params: dict[str, Any] = {
        "nodes": spec.nodes, "ntasks_per_node": tpn, "time": _minutes(spec.time), "job_name": spec.name,
        "srun_args": ["--kill-on-bad-exit=1"],
        # as the CLI's script: the --env exports, then the --setup lines (which may use them)
        "setup": [*_batch_lines(signal_name), *(f"export {k}={shlex.quote(v)}" for k, v in spec.env), *spec.setup],
        "signal_delay_s": signal_s,
    }
    if spec.exclusive:  # submitit writes --exclusive=<value>: only pass it when wanted
        params["exclusive"] = True
    if spec.gpus_per_node:
        params["gpus_per_node"] = spec.gpus_per_node
    for name in ("partition", "account", "qos", "constraint", "mem"):
        if getattr(spec, name) is not None:
            params[name] = getattr(spec, name)
    if spec.per_task_cpus is not None:
        params["cpus_per_task"] = spec.per_task_cpus
    # B: the batch shell alone gets the warning, and passes it on (_batch_lines); submitit writes USR2, always
    extra: dict[str, Any] = {"signal": f"B:{signal_name}@{signal_s}"}
    for arg in spec.sbatch_args:
        key, _, value = arg.lstrip("-").partition("=")
        extra[key.replace("-", "_")] = value or True
    params["additional_parameters"] = extra
    ex.update_parameters(**params)
    return ex


def _choose(scheduler: str) -> str:
    """--scheduler's one definition (schedulers/choice.py), within what the API runs on (no PBS), quietly."""
    from ..schedulers.choice import choose

    return choose(scheduler, allowed=("slurm", "local"), check_client=False, announce=False)


def _spec(script: str, options: dict[str, Any], module: bool = False) -> JobSpec:
    env = options.pop("env", ())
    if isinstance(env, dict):
        env = tuple(env.items())
    for key, value in env:  # they become `export KEY=VALUE` lines of the batch script: names only
        if not (isinstance(key, str) and ENV_KEY.fullmatch(key) and isinstance(value, str)):
            raise SpecError(f"env {key!r}: {value!r} is not valid (expected a shell variable name and a string "
                            f"value, e.g. env={{'FOO': '1'}})")

    spec = JobSpec(script=script, module=module, env=tuple(env), **options)
    return spec


def submit(fn: Callable[..., Any], *args: Any, scheduler: str = "auto", remote: str | None = None,
           remote_setup: Sequence[str] = (), remote_python: str = "python3", **options: Any) -> Job | RemoteJob:
    """Run ``fn(*args, **kwargs)`` on every rank of a distributed job; keyword arguments that are job
    options (nodes, gpus_per_node, tasks_per_node, cpus_per_task, mem, time, partition, account, qos, ...)
    configure the job, the others go to ``fn``. Validation is the CLI's: a bad option raises SpecError.

    ``remote="[user@]host[:dir]"``: from a laptop, on that login node's Slurm cluster over ssh (the working
    directory synced there, ``remote_setup`` lines run first, ``remote_python`` the training environment's
    interpreter there, with submitit); a RemoteJob answers as a Job does (see remote_api)."""
    job_options, kwargs = _split_options(options)
    if remote is not None:
        return _submit_remote(remote, fn, args, job_options, kwargs, scheduler, remote_setup, remote_python)
    if remote_setup or remote_python != "python3":
        raise SpecError("remote_setup/remote_python: only with remote='[user@]host[:dir]'")
    job_options.setdefault("job_name", getattr(fn, "__name__", "slurmlaunch"))
    spec = resolve_request(_spec(sys.executable, job_options, module=True))
    chosen = _choose(scheduler)
    job = _executor(spec, chosen).submit(_wrap(spec, fn, args, kwargs))
    return Job(job, spec, chosen)


def submit_script(path: str, args: Iterable[str] = (), *, scheduler: str = "auto", remote: str | None = None,
                  remote_setup: Sequence[str] = (), remote_python: str = "python3",
                  **options: Any) -> Job | RemoteJob:
    """Run a script on every rank, through the launcher, as `slurmlaunch submit` would (``remote``: as for
    submit; ``path`` is then relative to the synced directory there)."""
    job_options, unknown = _split_options(options)
    if unknown:
        raise SpecError(f"unknown option(s) {', '.join(sorted(unknown))} (valid: {', '.join(sorted(OPTION_NAMES))})")
    if remote is not None:
        return _submit_remote(remote, None, list(args), job_options, {}, scheduler, remote_setup, remote_python,
                              path=path)
    if remote_setup or remote_python != "python3":
        raise SpecError("remote_setup/remote_python: only with remote='[user@]host[:dir]'")
    spec = resolve_request(replace(_spec(path, job_options), args=tuple(args)))
    chosen = _choose(scheduler)
    job = _executor(spec, chosen).submit(_ScriptCall(spec))
    return Job(job, spec, chosen)


def _submit_remote(remote: str, fn: Callable[..., Any] | None, args: Sequence[Any], job_options: dict[str, Any],
                   kwargs: dict[str, Any], scheduler: str, setup: Sequence[str], python: str,
                   path: str | None = None) -> RemoteJob:
    """Checked here first (a bad option fails before any ssh), then submitted there by the same API."""
    from .remote_api import submit_remote

    if scheduler not in ("auto", "slurm"):
        raise SpecError(f"scheduler {scheduler!r} with remote=: only Slurm clusters are supported over ssh "
                        f"(leave scheduler out)")
    resolve_request(_spec(path or sys.executable, dict(job_options), module=fn is not None))
    return submit_remote(remote, fn, args, {**job_options, **kwargs}, path=path, setup=setup, python=python)


def map_array(fn: Callable[..., Any], *iterables: Iterable[Any], scheduler: str = "auto",
              **options: Any) -> list[Job]:
    """A job array: one distributed job per element (each its own world with its own MASTER_PORT)."""
    job_options, kwargs = _split_options(options)
    job_options.setdefault("job_name", getattr(fn, "__name__", "slurmlaunch"))
    spec = resolve_request(_spec(sys.executable, job_options, module=True))
    chosen = _choose(scheduler)
    ex = _executor(spec, chosen)
    calls = [_wrap(spec, fn, list(point), kwargs) for point in zip(*iterables, strict=True)]
    return [Job(j, spec, chosen) for j in ex.submit_array(calls)]


class Batch:
    """Collects ``submit(fn, *args, **kwargs)`` calls; on leaving the ``with`` block they go out as one job
    array (one distributed job each, same options), and ``jobs`` holds them in order."""

    def __init__(self, scheduler: str, options: dict[str, Any]) -> None:
        job_options, unknown = _split_options(options)
        if unknown:
            raise SpecError(f"unknown option(s) {', '.join(sorted(unknown))} for batch "
                            f"(the functions' own arguments go to submit)")
        job_options.setdefault("job_name", "slurmlaunch-batch")
        self.spec = resolve_request(_spec(sys.executable, job_options, module=True))
        self.scheduler = scheduler
        self.jobs: list[Job] = []
        self._calls: list[_DistributedCall] = []

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        """Queue one job; returns its index in ``jobs`` (filled when the block ends)."""
        self._calls.append(_wrap(self.spec, fn, args, kwargs))
        return len(self._calls) - 1

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None or not self._calls:
            return
        chosen = _choose(self.scheduler)
        submitted = _executor(self.spec, chosen).submit_array(self._calls)
        self.jobs = [Job(j, self.spec, chosen) for j in submitted]


def batch(*, scheduler: str = "auto", **options: Any) -> Batch:
    """``with slurmlaunch.batch(nodes=2, gpus_per_node=4) as b: b.submit(train, cfg)`` ... then ``b.jobs``."""
    return Batch(scheduler, options)
