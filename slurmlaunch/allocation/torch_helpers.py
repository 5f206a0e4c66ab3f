"""Optional helpers for training scripts. Import torch lazily: never on the launcher's or the CLI's path."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ..core.envvars import first_set, int_var
from ..core.errors import SlurmLaunchError
from ..core.rdzv import RDZV_TIMEOUT_VAR, parse_rendezvous_timeout
from .net import wait_listening

_ARRIVED = "slurmlaunch/arrived"
_POLL_S = 0.002  # non-zero ranks poll the master every 2 ms: no TCPStore client back-off of 0.25 s or more


def _compress(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def _wait_listening(addr: str, port: int, deadline: float, rank: int) -> None:
    failed = wait_listening(addr, port, deadline, _POLL_S)
    if failed is not None:
        raise SlurmLaunchError(
            f"rank {rank}: rendezvous timed out: nothing listened at MASTER_ADDR:MASTER_PORT={addr}:{port} "
            f"({failed}); rank 0 never started it"
        )


def rendezvous_timeout_s(value: float | None) -> float:
    """``value`` when given, else $SLURMLAUNCH_RDZV_TIMEOUT as the launcher reads it (core.rdzv): a bad
    value is the same one-line error there and here."""
    if value is not None:
        return value
    return parse_rendezvous_timeout(os.environ.get(RDZV_TIMEOUT_VAR))


def init_process_group(backend: str | None = None, *, rendezvous_timeout: float | None = None,
                       **kwargs: Any) -> Any:
    """``torch.distributed.init_process_group`` from the variables slurmlaunch (or torchrun) exported.

    Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK and SLURMLAUNCH_LOCAL_DEVICE (which GPU
    among the visible ones: the GPU rule, docs/explanation/launcher.md), SLURMLAUNCH_RDZV_TIMEOUT.

    * ``backend=None``: nccl when CUDA is available, xccl when Intel GPUs are (torch.xpu), else gloo; on a
      GPU the rank's device is selected.
    * The rendezvous is bounded by ``rendezvous_timeout`` seconds (default SLURMLAUNCH_RDZV_TIMEOUT, 900):
      rank 0 waits for every rank to check in and, on time-out, names the ranks that never arrived; the
      others poll the master every 2 ms, so none loses the TCPStore client's back-off of 0.25 s or more
      when rank 0 is the last to be ready.
    * Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) torchrun's own store is used.

    Returns the torch.device this rank should use. Other keyword arguments go to init_process_group.
    """
    import torch.distributed as dist

    env = os.environ
    rank, world, addr, port = _placement(env)
    device = _select_device(env)
    backend = backend or {"cuda": "nccl", "xpu": "xccl"}.get(device.type, "gloo")
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group(backend, **kwargs)
        return device
    # 0 means no bound, as for the launcher's watchdog (a deadline of now would fail every rank at once)
    store = _rendezvous(rank, world, addr, port, rendezvous_timeout_s(rendezvous_timeout) or 1e9)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, **kwargs)
    return device


def _placement(env: Mapping[str, str]) -> tuple[int, int, str, int]:
    """(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); one line when one is missing or not a number."""
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError) as e:
        raise SlurmLaunchError(f"init_process_group: {e} is missing or invalid: start this script with "
                               f"slurmlaunch (or torchrun)") from None
    return rank, world, addr, port


def _select_device(env: Mapping[str, str]) -> Any:
    """The rank's torch.device (GPU SLURMLAUNCH_LOCAL_DEVICE, else LOCAL_RANK), made the current one."""
    import torch

    # read as the launcher reads variables (core.envvars): a bad value is one line naming it
    name, text = first_set(env, "SLURMLAUNCH_LOCAL_DEVICE", "LOCAL_RANK") or ("LOCAL_RANK", "0")
    index = int_var(name, text)
    xpu = getattr(torch, "xpu", None)  # Intel GPUs (Level Zero), e.g. ALCF Aurora
    if torch.cuda.is_available():
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if xpu is not None and xpu.is_available():
        xpu.set_device(index)
        return torch.device("xpu", index)
    return torch.device("cpu")


def _rendezvous(rank: int, world: int, addr: str, port: int, limit: float) -> Any:
    """The TCPStore every rank has checked in to within ``limit`` seconds; rank 0 names the missing ones."""
    import torch.distributed as dist

    deadline = time.monotonic() + limit
    store_timeout = timedelta(seconds=max(limit, 1.0))
    if rank == 0:
        store = dist.TCPStore(addr, port, world, True, store_timeout, wait_for_workers=False)  # type: ignore[attr-defined]
    else:
        _wait_listening(addr, port, deadline, rank)
        store = dist.TCPStore(addr, port, world, False, store_timeout)  # type: ignore[attr-defined]
    store.set(f"{_ARRIVED}/{rank}", socket.gethostname())
    if rank == 0:
        keys = [f"{_ARRIVED}/{r}" for r in range(world)]
        try:  # the store wakes us when the last key appears: no polling
            store.wait(keys, timedelta(seconds=max(0.001, deadline - time.monotonic())))
        except RuntimeError:  # torch raises DistStoreError (a RuntimeError) on time-out
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            raise SlurmLaunchError(
                f"rank 0: rendezvous timed out after {limit:.0f}s at {addr}:{port}: {world - len(missing)} of "
                f"{world} ranks arrived; missing rank(s) {_compress(missing)}"
            ) from None
    return store
