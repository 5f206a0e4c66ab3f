"""The rendezvous bound, SLURMLAUNCH_RDZV_TIMEOUT, parsed once: for the launcher's watchdog and for
init_process_group. Pure: text in, seconds out."""

from __future__ import annotations

from .errors import SlurmLaunchError

RDZV_TIMEOUT_VAR = "SLURMLAUNCH_RDZV_TIMEOUT"
DEFAULT_RDZV_TIMEOUT = 900.0  # seconds a rank waits for the master before it is stopped


def parse_rendezvous_timeout(text: str | None) -> float:
    """Seconds from the variable's text; unset or empty: DEFAULT_RDZV_TIMEOUT; 0: no bound. Anything but a
    finite number >= 0 (a word, a negative, nan, inf) is refused in one line that names the value."""
    if text is None or not text.strip():
        return DEFAULT_RDZV_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):  # also false for nan
        # The wording is the one the batch logs have always shown (tests match it there).
        raise SlurmLaunchError(f"{RDZV_TIMEOUT_VAR}={text!r} is not valid (expected seconds >= 0; 0 = off)")
    return value
