"""The node side of environment staging (allocation/stage.py): what runs once per node, before and after the
ranks, to check the node-local space, unpack the pack, hold the copy for the job and remove it at the end.

Self-contained on purpose: the standard library only, nothing of slurmlaunch, no site-packages. The batch step
starts it as ``BASE_PYTHON -S -I .../stage_node.py OP ARG...`` (:func:`stage.node_command`): the base
interpreter of the ranks' venv (the node image's, which every node already has at that path) rather than the
venv's, and no ``site``, so that what runs on a node before its copy is ready reads nothing from the shared file
system but this one file (and, under PBS, the pack). Started as ``python -m slurmlaunch.allocation.stage``, the
same work cost about 700 calls on the shared file system per node (the venv's site-packages, its .pth files,
slurmlaunch's package), more than the 100 per node issue 42 allows.

    check DIR BYTES          0 when DIR (made if missing) has BYTES free; else one line naming the node and the
                             shortfall, and NO_SPACE
    hold TAR DEST            Slurm: unpack TAR (sbcast's node-local copy) into DEST, remove TAR, say READY on
                             stdout, hold until stdin ends or a stop signal, then remove DEST
    unpack PACK DEST BYTES REPORT
                             PBS: check, then unpack PACK (the shared cache's) into DEST; a failure's line goes
                             to stderr (the job's output) and to the file REPORT.HOST, for the batch step
    keep DEST                PBS: hold DEST for the job (its pid in DEST.pid) until it is stopped (the MoM's
                             SIGKILL at a qdel, or `stop`), then remove it
    stop DEST                PBS: stop the `keep` of DEST on this node and wait until it has removed the copy
"""

from __future__ import annotations

import os
import sys

READY = "slurmlaunch-stage-ready"
STAGE_PREFIX = "slurmlaunch-stage-"  # a job's copy: NODE-LOCAL-DIR/slurmlaunch-stage-JOB
REMOVING = ".removing"  # a node's copy being removed
NO_SPACE = 3  # a node's exit code when its node-local directory is too small
STOP_WAIT_S = 600.0  # `stop`: the removal of the copy, at most (a loaded disk took 96 s for torch's 36,000 files)
KEEP_START_S = 60.0  # `stop`: the `keep` task's pid file, at most (it may start after the unpack)
USAGE = ("usage: stage_node.py check DIR BYTES | hold TAR DEST | unpack PACK DEST BYTES REPORT | keep DEST | "
         "stop DEST")


def say(text: str) -> None:
    sys.stderr.write(f"slurmlaunch: {text}\n")
    sys.stderr.flush()


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def shortfall_line(node: str, where: str, free: int, need: int, what: str) -> str:
    """The one line of a node whose node-local directory cannot take the environment (``what``: what the
    need is made of)."""
    return (f"node {node}: the node-local directory {where} has {size_text(free)} free, staging the environment "
            f"needs {size_text(need)} ({what}): {size_text(need - free)} short")


def _host() -> str:
    return os.uname().nodename


def check(where: str, need: int, what: str = "the pack and its unpacked copy") -> str | None:
    """None when ``where`` (made if missing) has ``need`` bytes free; else the one line."""
    try:
        os.makedirs(where, exist_ok=True)
        st = os.statvfs(where)
    except OSError as e:
        return f"node {_host()}: the node-local directory {where} cannot be used: {e.strerror or e}"
    free = st.f_bavail * st.f_frsize
    return shortfall_line(_host(), where, free, need, what) if free < need else None


def remove(dest: str, tar: str | None = None) -> None:
    """Remove the copy ``dest`` (and ``tar``): renamed first (instant), so that a removal cut short (Slurm's
    KillWait, PBS's kill_delay after a cancel) leaves a name the next staged job on this node sweeps, not a copy
    that looks like a job's."""
    import shutil

    trash = f"{dest}{REMOVING}"
    try:
        os.rename(dest, trash)
    except OSError:
        trash = dest
    shutil.rmtree(trash, ignore_errors=True)
    for left in (tar, f"{dest}.pid"):
        if left:
            try:
                os.unlink(left)
            except OSError:
                pass


