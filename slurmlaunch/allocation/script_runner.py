"""The runner every rank's Python script goes through where the batch script asks for it
($SLURMLAUNCH_RETURNED_DIR): it runs the script as ``python SCRIPT`` would and leaves the marks that tell a
SIGABRT in torch's teardown from one in the training (docs: Teardown aborts). On the launcher's path:
standard library basics only."""

from __future__ import annotations

from collections.abc import Mapping
from os import path as _path

TYPE_CHECKING = False  # not `typing`: the launcher's path keeps it out (tests/allocation/test_net.py)
if TYPE_CHECKING:
    from typing import Any

RETURNED_DIR = "SLURMLAUNCH_RETURNED_DIR"
STACKS_DIR = "SLURMLAUNCH_STACKS_DIR"
TIMELINE_DIR = "SLURMLAUNCH_TIMELINE_DIR"  # allocation/timeline.py's; spelled here too, as the RUNNER spells it

# `python -c RUNNER SCRIPT ARGS...` (or `-c RUNNER -m MODULE ARGS...`) runs SCRIPT as `python SCRIPT` would: in
# __main__, with its argv, __file__ and sys.path[0], and tracebacks without a frame of this wrapper. When the
# script returns, or exits with status 0, it leaves an empty file named by $RANK in $SLURMLAUNCH_RETURNED_DIR;
# when it exits with another status (sys.exit(140): "saved, requeue me"), the status in $RANK.exit there.
# Why: torch can abort (SIGABRT) while the interpreter exits, after the training finished (gloo's threads,
# kept alive past destroy_process_group by DDP, race the process's own teardown); the file is the evidence
# that lets the batch log say "after the script returned" instead of guessing. An atexit hook cannot be
# installed in a program we exec, and a sitecustomize would shadow the site's own; this costs one compile.
# With $SLURMLAUNCH_STACKS_DIR set, the runner also arms faulthandler (a C-level handler: it runs while the main
# thread is stuck in a C call, all_reduce, and needs no ptrace, which most sites forbid: yama ptrace_scope=1):
# SIGWINCH appends every thread's Python stack to RANK.dump (what `slurmlaunch stacks` asks for), and SIGTERM,
# SIGHUP (the stops) write it to RANK.stopped and then go on to the handler there was (the default: the rank
# dies of it as before). A handler the script installs later replaces ours. Not USR1/USR2, the warning signals:
# the warning goes only to a rank whose script caught it (its SigCgt bit, allocation/warning.py), and a handler
# of ours would set that bit in every rank. Why SIGWINCH: its default is to be ignored, so one that
# reaches a process that has not armed it (an exec'd program, torchrun's agent) changes nothing; processes
# without a terminal never get it otherwise; Slurm, PBS, torch, NCCL and the warning path (USR1/USR2, TERM)
# do not use it. SIGRTMIN+n or SIGPWR would kill such a process. Forked children (DataLoader workers)
# disarm at once: they would write into the rank's files. RANK.pid ("PID START HOST", START from
# /proc/self/stat) tells the collector which process to signal on which node, and that it is still that one.
# Files are created new (O_EXCL|O_NOFOLLOW, 0600) after removing what stood there (a link is removed, not
# followed); a requeued or restarted rank starts them anew.
# The status matters when torch then aborts: the batch script (and the local scheduler) count a rank that
# aborted after asking for 128 + the warning signal as having exited so, and the requeue is not lost.
RUNNER_FILE = _path.join(_path.dirname(_path.abspath(__file__)), "rank_runner.py")
# `-0`: torchrun names a failed worker by its first argument without a leading "-" (the script, not this); the
# file's text runs in the rank's __main__, where the code compiled from it is named "<string>" as before; _f is
# closed and removed by the runner itself. In `ps`, a rank reads `python -u -c -0;_f=open(...) SCRIPT ARGS`.
RUNNER = f"-0;_f=open({RUNNER_FILE!r});exec(_f.read())"


_RUNNER_NAMESPACE: dict[str, object] = {}


def _runner_function(name: str) -> Any:
    """One of the runner's functions, defined in a namespace of its own (the runner's main is not run); the
    file is compiled once a process (the API's rank asks for two of them, and every rank of every job pays)."""
    if not _RUNNER_NAMESPACE:
        namespace: dict[str, object] = {"__name__": "slurmlaunch_runner"}
        with open(RUNNER_FILE, encoding="utf-8") as f:
            exec(f.read(), namespace)
        _RUNNER_NAMESPACE.update(namespace)
    return _RUNNER_NAMESPACE[name]


def arm_stacks(directory: str) -> None:
    """In this process (a rank the RUNNER does not start: the Python API's), what the RUNNER arms: the dumps
    into ``directory`` on SIGWINCH and at a stop signal, and RANK.pid ($RANK, $SLURMD_NODENAME)."""
    _runner_function("_slurmlaunch_arm")(directory)


def arm_timeline(directory: str) -> None:
    """In this process (a rank of the Python API), what the RUNNER arms for the start-up's moments in
    ``directory`` ($RANK): `import torch` done and init_process_group returned (only the latter when torch is
    imported already)."""
    _runner_function("_slurmlaunch_timeline")(directory)


def settle() -> None:
    """In this process (a rank of the Python API, whose function ran here), what the RUNNER does after the
    script: give torch's gloo workers the GIL until none is running, at most 0.5 s (docs: Teardown aborts)."""
    _runner_function("_slurmlaunch_settle")()


def recorded_exit(path: str) -> int | None:
    """The status RUNNER recorded at ``path`` (JobFiles.exit_mark) for a script that called sys.exit(N),
    N != 0; None when there is none (the script returned, or was killed before it exited)."""
    from .smallfile import read_small  # not on the launcher's own path

    try:
        text = read_small(path, 8).decode("ascii", errors="replace")
    except OSError:
        return None
    return int(text) if text.isdigit() and len(text) <= 3 else None


def python_argv(python: str, module: bool, script: str, environ: Mapping[str, str]) -> list[str]:
    """``python -u [-m] SCRIPT``, through RUNNER when $SLURMLAUNCH_RETURNED_DIR asks for the returned-marker or
    $SLURMLAUNCH_STACKS_DIR for the stacks, or $SLURMLAUNCH_TIMELINE_DIR for the start-up's moments."""
    if environ.get(RETURNED_DIR) or environ.get(STACKS_DIR) or environ.get(TIMELINE_DIR):
        return [python, "-u", "-c", RUNNER, *(["-m"] if module else []), script]
    return [python, "-u", *(["-m"] if module else []), script]
