"""The batch step's plan: the options the renderers write (render/slurm_script.py, render/pbs_script.py) before
`-- COMMAND`, declared once, and their reading (allocation/batch_step.py's :func:`main` reads its argv with
:func:`parse`). Standard library only; argparse is loaded only for a spelling the renderers do not write."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from types import SimpleNamespace


# The plan's options, declared once (the renderers write them, render/slurm_script.py and render/pbs_script.py):
# (flag, type (None: a switch), default, choices, metavar, help). parser() makes argparse's parser of them,
# which is the definition (its --help, its errors); parse() reads the spellings the renderers write without
# loading argparse, and leaves every other argv to argparse.
_OPTIONS: tuple[tuple[str, type | None, object, tuple[str, ...] | None, str | None, str | None], ...] = (
    ("--srun", None, False, None, None, "COMMAND is srun: its stderr goes to the job's srun log, whose words name "
     "the first failure; the requeue is scontrol's"),
    ("--outlive-stop", None, False, None, None, "SIGTERM (PBS's qdel, the walltime): wait for COMMAND, say where "
     "the ranks were, write no exit code"),
    ("--log-dir", str, None, None, None, "the job's output directory (without: the warning is passed on, no more)"),
    ("--job", str, None, None, None, "the job's tag in its file names"),
    ("--unit", str, "rank", ("rank", "node"), None, "what one output file holds"),
    ("--ranks", int, 1, None, None, "the world size"),
    ("--nodes", int, 1, None, None, None),
    ("--tasks-per-node", int, 1, None, None, None),
    ("--torchrun", None, False, None, None, "one task per node, each running torchrun"),
    ("--mpi", str, None, None, None, "PBS: the MPI whose mpiexec COMMAND is"),
    ("--warning", str, None, None, None, "the warning signal's name (USR2)"),
    ("--walltime", float, None, None, None, "PBS: the walltime in seconds (the warning is sent here)"),
    ("--warn-before", float, None, None, None, "PBS: seconds before the walltime to send the warning"),
    ("--requeue", int, None, None, "MAX", "requeue after the warning, at most MAX times"),
    ("--resubmit", str, None, None, "NAME", "PBS: requeue by submitting the job's kept script again, as job NAME, "
     "to start once this job has ended"),
    ("--requeued-by-script", None, False, None, None, "the script's framework requeues itself"),
    ("--stacks", None, False, None, None, "say where the ranks were when they were stopped"),
    ("--stage-env", str, None, ("on", "fallback"), None, "run the ranks from a node-local copy of their "
     "environment (allocation/stage.py); fallback: from the shared copy when it cannot be staged"),
)


def parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(prog="slurmlaunch batch-step", description="the batch script's last command")
    for flag, kind, default, choices, metavar, text in _OPTIONS:
        if kind is None:
            p.add_argument(flag, action="store_true", help=text)
        else:
            p.add_argument(flag, type=kind, default=default, choices=choices, metavar=metavar, help=text)
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def parse(argv: Sequence[str]) -> argparse.Namespace | SimpleNamespace:
    """What ``parser().parse_args(argv)`` gives, for the plain spellings the renderers write (``--flag VALUE``,
    a value that does not start with "-", COMMAND after ``--`` or after the options), without importing
    argparse; any other argv (--help, an unknown or abbreviated flag, ``--flag=VALUE``, a value argparse would
    refuse) goes to argparse, which answers as it always has."""
    from types import SimpleNamespace

    table = {flag: (kind, choices) for flag, kind, _, choices, _, _ in _OPTIONS}
    values: dict[str, object] = {flag[2:].replace("-", "_"): default for flag, _, default, *_ in _OPTIONS}
    i = 0
    while i < len(argv) and argv[i] != "--" and argv[i].startswith("-"):
        if argv[i] not in table:
            return parser().parse_args(argv)
        kind, choices = table[argv[i]]
        name = argv[i][2:].replace("-", "_")
        if kind is None:
            values[name] = True
            i += 1
            continue
        if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
            return parser().parse_args(argv)
        try:
            value = kind(argv[i + 1])
        except ValueError:
            return parser().parse_args(argv)
        if choices is not None and value not in choices:
            return parser().parse_args(argv)
        values[name] = value
        i += 2
    return SimpleNamespace(**values, command=list(argv[i:]))
