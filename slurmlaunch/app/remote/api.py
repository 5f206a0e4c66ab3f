"""The Python API from a laptop: ``slurmlaunch.submit(fn, *args, remote="login", ...)``.

What was chosen, and why: submitit does the pickling, the batch script and the result files on the login
node, exactly as when the API is called there. The laptop pickles the call (cloudpickle, as submitit does:
a function of ``__main__`` or a notebook travels by value) and sends it over the destination's ssh
connection to a small runner (api/runner.py, run by the remote interpreter in the remote project directory with
this slurmlaunch first on PYTHONPATH, see remote.ship_package), which calls this same API with
``scheduler="slurm"``. Rendering submitit's pickles here and copying them would need sbatch's answer
(the job id names submitit's folder) before the files exist there, and would re-implement submitit's
submission; driving it on the login node keeps one code path. The price: the remote training environment
needs submitit (slurmlaunch's own dependency; slurmlaunch itself travels).

The job handle here (RemoteJob) keeps the pickled submitit-based Job of the login node as bytes and sends
it back with every question (state, results, logs, cancel): the laptop keeps no state of its own beyond
it, and any laptop process holding the handle can ask. Results and exceptions (RankFailed, with the
failing rank's traceback) come back pickled; a wait is a series of bounded remote waits, so that no ssh
command runs for longer than WAIT_STEP_S. Each of them asks about every handle of this process for the same
destination (the same login node, setup lines, directory and interpreter) that has no answer yet, the one
waited for first (runner._wait_several): the answers of the others that ended meanwhile are kept by their
handles, so a loop over a map_array's or a batch's handles makes one ssh command per poll, not one per job.
"""

from __future__ import annotations

import base64
import os
import pickle
import shlex
import sys
import time
import weakref
from collections.abc import Sequence
from typing import Any

from ...core.errors import SpecError
from . import (
    COMMAND_TIMEOUT_S,
    Connection,
    RemoteError,
    Unreachable,
    check_python,
    parse_destination,
    pythonpath_setup,
    resolve_directory,
    shell_command,
    ship_package,
    sync,
)

WAIT_STEP_S = 20.0  # the longest one remote wait lasts; the laptop asks again after it

# Run remotely: ACTION on its argv, a pickle on its stdin; prints one line, base64 of a pickled dict.
RUNNER_MODULE = "slurmlaunch.app.api.runner"


