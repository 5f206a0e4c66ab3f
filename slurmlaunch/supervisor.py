"""Runs a set of rank processes on this machine: the local scheduler's and `slurmlaunch run`'s engine.

* each rank in its own session (process group), so a stop reaches its children too and none is left;
* output prefixed with the rank (``[rank 3] ...``), and copied to a per-rank log file when asked;
* the first rank to fail stops the others (SIGTERM, then SIGKILL after ``grace`` seconds) and its exit
  code is the result; a rank killed by signal N counts as exit code 128+N;
* SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 received by the supervisor are forwarded to every rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGINT, signal.SIGTERM)  # after these, ranks get `grace` seconds before SIGKILL


@dataclass(frozen=True)
class RankProcess:
    rank: int
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: str | None = None
    cwd: str | None = None
    unit: str = "rank"  # what the process is, for its output prefix: a rank, or (torchrun mode) a node


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    first_failed_rank: int | None
    codes: Mapping[int, int]
    interrupted_by: int | None = None  # the signal number that stopped the run, if any


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _pump(stream: BinaryIO, prefix: bytes, log: BinaryIO | None, out: BinaryIO, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        if log is not None:
            log.write(line)
            log.flush()
        with lock:
            out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
            out.flush()
    stream.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(ranks: Sequence[RankProcess], *, grace: float = 10.0, prefix: bool = True,
              out: BinaryIO | None = None, poll: float = 0.01) -> Outcome:
    """Start every rank, wait for all, stop all at the first failure; never returns with a rank alive."""
    out = out if out is not None else sys.stdout.buffer
    lock = threading.Lock()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    threads: list[threading.Thread] = []
    logs: list[BinaryIO] = []
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for p in procs.values():
            if p.poll() is None:
                _signal_group(p, signum)

    previous = {}
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        for sig in FORWARDED:
            previous[sig] = signal.signal(sig, forward)
    codes: dict[int, int] = {}
    first_failed: int | None = None
    stop_deadline: float | None = None
    try:
        for r in ranks:
            log: BinaryIO | None = None
            if r.log_path:
                fd = os.open(r.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
                log = os.fdopen(fd, "ab")
                logs.append(log)
            p = subprocess.Popen(list(r.argv), env=dict(r.env), cwd=r.cwd, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            procs[r.rank] = p
            label = f"[{r.unit} {r.rank}] ".encode() if prefix else b""
            assert p.stdout is not None
            t = threading.Thread(target=_pump, args=(p.stdout, label, log, out, lock), daemon=True)
            t.start()
            threads.append(t)
        while len(codes) < len(procs):
            for rank, p in procs.items():
                if rank in codes:
                    continue
                rc = p.poll()
                if rc is None:
                    continue
                codes[rank] = _code(rc)
                if codes[rank] != 0 and first_failed is None:
                    first_failed = rank
                    for other, q in procs.items():
                        if other not in codes and q.poll() is None:
                            _signal_group(q, signal.SIGTERM)
                    stop_deadline = time.monotonic() + grace
            if stop_deadline is None and any(s in STOPPING for s in received):
                stop_deadline = time.monotonic() + grace
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                for rank, p in procs.items():
                    if rank not in codes:
                        _signal_group(p, signal.SIGKILL)
            time.sleep(poll)
    finally:
        for p in procs.values():  # an exception above must not leave ranks behind
            if p.poll() is None:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        for p in procs.values():  # the rank has exited; its children must not outlive it
            _signal_group(p, signal.SIGKILL)
        for t in threads:
            t.join(timeout=5)
        for opened in logs:
            opened.close()
        if in_main_thread:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    interrupted = next((s for s in received if s in STOPPING), None)
    if first_failed is not None:
        exit_code = codes[first_failed]
    elif interrupted is not None:
        exit_code = 128 + interrupted
    else:
        exit_code = 0
    return Outcome(exit_code, first_failed, codes, interrupted)
