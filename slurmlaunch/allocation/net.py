"""The network checks, defined once: resolve a name, tell loopback, test a port, pick a free one, wait for a
listener. Used by the launcher's pre-flight and watchdog, `slurmlaunch run`, doctor's probe and
init_process_group.

On the launcher's path, which runs once per rank: only the C module `_socket` at import (`socket` drags in
selectors, enum tables and more); `socket` itself is imported by wait_listening alone, which runs in the
watchdog's forked child or outside the launcher.
"""

from __future__ import annotations

import _socket
import time
from collections.abc import Callable


def resolve(host: str, port: int | None = None) -> list[str]:
    """The addresses ``host`` resolves to here (TCP), sorted, without duplicates. Raises OSError
    (socket.gaierror) or UnicodeError (a name IDNA cannot encode) as getaddrinfo does: the caller says which
    option or variable held the name."""
    infos = _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def is_loopback(address: str) -> bool:
    """A numeric address (as getaddrinfo returns it) on the loopback: 127.0.0.0/8, ::1, or 127.x mapped into
    IPv6. Debian's 127.0.1.1 line for the machine's own name is the common trap, so the whole /8 counts."""
    address = address.split("%")[0].lower()
    if address.startswith("::ffff:"):
        address = address[len("::ffff:"):]
    if ":" in address:
        try:
            return _socket.inet_pton(_socket.AF_INET6, address) == b"\0" * 15 + b"\1"
        except OSError:
            return False
    return address.startswith("127.")


def all_loopback(addresses: list[str]) -> bool:
    """Every address is a loopback one (and there is at least one): no other machine can reach the name."""
    return bool(addresses) and all(is_loopback(a) for a in addresses)


def bindable(port: int) -> OSError | None:
    """Whether this machine can listen on TCP ``port`` on every IPv4 address now: None, or the error. With
    SO_REUSEADDR, as TCPStore listens, so a port in TIME_WAIT is no obstacle for it either."""
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        s.bind(("", port))
        s.listen(1)
        return None
    except OSError as e:
        return e
    finally:
        s.close()


def free_port() -> int:
    """A TCP port the kernel reports free on 127.0.0.1 right now (a world of one, --standalone)."""
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


def wait_listening(addr: str, port: int, deadline: float, poll: float,
                   give_up: Callable[[], bool] = lambda: False) -> str | None:
    """Try to connect to addr:port until it works (None) or time.monotonic() passes ``deadline`` or
    ``give_up()`` says so (the last error, as words). Polls every ``poll`` seconds, with no back-off."""
    import socket

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
