"""The public functions: submit, submit_script, map_array, batch; each here or, with ``remote=`` (or a
profile's ``remote`` key), from a laptop on a login node's cluster (app/remote/api.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.errors import SpecError
from ..resolve import resolve as resolve_request
from .calls import _DistributedCall, _ScriptCall, _wrap
from .executors import _choose, _executor
from .job import Job
from .job_options import OPTION_NAMES, _spec, _split_options, profile_remote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...schedulers.interface import Scheduler
    from ..remote.api import RemoteJob


@dataclass(frozen=True)
class _Where:
    """Where a job goes: here (``remote`` None), or that ssh destination, its set-up lines and interpreter."""

    remote: str | None = None
    setup: tuple[str, ...] = ()
    python: str = "python3"
    scheduler: str = "auto"  # the login node's: auto (its qsub without sbatch is PBS, else Slurm), slurm, pbs


def _over_ssh() -> list[Scheduler]:
    """The schedulers remote= runs on: the queued ones (the login node submits with this API there,
    app/api/runner.py; never the local scheduler: a login node does not run the laptop's job itself)."""
    from ...schedulers.registry import NAMES, scheduler

    return [e for e in map(scheduler, NAMES) if e.queued]


def _where(options: dict[str, Any], scheduler: str, remote: str | None, setup: Sequence[str],
           python: str | None) -> _Where:
    """remote=, remote_setup=, remote_python= as given; else a ``profile=``'s remote, remote-setup and python
    keys (docs: From your laptop). Set-up lines or an interpreter without a destination are refused."""
    if remote is None and "profile" in options:
        given = profile_remote(options["profile"])
        remote = given.get("remote")
        if remote is not None:
            setup = setup or given.get("remote_setup", ())
            python = python if python is not None else given.get("remote_python")
    if remote is None:
        if setup or python is not None:
            raise SpecError("remote_setup/remote_python: only with remote='[user@]host[:dir]'")
        return _Where()
    from ...schedulers.registry import canonical

    over_ssh = _over_ssh()
    names = [e.name for e in over_ssh]
    name = scheduler if scheduler == "auto" else canonical(scheduler)
    if name is None or (name != "auto" and name not in names):
        raise SpecError(f"scheduler {scheduler!r} with remote=: only {' and '.join(e.title for e in over_ssh)} "
                        f"clusters are supported over ssh (expected auto, {', '.join(names[:-1])} or {names[-1]})")
    return _Where(remote, tuple(setup), "python3" if python is None else python, name)


def submit(fn: Callable[..., Any], *args: Any, scheduler: str = "auto", remote: str | None = None,
           remote_setup: Sequence[str] = (), remote_python: str | None = None, **options: Any) -> Job | RemoteJob:
    """Run ``fn(*args, **kwargs)`` on every rank of a distributed job; keyword arguments that are job
    options (nodes, gpus_per_node, tasks_per_node, cpus_per_task, mem, time, partition, account, qos, ...)
    configure the job, the others go to ``fn``. Validation is the CLI's: a bad option raises SpecError.

    ``remote="[user@]host[:dir]"`` (or a ``profile=`` with a remote key): from a laptop, on that login node's
    Slurm or PBS cluster over ssh (``scheduler``: auto is PBS where the login node has qsub and no sbatch;
    the working directory synced there, ``remote_setup`` lines run first,
    ``remote_python`` the training environment's interpreter there, default python3, with submitit); a
    RemoteJob answers as a Job does (see remote_api)."""
    where = _where(options, scheduler, remote, remote_setup, remote_python)
    job_options, kwargs = _split_options(options)
    job_options.setdefault("job_name", getattr(fn, "__name__", "slurmlaunch"))
    spec = resolve_request(_spec(sys.executable, dict(job_options), module=True), has_script=False)
    if where.remote is not None:
        from ..remote.api import submit_remote

        return submit_remote(where.remote, fn, args, {**job_options, **kwargs}, setup=where.setup,
                             python=where.python, scheduler=where.scheduler)
    chosen = _choose(scheduler)
    job = _executor(spec, chosen).submit(_wrap(spec, fn, args, kwargs))
    return Job(job, spec, chosen)


def submit_script(path: str, args: Iterable[str] = (), *, scheduler: str = "auto", remote: str | None = None,
                  remote_setup: Sequence[str] = (), remote_python: str | None = None,
                  **options: Any) -> Job | RemoteJob:
    """Run a script on every rank, through the launcher, as `slurmlaunch submit` would (``remote``: as for
    submit; ``path`` is then relative to the synced directory there)."""
    where = _where(options, scheduler, remote, remote_setup, remote_python)
    job_options, unknown = _split_options(options)
    if unknown:
        raise SpecError(f"unknown option(s) {', '.join(sorted(unknown))} (valid: {', '.join(sorted(OPTION_NAMES))})")
    spec = resolve_request(_spec(path, dict(job_options)).changed(args=tuple(args)))
    if where.remote is not None:
        from ..remote.api import submit_remote

        return submit_remote(where.remote, None, list(args), job_options, path=path, setup=where.setup,
                             python=where.python, scheduler=where.scheduler)
    chosen = _choose(scheduler)
    job = _executor(spec, chosen).submit(_ScriptCall(spec))
    return Job(job, spec, chosen)


def map_array(fn: Callable[..., Any], *iterables: Iterable[Any], scheduler: str = "auto", remote: str | None = None,
              remote_setup: Sequence[str] = (), remote_python: str | None = None,
              **options: Any) -> list[Job] | list[RemoteJob]:
    """A job array: one distributed job per element (each its own world with its own MASTER_PORT);
    ``remote``: as for submit (one round of submission, one handle per element)."""
    where = _where(options, scheduler, remote, remote_setup, remote_python)
    job_options, kwargs = _split_options(options)
    job_options.setdefault("job_name", getattr(fn, "__name__", "slurmlaunch"))
    spec = resolve_request(_spec(sys.executable, dict(job_options), module=True), has_script=False)
    points = [list(point) for point in zip(*iterables, strict=True)]
    if where.remote is not None:
        from ..remote.api import map_remote

        columns = [list(column) for column in zip(*points, strict=True)] if points else []
        return map_remote(where.remote, fn, columns, {**job_options, **kwargs}, setup=where.setup,
                          python=where.python, scheduler=where.scheduler)
    chosen = _choose(scheduler)
    ex = _executor(spec, chosen)
    calls = [_wrap(spec, fn, point, kwargs) for point in points]
    return [Job(j, spec, chosen) for j in ex.submit_array(calls)]


class Batch:
    """Collects ``submit(fn, *args, **kwargs)`` calls; on leaving the ``with`` block they go out as one job
    array (one distributed job each, same options), and ``jobs`` holds them in order."""

    def __init__(self, scheduler: str, options: dict[str, Any], where: _Where = _Where()) -> None:
        job_options, unknown = _split_options(options)
        if unknown:
            raise SpecError(f"unknown option(s) {', '.join(sorted(unknown))} for batch "
                            f"(the functions' own arguments go to submit)")
        job_options.setdefault("job_name", "slurmlaunch-batch")
        self.spec = resolve_request(_spec(sys.executable, dict(job_options), module=True), has_script=False)
        self.scheduler = scheduler
        self.where = where
        self._options = job_options
        self.jobs: list[Job] | list[RemoteJob] = []
        self._calls: list[_DistributedCall] = []
        self._remote_calls: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        """Queue one job; returns its index in ``jobs`` (filled when the block ends)."""
        if self.where.remote is not None:
            self._remote_calls.append((fn, args, kwargs))
            return len(self._remote_calls) - 1
        self._calls.append(_wrap(self.spec, fn, args, kwargs))
        return len(self._calls) - 1

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None or not (self._calls or self._remote_calls):
            return
        if self.where.remote is not None:
            from ..remote.api import batch_remote

            self.jobs = batch_remote(self.where.remote, self._remote_calls, self._options, setup=self.where.setup,
                                     python=self.where.python, scheduler=self.where.scheduler)
            return
        chosen = _choose(self.scheduler)
        submitted = _executor(self.spec, chosen).submit_array(self._calls)
        self.jobs = [Job(j, self.spec, chosen) for j in submitted]


def batch(*, scheduler: str = "auto", remote: str | None = None, remote_setup: Sequence[str] = (),
          remote_python: str | None = None, **options: Any) -> Batch:
    """``with slurmlaunch.batch(nodes=2, gpus_per_node=4) as b: b.submit(train, cfg)`` ... then ``b.jobs``;
    ``remote``: as for submit (the calls go out in one round of submission when the block ends)."""
    return Batch(scheduler, options, _where(options, scheduler, remote, remote_setup, remote_python))