def unpack(tar: str, dest: str) -> str | None:
    """Unpack ``tar`` into ``dest`` (made now, private), then sweep the copies of earlier jobs on this node whose
    removal was cut short (ours only: removing other users' fails); None, or why it failed."""
    import shutil
    import subprocess

    try:
        os.makedirs(dest, 0o700)
        done = subprocess.run(["tar", "-C", dest, "-xf", tar], stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise OSError(f"tar -xf {tar} exited {done.returncode}")
    except OSError as e:
        return f"node {_host()}: could not unpack the environment into {dest}: {e}"
    parent = os.path.dirname(dest)
    for left in os.listdir(parent):
        if left.startswith(STAGE_PREFIX) and left.endswith(REMOVING):
            shutil.rmtree(os.path.join(parent, left), ignore_errors=True)
        elif left.startswith(STAGE_PREFIX) and left.endswith(".pid") and _gone(os.path.join(parent, left)):
            remove(os.path.join(parent, left[:-len(".pid")]))  # a PBS keeper SIGKILLed (a sister MoM's, at a qdel)
    return None


def _gone(pid_file: str) -> bool:
    """Whether the keeper whose pid ``pid_file`` holds has ended without removing its copy."""
    try:
        with open(pid_file) as f:
            os.kill(int(f.read().strip()), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False
    return False


def _on_stop(then: object) -> None:
    """Run ``then`` at a stop signal (TERM, INT, HUP); ignore the signals a user or the warning may send to every
    step or task (USR1, USR2, ALRM): the copy is the ranks'."""
    import signal

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, then)  # type: ignore[arg-type]
    for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        signal.signal(s, signal.SIG_IGN)


def hold(tar: str, dest: str) -> int:
    """Slurm: unpack ``tar`` into ``dest`` (then remove the tar), say READY on stdout, and hold until stdin ends
    (the batch step closes it after the ranks; srun passes stdin to every task) or a stop signal comes (Slurm's
    SIGTERM at a cancel or the time limit), then remove ``dest``."""

    def end(*_: object) -> None:
        remove(dest, tar)
        os._exit(0)

    _on_stop(end)
    why = unpack(tar, dest)
    if why is not None:
        say(why)
        end()
    try:
        os.unlink(tar)
    except OSError:
        pass
    sys.stdout.write(f"{READY} {_host()}\n")
    sys.stdout.flush()
    while sys.stdin.buffer.read(1 << 16):
        pass
    end()
    return 0


def unpack_pbs(pack: str, dest: str, need: int, report: str) -> int:
    """PBS: check the space for ``need`` bytes, then unpack ``pack`` (read once from the shared cache, no copy
    of the tar on the node) into ``dest``: 0, else the line on stderr and in REPORT.HOST, and NO_SPACE or 1."""
    why = check(os.path.dirname(dest), need, "its unpacked copy")
    code = NO_SPACE
    if why is None:
        why, code = unpack(pack, dest), 1
    if why is None:
        return 0
    say(why)
    try:
        with open(f"{report}.{_host()}", "w") as f:
            f.write(why + "\n")
    except OSError:
        pass
    return code


def keep(dest: str) -> int:
    """PBS: hold ``dest`` for the job: this task (the anchor, its pid in DEST.pid) waits for a stop signal, and
    a watcher of its own session removes the copy once the anchor has ended, however it ended. A sister MoM
    stops a job's tasks at a qdel with SIGKILL only (OpenPBS's IM_KILL_JOB, once the first host's batch step
    has ended; new tasks cannot be started then, tm_init answers "not connected"), which no handler sees; the
    MoM kills a task by its session, which the watcher has left. At the end of the job `stop` SIGTERMs the
    anchor."""
    import signal
    import time

    _on_stop(lambda *_: os._exit(0))  # the watcher removes the copy
    os.makedirs(os.path.dirname(dest), exist_ok=True)  # it may start before the unpack made it
    anchor = os.getpid()
    with open(f"{dest}.pid.{anchor}", "w") as f:
        f.write(str(anchor))
    os.replace(f"{dest}.pid.{anchor}", f"{dest}.pid")
    if os.fork() == 0:
        try:
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            while os.getppid() == anchor:  # reparented when the anchor ends: no file-system call in the loop
                time.sleep(0.5)
            remove(dest)
        finally:
            os._exit(0)
    while True:
        signal.pause()


def stop(dest: str) -> int:
    """PBS: SIGTERM the `keep` of ``dest`` on this node and wait until it has ended (bounded); when no `keep`
    came (it could not start), remove the copy here."""
    import time

    deadline = time.monotonic() + KEEP_START_S
    pid = 0
    while not pid and time.monotonic() < deadline:
        if not os.path.exists(dest) and not os.path.exists(f"{dest}.pid"):
            return 0  # nothing here (removed already, or never unpacked)
        try:
            with open(f"{dest}.pid") as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            time.sleep(0.2)
    if not pid:
        say(f"node {_host()}: no holder of {dest} came within {KEEP_START_S:.0f}s: removing the copy here")
        remove(dest)
        return 0
    try:
        os.kill(pid, 15)
    except ProcessLookupError:  # ended already: its watcher is removing the copy
        pass
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        if not os.path.exists(f"{dest}.pid"):  # the watcher removes it last
            return 0
        time.sleep(0.2)
    say(f"node {_host()}: the holder of {dest} did not remove it within {STOP_WAIT_S:.0f}s: removing it here")
    remove(dest)
    return 1


def main(argv: list[str]) -> int:
    op, args = (argv[0], argv[1:]) if argv else ("", [])
    try:
        if op == "check" and len(args) == 2:
            why = check(args[0], int(args[1]))
            if why is not None:
                say(why)
            return 0 if why is None else NO_SPACE
        if op == "hold" and len(args) == 2:
            return hold(args[0], args[1])
        if op == "unpack" and len(args) == 4:
            return unpack_pbs(args[0], args[1], int(args[2]), args[3])
        if op == "keep" and len(args) == 1:
            return keep(args[0])
        if op == "stop" and len(args) == 1:
            return stop(args[0])
    except ValueError:
        pass
    say(USAGE)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
