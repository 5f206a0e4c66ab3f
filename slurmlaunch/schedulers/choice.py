"""Which scheduler: the one definition of --scheduler auto or a name, for the CLI, the Python API and
--remote (where the clients are looked for on the login node)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from ..core.errors import SpecError
from .interface import Scheduler, SchedulerName
from .registry import ACCEPTED, NAMES, SHIPPED, canonical, scheduler

__all__ = ["NAMES", "auto_choice", "choose", "login_choice", "scheduler"]


def choose(requested: str, *, preview: bool = False, allowed: Sequence[SchedulerName] = NAMES,
           check_client: bool = True, announce: bool = True) -> SchedulerName:
    """The scheduler to use for ``requested`` (auto or one of ``allowed``; see :func:`auto_choice`). A named
    one must have its client on PATH (``check_client``), except for ``preview`` (--dry-run): previewing a
    script must not need the scheduler. ``announce``: say on stderr what auto chose and why."""
    name = canonical(requested) if requested != "auto" else None
    if requested != "auto" and name not in allowed:
        valid = [n for n in ACCEPTED if canonical(n) in allowed]
        raise SpecError(f"scheduler {requested!r} is not valid here (expected auto, {', '.join(valid)})")
    if name is not None:
        edge = scheduler(name)
        if check_client and not preview and not edge.available():
            raise SpecError(f"--scheduler {name}: {edge.client} is not on PATH (use --scheduler local on this "
                            f"machine)")
        return name
    chosen, why = auto_choice([scheduler(n) for n in SHIPPED if n in allowed], lambda edge: edge.available())
    if announce:
        announce_once(f"--scheduler auto chose {chosen.name} ({why})")
    return chosen.name


CHOICE_FILE = "scheduler-choice"  # in the state directory: the choice last said


def announce_once(line: str) -> None:
    """Say ``line`` (what auto chose, and why) on stderr unless it is what was said last for this user (the
    state directory's CHOICE_FILE): the first command on a machine says it, and so does the first after the
    choice or its reason changed (sbatch installed, a cluster gone), not every command after. Where the file
    cannot be read or written, it is said."""
    import os

    from ..core.paths import state_dir

    path = os.path.join(state_dir(os.environ), CHOICE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            if f.read(4096) == line:
                return
    except (OSError, UnicodeError):
        pass
    sys.stderr.write(f"slurmlaunch: {line}\n")
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(line)
    except OSError:
        pass


def auto_choice(candidates: Sequence[Scheduler], has_client: Callable[[Scheduler], bool], *, where: str = "PATH",
                check: bool = True, none_found: Callable[[list[str]], str] | None = None) -> tuple[Scheduler, str]:
    """--scheduler auto among ``candidates`` (in the registry's order): the first whose client is found
    (``has_client``) decides: itself where its :meth:`~.interface.Scheduler.auto_check` agrees (``check``),
    else the fallback (a candidate without a client: the local scheduler); with no client found, the
    fallback. Returns it and why, in words ("qsub is on PATH and sbatch is not"); SpecError naming the
    clients looked for where there is no fallback (``where``: whose PATH; ``none_found``: the message, from
    the clients' names)."""
    queued = [c for c in candidates if c.client is not None]
    fallback = next((c for c in candidates if c.client is None), None)
    missing: list[str] = []
    for edge in queued:
        assert edge.client is not None
        if not has_client(edge):
            missing.append(edge.client)
            continue
        ok, said = edge.auto_check() if check else (True, "")
        found = f"{edge.client} is on {where}"
        if ok:
            return edge, found + (f" and {said}" if said else "") + (f" and {' or '.join(missing)} is not"
                                                                       if missing else "")
        if fallback is None:
            raise SpecError(f"--scheduler auto: {found} but {said}")
        return fallback, f"{found} but {said}"
    if fallback is None:
        raise SpecError(none_found(missing) if none_found else
                        f"--scheduler auto: neither {' nor '.join(missing)} is on {where}")
    return fallback, f"no {' or '.join(missing)} on {where}" if missing else "the only one allowed"


def login_choice(requested: str, candidates: Sequence[Scheduler],
                 has_client: Callable[[Scheduler], bool] | None = None) -> SchedulerName:
    """The scheduler a login node's own command uses (doctor; the API's remote= runner), among queued
    ``candidates`` (nothing there falls back to running the job itself): a named one as named; auto: the
    first whose client is on PATH (Slurm where sbatch is, else PBS where qsub is), else the first (whose checks
    then say what is missing). ``has_client``: whether a client is there (default: on this machine's PATH;
    doctor --remote asks the login node's). No controller is asked."""
    if requested != "auto":
        return requested
    found = has_client or (lambda edge: edge.available())
    if not any(found(edge) for edge in candidates):
        return candidates[0].name
    return auto_choice(candidates, found, check=False)[0].name
