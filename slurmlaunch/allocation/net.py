"""Waiting for a master to listen, with a bound: one loop for run, the watchdog and the helper."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def wait_listening(addr: str, port: int, deadline: float, poll: float,
                   give_up: Callable[[], bool] = lambda: False) -> str | None:
    """Try to connect to addr:port until it works (None) or time.monotonic() passes ``deadline`` or
    ``give_up()`` says so (the last error, as words). Polls every ``poll`` seconds, with no back-off."""
    last = "no answer"
    while True:
        if give_up():
            return "given up"
        try:
            budget = max(0.05, min(2.0, deadline - time.monotonic()))
            with socket.create_connection((addr, port), timeout=budget):
                return None
        except OSError as e:
            last = e.strerror or type(e).__name__
        if time.monotonic() >= deadline:
            return last
        time.sleep(poll)