class _Session:
    """The destination's connection, directory, shipped package and interpreter, shared by the handles of
    one submission: its master is stopped when the last of them goes (or at exit); ControlPersist bounds it
    too."""

    def __init__(self, conn: Connection, directory: str, package: str, python: str) -> None:
        self.conn, self.directory, self.package, self.python = conn, directory, package, python
        self._finalizer = weakref.finalize(self, conn.close)

    def ask(self, action: str, data: bytes, timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
        return _run(self.conn, self.directory, self.package, self.python, action, data, timeout)


class RemoteJob:
    """A job submitted from here by the API with ``remote=``: the same questions as Job, asked over ssh."""

    def __init__(self, session: _Session, reply: dict[str, Any]) -> None:
        self._session = session
        self._job: bytes = reply["job"]
        self.job_id = str(reply["job_id"])
        self.world_size = int(reply["world"])
        self.remote = session.conn.dest.target
        self._values: list[Any] | None = None
        # the runner's answer to a wait (pickled: values or the error to raise), asked for by this handle's
        # wait or a sibling's, and whether it holds rank 0's value alone (result()'s)
        self._answer: tuple[bytes, bool] | None = None
        _HANDLES.add(self)

    @property
    def _where(self) -> tuple[Any, ...]:
        """What a wait's ssh command is run with: handles that agree on it are asked about together."""
        s = self._session
        return s.conn.dest.target, s.conn.setup, s.directory, s.package, s.python

    def _ask(self, action: str, timeout: float = COMMAND_TIMEOUT_S, **data: Any) -> dict[str, Any]:
        return self._session.ask(action, pickle.dumps({"job": self._job, **data}), timeout)

    @property
    def state(self) -> str:
        return str(self._ask("state")["state"])

    def done(self) -> bool:
        return bool(self._ask("state")["done"])

    def cancel(self) -> None:
        self._ask("cancel")

    def logs(self, rank: int = 0) -> str:
        return str(self._ask("logs", rank=rank)["text"])

    def _wait(self, rank0: bool) -> list[Any]:
        """A series of bounded waits there. A dropped connection (ssh's own failure) is retried with a
        growing pause for LOST_CONTACT_S, as `submit --wait` does, then raised; the job is not touched."""
        from ..follow import LOST_CONTACT_S

        failing_since: float | None = None
        while True:
            if self._answer is not None and (rank0 or not self._answer[1]):
                out = pickle.loads(self._answer[0])
                if "error" in out:
                    raise out["error"]
                return list(out["values"])
            where = self._where
            asked = [self, *(j for j in list(_HANDLES) if j is not self and j._answer is None and j._where == where)]
            try:
                answer = self._session.ask("wait", pickle.dumps({"jobs": [j._job for j in asked], "limit": WAIT_STEP_S,
                                                                 "rank0": rank0}),
                                           COMMAND_TIMEOUT_S + WAIT_STEP_S)
            except Unreachable as e:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    sys.stderr.write(f"slurmlaunch: lost contact with {self.remote} ({e}); trying again for up to "
                                     f"{LOST_CONTACT_S:.0f}s, the job is not affected\n")
                elif now - failing_since > LOST_CONTACT_S:
                    raise
                time.sleep(min(10.0, 1.0 + (now - failing_since) / 4))
                continue
            if failing_since is not None:
                sys.stderr.write(f"slurmlaunch: in contact with {self.remote} again\n")
                failing_since = None
            for index, blob in answer["answers"].items():
                asked[index]._answer = (blob, rank0)

    def results(self) -> list[Any]:
        """Every rank's return value, by rank (waits; RankFailed as locally)."""
        if self._values is None:
            self._values = self._wait(rank0=False)
        return self._values

    def result(self) -> Any:
        """Rank 0's return value (waits; RankFailed as locally)."""
        return self._values[0] if self._values is not None else self._wait(rank0=True)[0]

    def __repr__(self) -> str:
        return f"slurmlaunch.RemoteJob({self.job_id!r}, on {self.remote}, {self.world_size} ranks)"


# Every RemoteJob of this process (weakly: a handle dropped is forgotten), for the waits that ask together.
_HANDLES: weakref.WeakSet[RemoteJob] = weakref.WeakSet()


def _run(conn: Connection, directory: str, package: str, python: str, action: str, data: bytes,
         timeout: float) -> dict[str, Any]:
    """One runner call: its answer, or the SlurmLaunchError it sent back raised here."""
    script = (f"cd -- {shlex.quote(directory)} && umask 077 && {pythonpath_setup(package)} && "
              f"{shlex.join([python, '-m', RUNNER_MODULE, action, '{}.{}'.format(*sys.version_info[:2])])}")
    started = time.monotonic()
    proc = conn.run(shell_command(script, conn.setup, timeout), input_bytes=data, timeout=timeout, check=False)
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    try:
        answer: dict[str, Any] = pickle.loads(base64.b64decode(lines[-1], validate=True))
    except Exception:  # not the runner's line: the interpreter, submitit or the shell failed
        said = proc.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"]
        raise RemoteError(f"on {conn.dest.target}: the API runner ({python} {action}) failed after "
                          f"{time.monotonic() - started:.0f}s (exit {proc.returncode}): {said[-1]}") from None
    if "error" in answer:
        raise answer["error"]
    return answer


def submit_remote(remote: str, fn: Any, args: Sequence[Any], options: dict[str, Any], *,
                  path: str | None = None, setup: Sequence[str] = (), python: str = "python3",
                  sync_dir: bool = True, excludes: Sequence[str] = (), scheduler: str = "auto") -> RemoteJob:
    """Submit ``fn(*args, **kwargs)`` (or with ``path``, a script with ``args``) on ``remote``'s cluster.
    ``options`` are the API's keyword arguments (job options and the function's keyword arguments), checked
    there by the same code. The working directory is synced first (``sync_dir``), as `submit --remote` does,
    so that modules the function imports are there."""
    payload = {"fn": fn, "args": list(args), "scheduler": scheduler, **({"path": path} if path is not None else {})}
    return _submit(remote, "submit", payload, options, setup, python, sync_dir, excludes)[0]


def map_remote(remote: str, fn: Any, iterables: Sequence[Sequence[Any]], options: dict[str, Any], *,
               setup: Sequence[str] = (), python: str = "python3", scheduler: str = "auto") -> list[RemoteJob]:
    """map_array on ``remote``'s cluster: one job array, one handle per element (sharing one connection)."""
    return _submit(remote, "map_array", {"fn": fn, "iterables": [list(i) for i in iterables],
                                         "scheduler": scheduler}, options, setup, python)


def batch_remote(remote: str, calls: Sequence[tuple[Any, Sequence[Any], dict[str, Any]]], options: dict[str, Any],
                 *, setup: Sequence[str] = (), python: str = "python3", scheduler: str = "auto") -> list[RemoteJob]:
    """batch on ``remote``'s cluster: the calls (function, arguments, keyword arguments) as one job array."""
    return _submit(remote, "batch", {"calls": [(fn, list(a), dict(k)) for fn, a, k in calls],
                                     "scheduler": scheduler}, options, setup, python)


def _submit(remote: str, action: str, payload: dict[str, Any], options: dict[str, Any], setup: Sequence[str],
            python: str, sync_dir: bool = True, excludes: Sequence[str] = ()) -> list[RemoteJob]:
    """One round of submission there: sync, ship, the runner's ``action``; the jobs are written to this
    machine's index (remote_submit.write_local_record), so that `slurmlaunch list/status/logs/cancel` see them."""
    import cloudpickle  # type: ignore[import-untyped]  # submitit's own pickler

    from .jobs import _project_name

    if not isinstance(python, str) or not python:
        raise SpecError(f"remote_python {python!r} is not an interpreter (expected a path or a name on the "
                        f"remote PATH, e.g. python3)")
    dest = parse_destination(remote)
    conn = Connection(dest, tuple(setup))
    try:
        python = check_python(conn, python, flag="remote_python")  # ~/ expanded there; its version checked
        directory = resolve_directory(conn, dest.directory, _project_name(os.getcwd()), create=True)
        if sync_dir:
            sync(conn, os.getcwd(), directory, [*excludes, "/slurmlaunch-logs/"])
        package = ship_package(conn, directory)
        # the ranks put it first on their path too: submitit's batch script runs our wrapper there
        options = {**options, "setup": (*options.get("setup", ()), pythonpath_setup(package))}
        session = _Session(conn, directory, package, python)
        answer = session.ask(action, cloudpickle.dumps({**payload, **options}))
    except BaseException:
        conn.close()
        raise
    jobs = [RemoteJob(session, one) for one in answer["jobs"]]
    _remember(conn, answer, [job.job_id for job in jobs])
    return jobs


def _remember(conn: Connection, answer: dict[str, Any], ids: list[str]) -> None:
    """The jobs in this machine's index, with the records `submit --remote` writes (a job array's once, by
    its array id, its elements named ARRAYID_INDEX as the CLI's are)."""

    from ...schedulers.index import remember
    from ...schedulers.registry import scheduler as edge_of
    from .submit import known_there, write_local_record

    dest, setup = conn.dest, conn.setup
    spec = answer["spec"]
    base = ids[0].partition("_")[0]
    if "_" in ids[0]:
        spec = spec.changed(array=",".join(i.partition("_")[2] for i in ids))
    edge = edge_of(str(answer.get("scheduler", "slurm")))  # runner.login_scheduler's
    scheduler, tool = edge.name, str(edge.client)  # its submit command: sbatch, qsub
    command = [tool, answer["script_path"]] if answer.get("script_path") else [tool]
    record = write_local_record(dest, setup, spec, base, base, scheduler, command, str(answer.get("script", "")),
                                known_there(conn, edge, base))
    remember(base, scheduler, record, spec.name, remote=dest.target)
