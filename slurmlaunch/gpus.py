"""Which GPUs this process can see, without importing anything heavy (no torch, no NVML)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def dev_gpu_ids() -> list[str]:
    """The N of every /dev/nvidiaN: the GPUs of the machine when CUDA_VISIBLE_DEVICES is unset."""
    try:
        return sorted((n[6:] for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit()), key=int)
    except OSError:
        return []


def visible_gpus(environ: Mapping[str, str]) -> list[str]:
    """CUDA_VISIBLE_DEVICES as a list (Slurm's "NoDevFiles" and an empty value mean none), else /dev's GPUs."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [] if cvd.strip() in ("", "NoDevFiles") else cvd.split(",")
    return dev_gpu_ids()
