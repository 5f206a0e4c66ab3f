"""The warning signals' names, and which of them also stop a job. Here, not in parse.py (which reads
--signal and reaches here for the table), because the launcher reads this on every rank's start, where `re`
and `signal` (its enums) are not loaded."""

from __future__ import annotations

# Signals a batch script may ask Slurm for before the time limit. USR2 is the default (submitit's too); USR1
# is Lightning's, and NCCL only catches it when NCCL_PROXY_DUMP_SIGNAL asks it to (since NCCL 2.14).
WARNING_SIGNALS = ("USR2", "USR1", "TERM", "INT", "HUP", "ALRM", "URG", "XCPU", "CONT")
# The warning signals that are also how a job is stopped: TERM (scancel, qdel, the time limit), INT (Ctrl-C, the
# local scheduler's and `run`'s stop), HUP (a closed terminal). Asked for as the warning, they go to every rank
# (allocation/warning.py): they are meant to stop it. The other warning signals go only to a rank with a handler.
STOP_SIGNALS = ("TERM", "INT", "HUP")
