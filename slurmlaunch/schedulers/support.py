"""Which job options a scheduler carries out: the rule, written once. Pure: values in, values out.

Every option of a job means the same under every scheduler, or that scheduler refuses it with one line:
none is silently dropped. Each scheduler's module lists (its :class:`Refusals`) the JobSpec fields it cannot
carry out and what to do instead; a field listed there is refused when its value differs from the built-in
default (a default asks for nothing). tests/app/test_option_meaning.py walks the whole option table against every
scheduler's dry run, so a new option has to land in a table or show its effect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..core.errors import SpecError
from ..core.spec import FIELDS, JobSpec, flag_of


@dataclass(frozen=True)
class Refusals:
    """What one scheduler refuses: ``not_carried_out`` (field -> why, and what to do instead), ``values``
    (field -> (the values it takes, what they are): options whose values mean something under it alone), and
    ``more``: refusals that depend on the request itself (PBS's Torque flavour)."""

    not_carried_out: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    more: Callable[[JobSpec], Mapping[str, str]] | None = None


def flag(name: str) -> str:
    """The option that sets field ``name``, as the CLI spells it (core.spec's declaration)."""
    return flag_of(name)


def default(name: str) -> object:
    """Field ``name``'s default (core.spec's declaration)."""
    return FIELDS[name].default


def _where(origin: str | None) -> str:
    return f" (from {origin})" if origin and origin not in ("command line", "built-in default") else ""


def refuse(spec: JobSpec, scheduler: str, refusals: Refusals, origins: Mapping[str, str] | None = None) -> None:
    """SpecError for the first option ``scheduler`` cannot carry out (its ``refusals``) or whose value is
    another scheduler's; ``origins`` (as the profiles give them, by option dest) names where a value came from."""
    table = dict(refusals.not_carried_out)
    if refusals.more is not None:
        table.update(refusals.more(spec))
    for name, (values, meaning) in refusals.values.items():
        value = spec.value(name)
        if value is not None and value not in values:
            where = _where((origins or {}).get(name))
            raise SpecError(f"{flag(name)} {value}{where}: not valid under {scheduler} (expected {meaning}: one of "
                            f"{', '.join(values)})")
    for name, why in table.items():
        value = spec.value(name)
        if value == default(name) or value in ((), None, False) or (name == "signal" and spec.warning is None):
            continue
        where = _where((origins or {}).get(name) or (origins or {}).get(name.rstrip("s")))
        shown = value if not isinstance(value, tuple) else " ".join(map(str, value))
        raise SpecError(f"{flag(name)} {shown!s}{where}: the {scheduler} scheduler cannot carry it out: {why}")
