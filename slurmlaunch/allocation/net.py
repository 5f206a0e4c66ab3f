"""The network checks, defined once: resolve a name, tell loopback, test a port, pick a free one, wait for a
listener, tell whether a process tree holds a TCP connection. Used by the launcher's pre-flight and
watchdog, `slurmlaunch run`, doctor's probe and init_process_group.

On the launcher's path, which runs once per rank: only the C module `_socket` at import (`socket` drags in
selectors, enum tables and more); `socket` itself is imported by wait_listening alone, which runs in the
watchdog's forked child or outside the launcher.
"""

from __future__ import annotations

import _socket
import os
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
    """A TCP port the kernel reports free on 127.0.0.1 right now (a world of one, chosen inside the rank just
    before exec; where a process outlives the ranks, :class:`HeldPort` keeps the port instead)."""
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


class HeldPort:
    """A TCP port on 127.0.0.1 the kernel reports free, kept: this process holds it bound (SO_REUSEADDR, not
    listening) until :meth:`close`. Why: a port from bind(0) and close is free only until another process's
    bind(0) draws it from the same ephemeral pool, before rank 0 listens (its pre-flight then refused with exit
    78: seen under load). While held, the kernel hands it to no other bind(0) nor plain bind, yet rank 0 still
    binds and listens on it: its pre-flight and torch's TCPStore (libuv too) bind with SO_REUSEADDR, which Linux
    allows beside a bound socket that does not listen. Not inherited by the ranks (close-on-exec), so the
    process that starts them holds it for the job's life: `run --standalone`, the local scheduler."""

    __slots__ = ("port", "_sock")

    def __init__(self) -> None:
        self._sock: _socket.socket | None = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            self._sock.bind(("127.0.0.1", 0))
            self.port = int(self._sock.getsockname()[1])
        except OSError:
            self._sock.close()
            raise

    def close(self) -> None:
        """Let the port go (after the ranks have ended); again is a no-op."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


GIVEN_UP = "given up"  # what wait_listening returns when give_up() said so


def wait_listening(addr: str, port: int, deadline: float, poll: float,
                   give_up: Callable[[], bool] = lambda: False) -> str | None:
    """Try to connect to addr:port until it works (None) or time.monotonic() passes ``deadline`` or
    ``give_up()`` says so (the last error, as words). Polls every ``poll`` seconds, with no back-off."""
    import socket

    last = "no answer"
    while True:
        if give_up():
            return GIVEN_UP
        try:
            budget = max(0.05, min(2.0, deadline - time.monotonic()))
            with socket.create_connection((addr, port), timeout=budget):
                return None
        except OSError as e:
            last = e.strerror or type(e).__name__
        if time.monotonic() >= deadline:
            return last
        time.sleep(poll)


_ESTABLISHED = "01"  # the state column of /proc/net/tcp{,6} (include/net/tcp_states.h: TCP_ESTABLISHED)


def _established(pid: int, inodes: set[str]) -> bool:
    """Whether one of the socket ``inodes`` is an established TCP connection in ``pid``'s network namespace.
    Reading /proc/PID/net/tcp walks the kernel's whole established hash (262144 buckets on a 24 GiB machine:
    about 10 ms of CPU per read, however few connections there are), so it is read only for inet sockets,
    and tcp6 only when tcp did not answer."""
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii", errors="replace") as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == _ESTABLISHED and fields[9] in inodes:
                        return True
        except OSError:
            continue
    return False


def _unix_inodes(pid: int) -> set[str]:
    """The inodes of the Unix-domain sockets in ``pid``'s network namespace (a cheap table: PMIx's and the
    scheduler's local links are these, and are no rendezvous)."""
    inodes: set[str] = set()
    try:
        with open(f"/proc/{pid}/net/unix", encoding="ascii", errors="replace") as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) > 6:
                    inodes.add(fields[6])
    except OSError:
        pass
    return inodes


def _process_tree(pid: int, exclude: int) -> list[int]:
    """``pid`` and its descendants (by /proc/PID/task/TID/children), without ``exclude`` and its own."""
    tree: list[int] = []
    todo = [pid]
    while todo and len(tree) < 4096:
        current = todo.pop()
        if current == exclude:
            continue
        tree.append(current)
        try:
            tids = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{current}/task/{tid}/children", encoding="ascii") as f:
                    todo.extend(int(child) for child in f.read().split())
            except (OSError, ValueError):
                continue
    return tree


def _socket_inodes(pid: int, exclude: int) -> set[str]:
    """The inodes of every socket that ``pid`` or a descendant (``exclude`` and its own left out) holds open."""
    inodes: set[str] = set()
    for member in _process_tree(pid, exclude):
        try:
            fds = os.listdir(f"/proc/{member}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{member}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    return inodes


def holds_connection(pid: int, exclude: int = -1) -> bool:
    """Whether ``pid`` or one of its descendants (``exclude`` and its own left out) holds an established TCP
    connection. Every rendezvous torch offers ends in one: env:// and tcp:// connect to a TCPStore, and a
    world of several processes joined by gloo or NCCL, whatever its init_method (file:// too), keeps TCP
    connections between its ranks. Reads /proc (Linux); False where it cannot. Cheap while the tree holds
    no inet socket (a rank importing torch): the TCP tables are read only when it does (issue 30: read
    every 0.25 s by the watchdog beside the ranks, they took ~50 ms of CPU a second from their imports)."""
    inodes = _socket_inodes(pid, exclude)
    if inodes:
        inodes -= _unix_inodes(pid)
    return bool(inodes) and _established(pid, inodes)
