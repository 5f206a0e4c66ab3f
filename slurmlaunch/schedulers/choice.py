"""Which scheduler: the one definition of --scheduler auto/slurm/pbs/local, for the CLI and the Python API."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import cast

from ..core.errors import SchedulerError, SpecError
from .interface import Scheduler, SchedulerName

NAMES: tuple[SchedulerName, ...] = ("slurm", "pbs", "local")


def scheduler(name: str) -> Scheduler:
    """The edge called ``name`` (imported only when asked for: the local one brings the launcher's modules)."""
    if name == "slurm":
        from . import slurm

        return slurm.EDGE
    if name == "pbs":
        from . import pbs

        return pbs.EDGE
    if name == "local":
        from . import local

        return local.EDGE
    raise SpecError(f"scheduler {name!r} is not valid (expected auto, {', '.join(NAMES)})")


def choose(requested: str, *, preview: bool = False, allowed: Sequence[SchedulerName] = NAMES,
           check_client: bool = True, announce: bool = True) -> SchedulerName:
    """The scheduler to use for ``requested`` (auto or one of ``allowed``). auto: Slurm where sbatch is on
    PATH and a controller answers `scontrol ping`, else PBS where qsub is (when allowed), else local.
    auto never chooses local where a Slurm cluster is configured and its controller is silent: SchedulerError.
    A named one must have its client on PATH (``check_client``), except for ``preview`` (--dry-run):
    previewing a script must not need the scheduler. ``announce``: say on stderr what auto chose and why."""
    if requested != "auto" and requested not in allowed:
        raise SpecError(f"scheduler {requested!r} is not valid here (expected auto, {', '.join(allowed)})")
    if requested != "auto":
        name = cast(SchedulerName, requested)
        if check_client and not preview and name != "local" and not scheduler(name).available():
            client = "sbatch" if name == "slurm" else "qsub"
            raise SpecError(f"--scheduler {name}: {client} is not on PATH (use --scheduler local on this machine)")
        return name
    from . import pbs, slurm

    chosen: SchedulerName
    if not slurm.available():
        chosen, why = ("pbs", "qsub is on PATH and sbatch is not") if "pbs" in allowed and pbs.available() else \
            ("local", "no sbatch or qsub on PATH")
    else:
        up, said = slurm.controller_answers()
        if not up and slurm.cluster_configured(said):
            # Never run a cluster's job on the submitting host (a login node) because its controller blinked.
            raise SchedulerError(
                f"--scheduler auto: a Slurm cluster is configured here{_conf_shown()} but its controller does "
                f"not answer ({_first_words(said)}); nothing was run: retry when "
                f"`scontrol ping` says UP, or pass --scheduler local to run on this machine")
        chosen, why = ("slurm", "sbatch is on PATH and slurmctld answers") if up else \
            ("local", "sbatch is on PATH but no Slurm cluster is configured here")
    if announce:
        sys.stderr.write(f"slurmlaunch: --scheduler auto chose {chosen} ({why})\n")
    return chosen


def _conf_shown() -> str:
    conf = os.environ.get("SLURM_CONF")
    return f" (SLURM_CONF={conf})" if conf else ""


def _first_words(said: str) -> str:
    """scontrol's answer without its banner of asterisks ("RESTORE SLURMCTLD DAEMON TO SERVICE")."""
    parts = [p.strip() for p in re.split(r"\n| \| ", said)]
    return " | ".join(p for p in parts if any(c.isalnum() for c in p) and "RESTORE SLURMCTLD" not in p) or "no output"
