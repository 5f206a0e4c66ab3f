"""The schedulers slurmlaunch knows: the shipped ones, one line each, and those installed plug-ins add.

A scheduler is a module whose ``EDGE`` (or the attribute its line names) is a :class:`~.interface.Scheduler`.
The shipped lines are in the order --scheduler auto tries them (the last, which needs no client, is the
fallback). A plug-in is a distribution that declares an entry point in the group ``slurmlaunch.schedulers``
(``NAME = "package.module:EDGE"``, pyproject.toml's ``[project.entry-points."slurmlaunch.schedulers"]``, as
TorchX's ``torchx.schedulers``): its scheduler is then taken by name everywhere a shipped one is (--scheduler
NAME, a profile, the Python API's ``scheduler=``, the job commands on its jobs), never by auto. Installed
plug-ins are looked up only when a name is not a shipped one: a command on the shipped schedulers reads no
package metadata. Modules are imported only when asked for: the local one brings the launcher's modules."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from ..core.errors import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .interface import Scheduler

SchedulerName = str  # as interface.SchedulerName: kept apart so that reading the registry imports no edge

ENTRY_POINTS = "slurmlaunch.schedulers"  # the entry point group of scheduler plug-ins


@dataclass(frozen=True)
class Plugin:
    name: SchedulerName  # what --scheduler, records and the index say
    module: str  # the module whose ``attribute`` is the edge (full dotted name)
    aliases: tuple[str, ...] = ()  # other names --scheduler takes for it
    attribute: str = "EDGE"
    shipped: bool = True  # False: an installed plug-in's (its entry point)


# The shipped schedulers, in the order --scheduler auto tries them.
PLUGINS: tuple[Plugin, ...] = (
    Plugin("slurm", f"{__package__}.slurm"),
    Plugin("pbs", f"{__package__}.pbs"),
    Plugin("local", f"{__package__}.local"),
)

SHIPPED: tuple[SchedulerName, ...] = tuple(p.name for p in PLUGINS)


@functools.cache
def installed() -> tuple[Plugin, ...]:
    """Every scheduler: the shipped ones, then the plug-ins' entry points (``slurmlaunch.schedulers``) by name.
    SpecError for a plug-in whose name is a shipped one's or whose value names no module."""
    from importlib.metadata import entry_points

    taken = {n for p in PLUGINS for n in (p.name, *p.aliases)}
    found: dict[str, Plugin] = {}
    for ep in entry_points(group=ENTRY_POINTS):
        module, _, attribute = ep.value.partition(":")
        dist = getattr(ep, "dist", None)
        origin = f"entry point {ep.name} = {ep.value!r}" + (f" of {dist.name}" if dist is not None else "")
        if ep.name in taken or ep.name == "auto":
            raise SpecError(f"scheduler plug-in {origin}: {ep.name!r} is a name slurmlaunch gives its own "
                            f"scheduler (rename the plug-in's entry point)")
        if not module.strip() or ep.name in found and found[ep.name].module != module.strip():
            raise SpecError(f"scheduler plug-in {origin}: not valid (expected NAME = \"package.module:EDGE\", "
                            f"one per name)")
        found[ep.name] = Plugin(ep.name, module.strip(), (), attribute.strip() or "EDGE", shipped=False)
    return (*PLUGINS, *(found[n] for n in sorted(found)))


class _Names(Sequence[str]):
    """Scheduler names (``aliases``: with the aliases): the shipped ones answer without reading any package
    metadata; asking for another name, or for all of them, looks up the installed plug-ins."""

    def __init__(self, aliases: bool) -> None:
        self._aliases = aliases

    def _of(self, plugins: Sequence[Plugin]) -> tuple[str, ...]:
        names = tuple(p.name for p in plugins)
        return (*names, *(a for p in plugins for a in p.aliases)) if self._aliases else names

    def _all(self) -> tuple[str, ...]:
        return self._of(installed())

    def __contains__(self, name: object) -> bool:
        return name in self._of(PLUGINS) or (isinstance(name, str) and name in self._all())

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._all()[index]

    def __repr__(self) -> str:
        return repr(self._all())


NAMES: Sequence[SchedulerName] = _Names(aliases=False)
# What --scheduler accepts besides auto: the names, then the aliases.
ACCEPTED: Sequence[str] = _Names(aliases=True)


def _find(name: str) -> Plugin | None:
    """``name``'s line: a shipped one's without reading package metadata, else an installed plug-in's."""
    def named(plugins: Sequence[Plugin]) -> Plugin | None:
        return next((p for p in plugins if name == p.name or name in p.aliases), None)

    return named(PLUGINS) or named(installed())


def canonical(name: str) -> SchedulerName | None:
    """The registry's name for ``name`` (a name or an alias), or None."""
    found = _find(name)
    return found.name if found is not None else None


def scheduler(name: str) -> Scheduler:
    """The edge called ``name`` (or one of its aliases); SpecError naming the valid ones otherwise, or saying
    what is wrong with the plug-in that claims the name."""
    found = _find(name)
    if found is None:
        raise SpecError(f"scheduler {name!r} is not valid (expected auto, {', '.join(ACCEPTED)})")
    try:
        edge: Scheduler = getattr(importlib.import_module(found.module), found.attribute)
    except (ImportError, AttributeError) as e:
        if found.shipped:
            raise
        raise SpecError(f"scheduler plug-in {name!r}: {found.module}:{found.attribute} cannot be loaded ({e}); "
                        f"reinstall the package that provides it, or uninstall it") from None
    if edge.name != found.name:
        raise SpecError(f"scheduler plug-in {name!r}: {found.module}:{found.attribute} calls itself "
                        f"{edge.name!r} (expected {found.name!r}, its entry point's name)")
    return edge
