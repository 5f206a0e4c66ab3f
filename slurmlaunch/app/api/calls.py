"""What submitit runs in every task: the distributed environment, then the function (or the script);
the return value pickled by the rank itself, a SystemExit recorded with its code and time."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .failures import _failure, _mark, _signal_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...core.spec import JobSpec  # a rank under Slurm does not load it (_DistributedCall.spec)


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


# Set by app/api/rank.py in a rank the launcher started: its distributed variables are exported already.
LAUNCHED = "SLURMLAUNCH_API_LAUNCHED"


def _export_distributed_env() -> None:
    """In a task: map the rank's variables exactly as `slurmlaunch launch` does and export the result. Nothing to
    do in a rank the launcher started (every scheduler's, the local one's too: app/api/rank.py): it has done so."""
    environ = os.environ
    if environ.get(LAUNCHED) == "1":
        return
    from ...allocation.launch import preflight, resolve

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
    import json  # here: a rank that exits by SystemExit is rare, and json is not otherwise on a rank's start

    temporary.write_text(json.dumps({"code": number, "at": at, "message": message}))
    os.replace(temporary, path)


def _warning_runs_on() -> None:
    """A callable without ``checkpoint`` runs on to its time limit through the warning (issue 40: the default
    warning harms no one who did not ask for it). submitit's handler, in rank 0, ends such a job at the time
    limit's warning ("Job not requeued because: timed-out and not checkpointable", 90 s before the scheduler
    would have: submitit reads any warning as a time-out in a job under 50 minutes); here the warning that
    submitit reads as a time-out is only said, and a preemption (not timed out) is still submitit's: requeued
    from the start. Reads $SUBMITIT_PREEMPT_SIGNAL (the warning's name, as submitit does); a handler that is not
    submitit's is left alone. Before _arm_stacks: its dump chains to the handler there is."""
    from ...core.errors import SpecError
    from ...core.parse import signal_number

    try:
        number = signal_number(os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
    except SpecError:
        return
    previous = signal.getsignal(number)
    owner = getattr(previous, "__self__", None)
    timed_out = getattr(owner, "has_timed_out", None)
    if not callable(previous) or not callable(timed_out):
        return

    def handler(signum: int, frame: Any) -> None:
        if timed_out():
            import sys

            sys.stderr.write(f"slurmlaunch: {_signal_name(signum)}, the time limit's warning: the function has no "
                             f"checkpoint method, so it runs on to its limit\n")
            return
        previous(signum, frame)

    signal.signal(number, handler)


def _arm_stacks(log_dir: str) -> None:
    """Arm this rank's stack dumps (`job.stacks()`, the stop signals) in the job's stacks directory, as the
    launcher's RUNNER does for a script."""
    import submitit

    from ...allocation.script_runner import arm_stacks
    from ...core.jobfiles import JobFiles

    directory = JobFiles(log_dir, str(submitit.JobEnvironment().job_id)).stacks
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        return
    _unarm_stops()
    arm_stacks(directory)


def _unarm_stops() -> None:
    """The stop signals' dumps the RUNNER armed before this rank's module ran (the launcher runs it through the
    RUNNER), taken off with the handlers set since (submitit's, rank.py's) kept: faulthandler arms a signal's
    handler once and only updates it when asked again, so once submitit's signal.signal had replaced it, a stop
    saved no stacks (an empty RANK.stopped); armed again after this, the dump chains to the handler there is."""
    import faulthandler

    for number in (signal.SIGTERM, signal.SIGHUP):
        handler = signal.getsignal(number)
        faulthandler.unregister(number)  # back to the handler it found (the RUNNER's: the default)
        if handler is not None:  # None: one not set from Python, left as unregister put it
            signal.signal(number, handler)


def _timeline_dir(log_dir: str) -> str:
    """The job's directory of start-up moments (docs/how-to/timeline.md), made; "" when it cannot be."""
    import submitit

    from ...core.jobfiles import JobFiles

    directory = JobFiles(log_dir, str(submitit.JobEnvironment().job_id)).timeline
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        return ""
    return directory


def _start_timeline(log_dir: str) -> None:
    """This rank's start-up moments (`job.timeline()`): the process's start as `launch`, now (the function about
    to run) as `exec`, then what the RUNNER notes (init_process_group returned; `import torch` done, when it
    comes after this) and the function's slurmlaunch.mark() calls."""
    from ...allocation.script_runner import arm_timeline
    from ...allocation.timeline import TIMELINE_DIR, launched, process_start_ns

    directory, rank = _timeline_dir(log_dir), os.environ.get("RANK", "")
    if not directory or not rank.isdigit():
        return
    os.environ[TIMELINE_DIR] = directory
    launched(os.environ, int(rank), process_start_ns())
    arm_timeline(directory)


_PICKLED_CODE = "<dynamic-code>"  # cloudpickle's file name for a function it pickled by value (a script's)


# submitit.helpers.TorchDistributedEnvironment().export() refuses to replace what is set: these words (submitit
# 1.5) on one of the variables slurmlaunch exports to every rank before the function runs
_EXPORT_REFUSED = "Cannot export environment variables as "


def _hint(error: BaseException) -> str:
    """One line after the traceback where slurmlaunch knows why the function failed; "" otherwise."""
    if isinstance(error, RuntimeError) and str(error).startswith(_EXPORT_REFUSED):
        return ("slurmlaunch: this rank's MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE and "
                "LOCAL_WORLD_SIZE are exported before the function runs (docs: Python API); submitit's "
                "TorchDistributedEnvironment() reads the same world without .export(): drop the call, or call "
                "export(overwrite=True, set_cuda_visible_devices=False)\n")
    return ""


def _traceback_text(error: BaseException) -> str:
    """The traceback as traceback.format_exc() writes it, except that a function cloudpickle carried by
    value (one defined in the user's script) shows its real file again: its module's ``__file__``, which
    cloudpickle keeps in the function's globals, and the line read from that file where this node has it."""
    shown = traceback.TracebackException.from_exception(error)
    seen: set[int] = set()
    todo: list[tuple[traceback.TracebackException, BaseException]] = [(shown, error)]
    while todo:
        te, exc = todo.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
        if len(frames) == len(te.stack):
            places = [_real_place(summary, frame) for summary, frame in zip(te.stack, frames, strict=True)]
            te.stack = traceback.StackSummary.from_list(places)
        for inner_te, inner in ((te.__cause__, exc.__cause__), (te.__context__, exc.__context__)):
            if inner_te is not None and inner is not None:
                todo.append((inner_te, inner))
    return "".join(shown.format())


def _real_place(summary: traceback.FrameSummary, frame: Any) -> traceback.FrameSummary:
    real = frame.f_globals.get("__file__") if summary.filename == _PICKLED_CODE else None
    if not isinstance(real, str):
        return summary
    # the columns that draw the carets exist from Python 3.11 on
    columns = {k: getattr(summary, k) for k in ("end_lineno", "colno", "end_colno") if hasattr(summary, k)}
    return traceback.FrameSummary(real, summary.lineno, summary.name, **columns)


class _DistributedCall:
    """What submitit runs in every task: the environment, then ``fn``; a failure is marked with its rank
    and time, so that the caller can tell the first failure from its consequences in the other ranks.
    SystemExit is not an error submitit reports (the process just exits with the code): the rank records
    the code and the time itself (_exit_record)."""

    def __init__(self, spec: JobSpec, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self._spec: JobSpec | bytes = spec
        self.log_dir = spec.log_dir
        self.fn, self.args, self.kwargs = fn, tuple(args), dict(kwargs)

    @property
    def spec(self) -> JobSpec:
        """The job's spec. It travels pickled on its own and a rank unpickles it only where it is used (a
        checkpoint's resubmission): a rank needs the log directory alone, and JobSpec's module (a dataclass of
        some 50 fields) costs a rank about 2.5 ms of CPU to load, which every rank of every short job pays
        (issue 32)."""
        spec = self._spec
        if isinstance(spec, bytes):
            import pickle

            spec = self._spec = pickle.loads(spec)
        return spec

    def __getstate__(self) -> dict[str, Any]:
        import pickle

        spec = self._spec if isinstance(self._spec, bytes) else pickle.dumps(self._spec)
        return {**self.__dict__, "_spec": spec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "spec" in state:  # pickled by a slurmlaunch before this one (a job queued across an upgrade)
            state["_spec"] = state.pop("spec")
            state["log_dir"] = state["_spec"].log_dir
        self.__dict__.update(state)

    def __call__(self) -> _Packed:
        record = _own_exit_record()
        if record is not None:
            record.unlink(missing_ok=True)  # an earlier run's, before a requeue
        from ...allocation.script_runner import settle

        _export_distributed_env()
        if not hasattr(self, "checkpoint"):
            _warning_runs_on()
        _arm_stacks(self.log_dir)
        _start_timeline(self.log_dir)
        try:
            value = self.fn(*self.args, **self.kwargs)
        except SystemExit as e:  # passed on: submitit exits that way to requeue a preempted job
            if record is not None and not _raised_by_submitit(e):
                _record_exit(record, e)
            raise
        except Exception as e:
            mark = _mark()
            raise RuntimeError(mark + _traceback_text(e) + _hint(e)) from e
        finally:  # before submitit's process finalizes: torch's gloo workers done (docs: Teardown aborts)
            settle()
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
        import shutil
        import tempfile

        from ...allocation.script_runner import RETURNED_DIR, TIMELINE_DIR
        from ...allocation.torchrun_mode import teardown_message
        from ...render.launch import launch_command

        _export_distributed_env()
        _warning_runs_on()  # and the script, started through the launcher, ignores it unless it handles it
        try:
            marks = tempfile.mkdtemp(prefix="slurmlaunch-returned-")  # the runner marks a script that returned
        except OSError:  # no writable TMPDIR: the script runs all the same, an abort is then not told apart
            marks = ""
        rank = os.environ.get("RANK", "rank")
        try:
            timeline = _timeline_dir(self.spec.log_dir)  # the launcher and the runner record there
            extra = {**({RETURNED_DIR: marks} if marks else {}), **({TIMELINE_DIR: timeline} if timeline else {})}
            done = subprocess.run(launch_command(self.spec), cwd=self.spec.program.workdir,
                                  env=dict(os.environ, **extra) if extra else None)
            returned = bool(marks) and os.path.exists(os.path.join(marks, rank))
        finally:
            if marks:
                shutil.rmtree(marks, ignore_errors=True)
        if done.returncode != 0:
            how = (f"was killed by {_signal_name(-done.returncode)}" if done.returncode < 0
                   else f"exited with code {done.returncode}")
            if done.returncode == -signal.SIGABRT and returned and rank.isdigit():  # docs: Teardown aborts
                how += f": {teardown_message(int(rank))}"
            raise _failure(f"{self.spec.program.script} {how}")
        return done.returncode


def _wrap(spec: JobSpec, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> _DistributedCall:
    cls = _CheckpointableCall if hasattr(fn, "checkpoint") else _DistributedCall
    return cls(spec, fn, args, kwargs)

