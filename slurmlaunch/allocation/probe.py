"""What `slurmlaunch doctor --allocate` runs on every rank (through the launcher, without its preflight, so
that problems are reported rather than stopped at): name resolution of MASTER_ADDR, whether rank 0's
MASTER_PORT is reachable from every rank, the GPUs a task sees, Python and torch. Writes one JSON file per
rank into the directory given as its argument (RankReport.to_json; doctor reads it back with from_json).
Every wait is bounded by $SLURMLAUNCH_PROBE_TIMEOUT, torch's import (beside the port check) included.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from .gpus import dev_gpu_ids
from .net import resolve as resolve_addresses
from .net import wait_listening


@dataclass(frozen=True)
class Finding:
    """One check's verdict and what was seen."""

    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail}

    @classmethod
    def from_json(cls, data: Any) -> Finding:
        return cls(bool(data["ok"]), str(data["detail"]))


@dataclass(frozen=True)
class TorchFinding:
    """Whether torch imports, and what it sees (cuda, devices, import_s: only when it imported)."""

    ok: bool
    detail: str
    cuda: bool = False
    devices: int = 0
    import_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        if not self.ok:
            return {"ok": False, "detail": self.detail}
        return {"ok": True, "detail": self.detail, "cuda": self.cuda, "devices": self.devices,
                "import_s": self.import_s}

    @classmethod
    def from_json(cls, data: Any) -> TorchFinding:
        if not data["ok"]:
            return cls(False, str(data["detail"]))
        return cls(True, str(data["detail"]), bool(data["cuda"]), int(data["devices"]), data.get("import_s"))


@dataclass(frozen=True)
class GpuView:
    """The GPUs a task sees: its CUDA_VISIBLE_DEVICES, the GPU device files in /dev, the launcher's choice."""

    visible: str | None
    dev: int
    local_device: str | None

    def to_json(self) -> dict[str, Any]:
        return {"CUDA_VISIBLE_DEVICES": self.visible, "dev": self.dev, "local_device": self.local_device}

    @classmethod
    def from_json(cls, data: Any) -> GpuView:
        return cls(data["CUDA_VISIBLE_DEVICES"], int(data["dev"]), data["local_device"])


@dataclass(frozen=True)
class RankReport:
    """What one rank found (its file's JSON: to_json, read back by from_json)."""

    rank: int
    local_rank: str | None
    host: str
    master_addr: str
    master_port: int
    resolve: Finding
    port: Finding
    gpus: GpuView
    python: Finding
    torch: TorchFinding

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "host": self.host,
                "master_addr": self.master_addr, "master_port": self.master_port,
                "resolve": self.resolve.to_json(), "port": self.port.to_json(), "gpus": self.gpus.to_json(),
                "python": self.python.to_json(), "torch": self.torch.to_json()}

    @classmethod
    def from_json(cls, data: Any) -> RankReport:
        """The report of a parsed file; KeyError, TypeError or ValueError when it is not one."""
        return cls(int(data["rank"]), data["local_rank"], str(data["host"]), str(data["master_addr"]),
                   int(data["master_port"]), Finding.from_json(data["resolve"]), Finding.from_json(data["port"]),
                   GpuView.from_json(data["gpus"]), Finding.from_json(data["python"]),
                   TorchFinding.from_json(data["torch"]))


def report_name(rank: int) -> str:
    """The file one rank's report is written to, in the directory doctor gives (doctor reads it back)."""
    return f"rank-{rank}.json"


def resolve(addr: str) -> Finding:
    try:
        return Finding(True, ",".join(resolve_addresses(addr)))
    except (OSError, UnicodeError) as e:
        return Finding(False, f"does not resolve ({e})")


def serve(port: int, expected: int, deadline: float) -> Finding:
    """Rank 0: listen on MASTER_PORT until every other rank has connected, or the deadline."""
    try:
        srv = socket.create_server(("", port), reuse_port=False)
    except OSError as e:
        return Finding(False, f"cannot listen on port {port} ({e.strerror})")
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
        return Finding(False, f"listening on {port}: {seen} of {expected} other ranks connected before the timeout")
    return Finding(True, f"listening on {port}: all {expected} other ranks connected")


def reach(addr: str, port: int, deadline: float) -> Finding:
    """Other ranks: connect to MASTER_ADDR:MASTER_PORT, retrying until rank 0 listens or the deadline."""
    last = wait_listening(addr, port, deadline, 0.2)
    if last is None:
        return Finding(True, f"reached {addr}:{port}")
    return Finding(False, f"could not reach {addr}:{port} ({last})")


def torch_info() -> TorchFinding:
    start = time.monotonic()
    try:
        import torch
    except Exception as e:  # any import failure is the finding itself
        return TorchFinding(False, f"import torch failed: {type(e).__name__}: {e}")
    cuda = torch.cuda.is_available()
    devices = torch.cuda.device_count() if cuda else 0
    return TorchFinding(True, f"torch {torch.__version__}, cuda available: {cuda}, devices: {devices}",
                        bool(cuda and devices), devices, round(time.monotonic() - start, 2))


def main(argv: list[str]) -> int:
    out_dir = argv[0]
    env = os.environ
    timeout = float(env.get("SLURMLAUNCH_PROBE_TIMEOUT", "60"))
    deadline = time.monotonic() + timeout
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    addr, port = env.get("MASTER_ADDR", ""), int(env.get("MASTER_PORT", "0") or 0)
    # torch's import (seconds of CPU, many more on a loaded node) runs beside the port check, within the same
    # budget. After it, it came on top of that wait, which rank 0 spends whole when the others never connect
    # (an unresolvable MASTER_ADDR): on a loaded machine the probe job outlived doctor's --timeout.
    found: list[TorchFinding] = []
    importer = threading.Thread(target=lambda: found.append(torch_info()), name="import-torch", daemon=True)
    importer.start()
    resolved = resolve(addr) if addr else Finding(False, "MASTER_ADDR is not set")
    if rank == 0:
        port_found = serve(port, world - 1, deadline) if world > 1 else Finding(True, "one rank: nothing to reach")
    else:
        port_found = reach(addr, port, deadline) if resolved.ok else Finding(False, "skipped: MASTER_ADDR unresolved")
    importer.join(max(0.0, deadline - time.monotonic()))
    torch_found = found[0] if found else TorchFinding(False, f"import torch did not finish within the probe's "
                                                             f"{timeout:g}s (a slow file system?)")
    report = RankReport(
        rank, env.get("LOCAL_RANK"), socket.gethostname(), addr, port, resolved, port_found,
        GpuView(env.get("CUDA_VISIBLE_DEVICES"), len(dev_gpu_ids()), env.get("SLURMLAUNCH_LOCAL_DEVICE")),
        Finding(True, f"{sys.executable} {sys.version.split()[0]}"), torch_found)
    with open(os.path.join(out_dir, report_name(rank)), "w") as f:
        json.dump(report.to_json(), f)
    if importer.is_alive():  # an import still under way is not waited for, nor torn down at the exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
