"""Environment staging under PBS (allocation/stage.py's steps 2-4 and the clean-up): one task per host of the
job through pbs_tmrsh, PBS's task manager (as the warning's `warn-node` and Open MPI's daemons start there,
allocation/tmrsh.py), each running allocation/stage_node.py with the base interpreter.

PBS has no sbcast, and a task started by pbs_tmrsh has no standard input and writes into the job's output file,
not back to pbs_tmrsh, which only returns the task's exit status. So, per host:
1. ``keep DEST``, started first and left running: it holds the copy for the job and removes it at a stop
   signal, the MoM's SIGTERM to every task of the job at a qdel or the walltime, or `stop`'s at the end;
2. ``unpack PACK DEST BYTES REPORT``: the space check, then the pack unpacked from the shared cache straight
   into DEST (read once per node, no tar left on the node); its exit status says how it went, and a failing
   node writes its line to REPORT.HOST beside the job's files for the batch step to name it;
3. at the end, ``stop DEST``: SIGTERM to that host's `keep`, waiting until it has removed the copy. After a
   qdel no task can be started any more; the MoMs end every `keep` with the job (a sister's with SIGKILL), and
   the watcher each left in a session of its own removes the copy then.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Callable

from .stage import READY_WAIT_S, StageFailed, node_command, nodes_said
from .stage_node import NO_SPACE, STOP_WAIT_S
from .tmrsh import _read, find_tmrsh

STOP_S = STOP_WAIT_S + 60  # a host's `stop` task, at most: the removal, and pbs_tmrsh's start and end


def _tasks(hosts: list[str], tmrsh: str, *args: str) -> dict[str, subprocess.Popen[bytes]]:
    return {host: subprocess.Popen([tmrsh, host, *node_command(*args)], stdin=subprocess.DEVNULL)
            for host in hosts}


def _wait(tasks: dict[str, subprocess.Popen[bytes]], limit: float) -> dict[str, int | None]:
    """Each task's exit status; None for one still running after ``limit`` seconds in all (then killed: its
    pbs_tmrsh only, the task on the host runs on until the job ends)."""
    import time

    deadline = time.monotonic() + limit
    codes: dict[str, int | None] = {}
    for host, proc in tasks.items():
        try:
            codes[host] = proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes[host] = None
    return codes


def pbs_hosts(hosts: list[str], report: str, pack: str, size: int, root: str,
              lap: Callable[[str], None]) -> Callable[[], None]:
    """Stage ``pack`` as ``root`` on every host of ``hosts`` (the job's, $PBS_NODEFILE's order): the clean-up
    that removes every copy. StageFailed when a host could not take it (the others' copies removed). Reads
    $PBS_EXEC and pbs.conf (where pbs_tmrsh is)."""
    if not hosts:
        raise StageFailed("the job's hosts are not known ($PBS_NODEFILE cannot be read)")
    tmrsh = find_tmrsh(os.environ, lambda p: os.access(p, os.X_OK), _read)
    if tmrsh is None:
        raise StageFailed("no pbs_tmrsh was found ($PBS_EXEC/bin, pbs.conf's PBS_EXEC/bin, PATH, /opt/pbs/bin) to "
                          "start a task on each host of the job")
    keepers = _tasks(hosts, tmrsh, "keep", root)

    def clean() -> None:
        # every host, whatever its keeper's pbs_tmrsh here says: a qdel's SIGTERM ends those (they are this
        # host's processes of the job), not the keepers on the other hosts, which a sister MoM SIGKILLs only
        # once the batch step has ended
        stops = _tasks(hosts, tmrsh, "stop", root)
        # 255: pbs_tmrsh could not start the task (after a qdel, tm_init: "not connected"): the MoMs end the
        # anchors with the job, and their watchers remove the copies
        late = [h for h, code in _wait(stops, STOP_S).items() if code not in (0, 255)]
        _wait(keepers, 30)  # their pbs_tmrsh end with the anchors
        if late:
            where = ", ".join(sorted(set(late)))
            sys.stderr.write(f"slurmlaunch: the staged environment's copy may be left on {where} (its holder did "
                             f"not end in time)\n")

    codes = _wait(_tasks(hosts, tmrsh, "unpack", pack, root, str(size), report), READY_WAIT_S)
    bad = {h: c for h, c in codes.items() if c != 0}
    if not bad:
        lap("space check and unpack")
        return clean
    clean()
    lines = []
    for said in sorted(glob.glob(glob.escape(report) + ".*")):  # REPORT.HOST, HOST as the host names itself
        try:
            with open(said) as f:
                lines.append(f.read().strip())
            os.unlink(said)
        except OSError:
            pass
    if all(c == NO_SPACE for c in bad.values()):
        raise nodes_said(lines, NO_SPACE)
    said = "; ".join(lines) or ", ".join(
        f"{h} ({f'not within {READY_WAIT_S:.0f}s' if c is None else f'exit {c}'})" for h, c in bad.items())
    raise StageFailed(f"the environment could not be unpacked on every host: {said}")
