"""The Python front end, built on submitit: run a function (or a script) as a distributed job.

    import slurmlaunch
    job = slurmlaunch.submit(train, cfg, nodes=2, gpus_per_node=4, time="4:00:00", partition="gpu")
    print(job.result())          # rank 0's return value
    print(job.results())         # every rank's, indexed by rank

The options are JobSpec's fields, validated by the same code as the CLI's. Under Slurm, submitit's
SlurmExecutor runs one task per GPU (srun --kill-on-bad-exit); ``scheduler="local"`` uses submitit's
LocalExecutor and emulates the nodes the way the CLI's local scheduler does. Inside every task the torch
distributed environment is computed and exported by the launcher's own code (detect, checks, exports)
before ``fn`` runs.
"""

from __future__ import annotations

import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from .errors import SlurmLaunchError, SpecError
from .spec import JobSpec, validate

_MARK = "slurmlaunch-rank-failure"
# `slurmlaunch submit` features the submitit-based API does not carry out: refused, never silently dropped.
CLI_ONLY = frozenset({"array", "max_parallel", "sweep", "mode", "nproc_per_node", "max_restarts", "min_nodes",
                      "container_image", "apptainer", "container_mounts", "container_workdir", "template_dir"})
OPTION_NAMES = frozenset(f.name for f in fields(JobSpec)) - {"script", "args", "module", "no_python", "python",
                                                             "workdir"} - CLI_ONLY
# A profile's keys (the CLI's option names) as JobSpec fields, where they differ.
_PROFILE_FIELDS = {"sbatch_arg": "sbatch_args", "container_mount": "container_mounts", "pbs_resource": "pbs_resources",
                   "mpiexec_arg": "mpiexec_args"}


class RankFailed(SlurmLaunchError):
    """A rank of a distributed job raised; ``rank`` is the first to fail, ``trace`` its traceback."""

    def __init__(self, rank: int, trace: str) -> None:
        super().__init__(f"rank {rank} failed:\n{trace}")
        self.rank = rank
        self.trace = trace


def _export_distributed_env(spec: JobSpec) -> None:
    """In a task: give submitit's local tasks the variables a Slurm step would have, then map them exactly
    as `slurmlaunch launch` does and export the result."""
    from .launch import preflight, resolve

    environ = os.environ
    if "SUBMITIT_LOCAL_JOB_ID" in environ and "SLURM_PROCID" not in environ:
        from .schedulers.local import gpu_plan, rank_env

        rank = int(environ["SUBMITIT_LOCAL_GLOBALID"])
        gpus, _ = gpu_plan(spec, environ)
        emulated = rank_env(spec, environ["SUBMITIT_LOCAL_JOB_ID"], rank, environ, gpus)
        environ.update({k: v for k, v in emulated.items() if environ.get(k) != v})
    dist = preflight(resolve(environ), environ)
    environ.update(dist.exports(environ))


