"""The runner every rank's Python script goes through where the batch script asks for it
($SLURMLAUNCH_RETURNED_DIR): it runs the script as ``python SCRIPT`` would and leaves the marks that tell a
SIGABRT in torch's teardown from one in the training (docs: Teardown aborts). On the launcher's path:
standard library basics only."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module, as the launcher: `signal` loads enum
from collections.abc import Mapping

from ..core import EXIT_MARK_SUFFIX, STACKS_DUMP_SUFFIX, STACKS_PID_SUFFIX, STACKS_STOP_SUFFIX

RETURNED_DIR = "SLURMLAUNCH_RETURNED_DIR"
STACKS_DIR = "SLURMLAUNCH_STACKS_DIR"

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
# SIGHUP, SIGUSR1, SIGUSR2 (the stops and the warning signals) write it to RANK.stopped and then go on to the
# handler there was (the default: the rank dies of it as before). A handler the script installs later replaces
# ours (a checkpointing SIGUSR2 handler still wins). A warning signal the rank started with ignored (the
# launcher's rule) is left ignored: it stops nothing, so it dumps nothing. Why SIGWINCH: its default is to be
# ignored, so one that
# reaches a process that has not armed it (an exec'd program, torchrun's agent) changes nothing; processes
# without a terminal never get it otherwise; Slurm, PBS, torch, NCCL and the warning path (USR1/USR2, TERM)
# do not use it. SIGRTMIN+n or SIGPWR would kill such a process. Forked children (DataLoader workers)
# disarm at once: they would write into the rank's files. RANK.pid ("PID START HOST", START from
# /proc/self/stat) tells the collector which process to signal on which node, and that it is still that one.
# Files are created new (O_EXCL|O_NOFOLLOW, 0600) after removing what stood there (a link is removed, not
# followed); a requeued or restarted rank starts them anew.
# The status matters when torch then aborts: the batch script (and the local scheduler) count a rank that
# aborted after asking for 128 + the warning signal as having exited so, and the requeue is not lost.
_RUNNER = """-0  # torchrun names a failed worker by its first argument without a leading "-": the script, not this
ARM_DEFINITIONSETTLE_DEFINITIONdef _slurmlaunch_main():
    import os, sys
    where, argv = os.environ.get("SLURMLAUNCH_RETURNED_DIR", ""), sys.argv[1:]
    main = sys.modules["__main__"].__dict__
    del main["_slurmlaunch_main"]
    stacks = os.environ.get("SLURMLAUNCH_STACKS_DIR", "")
    if stacks:
        _slurmlaunch_arm(stacks)
    del main["_slurmlaunch_arm"]
    settle = main.pop("_slurmlaunch_settle")
    hook = sys.excepthook
    def excepthook(kind, value, tb):
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        hook(kind, value.with_traceback(tb) if isinstance(value, BaseException) else value, tb)
    sys.excepthook = excepthook
    def returned():
        if where:
            try:
                os.close(os.open(os.path.join(where, os.environ.get("RANK", "rank")), os.O_WRONLY | os.O_CREAT, 0o644))
            except OSError:
                pass
    def exited(code):
        if where:
            try:
                fd = os.open(os.path.join(where, os.environ.get("RANK", "rank") + EXIT_MARK_SUFFIX),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                try:
                    os.write(fd, str(code & 255 if isinstance(code, int) else 1).encode())
                finally:
                    os.close(fd)
            except OSError:
                pass
    try:
        if argv[:1] == ["-m"]:
            import runpy
            sys.argv[:] = ["-m", *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[1])
        else:
            path = os.path.abspath(argv[0])
            sys.argv[:] = argv
            sys.path[0] = os.path.dirname(os.path.realpath(path))
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec", dont_inherit=True)
            main.update(__file__=path, __cached__=None)
            exec(code, main)
    except SystemExit as e:
        if e.code is None or e.code == 0:
            returned()
        else:
            exited(e.code)
        settle()
        raise
    except BaseException:
        settle()
        raise
    returned()
    settle()
_slurmlaunch_main()
"""
# After the script (or the API's function) ended, before the interpreter finalizes (docs: Teardown aborts).
_SETTLE = """def _slurmlaunch_settle():
    # torch's gloo workers destroy each finished all-reduce themselves, and with it a Python object that
    # the backward pass left in the work's thread-local state: a worker still on its way there when the
    # interpreter finalizes is ended by CPython 3.11-3.13 inside a C++ destructor, and that is SIGABRT
    # (docs: Teardown aborts). Before finalizing, give them the GIL until none is running (at most 0.5 s).
    # names taken from builtins here: in the RUNNER this runs with the script's globals, which may rebind
    # them (`from os import *` brings os.open); best effort, so nothing it meets ends the process
    import builtins, os, sys
    if "torch" not in sys.modules:
        return
    import time
    fail, reader = builtins.Exception, builtins.open
    quiet, deadline = 0, time.monotonic() + 0.5
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(0.002)
        quiet += 1
        try:
            tids = os.listdir("/proc/self/task")
        except fail:
            return
        for tid in tids:
            try:  # a thread that ended since the listing is skipped
                with reader("/proc/self/task/" + tid + "/stat", "rb") as f:
                    stat = f.read()
                end = stat.rindex(b")")
                if stat[stat.index(b"(") + 1:end].startswith(b"pt_gloo") and stat[end + 2:end + 3] == b"R":
                    quiet = 0
            except fail:
                continue
"""
# The stacks' arming (the comment above), one definition for the RUNNER and for arm_stacks (the Python API's ranks).
_ARM = """def _slurmlaunch_arm(stacks):
    import os
    try:
        import faulthandler  # not `signal`: its enums cost ~10 ms at start-up; the numbers are filled in below
        base = os.path.join(stacks, os.environ.get("RANK", "rank"))
        def fresh(path):
            try:
                os.unlink(path)
            except OSError:
                pass
            how = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
            return os.open(path, how, 0o600)
        import _signal
        # a warning signal the rank started with ignored (the launcher's rule: $SLURMLAUNCH_WARNING) stops
        # nothing: it stays ignored, so no stacks at it, and a program the script execs inherits it ignored
        armed = [s for s in (SIGNAL_WINCH, SIGNAL_TERM, SIGNAL_HUP, SIGNAL_USR1, SIGNAL_USR2)
                 if _signal.getsignal(s) != _signal.SIG_IGN]
        faulthandler.register(SIGNAL_WINCH, fresh(base + STACKS_DUMP_SUFFIX), all_threads=True)
        stop = fresh(base + STACKS_STOP_SUFFIX)
        for s in armed:
            if s != SIGNAL_WINCH:
                faulthandler.register(s, stop, all_threads=True, chain=True)
        def forked():
            for s in (SIGNAL_WINCH, *armed):
                faulthandler.unregister(s)
        os.register_at_fork(after_in_child=forked)
        with open("/proc/self/stat", "rb") as f:
            start = f.read().rsplit(b")", 1)[1].split()[19].decode()
        host = "".join((os.environ.get("SLURMD_NODENAME") or os.uname().nodename).split()) or "?"
        fd = fresh(base + STACKS_PID_SUFFIX)
        os.write(fd, f"{os.getpid()} {start} {host}\\n".encode())
        os.close(fd)
    except (OSError, ValueError, IndexError, RuntimeError, AttributeError):
        pass
"""
RUNNER = _RUNNER.replace("ARM_DEFINITION", _ARM).replace("SETTLE_DEFINITION", _SETTLE)  # with the names JobFiles spells
for _name, _value in (("EXIT_MARK_SUFFIX", EXIT_MARK_SUFFIX), ("STACKS_DUMP_SUFFIX", STACKS_DUMP_SUFFIX),
                      ("STACKS_STOP_SUFFIX", STACKS_STOP_SUFFIX), ("STACKS_PID_SUFFIX", STACKS_PID_SUFFIX),
                      *((f"SIGNAL_{name}", int(getattr(_signal, "SIG" + name)))
                        for name in ("WINCH", "TERM", "HUP", "USR1", "USR2"))):
    RUNNER = RUNNER.replace(_name, repr(_value))
    _ARM = _ARM.replace(_name, repr(_value))


def arm_stacks(directory: str) -> None:
    """In this process (a rank the RUNNER does not start: the Python API's), what the RUNNER arms: the dumps
    into ``directory`` on SIGWINCH and at a stop signal, and RANK.pid ($RANK, $SLURMD_NODENAME)."""
    namespace: dict[str, object] = {}
    exec(_ARM, namespace)
    arm = namespace["_slurmlaunch_arm"]
    assert callable(arm)
    arm(directory)


def settle() -> None:
    """In this process (a rank of the Python API, whose function ran here), what the RUNNER does after the
    script: give torch's gloo workers the GIL until none is running, at most 0.5 s (docs: Teardown aborts)."""
    namespace: dict[str, object] = {}
    exec(_SETTLE, namespace)
    run = namespace["_slurmlaunch_settle"]
    assert callable(run)
    run()


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
    $SLURMLAUNCH_STACKS_DIR for the stacks."""
    if environ.get(RETURNED_DIR) or environ.get(STACKS_DIR):
        return [python, "-u", "-c", RUNNER, *(["-m"] if module else []), script]
    return [python, "-u", *(["-m"] if module else []), script]
