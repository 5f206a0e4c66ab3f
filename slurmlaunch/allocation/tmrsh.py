"""Open MPI's rsh launcher through PBS's task manager, for an Open MPI built without PBS's `tm` (Debian's and
Ubuntu's are): the PBS script gives mpiexec ``--mca plm_rsh_agent "PYTHON -m slurmlaunch.allocation.tmrsh"``.

mpiexec then calls ``AGENT HOST WORD...`` once per other host to start its daemon there. ``pbs_tmrsh HOST
CMD ARG...`` starts CMD on HOST as a task of the job, through the MoMs: no ssh keys between compute nodes,
and the daemon (so every rank under it) is the job's, accounted and killed with it on qdel or the walltime.
Open MPI writes the words as one shell command line, as it would for ssh (``PATH=...; export PATH; orted
...``), while pbs_tmrsh runs its argv without a shell: the words are joined and run by ``/bin/sh -c``, as an
sshd would. With no pbs_tmrsh anywhere (not a PBS job, or Torque), it is ``ssh HOST WORD...``, Open MPI's
default. An Open MPI built with `tm` never calls the agent (its tm launcher wins inside a PBS job).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

DEFAULT_EXEC = "/opt/pbs"
LINGER_S = 2


def _conf_exec(read: Callable[[str], str | None], env: Mapping[str, str]) -> str | None:
    """PBS_EXEC from pbs.conf ($PBS_CONF_FILE, else /etc/pbs.conf)."""
    text = read(env.get("PBS_CONF_FILE") or "/etc/pbs.conf") or ""
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == "PBS_EXEC" and value:
            return value
    return None


def find_tmrsh(env: Mapping[str, str], exists: Callable[[str], bool],
               read: Callable[[str], str | None]) -> str | None:
    """pbs_tmrsh: in $PBS_EXEC/bin, pbs.conf's PBS_EXEC/bin, on PATH, or /opt/pbs/bin; None when none is."""
    places = [env.get("PBS_EXEC"), _conf_exec(read, env)]
    candidates = [f"{p}/bin/pbs_tmrsh" for p in places if p]
    candidates += [f"{d}/pbs_tmrsh" for d in env.get("PATH", "").split(os.pathsep) if d]
    candidates.append(f"{DEFAULT_EXEC}/bin/pbs_tmrsh")
    return next((c for c in candidates if exists(c)), None)


def command(argv: list[str], tmrsh: str | None) -> list[str]:
    """What runs for the agent's arguments HOST WORD...: pbs_tmrsh HOST /bin/sh -c 'WORD ...', or ssh."""
    if len(argv) < 2:
        raise ValueError(f"expected HOST COMMAND..., got {argv!r}")
    host, words = argv[0], argv[1:]
    if tmrsh is None:
        return ["ssh", host, *words]
    # The daemon detaches itself (a new session, its parent exits); when the task's shell ended with the
    # parent, the MoM's clean-up of the ended task now and then caught the daemon before it had detached
    # (seen: no daemon on the second host, mpiexec waiting for ever). The shell outlives it by LINGER_S,
    # keeping the parent's status. Kept attached instead, the daemon is SIGKILLed by qdel and its ranks,
    # each in a process group of its own, outlive the job.
    return [tmrsh, host, "/bin/sh", "-c", f"{' '.join(words)}\nrc=$?; sleep {LINGER_S}; exit $rc"]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return None


def main(argv: list[str]) -> int:
    try:
        cmd = command(argv, find_tmrsh(os.environ, lambda p: os.access(p, os.X_OK), _read))
    except ValueError as e:
        sys.stderr.write(f"slurmlaunch tmrsh: {e}\n")
        return 2
    os.execvp(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
