"""The schedulers slurmlaunch knows: one line each. A scheduler is a module of this package whose ``EDGE`` is a
:class:`~.interface.Scheduler`; the line names it, in the order --scheduler auto tries them (the last, which
needs no client, is the fallback). Modules are imported only when asked for: the local one brings the
launcher's modules."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..core.errors import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .interface import Scheduler

SchedulerName = str  # as interface.SchedulerName: kept apart so that reading the registry imports no edge


@dataclass(frozen=True)
class Plugin:
    name: SchedulerName  # what --scheduler, records and the index say
    module: str  # the module of this package whose EDGE it is
    aliases: tuple[str, ...] = ()  # other names --scheduler takes for it


PLUGINS: tuple[Plugin, ...] = (
    Plugin("slurm", "slurm"),
    Plugin("pbs", "pbs"),
    Plugin("local", "local"),
)

NAMES: tuple[SchedulerName, ...] = tuple(p.name for p in PLUGINS)
# What --scheduler accepts besides auto: the names, then the aliases.
ACCEPTED: tuple[str, ...] = (*NAMES, *(a for p in PLUGINS for a in p.aliases))


def canonical(name: str) -> SchedulerName | None:
    """The registry's name for ``name`` (a name or an alias), or None."""
    return next((p.name for p in PLUGINS if name == p.name or name in p.aliases), None)


def scheduler(name: str) -> Scheduler:
    """The edge called ``name`` (or one of its aliases); SpecError naming the valid ones otherwise."""
    found = next((p for p in PLUGINS if name == p.name or name in p.aliases), None)
    if found is None:
        raise SpecError(f"scheduler {name!r} is not valid (expected auto, {', '.join(ACCEPTED)})")
    edge: Scheduler = importlib.import_module(f"{__package__}.{found.module}").EDGE
    return edge
