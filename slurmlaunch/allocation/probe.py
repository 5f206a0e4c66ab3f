"""What `slurmlaunch doctor --allocate` runs on every rank (through the launcher, without its preflight, so
that problems are reported rather than stopped at): name resolution of MASTER_ADDR, whether rank 0's
MASTER_PORT is reachable from every rank, the GPUs a task sees, Python and torch. Writes one JSON file per
rank into the directory given as its argument. Every wait is bounded by $SLURMLAUNCH_PROBE_TIMEOUT.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

from .gpus import dev_gpu_ids
from .net import resolve as resolve_addresses
from .net import wait_listening


def report_name(rank: int) -> str:
    """The file one rank's report is written to, in the directory doctor gives (doctor reads it back)."""
    return f"rank-{rank}.json"


def resolve(addr: str) -> tuple[bool, str]:
    try:
        return True, ",".join(resolve_addresses(addr))
    except (OSError, UnicodeError) as e:
        return False, f"does not resolve ({e})"


def serve(port: int, expected: int, deadline: float) -> tuple[bool, str]:
    """Rank 0: listen on MASTER_PORT until every other rank has connected, or the deadline."""
    try:
        srv = socket.create_server(("", port), reuse_port=False)
    except OSError as e:
        return False, f"cannot listen on port {port} ({e.strerror})"
    srv.settimeout(0.5)
    seen = 0
    with srv:
        while seen < expected and time.monotonic() < deadline:
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.close()
            seen += 1
    if seen < expected:
        return False, f"listening on {port}: {seen} of {expected} other ranks connected before the timeout"
    return True, f"listening on {port}: all {expected} other ranks connected"


def reach(addr: str, port: int, deadline: float) -> tuple[bool, str]:
    """Other ranks: connect to MASTER_ADDR:MASTER_PORT, retrying until rank 0 listens or the deadline."""
    last = wait_listening(addr, port, deadline, 0.2)
    if last is None:
        return True, f"reached {addr}:{port}"
    return False, f"could not reach {addr}:{port} ({last})"


def torch_info() -> dict[str, Any]:
    start = time.monotonic()
    try:
        import torch
    except Exception as e:  # any import failure is the finding itself
        return {"ok": False, "detail": f"import torch failed: {type(e).__name__}: {e}"}
    cuda = torch.cuda.is_available()
    devices = torch.cuda.device_count() if cuda else 0
    return {"ok": True, "detail": f"torch {torch.__version__}, cuda available: {cuda}, devices: {devices}",
            "cuda": bool(cuda and devices), "devices": devices, "import_s": round(time.monotonic() - start, 2)}


def main(argv: list[str]) -> int:
    out_dir = argv[0]
    env = os.environ
    timeout = float(env.get("SLURMLAUNCH_PROBE_TIMEOUT", "60"))
    deadline = time.monotonic() + timeout
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    addr, port = env.get("MASTER_ADDR", ""), int(env.get("MASTER_PORT", "0") or 0)
    resolved, where = resolve(addr) if addr else (False, "MASTER_ADDR is not set")
    if rank == 0:
        port_ok, port_detail = serve(port, world - 1, deadline) if world > 1 else (True, "one rank: nothing to reach")
    else:
        port_ok, port_detail = reach(addr, port, deadline) if resolved else (False, "skipped: MASTER_ADDR unresolved")
    record = {
        "rank": rank, "local_rank": env.get("LOCAL_RANK"), "host": socket.gethostname(), "master_addr": addr,
        "master_port": port, "resolve": {"ok": resolved, "detail": where},
        "port": {"ok": port_ok, "detail": port_detail},
        "gpus": {"CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES"), "dev": len(dev_gpu_ids()),
                 "local_device": env.get("SLURMLAUNCH_LOCAL_DEVICE")},
        "python": {"ok": True, "detail": f"{sys.executable} {sys.version.split()[0]}"},
        "torch": torch_info(),
    }
    with open(os.path.join(out_dir, report_name(rank)), "w") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