class _DistributedCall:
    """What submitit runs in every task: the environment, then ``fn``; a failure is marked with its rank
    and time, so that the caller can tell the first failure from its consequences in the other ranks."""

    def __init__(self, spec: JobSpec, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.spec, self.fn, self.args, self.kwargs = spec, fn, tuple(args), dict(kwargs)

    def __call__(self) -> Any:
        _export_distributed_env(self.spec)
        try:
            return self.fn(*self.args, **self.kwargs)
        except Exception as e:  # not SystemExit: submitit exits that way to requeue a preempted job
            rank = os.environ.get("RANK", "?")
            raise RuntimeError(f"{_MARK} rank={rank} at={time.time():.6f}\n{traceback.format_exc()}") from e


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
        import subprocess

        from .schedulers.slurm import launch_command

        _export_distributed_env(self.spec)
        done = subprocess.run(launch_command(self.spec), cwd=self.spec.workdir)
        if done.returncode != 0:
            raise RuntimeError(f"{_MARK} rank={os.environ.get('RANK', '?')} at={time.time():.6f}\n"
                               f"{self.spec.script} exited with code {done.returncode}")
        return done.returncode


def _wrap(spec: JobSpec, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> _DistributedCall:
    cls = _CheckpointableCall if hasattr(fn, "checkpoint") else _DistributedCall
    return cls(spec, fn, args, kwargs)


class Job:
    """A submitted distributed job (one submitit job with one task per rank)."""

    def __init__(self, job: Any, spec: JobSpec, scheduler: str) -> None:
        self._job = job
        self.spec = spec
        self.scheduler = scheduler

    @property
    def job_id(self) -> str:
        return str(self._job.job_id)

    @property
    def state(self) -> str:
        return str(self._job.state)

    def done(self) -> bool:
        return bool(self._job.done())

    def cancel(self) -> None:
        self._job.cancel(check=False)

    def logs(self, rank: int = 0) -> str:
        """What rank ``rank`` printed (stdout, then stderr)."""
        task = self._job.task(rank)
        return (task.stdout() or "") + (task.stderr() or "")

    def results(self) -> list[Any]:
        """Every rank's return value, by rank; waits for the job. Raises RankFailed for the first rank that
        failed (by time), with its traceback."""
        from submitit.core.utils import FailedJobError, UncompletedJobError

        values: list[Any] = []
        failures: list[tuple[float, int, str]] = []
        for rank in range(self.spec.world_size):
            try:
                values.append(self._job.task(rank).result())
            except (FailedJobError, UncompletedJobError) as e:
                text = str(e)
                mark = re.search(_MARK + r" rank=(\S+) at=([\d.]+)\n", text)
                when = float(mark.group(2)) if mark else float("inf")
                failures.append((when, rank, text[mark.end():] if mark else text))
                values.append(None)
        if failures:
            _, rank, trace = min(failures)
            raise RankFailed(rank, trace)
        return values

    def result(self) -> Any:
        """Rank 0's return value (waits for the job; raises RankFailed when any rank failed)."""
        return self.results()[0]

    def __repr__(self) -> str:
        return f"slurmlaunch.Job({self.job_id!r}, {self.scheduler}, {self.spec.world_size} ranks)"


def profile_options(name: str) -> dict[str, Any]:
    """The job options profile ``name`` (with the files' [defaults]) sets, as keyword arguments (README:
    Profiles). Settings the API does not carry out (mode, containers, ...) are refused; the scheduler,
    template and --wait settings are the CLI's and are not taken."""
    import argparse

    from . import profiles
    from .cli import add_submit_options
    from .spec import parse_env, parse_nodes

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
    from .schedulers.pbs import walltime

    h, m, s = (int(p) for p in walltime(time_text).split(":"))
    return max(1, h * 60 + m + (1 if s else 0))


def _executor(spec: JobSpec, scheduler: str) -> Any:
    import submitit

    folder = Path(spec.log_dir) / "submitit" / "%j"
    tpn = spec.ntasks_per_node
    if scheduler == "local":
        local = submitit.LocalExecutor(folder=str(folder), python=spec.python)
        local.update_parameters(tasks_per_node=spec.world_size, nodes=1, timeout_min=_minutes(spec.time),
                                signal_delay_s=spec.warning[1] if spec.warning else 90)
        return local
    ex = submitit.SlurmExecutor(folder=str(folder), python=spec.python)
    params: dict[str, Any] = {
        "nodes": spec.nodes, "ntasks_per_node": tpn, "time": _minutes(spec.time), "job_name": spec.name,
        "srun_args": ["--kill-on-bad-exit=1"], "setup": list(spec.setup),
        "signal_delay_s": spec.warning[1] if spec.warning else 90,
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
    extra = {}
    for arg in spec.sbatch_args:
        key, _, value = arg.lstrip("-").partition("=")
        extra[key.replace("-", "_")] = value or True
    if extra:
        params["additional_parameters"] = extra
    ex.update_parameters(**params)
    return ex


def _choose(scheduler: str) -> str:
    if scheduler not in ("auto", "slurm", "local"):
        raise SpecError(f"scheduler {scheduler!r} is not valid here (expected auto, slurm or local)")
    if scheduler != "auto":
        return scheduler
    from .schedulers import slurm

    return "slurm" if slurm.available() and slurm.controller_answers()[0] else "local"


def _spec(script: str, options: dict[str, Any], module: bool = False) -> JobSpec:
    env = options.pop("env", ())
    if isinstance(env, dict):
        env = tuple(env.items())

    spec = JobSpec(script=script, module=module, env=tuple(env), **options)
    return spec


def submit(fn: Callable[..., Any], *args: Any, scheduler: str = "auto", **options: Any) -> Job:
    """Run ``fn(*args, **kwargs)`` on every rank of a distributed job; keyword arguments that are job
    options (nodes, gpus_per_node, tasks_per_node, cpus_per_task, mem, time, partition, account, qos, ...)
    configure the job, the others go to ``fn``. Validation is the CLI's: a bad option raises SpecError."""
    job_options, kwargs = _split_options(options)
    job_options.setdefault("job_name", getattr(fn, "__name__", "slurmlaunch"))
    spec = validate(_spec(sys.executable, job_options, module=True))
    chosen = _choose(scheduler)
    job = _executor(spec, chosen).submit(_wrap(spec, fn, args, kwargs))
    return Job(job, spec, chosen)


def submit_script(path: str, args: Iterable[str] = (), *, scheduler: str = "auto", **options: Any) -> Job:
    """Run a script on every rank, through the launcher, as `slurmlaunch submit` would."""
    job_options, unknown = _split_options(options)
    if unknown:
        raise SpecError(f"unknown option(s) {', '.join(sorted(unknown))} (valid: {', '.join(sorted(OPTION_NAMES))})")
    spec = validate(replace(_spec(path, job_options), args=tuple(args)))
    chosen = _choose(scheduler)
    job = _executor(spec, chosen).submit(_ScriptCall(spec))
    return Job(job, spec, chosen)


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
