"""The batch step's scheduler commands (scontrol requeue; under PBS qsub and qdel): each runs through
:func:`run_command`, bounded.

schedulers/runner.py is the one place the submitting side's scheduler commands run, but the batch step runs
inside the allocation, a layer below schedulers/ (pyproject's import contracts: allocation/ imports only core/
and the standard library), and wants none of its runners (ssh to a login node): it is on the job's own node. Its
few commands run here instead, and nowhere else in allocation/. (The warning's per-node steps, an `srun
--overlap` or `pbs_tmrsh` per host started side by side, are the ranks' processes, not scheduler requests: they
stay with the warning, in batch_step.Step._warn_nodes.)
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

COMMAND_TIMEOUT_S = 60.0  # a scheduler's client that has not answered by then is taken as failed


def run_command(argv: Sequence[str], *, capture: bool = True,
                timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str] | str:
    """``argv`` run to its end, without a shell, stdin none, within ``timeout`` seconds (then killed): its
    result, its output captured as text (``capture`` False: left to the job's own stdout and stderr, where it
    says why it failed); why it did not run, in Python's words, when it could not start or ran out of time."""
    try:
        return subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=capture, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
