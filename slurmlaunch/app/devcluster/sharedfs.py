"""A shared file system with latency for the networked dev cluster (issue 42): a directory served over SFTP
from the cluster's hub namespace and mounted with sshfs on a node, so that what ranks read from it crosses
the cluster's network and every request is counted on the server side.

This kernel has no `netem`, so the latency is added by the server's relay: one process in the hub namespace
accepts sshfs's TCP connection (`sshfs -o directport`, no ssh in between), runs OpenSSH's `sftp-server` for
it, and holds every chunk D ms before passing it on, each way (a request waits D, its answer D more: one
round trip costs 2·D plus the work). It parses the SFTP packets as they pass and keeps a count per request
type and the bytes of file data served in DIR/COUNTS, rewritten at most every 0.2 s.

    serve(root, net, delay_ms)           -> the server (pid recorded in root/sharedfs-pids)
    mount(root, net, node, export, mnt)  -> sshfs on that node (pid recorded too)
    counts(root)                         -> Served(requests={"lstat": n, ...}, data_bytes=N)
    stop(root)                           -> unmount, stop what serve/mount started

The traffic of a mount goes through its node's network namespace. The mount itself is in the host's mount
table, seen by every process, unless ``mount_ns_of`` names a slurmd: the dev cluster gives each slurmd a mount
namespace of its own, so each node can have its own mount at the same path (as a real cluster's do)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import DevClusterError
from .netns import Network, _running, _stop_pids

COUNTS = "sharedfs-counts.json"
PIDS = "sharedfs-pids"  # one "KIND PID [MOUNTPOINT]" line per process started
PORT = 7022
SFTP_SERVER = "/usr/lib/openssh/sftp-server"

# SFTP v3 packet types (draft-ietf-secsh-filexfer-02): the requests a client sends, and the data reply.
REQUESTS = {1: "init", 3: "open", 4: "close", 5: "read", 6: "write", 7: "lstat", 8: "fstat", 9: "setstat",
            10: "fsetstat", 11: "opendir", 12: "readdir", 13: "remove", 14: "mkdir", 15: "rmdir",
            16: "realpath", 17: "stat", 18: "rename", 19: "readlink", 20: "symlink", 200: "extended"}
DATA = 103


def missing_requirements() -> str | None:
    """Why the latency file system cannot run here, or None."""
    if not shutil.which("sshfs"):
        return "sshfs is not installed (apt-get install sshfs)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (FUSE is not available in this kernel or container)"
    if not os.access(SFTP_SERVER, os.X_OK):
        return f"{SFTP_SERVER} is missing (the openssh-sftp-server package)"
    return None


class _Counter:
    """Counts SFTP packets in one direction of one connection, across chunk boundaries."""

    def __init__(self, totals: dict[str, int], lock: threading.Lock) -> None:
        self.buf = b""
        self.totals = totals
        self.lock = lock

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while len(self.buf) >= 5:
            size = int.from_bytes(self.buf[:4], "big")
            if len(self.buf) < 4 + size:
                return
            kind = self.buf[4]
            with self.lock:
                if kind == DATA:  # type, id, then the data's own length: 9 bytes of header after the size
                    self.totals["data_bytes"] = self.totals.get("data_bytes", 0) + max(0, size - 9)
                else:
                    name = REQUESTS.get(kind)
                    if name:
                        self.totals[name] = self.totals.get(name, 0) + 1
            self.buf = self.buf[4 + size:]


def _delayed_pipe(read: Callable[[int], bytes], write: Callable[[bytes], object], delay: float,
                  counter: _Counter) -> None:
    """Copy chunks from ``read`` to ``write``, each one ``delay`` seconds after it arrived, in order: a reader
    thread stamps them, this thread sleeps until each is due (chunks in flight overlap, as on a wire)."""
    q: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def reader() -> None:
        while True:
            try:
                chunk = read(65536)
            except OSError:
                chunk = b""
            q.put((time.monotonic() + delay, chunk))
            if not chunk:
                return

    threading.Thread(target=reader, daemon=True).start()
    while True:
        due, chunk = q.get()
        if not chunk:
            return
        counter.feed(chunk)
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            write(chunk)
        except OSError:
            return


def _serve_one(conn: socket.socket, delay: float, totals: dict[str, int], lock: threading.Lock) -> None:
    proc = subprocess.Popen([SFTP_SERVER, "-e", "-l", "QUIET"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            bufsize=0)
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def to_server(chunk: bytes) -> None:
        stdin.write(chunk)

    up = threading.Thread(target=_delayed_pipe, args=(conn.recv, to_server, delay, _Counter(totals, lock)),
                          daemon=True)
    up.start()
    _delayed_pipe(stdout.read, conn.sendall, delay, _Counter(totals, lock))
    conn.close()
    proc.kill()
    proc.wait()


def _server_main(addr: str, port: int, delay_ms: float, counts_path: str) -> None:
    totals: dict[str, int] = {}
    lock = threading.Lock()
    listener = socket.create_server((addr, port))

    def writer() -> None:
        last = None
        while True:
            with lock:
                now = dict(totals)
            if now != last:
                tmp = counts_path + ".tmp"
                with open(tmp, "w") as f:
                    json.dump({"delay_ms": delay_ms, "requests": {k: v for k, v in now.items() if k != "data_bytes"},
                               "data_bytes": now.get("data_bytes", 0)}, f)
                os.replace(tmp, counts_path)
                last = now
            time.sleep(0.2)

    threading.Thread(target=writer, daemon=True).start()
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_one, args=(conn, delay_ms / 1000.0, totals, lock), daemon=True).start()


def _record(root: Path, line: str) -> None:
    with open(root / PIDS, "a") as f:
        f.write(line + "\n")


def _wait_port(net: Network, ns: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    probe = (f"import socket; socket.create_connection(({net.hub_addr!r}, {port}), timeout=1).close()")
    while time.monotonic() < deadline:
        if subprocess.run([*net.enter(ns), sys.executable, "-c", probe], capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    raise DevClusterError(f"the shared file system's server did not listen on {net.hub_addr}:{port} "
                          f"within {timeout:.0f} s")


def serve(root: Path, net: Network, delay_ms: float, port: int = PORT, timeout: float = 15.0) -> int:
    """Start the counting, delaying SFTP server in the hub namespace on ``net.hub_addr:port``; its pid."""
    why = missing_requirements()
    if why:
        raise DevClusterError(f"the shared file system cannot run here: {why}")
    (root / COUNTS).unlink(missing_ok=True)
    log = open(root / "sharedfs-server.log", "ab")
    proc = subprocess.Popen([*net.enter(net.hub), sys.executable, "-m", __name__, net.hub_addr, str(port),
                             str(delay_ms), str(root / COUNTS)], stdout=log, stderr=log, start_new_session=True)
    log.close()
    _record(root, f"server {proc.pid}")
    _wait_port(net, net.node_ns(1), port, timeout)
    return proc.pid


def mount(root: Path, net: Network, node: int, export: str, mountpoint: Path, port: int = PORT,
          timeout: float = 15.0, mount_ns_of: int | None = None) -> int:
    """Mount ``export`` (a directory on this machine, served by :func:`serve`) at ``mountpoint`` with sshfs
    started in node ``node``'s network namespace; its pid. Read-only, sshfs's default caches, links followed on
    the server. With
    ``mount_ns_of`` (a slurmd's pid: the dev cluster gives each its own mount namespace) the mount is made
    in that process's mount namespace, so every node can have its own mount at the same path; sshfs
    unmounts it when it is stopped."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    enter = [*net.enter(net.node_ns(node))]
    if mount_ns_of is not None:
        enter.append(f"--mount=/proc/{mount_ns_of}/ns/mnt")
    log = open(root / f"sharedfs-node{node}.log", "ab")
    # follow_symlinks: this sshfs (Debian 12's 3.7.3) answers EPERM to reading any link whose target holds a
    # "/", such as a venv's bin/python -> /usr/bin/python3; the server follows links and shows what they name
    proc = subprocess.Popen([*enter, "sshfs", "-f", "-o",
                             f"directport={port},ro,allow_other,follow_symlinks", f"{net.hub_addr}:{export}",
                             str(mountpoint)],
                            stdout=log, stderr=log, start_new_session=True)
    log.close()
    _record(root, f"sshfs {proc.pid} {mountpoint}" if mount_ns_of is None else f"sshfs {proc.pid}")
    deadline = time.monotonic() + timeout
    probe = [*enter, "mountpoint", "-q", str(mountpoint)]
    while subprocess.run(probe).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (root / f"sharedfs-node{node}.log").read_text(errors="replace").strip()[-300:]
            raise DevClusterError(f"sshfs did not mount {export} at {mountpoint} within {timeout:.0f} s "
                                  f"(exit {proc.poll()}): {tail}")
        time.sleep(0.1)
    return proc.pid


@dataclass(frozen=True)
class Served:
    """What the server has served so far: the SFTP requests by type, and the bytes of file data."""

    requests: dict[str, int]
    data_bytes: int

    @property
    def total(self) -> int:
        return sum(self.requests.values())


def counts(root: Path) -> Served:
    """What the server of the cluster in ``root`` has served (as of its last write, at most 0.2 s old)."""
    try:
        d = json.loads((root / COUNTS).read_text())
        return Served({str(k): int(v) for k, v in d["requests"].items()}, int(d["data_bytes"]))
    except (OSError, ValueError, KeyError, AttributeError):
        return Served({}, 0)


def stop(root: Path, timeout: float = 10.0) -> None:
    """Unmount every mount :func:`mount` made and stop the processes :func:`serve` and :func:`mount` started,
    by their recorded pids. Safe to repeat."""
    try:
        lines = [ln.split() for ln in (root / PIDS).read_text().splitlines() if ln.strip()]
    except OSError:
        return
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount"
    for parts in lines:
        if parts[0] == "sshfs" and len(parts) > 2 and os.path.ismount(parts[2]):
            if subprocess.run([fusermount, "-u", parts[2]], capture_output=True).returncode != 0:
                subprocess.run([fusermount, "-u", "-z", parts[2]], capture_output=True)
    _stop_pids([int(p[1]) for p in lines if _running(int(p[1]))], timeout)
    (root / PIDS).unlink()


if __name__ == "__main__":
    _server_main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
