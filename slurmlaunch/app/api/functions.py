"""The public functions: submit, submit_script, map_array, batch."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from ...core.errors import SpecError
from ...core.spec import validate
from .calls import _DistributedCall, _ScriptCall, _wrap
from .executors import _choose, _executor
from .job import Job
from .job_options import OPTION_NAMES, _spec, _split_options

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..remote_api import RemoteJob


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
    spec = validate(_spec(sys.executable, job_options, module=True))
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
    spec = validate(replace(_spec(path, job_options), args=tuple(args)))
    chosen = _choose(scheduler)
    job = _executor(spec, chosen).submit(_ScriptCall(spec))
    return Job(job, spec, chosen)


def _submit_remote(remote: str, fn: Callable[..., Any] | None, args: Sequence[Any], job_options: dict[str, Any],
                   kwargs: dict[str, Any], scheduler: str, setup: Sequence[str], python: str,
                   path: str | None = None) -> RemoteJob:
    """Checked here first (a bad option fails before any ssh), then submitted there by the same API."""
    from ..remote_api import submit_remote

    if scheduler not in ("auto", "slurm"):
        raise SpecError(f"scheduler {scheduler!r} with remote=: only Slurm clusters are supported over ssh "
                        f"(leave scheduler out)")
    validate(_spec(path or sys.executable, dict(job_options), module=fn is not None))
    return submit_remote(remote, fn, args, {**job_options, **kwargs}, path=path, setup=setup, python=python)


def map_array(fn: Callable[..., Any], *iterables: Iterable[Any], scheduler: str = "auto",
              **options: Any) -> list[Job]:
    """A job array: one distributed job per element (each its own world with its own MASTER_PORT)."""
    job_options, kwargs = _split_options(options)
    job_options.setdefault("job_name", getattr(fn, "__name__", "slurmlaunch"))
    spec = validate(_spec(sys.executable, job_options, module=True))
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
        self.spec = validate(_spec(sys.executable, job_options, module=True))
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
