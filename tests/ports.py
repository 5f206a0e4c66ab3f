"""Ports and job ids for tests, without races between pytest-xdist workers or between test runs on one machine.

A test process takes a *slot* the first time it asks for a port or a job id: slot N is held by an exclusive
``flock`` on ``SLOT_DIR/slot-N.lock`` for as long as the process lives (the kernel drops it when the process
dies, however it dies), so no two live processes on this machine hold the same slot. A slot owns

- ``PORTS_PER_SLOT`` TCP ports of its own, in ``PORT_REGION``: below every rendezvous port a client derives
  (idr-torch's 10000-29999 is the lowest, slurmlaunch.app.devcluster.slurm.CLIENT_PORTS) and far below the
  kernel's ephemeral range (32768-60999 here), so neither ``bind(0)`` nor an outgoing connection of anyone on
  the machine ever lands in it, and no other slot hands them out;
- ``JOB_IDS_PER_SLOT`` job ids (tests.helpers.first_job_id): a job's MASTER_PORT is derived from its id
  (envvars.derive_port, modulo 16992), and ``SLOTS`` blocks of ids fit in one turn of that modulus, so two
  slots' jobs never derive the same port.

Within a slot, ports are handed out in turn and each is checked bindable first (a port a test of this same
process still listens on is skipped), so a port is free when it is returned and stays free until its user binds
it: nobody else takes ports from this range. What a port cannot be protected from is the process it was given
to being slow; that is the test's business, not a race.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from pathlib import Path

SLOT_DIR = Path(os.environ.get("SLURMLAUNCH_TEST_SLOT_DIR", "/tmp/slurmlaunch-test-slots"))
SLOTS = 8
PORTS_PER_SLOT = 1000
PORT_REGION = (2000, 2000 + SLOTS * PORTS_PER_SLOT - 1)  # 2000-9999
JOB_IDS_PER_SLOT = 2000  # SLOTS x 2000 = 16000 < 16992, derive_port's modulus
SLOT_WAIT_S = 600.0  # a ninth concurrent test process waits this long for a slot, then fails saying who holds them

_lock = threading.Lock()
_slot: int | None = None
_slot_fd: int | None = None
_next = 0


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


def slot() -> int:
    """This process's slot (0..SLOTS-1), taken on first use and kept until the process exits."""
    global _slot, _slot_fd
    with _lock:
        if _slot is not None:
            return _slot
        SLOT_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        deadline = time.monotonic() + SLOT_WAIT_S
        while True:
            for n in range(SLOTS):
                path = SLOT_DIR / f"slot-{n}.lock"
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()} ({os.environ.get('PYTEST_XDIST_WORKER', 'no xdist')})\n".encode())
                _slot, _slot_fd = n, fd
                return n
            if time.monotonic() > deadline:
                held = "; ".join(f"slot {n}: {_holder(SLOT_DIR / f'slot-{n}.lock')}" for n in range(SLOTS))
                raise RuntimeError(f"waited {SLOT_WAIT_S:.0f}s for one of the {SLOTS} test slots in {SLOT_DIR} "
                                   f"(each held by a live test process: {held})")
            time.sleep(1.0)


INHERITED = "SLURMLAUNCH_TEST_PORTS"  # "LO-HI": ports a test process gave this child of its (child_env)


def slot_ports(n: int | None = None) -> range:
    """The ports slot ``n`` owns; by default this process's: those its parent test process handed it
    (``SLURMLAUNCH_TEST_PORTS``, see :func:`child_env`), else its own slot's."""
    if n is None and os.environ.get(INHERITED):
        lo, hi = (int(x) for x in os.environ[INHERITED].split("-"))
        return range(lo, hi + 1)
    n = slot() if n is None else n
    start = PORT_REGION[0] + n * PORTS_PER_SLOT
    return range(start, start + PORTS_PER_SLOT)


def bindable(port: int) -> bool:
    """Whether ``port`` can be listened on at 127.0.0.1 and on every address now."""
    for addr in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as s:
            try:
                s.bind((addr, port))
            except OSError:
                return False
    return True


def port() -> int:
    """A TCP port of this process's own that nothing listens on now (the next of its slot's, in turn)."""
    return port_block(1).start


def run_port() -> int:
    """The port ``slurmlaunch run`` listens on when a test gives it none: the last of this process's own, never
    handed out by :func:`port` (tests/conftest.py makes it the process's PET_MASTER_PORT)."""
    return slot_ports()[-1]


def port_block(count: int) -> range:
    """``count`` consecutive ports of this process's own, each free now: for a child process that needs
    several (it takes them in turn; the range is not handed out again until the slot's ports wrap around)."""
    global _next
    ports = slot_ports()[:-1]  # the last is run_port()'s
    if not 0 < count <= len(ports) // 4:
        raise ValueError(f"port_block({count}): between 1 and {len(ports) // 4} ports at once")
    with _lock:
        for _ in range(len(ports)):
            if _next + count > len(ports):
                _next = 0
            block = range(ports.start + _next, ports.start + _next + count)
            _next += count
            if all(bindable(p) for p in block):
                return block
    raise RuntimeError(f"no {count} free ports in a row among this test process's {ports.start}-{ports.stop - 1}")


def child_env(count: int = 50) -> dict[str, str]:
    """Variables for a child process that asks :func:`port` itself (a Python started by the test, a benchmark):
    a block of this process's ports, so the child takes no slot of its own."""
    block = port_block(count)
    return {INHERITED: f"{block.start}-{block.stop - 1}"}
