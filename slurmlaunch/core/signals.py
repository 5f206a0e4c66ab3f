"""The warning signals' names, and which of them a rank starts with ignored. Here, not in parse.py (which reads
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
# Names the warning signal to the API's local ranks (app/api/local.py, which starts them with it ignored until
# submitit's handler is set; the local API moves onto the local scheduler, and this with it). Not read by the
# launcher: an inherited SIG_IGN reads as a handler to Lightning, which then never arms its requeue.
WARNING_VAR = "SLURMLAUNCH_WARNING"


def ignored_until_handled(text: str | None) -> list[int]:
    """The numbers of the warning signals ``text`` ($SLURMLAUNCH_WARNING: NAME[,NAME...]) names that a rank starts
    with ignored: every one of WARNING_SIGNALS but STOP_SIGNALS. An ignored signal stays ignored across exec
    until the program installs a handler (Python keeps an inherited SIG_IGN for every signal but the ones it
    handles itself; signal.signal, and Lightning's and submitit's handlers, then receive it). A name that is
    not a warning signal is skipped: a variable gone wrong must not stop the rank. Numbers from the C module
    (`signal` loads enum), on this system."""
    import _signal  # type: ignore[import-not-found]  # the C module, no stub

    return [int(getattr(_signal, "SIG" + name)) for name in (text or "").split(",")
            if name in WARNING_SIGNALS and name not in STOP_SIGNALS]
