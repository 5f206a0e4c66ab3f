"""submitit's executors, set up for a job: the local one with our controller, Slurm's with the CLI's
signal plan (its batch lines) and private folders."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from ...core.errors import SpecError
from ...core.spec import JobSpec
from ...render.launch import batch_step_command
from .collect import _BATCH_MARK
from .local import _local_executor


def _minutes(time_text: str | None) -> int:
    """submitit's timeout_min for --time: whole minutes, rounded up; no limit (unset, UNLIMITED, INFINITE, or
    0, which sbatch reads as no limit) as a year."""
    from ...core.spec import time_seconds

    seconds = None if time_text is None else time_seconds(time_text)
    return 60 * 24 * 365 if seconds is None else max(1, -(-seconds // 60))


def _batch_lines(signal_name: str) -> list[str]:
    """The first of submitit's setup lines in its batch script: the job's files private, the mark that the
    batch shell started (collect.py reads it), the signal submitit's handler in the ranks listens to."""
    return [
        "# slurmlaunch: what this job writes (results, logs) is the user's alone",
        "umask 077",
        f'echo "{_BATCH_MARK} (restart ${{SLURM_RESTART_COUNT:-0}})" >&2',
        f"export SUBMITIT_PREEMPT_SIGNAL={shlex.quote(signal_name)}",
    ]


def _srun_lines(spec: JobSpec, signal_name: str) -> list[str]:
    """The last of submitit's setup lines: its own srun line, the script's last command, runs through the
    batch step (allocation/batch_step.py, as the CLI's script does), which the batch shell becomes (exec:
    the warning signal --signal=B: sends reaches it) and which passes the warning on to the ranks through
    srun. Defined after the --setup lines, so that an srun of theirs runs as they wrote it."""
    step = [*batch_step_command(spec), "--warning", signal_name]
    return ["srun() {  # the batch step runs srun and passes the warning signal on to the ranks",
            f'    exec {shlex.join(step)} -- srun "$@"',
            "}"]


def _private_folder(spec: JobSpec) -> Path:
    """The folder of submitit's files (the pickled arguments and results): the user's alone, as the CLI's
    job records are. Nothing removes them: submitit never does, and result() can be asked again later."""
    base = Path(spec.log_dir) / "submitit"
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o700)
    return base / "%j"


def _executor(spec: JobSpec, name: str) -> Any:
    """The submitit executor of scheduler ``name``: submitit's own local one (ours, app/api/local.py) for a
    scheduler without a queue; submitit's own for a scheduler it knows (Slurm: set up below); else the API's
    own executor, which goes through the scheduler's edge (PBS: app/api/pbs.py)."""
    import submitit

    from ...schedulers.registry import scheduler

    edge = scheduler(name)
    own = edge.queued and edge.submitit_executor is None
    if own:  # what the edge cannot carry out is refused as the CLI refuses it, before any file is written
        edge.refuse_unsupported(spec)
    folder = _private_folder(spec)
    tpn = spec.ntasks_per_node
    if spec.warning_note:  # the CLI's line: the warning moved half-way (a time limit too short for it)
        sys.stderr.write(f"slurmlaunch: {spec.warning_note}\n")
    if not edge.queued:
        from ...schedulers.local import not_enforced_note

        note = not_enforced_note(spec)  # the CLI's line: a partition, --mem... this machine only shows
        if note:
            sys.stderr.write(f"slurmlaunch: {note}\n")
        local = _local_executor(str(folder), spec)
        local.update_parameters(tasks_per_node=spec.world_size, nodes=1, timeout_min=_minutes(spec.resources.time),
                                signal_delay_s=spec.warning[1] if spec.warning else 90)
        return local
    if own:
        from .pbs import PbsExecutor

        pbs = PbsExecutor(str(folder), spec)
        pbs.update_parameters(timeout_min=_minutes(spec.resources.time))
        return pbs
    if spec.warning is None:
        raise SpecError(f"signal {spec.preemption.signal!r} is not carried out under Slurm by the submitit-based API "
                        f"(submitit always asks for a warning signal): give NAME@SECONDS, or use `slurmlaunch submit`")
    signal_name, signal_s = spec.warning
    # submitit counts its requeues after a time-out down from max_num_timeout (preemptions are not counted)
    ex = submitit.SlurmExecutor(folder=str(folder), python=spec.program.python,
                                max_num_timeout=spec.preemption.max_requeues)
    params: dict[str, Any] = {
        "nodes": spec.resources.nodes, "ntasks_per_node": tpn, "time": _minutes(spec.resources.time),
        "job_name": spec.name,
        "srun_args": ["--kill-on-bad-exit=1"],
        # as the CLI's script: the --env exports, then the --setup lines (which may use them)
        "setup": [*_batch_lines(signal_name), *(f"export {k}={shlex.quote(v)}" for k, v in spec.environment.env),
                  *spec.environment.setup, *_srun_lines(spec, signal_name)],
        "signal_delay_s": signal_s,
    }
    if spec.resources.exclusive:  # submitit writes --exclusive=<value>: only pass it when wanted
        params["exclusive"] = True
    if spec.resources.gpus_per_node:
        params["gpus_per_node"] = spec.resources.gpus_per_node
    for name in ("partition", "account", "qos", "constraint", "mem"):
        if spec.value(name) is not None:
            params[name] = spec.value(name)
    if spec.per_task_cpus is not None:
        params["cpus_per_task"] = spec.per_task_cpus
    # B: the batch shell alone gets the warning, and passes it on (_srun_lines); submitit writes USR2, always
    extra: dict[str, Any] = {"signal": f"B:{signal_name}@{signal_s}"}
    for arg in spec.site.sbatch_args:
        key, _, value = arg.lstrip("-").partition("=")
        extra[key.replace("-", "_")] = value or True
    params["additional_parameters"] = extra
    ex.update_parameters(**params)
    return ex


def _choose(requested: str) -> str:
    """--scheduler's one definition (schedulers/choice.py), within what the API runs on, quietly: auto keeps to
    the schedulers submitit runs itself (Slurm, local); one the API's own executor runs (PBS, app/api/pbs.py)
    only when named, and then its client must be there."""
    from ...schedulers.choice import choose
    from ...schedulers.registry import NAMES, canonical, scheduler

    named = canonical(requested)
    own = named is not None and scheduler(named).submitit_executor is None
    # a named one is allowed as it is: the others' modules (the local one brings the launcher's) are not loaded
    allowed = (named,) if named is not None else tuple(n for n in NAMES if scheduler(n).submitit_executor is not None)
    return choose(requested, allowed=allowed, check_client=own, announce=False)

